"""The store's SQL layer (store/sql.py): stores made by earlier releases open and keep working on
both dialects, the two dialects order nullable columns alike, and a statement that would run on
SQLite only is caught before it reaches a PostgreSQL deployment.

tests/fixtures/store/v11.*.sql are dumps of stores that the store code of schema version 11 made
(before this layer, when PostgreSQL ran SQLite's statements rewritten by regular expressions):
`sqlite3`'s iterdump and `pg_dump --inserts` of a few attempts, logs, points, a dropped-line count,
a diagnosis with its revision and an export row.
"""

from __future__ import annotations

import ast
import inspect
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres_support import PG_URL, fresh_schema

from hypocenter.store import open_store
from hypocenter.store.base import DiagnosisFilter, Entry, Retention
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.postgres import PostgresStore, _Connection
from hypocenter.store.sql import json_text, sql
from hypocenter.store.sqlite import SQLiteStore

FIXTURES = Path(__file__).parents[1] / "fixtures" / "store"
T0 = 1_793_000_000_000_000_000


@pytest.fixture()
def pg_schema() -> Iterator[str]:
    yield from fresh_schema()


def _keeps_working(store: SQLiteStore) -> None:
    """What the version-11 store held reads back, and new records, diagnoses and exports go in."""
    assert store.schema_version() == len(MIGRATIONS)  # upgraded from 11, if there is more
    row = store.attempt("81234", 0)
    assert row is not None and row.nodes == ["node01"] and row.scope == {"cluster": "eos"}
    assert [r.line for r in store.attempt_logs(row.id)] == [1, 2, 3, 4, 5, 6]
    assert [r.line for r in store.node_logs(["node02"], T0, T0 + 10**12)] == [3, 4, 5, 6, 7, 8]
    assert store.drops(row.id, ["node02"]) == {("node02", "logs/node02/kern.log"): 2}
    got = store.get_diagnosis("dx-81234")
    assert got is not None and got.nodes == ["node01"] and got.provenance == {"source": "otlp"}
    (facts,) = store.diagnosis_facts(0.0)
    assert facts.components == [("node01", "gpu", "0000:4e:00")] and facts.culprits == ["node01"]
    (pending,) = store.claim_exports("loki", time.time(), 10, 60.0)
    assert pending.diagnosis_id == "dx-81234"
    # new rows take ids after the old ones (PostgreSQL: the identity sequences came along)
    new = [
        Entry(
            "81234",
            0,
            "node01",
            "logs/node01/train.log",
            "text",
            f"later {i}",
            T0 + (10 + i) * 10**9,
            11 + i,
            f"81234|node01|{11 + i}",
        )
        for i in range(3)
    ]
    assert store.ingest(new, [], time.time()) == 3 and store.ingest(new, [], time.time()) == 0
    assert [r.line for r in store.attempt_logs(row.id)] == [1, 2, 3, 4, 5, 6, 11, 12, 13]
    assert (
        store.put_diagnosis(
            row.id,
            '{"id": "dx-81234", "v": 2}',
            {
                "id": "dx-81234",
                "workload": "81234",
                "attempt": 0,
                "outcome": "attributed",
                "culprits": ["node01"],
            },
            provisional=False,
            analyzed_from=time.time() + 1,
        )
        == 2
    )
    assert [r.revision for r in store.diagnosis_revisions("dx-81234")] == [1, 2]
    assert [d.id for d in store.list_diagnoses(DiagnosisFilter())] == ["dx-81234"]


