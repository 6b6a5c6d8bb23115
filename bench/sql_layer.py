"""What the store's SQL layer costs per statement, beside plain sqlite3 / psycopg and SQLAlchemy Core,
measured in the same run (issue #11: "measure and choose"):

    python -m bench.sql_layer [--rounds 7] [--postgres URL]     (URL: else HYPOCENTER_TEST_POSTGRES_URL)

Three statements of the store's hot paths, each run by three means on each dialect:

- ingest: the OTLP batch insert of log records (`executemany` of 100 rows, duplicates ignored);
- one-row insert: a metric point (`execute` of one row, duplicates ignored);
- one-row read: an attempt by its key (`SELECT * … WHERE workload=? AND attempt=?`, fetched).

Means: plain — the driver with a hand-written string (today's SQLite text, or its PostgreSQL
rendering); layer — store/sql.py as the store uses it (`sql("…")` written at the call, the
PostgreSQL store's connection wrapper); SQLAlchemy — Core table objects and each dialect's
`insert(…).on_conflict_do_nothing()`, run through an Engine connection (`pip install sqlalchemy` for
this column). SQLAlchemy 2.0 gives those upsert constructs no cache key (its engine logs "no key"),
so they are compiled at every execution; its plain `insert()` and `select()` are cached. Each mean runs its statements inside
one transaction of its own; a round times every mean once, interleaved, and the best round is
printed (as timeit does: the one least disturbed by other processes on a shared machine). SQLite is a WAL file with synchronous=OFF, so that disk syncs do not drown the overhead.
Figures are for this machine and run only; compare columns of one run.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from hypocenter.store.base import Entry
from hypocenter.store.sql import sql
from hypocenter.store.sqlite import SQLiteStore

BATCH = 100
STATEMENTS = {"ingest": 20, "insert": 300, "read": 500}  # statements per mean per round
LOG_COLUMNS = "attempt_id, node, stream, kind, line, time_ns, body, received, dedup"
POINT_COLUMNS = "attempt_id, node, source, name, labels, time_ns, value, received, dedup"
BODY = "n1:1:2 [0] NCCL INFO Channel 07/0 : 3[0] -> 4[0] [send] via NET/IB/0 after 1234 ms, retrying"


def _log_rows(tag: str, n: int) -> list[tuple[Any, ...]]:
    return [
        (
            1,
            "node01",
            "logs/node01/train.log",
            "text",
            i,
            1_793_000_000_000_000_000 + i,
            BODY,
            1000.0,
            f"{tag}|{i}",
        )
        for i in range(n)
    ]


def _point(tag: str, i: int) -> tuple[Any, ...]:
    return (
        1,
        None,
        "metrics/dcgm.json",
        "DCGM_FI_DEV_XID_ERRORS",
        '{"gpu":"0"}',
        i,
        1.0,
        1000.0,
        f"{tag}|{i}",
    )


Runner = Callable[[str, str], None]  # (workload, unique tag)
SQLITE_PRAGMAS = ("PRAGMA synchronous=OFF", "PRAGMA foreign_keys=ON")


# The statements as store/sqlite.py writes them (portable text, `?` placeholders)
INGEST = f"INSERT INTO log_entries ({LOG_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
POINT = (
    f"INSERT INTO metric_points ({POINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
READ = "SELECT * FROM attempts WHERE workload=? AND attempt=?"


def _runner(db: Any, begin: Callable[[], Any], statements: tuple[str, str, str] | None) -> Runner:
    """`statements`: hand-written (plain), or None: `sql(text)` looked up at each call, as the store does,
    on sqlite3 or on PostgresStore's connection wrapper (the layer)."""

    def run(what: str, tag: str) -> None:
        with begin():
            if what == "ingest":
                for b in range(STATEMENTS[what]):
                    db.executemany(
                        statements[0] if statements else sql(INGEST), _log_rows(f"{tag}.{b}", BATCH)
                    )
            elif what == "insert":
                for i in range(STATEMENTS[what]):
                    db.execute(statements[1] if statements else sql(POINT), _point(tag, i))
            else:
                for _ in range(STATEMENTS[what]):
                    db.execute(statements[2] if statements else sql(READ), ("81234", 0)).fetchone()

    return run


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    yield
    db.execute("COMMIT")


