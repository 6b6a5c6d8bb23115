"""The PostgreSQL store: the same `Store`, tables and migrations as SQLite, shared by server replicas.

    PostgresStore(url)     `postgresql://user:password@host:port/database` (libpq URL; `?options=
                           -csearch_path%3Dschema` puts the tables in another schema)

Every query and every migration is `SQLiteStore`'s, written once with store/sql.py: this class
brings its own connection and runs each statement's PostgreSQL text (`Statement.postgres`), so the
two stores cannot drift apart in behaviour; tests/store/test_contract.py runs one contract against
both. How the dialects differ, and how the statements deal with it:

- SQL both take, written that way in store/sqlite.py: `INSERT … ON CONFLICT DO NOTHING` (never
  SQLite's `INSERT OR IGNORE`); an upsert reads the row already there as `table.column` (a bare
  column is ambiguous here); `CAST(id AS TEXT)` where an integer meets text; HAVING repeats the
  aggregate (no select aliases here); an ORDER BY on a nullable column says `NULLS FIRST`
  ascending and `NULLS LAST` descending, SQLite's own order (PostgreSQL's default is the reverse).
- Rendered per dialect by store/sql.py when a statement is defined: placeholders (`?` becomes
  psycopg's `%s`, a literal % is doubled), JSON members (`json_text`: `#>>` on jsonb here,
  `json_extract` in SQLite), and column types in migrations: identities for SQLite's rowid keys,
  BIGINT for INTEGER, DOUBLE PRECISION for REAL, and TEXT COLLATE "C" for TEXT (byte order, as
  SQLite sorts: diagnoses must not depend on the database's locale).
- In this class: connections, the migration lock, and `_attempt_id` (RETURNING and a re-read
  where replicas race; SQLite has one writer).

PostgreSQL text cannot hold NUL: a NUL in a log line is stored as U+FFFD.

Several replicas may share one database: migrations take an advisory lock, attempts are created
with ON CONFLICT, and record dedup keys make concurrent retries store once. A dropped connection
fails the current call (the ingest queue answers UNAVAILABLE, the exporter retries) and the next
call reconnects.

Needs psycopg 3: `pip install 'hypocenter[postgresql]'`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hypocenter.config import redact_url
from hypocenter.errors import TransientError
from hypocenter.store.base import StoreError
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.sql import Statement, sql
from hypocenter.store.sqlite import SQLiteStore

MIGRATION_LOCK = 0x6879706F  # pg_advisory_xact_lock key: "hypo"


def _clean(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value


def _params(args: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_clean(a) for a in args)


class _Row:
    """A result row addressed by position or by column name, like sqlite3.Row."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key]] if isinstance(key, str) else self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    index = {col.name: i for i, col in enumerate(cursor.description or ())}
    return lambda values: _Row(index, values)


def _text(statement: str) -> str:
    if not isinstance(statement, Statement):  # a plain string would be run as SQLite's text
        raise TypeError(f"write the statement with hypocenter.store.sql.sql(...): {statement!r}")
    return statement.postgres


class _Connection:
    """What SQLiteStore's queries call on a connection, over a psycopg connection: each statement's
    PostgreSQL text."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, statement: str, args: Sequence[Any] = ()) -> Any:
        text = _text(statement)
        cur = self._conn.cursor()
        cur.execute(text, _params(args) if args else None)
        return cur

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> Any:
        text = _text(statement)
        cur = self._conn.cursor()
        rows = list(rows)
        if rows:
            cur.executemany(text, [_params(r) for r in rows])
        return cur


# --------------------------------------------------------------------------------------------- the store


class PostgresStore(SQLiteStore):
    """SQLiteStore's queries over one PostgreSQL connection (behind a lock, like SQLite's)."""

    shared = True  # several replicas may use the database at once (store/coordination.py)

    def __init__(self, url: str) -> None:  # SQLiteStore.__init__ opens a file: not called
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "PostgreSQL stores need psycopg 3: pip install 'hypocenter[postgresql]'"
            ) from None
        self._psycopg = psycopg
        self.url = url
        self.path = redact_url(url)
        self._lock = threading.RLock()
        self.exporters: tuple[str, ...] = ()
        self._conn: Any = None
        self._opened = False
        with self._lock:
            self._connect()
        try:
            self.migrate()
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"{self.path}: not a usable hypocenter store: {exc}") from None
        self._opened = True

    def _connect(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        if self._conn is not None:
            self._conn.close()
        try:
            conn = self._psycopg.connect(
                self.url, autocommit=True, row_factory=_row_factory, connect_timeout=10
            )
        except self._psycopg.Error as exc:
            # At start a bad URL is the operator's to fix; later the database is away for now.
            error = TransientError if self._opened else StoreError
            raise error(f"{self.path}: cannot connect: {str(exc).strip()}") from None
        row = conn.execute(
            "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        encoding = row[0] if row is not None else "?"
        if encoding != "UTF8":
            conn.close()
            raise StoreError(
                f"{self.path}: the database's encoding is {encoding}: create it with ENCODING 'UTF8'"
            )
        self._conn = conn
        return conn

    # ----------------------------------------------------------------------------------- plumbing

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            conn = self._connect()
            with conn.transaction():
                yield _Connection(conn)

    def _rows(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return list(_Connection(self._connect()).execute(statement, args).fetchall())

    def _tuples(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            cur = self._connect().cursor(row_factory=self._psycopg.rows.tuple_row)
            cur.execute(_text(statement), _params(args) if args else None)
            return list(cur.fetchall())

    def migrate(self) -> int:
        """Apply the migrations this database does not have yet (one replica at a time)."""
        with self._tx() as db:
            db.execute(sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
            db.execute(
                sql(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY,"
                    " applied DOUBLE PRECISION NOT NULL)"
                )
            )
            have = int(
                db.execute(sql("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")).fetchone()[0]
            )
            if have > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path}: schema version {have} is newer than this hypocenter "
                    f"knows ({len(MIGRATIONS)}): upgrade hypocenter"
                )
            for version in range(have + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1].postgres:
                    db._conn.execute(statement)
                db.execute(sql("INSERT INTO schema_migrations VALUES (?, ?)"), (version, time.time()))
        return len(MIGRATIONS)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def _attempt_id(self, db: Any, workload: str, attempt: int, now: float) -> int:
        # Replicas may create the same attempt at once: the loser's insert does nothing and it reads the row.
        select = sql("SELECT id FROM attempts WHERE workload=? AND attempt=?")
        row = db.execute(select, (workload, attempt)).fetchone()
        if row is None:
            row = db.execute(
                sql(
                    "INSERT INTO attempts (workload, attempt, activity) VALUES (?, ?, ?)"
                    " ON CONFLICT (workload, attempt) DO NOTHING RETURNING id"
                ),
                (workload, attempt, now),
            ).fetchone()
        if row is None:
            row = db.execute(select, (workload, attempt)).fetchone()
        assert row is not None, "an attempt row that conflicted on insert is there to read"
        return int(row[0])