def _sqlite_schema(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as con:
        return list(con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name"))


def test_a_schema_11_sqlite_file_opens_and_keeps_working(tmp_path: Path) -> None:
    old = tmp_path / "v11.db"
    with sqlite3.connect(old) as con:
        con.executescript((FIXTURES / "v11.sqlite.sql").read_text())
    con.close()
    SQLiteStore(tmp_path / "fresh.db").close()
    store = open_store(str(old))
    try:
        _keeps_working(store)
    finally:
        store.close()
    # the store upgraded is the one made today, to the text of every table and index
    assert _sqlite_schema(old) == _sqlite_schema(tmp_path / "fresh.db")


def _pg_schema(conn: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    def rows(query: str) -> list[tuple[Any, ...]]:
        return [tuple(str(v).replace(schema, "S") for v in r) for r in conn.execute(query, (schema,))]

    return {
        "columns": rows(
            "SELECT table_name, column_name, data_type, collation_name, is_nullable, column_default,"
            " is_identity, identity_generation FROM information_schema.columns WHERE table_schema = %s"
            " ORDER BY table_name, column_name"
        ),
        "indexes": rows(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY indexname"
        ),
        "constraints": rows(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s ORDER BY 1, 2"
        ),
    }


@pytest.mark.postgresql
def test_a_schema_11_postgresql_schema_opens_and_keeps_working(pg_schema: str) -> None:
    import psycopg

    old = pg_schema.rsplit("%3D", 1)[1]
    dump = (FIXTURES / "v11.postgresql.sql").read_text().replace("v11_schema", old)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(dump.encode())
    store = open_store(pg_schema)
    try:
        _keeps_working(store)
    finally:
        store.close()
    another = fresh_schema()
    fresh = next(another)
    try:
        open_store(fresh).close()
        with psycopg.connect(PG_URL) as conn:
            # the schema upgraded is the one made today: types, byte-order collations, identities, indexes
            assert _pg_schema(conn, old) == _pg_schema(conn, fresh.rsplit("%3D", 1)[1])
    finally:
        another.close()


@pytest.mark.postgresql
def test_nullable_columns_sort_alike_on_both_stores(pg_schema: str, tmp_path: Path) -> None:
    """NULLs first ascending and last descending, as SQLite sorts them, in every statement that
    orders by a nullable column: compaction's and collapse's stream lists, retention's oldest lines,
    failed attempts, the diagnosis list."""
    sqlite, pg = open_store(str(tmp_path / "s.db")), open_store(pg_schema)
    try:
        # one time for all: retention's (time, line) order then rests on the NULL lines
        logs = [
            Entry(w, 0, node, stream, "text", f"{stream} {i}", T0, line, f"{w}|{node}|{stream}|{i}")
            for w, node in (("b", "n2"), (None, "n1"), ("a", None), (None, None), ("a", "n1"))
            for stream in ("s2", "s1")
            for i, line in enumerate((3, None, 1, None))
        ]
        order: dict[str, list[Any]] = {}
        for name, store in (("sqlite", sqlite), ("postgresql", pg)):
            store.ingest(logs, [], now=1000.0)
            ids = {a.id: a.workload for a in (store.attempt(w, 0) for w in ("a", "b")) if a is not None}
            due = [(ids.get(k.attempt_id), k.node, k.stream) for k in store.compaction_due(1001.0, 100)]
            for workload, reason in (("a", "first"), ("b", "second")):
                a = store.attempt(workload, 0)
                assert a is not None
                store.fail_analysis(a.id, reason, now=5.0, analyzed_from=0.0)
            failed = [a.workload for a in store.failed_attempts(10)]
            store.sweep(1000.0, Retention(max_lines_per_stream=2))  # drops the two oldest: NULL lines first
            kept = [(r.node, r.stream, r.line) for r in store.node_logs(["n1"], 0, T0 * 2)]
            order[name] = [due, failed, kept]
        assert order["sqlite"] == order["postgresql"]
        due, _, kept = order["sqlite"]
        assert due[:3] == [(None, None, "s1"), (None, None, "s2"), (None, "n1", "s1")]
        assert [line for _, _, line in kept] == [3, 1, 3, 1]  # the NULL-line rows went first
    finally:
        sqlite.close()
        pg.close()


def test_constructs_render_per_dialect() -> None:
    s = sql(
        "SELECT id, ",
        json_text("body", "root_cause", "components"),
        " FROM diagnoses WHERE id = ? AND x LIKE '%'",
    )
    assert (
        s
        == "SELECT id, json_extract(body, '$.root_cause.components') FROM diagnoses WHERE id = ? AND x LIKE '%'"
    )
    assert s.postgres == (
        "SELECT id, (body::jsonb #>> '{root_cause,components}') FROM diagnoses WHERE id = %s AND x LIKE '%%'"
    )
    assert sql("SELECT 1 WHERE a = ?") is sql("SELECT 1 WHERE a = ?")  # rendered once
    with pytest.raises(ValueError, match="quoted literal"):
        sql("SELECT 1 WHERE a = 'why?'")
    with pytest.raises(TypeError, match="sql"):  # a plain string would run SQLite's text on PostgreSQL
        _Connection(None).execute("SELECT 1 WHERE a = ?", (1,))


def test_every_shared_statement_goes_through_the_layer() -> None:
    """The statements PostgresStore runs from SQLiteStore are written with sql(...), not as plain
    strings: those would work on SQLite and fail only on a PostgreSQL deployment."""
    own = set(vars(PostgresStore))  # methods PostgresStore replaces: SQLite-only code is fine there
    tree = ast.parse(Path(inspect.getfile(SQLiteStore)).read_text())
    plain: list[str] = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name not in own:
            for call in ast.walk(fn):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.args
                    and call.func.attr in ("execute", "executemany", "_rows")
                    and isinstance(call.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp))
                ):
                    plain.append(f"{fn.name}:{call.lineno}")
    assert plain == []


def test_migrations_name_column_types_for_both_dialects() -> None:
    """A bare INTEGER would be a 32-bit column in PostgreSQL, a bare TEXT one sorted by locale."""
    for version, migration in enumerate(MIGRATIONS, 1):
        code = re.sub(r"--[^\n]*|'[^']*'", "", migration.template)
        bare = re.findall(
            r"(?<![$\w])(INTEGER|REAL|TEXT|BIGINT|DOUBLE PRECISION|VARCHAR)\b", code, re.IGNORECASE
        )
        assert bare == [], f"migration {version}: write $ID, $INTEGER, $REAL or $TEXT"
    assert [len(m.sqlite) for m in MIGRATIONS] == [len(m.postgres) for m in MIGRATIONS]


@pytest.mark.postgresql
def test_postgresql_pages_the_diagnosis_list_from_its_index(pg_schema: str) -> None:
    """The list's order (newest window first, NULL windows last) is the index's order, so a page is read
    from the index, not by sorting every diagnosis stored (a table of a fleet's years)."""
    import psycopg

    open_store(pg_schema).close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{pg_schema.rsplit("%3D", 1)[1]}"')
        conn.execute("SET enable_sort = off")  # a plan that must sort says so even on an empty table
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT * FROM diagnoses ORDER BY window_end_ns DESC NULLS LAST, id LIMIT 50"
            )
        )
    assert "diagnoses_list" in plan and "Sort" not in plan, plan