def _sqlalchemy(url: str, dialect: str, **engine_args: Any) -> tuple[Runner, Callable[[], None]]:
    import sqlalchemy as sa
    from sqlalchemy import event

    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    meta = sa.MetaData()
    logs = sa.Table("log_entries", meta, *(sa.Column(c) for c in LOG_COLUMNS.split(", ")))
    points = sa.Table("metric_points", meta, *(sa.Column(c) for c in POINT_COLUMNS.split(", ")))
    attempts = sa.Table(
        "attempts",
        meta,
        sa.Column("id"),
        sa.Column("workload"),
        sa.Column("attempt"),
        sa.Column("scope"),
        sa.Column("activity"),
    )
    ingest = insert(logs).on_conflict_do_nothing()
    point = insert(points).on_conflict_do_nothing()
    read = sa.select(attempts).where(
        attempts.c.workload == sa.bindparam("w"), attempts.c.attempt == sa.bindparam("a")
    )
    engine = sa.create_engine(url, **engine_args)
    if dialect == "sqlite":

        @event.listens_for(engine, "connect")
        def pragmas(dbapi_conn: Any, _: Any) -> None:  # as the store's own connection has them
            for pragma in SQLITE_PRAGMAS:
                dbapi_conn.execute(pragma)

    log_keys, point_keys = LOG_COLUMNS.split(", "), POINT_COLUMNS.split(", ")

    def run(what: str, tag: str) -> None:
        with engine.begin() as conn:
            if what == "ingest":
                for b in range(STATEMENTS[what]):
                    conn.execute(
                        ingest, [dict(zip(log_keys, r, strict=True)) for r in _log_rows(f"{tag}.{b}", BATCH)]
                    )
            elif what == "insert":
                for i in range(STATEMENTS[what]):
                    conn.execute(point, dict(zip(point_keys, _point(tag, i), strict=True)))
            else:
                for _ in range(STATEMENTS[what]):
                    conn.execute(read, {"w": "81234", "a": 0}).fetchone()

    return run, engine.dispose


def _measure(means: dict[str, Runner], rounds: int) -> dict[tuple[str, str], float]:
    """µs per statement, the best round; every mean timed once per round, interleaved, in turns."""
    times: dict[tuple[str, str], list[float]] = {}
    names = list(means)
    for r in range(rounds + 1):  # round 0 warms caches (compiled statements, prepared queries) and is dropped
        for what in STATEMENTS:
            for name in names[r % len(names) :] + names[: r % len(names)]:
                tag = f"{name}.{what}.{r}.{uuid.uuid4().hex[:6]}"
                t = time.perf_counter()
                means[name](what, tag)
                if r:
                    times.setdefault((what, name), []).append(
                        (time.perf_counter() - t) * 1e6 / STATEMENTS[what]
                    )
    return {k: min(v) for k, v in times.items()}


def _sqlite_means(directory: Path) -> tuple[dict[str, Runner], Callable[[], None]]:
    """Each mean on a store file of its own, made by SQLiteStore, with one attempt in it."""
    paths = {name: directory / f"{name}.db" for name in ("plain", "layer", "SQLAlchemy")}
    for path in paths.values():
        store = SQLiteStore(path, synchronous="OFF")
        store.ingest([Entry("81234", 0, "node01", "s", "text", "x", 1, 1, "seed")], [], 1000.0)
        store.close()
    plain = sqlite3.connect(paths["plain"], isolation_level=None, check_same_thread=False)
    plain.row_factory = sqlite3.Row  # rows as the store reads them: what differs is the statement alone
    for pragma in SQLITE_PRAGMAS:
        plain.execute(pragma)
    store = SQLiteStore(paths["layer"], synchronous="OFF")
    # plain: the SQLite text the store ran before this layer (INSERT OR IGNORE), as the reference
    old = (
        INGEST.replace("INSERT", "INSERT OR IGNORE", 1).removesuffix(" ON CONFLICT DO NOTHING"),
        POINT.replace("INSERT", "INSERT OR IGNORE", 1).removesuffix(" ON CONFLICT DO NOTHING"),
        READ,
    )
    means: dict[str, Runner] = {
        "plain": _runner(plain, lambda: _immediate(plain), old),
        "layer": _runner(store._db, store._tx, None),
    }
    closers: list[Callable[[], None]] = [plain.close, store.close]
    try:
        import sqlalchemy as sa

        _add_sqlalchemy(
            means, closers, f"sqlite:///{paths['SQLAlchemy']}", "sqlite", poolclass=sa.pool.StaticPool
        )
    except ImportError:
        pass
    return means, lambda: _close_all(closers)


