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
with ON CONFLICT, record dedup keys make concurrent retries store once, and a stream's state is
written only over the version its reduction read (store/sqlite.py `_arrive`). A dropped connection
fails the current call with `StoreUnavailable` (the ingest queue answers UNAVAILABLE, the exporter
retries) and the next call reconnects; the outage is logged when it starts and when it ends, not
once per refused call.

Needs psycopg 3: `pip install 'hypocenter[postgresql]'`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hypocenter.config import redact_url
from hypocenter.errors import TransientError
from hypocenter.store.base import StoreError, StoreUnavailable, StreamConflict
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.sql import Statement, sql
from hypocenter.store.sqlite import SQLiteStore

MIGRATION_LOCK = 0x6879706F  # pg_advisory_xact_lock key: "hypo"
log = logging.getLogger("hypocenter.store")
# libpq settings a URL may override. A database cut off by the network (no reset, packets dropped)
# is noticed in seconds, not after the kernel's TCP timeouts (minutes to hours), so the store reports
# it unavailable (and reconnects) instead of hanging: keepalives on an idle connection, and
# tcp_user_timeout (ms) for a request whose bytes go unacknowledged.
CONNECTION_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}
IDLE_IN_TRANSACTION_MS = 20_000


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


_INSERT_UNNESTED = sql(
    "INSERT INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup, compacted)"
    " SELECT a, n, s, k, l, t, b, r, d, c FROM unnest(CAST(? AS BIGINT[]), CAST(? AS TEXT[]), CAST(? AS TEXT[]),"
    " CAST(? AS TEXT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS TEXT[]), CAST(? AS DOUBLE PRECISION[]),"
    " CAST(? AS TEXT[]), CAST(? AS BIGINT[])) WITH ORDINALITY AS u(a, n, s, k, l, t, b, r, d, c, o)"
    " ORDER BY o ON CONFLICT DO NOTHING"
)


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
        self._down_since: float | None = None  # when the database stopped answering, while it does not
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
        info = self._psycopg.conninfo
        given = info.conninfo_to_dict(self.url)
        url = info.make_conninfo(self.url, **{k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given})
        try:
            conn = self._psycopg.connect(url, autocommit=True, row_factory=_row_factory)
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
        # A replica stopped (SIGSTOP, a frozen VM) inside a transaction must not hold its row locks
        # over the other replicas' ingest: the database ends such a transaction, and the session.
        conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        self._conn = conn
        return conn

    # ----------------------------------------------------------------------------------- plumbing

    @contextmanager
    def _answering(self) -> Iterator[None]:
        """Run one call against the database: a lost connection becomes `StoreUnavailable`, and the
        outage is logged once when it starts and once when the database answers again."""
        errors = self._psycopg.errors
        try:
            yield
        except (errors.DeadlockDetected, errors.SerializationFailure) as exc:
            # rolled back to let another replica's transaction through: the same as a lost race
            raise StreamConflict(f"{self.path}: {str(exc).strip()}") from None
        except (
            self._psycopg.OperationalError,
            self._psycopg.InterfaceError,
            TransientError,
            errors.IdleInTransactionSessionTimeout,
        ) as exc:
            if not self._opened or isinstance(exc, StoreUnavailable):
                raise
            # The server ended the session (an outage of this replica's connection: e.g. the process
            # was paused inside a transaction past idle_in_transaction_session_timeout, or an admin
            # or crash shutdown): the connection is gone whatever psycopg says of it yet.
            ended = isinstance(
                exc, (errors.IdleInTransactionSessionTimeout, errors.AdminShutdown, errors.CrashShutdown)
            )
            if ended and self._conn is not None:
                self._conn.close()
            elif self._conn is not None and not self._conn.closed and not self._conn.broken:
                raise  # the database answered: an error of this statement, not an outage
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "store unavailable: %s; refusing writes (UNAVAILABLE / 503, clients retry) until it answers",
                    reason,
                )
            raise StoreUnavailable(f"store unavailable: {reason}") from None
        if self._down_since is not None:
            log.warning("store available again after %.0f s", time.monotonic() - self._down_since)
            self._down_since = None

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock, self._answering():
            conn = self._connect()
            with conn.transaction():
                yield _Connection(conn)

    def _rows(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock, self._answering():
            return list(_Connection(self._connect()).execute(statement, args).fetchall())

    def _tuples(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock, self._answering():
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

    def _insert_entries(self, db: Any, rows: list[tuple[Any, ...]]) -> None:
        """One statement for a batch's rows (arrays unnested in order) instead of one per row: the
        per-statement work of the backend is most of what a healthy batch costs PostgreSQL."""
        if len(rows) < 2:
            super()._insert_entries(db, rows)
            return
        db.execute(_INSERT_UNNESTED, [[_clean(v) for v in column] for column in zip(*rows, strict=True)])

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