def _add_sqlalchemy(
    means: dict[str, Runner], closers: list[Callable[[], None]], url: str, dialect: str, **engine_args: Any
) -> None:
    """SQLAlchemy Core as a third mean, when it is installed (ImportError otherwise)."""
    runner, dispose = _sqlalchemy(url, dialect, **engine_args)
    means["SQLAlchemy"] = runner
    closers.append(dispose)


def _close_all(closers: list[Callable[[], None]]) -> None:
    for c in closers:
        c()


def _postgres_means(url: str) -> tuple[dict[str, Runner], Callable[[], None]]:
    """Each mean on a schema of its own, made by PostgresStore, with one attempt in it."""
    import psycopg

    from hypocenter.store.postgres import PostgresStore, _Connection, _row_factory

    schemas = {
        name: f"bench_{name.lower()}_{uuid.uuid4().hex[:8]}" for name in ("plain", "layer", "SQLAlchemy")
    }
    scoped = {
        name: f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
        for name, schema in schemas.items()
    }
    with psycopg.connect(url, autocommit=True) as admin:
        for schema in schemas.values():
            admin.execute(f"CREATE SCHEMA {schema}")
    stores = {name: PostgresStore(u) for name, u in scoped.items()}
    for store in stores.values():
        store.ingest([Entry("81234", 0, "node01", "s", "text", "x", 1, 1, "seed")], [], 1000.0)
    plain = psycopg.connect(
        scoped["plain"], autocommit=True, row_factory=_row_factory
    )  # rows as the store reads them
    conn = stores["layer"]._connect()
    means: dict[str, Runner] = {
        "plain": _runner(
            plain.cursor(), plain.transaction, (sql(INGEST).postgres, sql(POINT).postgres, sql(READ).postgres)
        ),
        "layer": _runner(_Connection(conn), conn.transaction, None),
    }
    closers: list[Callable[[], None]] = [plain.close, *(s.close for s in stores.values())]
    with suppress(ImportError):
        _add_sqlalchemy(
            means,
            closers,
            scoped["SQLAlchemy"].replace("postgresql://", "postgresql+psycopg://", 1),
            "postgresql",
        )

    def close() -> None:
        _close_all(closers)
        with psycopg.connect(url, autocommit=True) as admin:
            for schema in schemas.values():
                admin.execute(f"DROP SCHEMA {schema} CASCADE")

    return means, close


def _render_cost() -> tuple[float, float]:
    text = (
        "INSERT INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
    )
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):
        sql.__wrapped__(text)
    render = (time.perf_counter() - t) * 1e6 / n
    t = time.perf_counter()
    for _ in range(n):
        sql(text)
    return render, (time.perf_counter() - t) * 1e6 / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sql_layer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--postgres", default=os.environ.get("HYPOCENTER_TEST_POSTGRES_URL", ""))
    args = ap.parse_args(argv)
    results: dict[str, dict[tuple[str, str], float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        means, close = _sqlite_means(Path(tmp))
        try:
            results["SQLite"] = _measure(means, args.rounds)
        finally:
            close()
    if args.postgres:
        means, close = _postgres_means(args.postgres)
        try:
            results["PostgreSQL"] = _measure(means, args.rounds)
        finally:
            close()
    labels = {
        "ingest": f"ingest executemany ({BATCH} rows)",
        "insert": "one-row insert",
        "read": "one-row read",
    }
    print(f"µs per statement, best of {args.rounds} rounds (overhead over plain in brackets)")
    for dialect, got in results.items():
        names = sorted({n for _, n in got}, key=["plain", "layer", "SQLAlchemy"].index)
        print(f"\n{dialect:<34}" + "".join(f"{n:>22}" for n in names))
        for what, label in labels.items():
            base = got[(what, "plain")]
            cells = [
                f"{got[(what, n)]:8.1f}"
                + (
                    ""
                    if n == "plain"
                    else f" ({got[(what, n)] - base:+.1f}, {(got[(what, n)] / base - 1) * 100:+.0f}%)"
                )
                for n in names
            ]
            print(f"{label:<34}" + "".join(f"{c:>22}" for c in cells))
    if "PostgreSQL" not in results:
        print("\nPostgreSQL: not measured (give --postgres URL or set HYPOCENTER_TEST_POSTGRES_URL)")
    render, cached = _render_cost()
    print(
        f"\nstore/sql.py: rendering a statement for both dialects {render:.2f} µs (once per text);"
        f" the cached lookup at each call {cached:.2f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
