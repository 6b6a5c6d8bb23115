"""One store contract, run against SQLite and PostgreSQL: nothing acknowledged is lost, nothing is
stored twice, migrations are idempotent, diagnoses survive a reconnect, and both stores hand the
engine the same rows in the same order.

PostgreSQL runs when HYPOCENTER_TEST_POSTGRES_URL names a database this test may create schemas in
(`.ci/run` starts one from Debian's package and sets it); each test gets a schema of its own.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres_support import PG_URL, fresh_schema

from hypocenter.store import open_store
from hypocenter.store.base import DiagnosisFilter, Entry, Point, Retention, Store
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.sql import sql
from hypocenter.store.sqlite import SQLiteStore

T0 = 1_793_000_000_000_000_000


@pytest.fixture()
def pg_schema() -> Iterator[str]:
    yield from fresh_schema()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def open_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens (and reopens: a reconnect) one store of the parametrised kind; closes what it opened."""
    url = str(tmp_path / "store.db") if request.param == "sqlite" else request.getfixturevalue("pg_schema")
    opened: list[Store] = []

    def connect() -> Store:
        opened.append(open_store(url))
        return opened[-1]

    yield connect
    for s in opened:
        s.close()


def _entries(workload: str | None, node: str | None, stream: str, n: int, start: int = 0) -> list[Entry]:
    return [
        Entry(
            workload=workload,
            attempt=0,
            node=node,
            stream=stream,
            kind="text",
            body=f"{stream} line {i} ünïcode",
            time_ns=T0 + i * 1_000_000_000,
            line=i + 1,
            dedup=f"{workload}|{node}|{stream}|{i + 1}",
            scope={"cluster": "eos"} if workload else {},
        )
        for i in range(start, n)
    ]


def _points(workload: str | None, node: str | None, n: int) -> list[Point]:
    return [
        Point(
            workload=workload,
            attempt=0,
            node=node,
            source="metrics/dcgm.json",
            name="DCGM_FI_DEV_XID_ERRORS",
            labels={"gpu": str(i % 2), "Hostname": node or "?"},
            time_ns=T0 + i * 15_000_000_000,
            value=float(i),
        )
        for i in range(n)
    ]


def _summary(
    did: str,
    workload: str,
    outcome: str = "attributed",
    domain: str | None = "hardware",
    culprits: tuple[str, ...] = ("node02",),
) -> dict[str, Any]:
    return {
        "id": did,
        "workload": workload,
        "attempt": 0,
        "cluster": "eos",
        "outcome": outcome,
        "domain": domain,
        "subdomain": "nvlink" if domain else None,
        "terminal_state": "FAILED",
        "window_start_ns": T0,
        "window_end_ns": T0 + 3600 * 10**9,
        "culprits": list(culprits),
        "affected": ["node01", "node02"],
    }


def test_migrations_are_idempotent(open_url: Callable[[], Store]) -> None:
    first = open_url()
    assert isinstance(first, SQLiteStore)  # PostgresStore runs SQLiteStore's queries
    assert first.schema_version() == len(MIGRATIONS)
    first.close()
    again = open_url()
    assert isinstance(again, SQLiteStore)
    assert again.migrate() == len(MIGRATIONS) and again.migrate() == len(MIGRATIONS)
    versions = [r[0] for r in again._rows(sql("SELECT version FROM schema_migrations ORDER BY version"))]
    assert versions == list(range(1, len(MIGRATIONS) + 1))


def test_nothing_lost_nothing_twice(open_url: Callable[[], Store]) -> None:
    store = open_url()
    logs = _entries("81234", "node01", "logs/node01/train.log", 50) + _entries(
        None, "node02", "logs/node02/kern.log", 30
    )
    points = _points("81234", None, 8) + _points(None, "node02", 6)
    now = time.time()
    assert store.ingest(logs, points, now) == len(logs) + len(points)
    assert store.ingest(logs, points, now + 1) == 0  # an exporter retry of an acknowledged batch
    assert (
        store.ingest(logs[:10] + _entries("81234", "node01", "logs/node01/train.log", 60, 50), [], now + 2)
        == 10
    )
    row = store.attempt("81234", 0)
    assert row is not None and row.nodes == ["node01"] and row.scope == {"cluster": "eos"} and row.dirty
    assert row.first_ns == T0 and row.last_ns == T0 + 7 * 15 * 10**9  # its last metric point
    got = store.attempt_logs(row.id)
    assert [g.line for g in got] == list(range(1, 61)) and got[
        0
    ].body == "logs/node01/train.log line 0 ünïcode"
    assert len(store.node_logs(["node02"], T0, T0 + 10**9)) == 30  # the node stream joins whole
    assert store.node_logs(["node09"], T0, T0 + 10**12) == []
    assert len(store.attempt_points(row.id)) == 8 and len(store.node_points(["node02"], T0, T0 + 10**12)) == 6
    assert store.known_nodes() == ["node02"]
    stats = store.stats()
    assert (stats["attempts"], stats["log_entries"], stats["metric_points"]) == (1, 90, 14)


def test_concurrent_writers_store_once(open_url: Callable[[], Store]) -> None:
    """Two connections (two replicas, or a retry racing the original) ingest the same records."""
    a, b = open_url(), open_url()
    logs = _entries("77", "node01", "logs/node01/train.log", 200)
    counts: list[int] = []

    def write(store: Store) -> None:
        for i in range(0, len(logs), 20):
            counts.append(store.ingest(logs[i : i + 20], [], time.time()))

    threads = [threading.Thread(target=write, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(counts) == 200
    row = a.attempt("77", 0)
    assert row is not None and len(b.attempt_logs(row.id)) == 200 and b.stats()["attempts"] == 1


def test_diagnoses_survive_a_reconnect(open_url: Callable[[], Store]) -> None:
    store = open_url()
    store.ingest(_entries("81234", "node01", "s", 3) + _entries("233410", "node07", "s", 3), [], time.time())
    for workload, did, summary in (
        ("81234", "dx-a", _summary("dx-a", "81234")),
        ("233410", "dx-b", _summary("dx-b", "233410", domain="network", culprits=("node07",))),
    ):
        row = store.attempt(workload, 0)
        assert row is not None
        body = json.dumps({"id": did, "text": "ünïcode \u2192 evidence"}, ensure_ascii=False)
        store.put_diagnosis(row.id, body, summary, provisional=False, analyzed_from=time.time() + 1)
    # re-analysis replaces, never duplicates
    row = store.attempt("81234", 0)
    assert row is not None and not row.dirty
    store.put_diagnosis(
        row.id,
        '{"id": "dx-a", "v": 2}',
        _summary("dx-a", "81234"),
        provisional=False,
        analyzed_from=time.time() + 1,
    )
    store.close()
    again = open_url()
    got = again.get_diagnosis("dx-a")
    assert got is not None and got.body == '{"id": "dx-a", "v": 2}' and got.nodes == ["node02"]
    b = again.get_diagnosis("dx-b")
    assert b is not None and b.body == json.dumps(
        {"id": "dx-b", "text": "ünïcode \u2192 evidence"}, ensure_ascii=False
    )

    def ids(**kw: Any) -> list[str]:
        return [r.id for r in again.list_diagnoses(DiagnosisFilter(**kw))]

    assert sorted(ids()) == ["dx-a", "dx-b"]
    assert ids(domain="network") == ["dx-b"] and ids(node="node02") == ["dx-a"] and ids(cluster="nope") == []
    assert ids(since_ns=T0 + 7200 * 10**9) == [] and sorted(ids(until_ns=T0)) == ["dx-a", "dx-b"]
    assert again.stats()["diagnoses"] == 2


def test_diagnosis_pages_search_and_version(open_url: Callable[[], Store]) -> None:
    """The web UI's list: newest window end first, keyset pages that neither skip nor repeat a row
    (ties on the window end broken by id, windowless diagnoses last), a case-insensitive workload
    search that takes % and _ literally, a count, and a version that changes on every write."""
    store = open_url()
    workloads = [f"Job_{i:02d}" for i in range(9)] + ["job%x", "nowindow"]
    store.ingest([e for w in workloads for e in _entries(w, "node01", "s", 1)], [], time.time())
    versions = {store.diagnoses_version()}
    for i, w in enumerate(workloads):
        summary = _summary(f"dx-{w.lower()}", w)
        # three diagnoses share each window end: paging must break the tie the same way on both stores
        summary["window_end_ns"] = None if w == "nowindow" else T0 + (i // 3) * 10**9
        row = store.attempt(w, 0)
        assert row is not None
        store.put_diagnosis(row.id, "{}", summary, provisional=False, analyzed_from=time.time() + 1)
        versions.add(store.diagnoses_version())
    assert len(versions) == len(workloads) + 1
    everything = store.list_diagnoses(DiagnosisFilter(limit=1000))
    ends = [r.window_end_ns for r in everything]
    assert ends[-1] is None and ends[:-1] == sorted(ends[:-1], reverse=True)  # type: ignore[type-var]
    assert [r.id for r in everything[:3]] == sorted(r.id for r in everything[:3])
    paged: list[str] = []
    after: tuple[int | None, str] | None = None
    while True:
        page = store.list_diagnoses(DiagnosisFilter(limit=2, after=after))
        if not page:
            break
        paged += [r.id for r in page]
        after = (page[-1].window_end_ns, page[-1].id)
    assert paged == [r.id for r in everything] and len(paged) == len(workloads)
    assert store.count_diagnoses(DiagnosisFilter()) == len(workloads)

    def ids(search: str) -> list[str]:
        return sorted(r.id for r in store.list_diagnoses(DiagnosisFilter(search=search)))

    assert ids("JOB_0") == [f"dx-job_{i:02d}" for i in range(9)]
    assert ids("b_0") == [f"dx-job_{i:02d}" for i in range(9)]  # _ is a character, not a wildcard
    assert ids("%") == ["dx-job%x"] and ids("b%x") == ["dx-job%x"]  # so is %
    assert ids("nothing") == [] and store.count_diagnoses(DiagnosisFilter(search="job_0", node="node02")) == 9
    before = store.diagnoses_version()
    row = store.attempt("Job_00", 0)
    assert row is not None  # a re-analysis replaces the row: same count, new version
    store.put_diagnosis(
        row.id, "{}", _summary("dx-job_00-v2", "Job_00"), provisional=False, analyzed_from=time.time() + 1
    )
    assert store.diagnoses_version() != before and store.count_diagnoses(DiagnosisFilter()) == len(workloads)


def test_assembly_reads_the_log_rows_as_tuples(open_url: Callable[[], Store]) -> None:
    """What an attempt's assembly reads (`attempt_lines`, `node_lines`: a tuple per row) is what
    `attempt_logs` and `node_logs` hold, in their order, without the terminal-state markers: gap rows
    of streams reduced on arrival, documents, and each row's time as in or out of the range."""
    from hypocenter.engine import default_engine
    from hypocenter.server.arrival import Arrival

    store = open_url()
    chatter = [
        Entry(
            workload=None,
            attempt=0,
            node="node-b",
            stream="kern.log",
            kind="text",
            body=f"Nov  2 10:{i // 60:02d}:{i % 60:02d} node-b kernel: audit: pid={i}",
            time_ns=T0 + i * 10**9,
            line=i + 1,
            dedup=f"kern|{i}",
        )
        for i in range(300)
    ]
    reduced = Arrival(default_engine().extractor).split(store, chatter, 1000.0)
    store.ingest(reduced.rest, [], 1000.0, (), reduced.writes)
    logs = [
        *_entries("9", "node-a", "app.log", 6),
        *_entries(None, "node-b", "old.log", 3),
        Entry(
            workload="9",
            attempt=0,
            node=None,
            stream="events/x.json",
            kind="doc",
            body='{"a": 1}',
            time_ns=T0,
            line=None,
            dedup="doc",
        ),
        Entry(
            workload="9",
            attempt=0,
            node="node-a",
            stream="app.log",
            kind="state",
            body="attempt ended: FAILED",
            time_ns=T0 + 7 * 10**9,
            line=None,
            dedup="state",
            scope={"state": "FAILED"},
        ),
    ]
    store.ingest(logs, [], 1001.0)
    row = store.attempt("9", 0)
    assert row is not None
    lo, hi = T0 + 2 * 10**9, T0 + 100 * 10**9

    def expected(rows: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (
                r.node,
                r.stream,
                int(r.kind == "doc"),
                int(r.kind == "gap"),
                r.line,
                int(lo <= r.time_ns <= hi),
                r.body,
            )
            for r in rows
            if r.kind != "state"
        ]

    # unsorted: in attempt_logs' order (stream, arrival) and node_logs' (node, stream, arrival) once sorted
    got = [r[:-1] for r in sorted(store.attempt_lines(row.id, lo, hi), key=lambda r: (r[1], r[-1]))]
    assert got == expected(store.attempt_logs(row.id)) and len(got) == 7 and got[-1][2] == 1
    got = [
        r[:-1] for r in sorted(store.node_lines(["node-b"], lo, hi), key=lambda r: (r[0] or "", r[1], r[-1]))
    ]
    assert got == expected(store.node_logs(["node-b"], lo, hi))
    assert {r[1] for r in got} == {"kern.log", "old.log"} and any(
        r[3] for r in got
    )  # gaps stand for blanked lines
    assert {r[5] for r in got} == {0, 1}
    assert store.node_lines([], lo, hi) == []


def test_retention_counts_what_it_drops(open_url: Callable[[], Store]) -> None:
    store = open_url()
    store.ingest(
        _entries(None, "node02", "logs/node02/kern.log", 10) + _entries("5", "node01", "app", 4),
        [],
        time.time(),
    )
    removed = store.sweep(time.time(), Retention(max_lines_per_stream=6))
    assert removed == 4
    kept = store.node_logs(["node02"], T0, T0 + 10**12)
    assert [k.line for k in kept] == [5, 6, 7, 8, 9, 10]  # the oldest went
    row = store.attempt("5", 0)
    assert row is not None
    assert store.drops(row.id, ["node02"]) == {("node02", "logs/node02/kern.log"): 4}
    store.sweep(time.time(), Retention(max_lines_per_stream=5))
    assert store.drops(row.id, ["node02"]) == {("node02", "logs/node02/kern.log"): 5}


# ------------------------------------------------------------------------------------------ PostgreSQL only


def _columns_sqlite(path: Path) -> dict[str, list[tuple[str, bool]]]:
    with sqlite3.connect(path) as con:
        tables = [
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        ]
        return {
            t: [(c[1], bool(c[3]) or bool(c[5])) for c in con.execute(f"PRAGMA table_info({t})")]
            for t in tables
        }


@pytest.mark.postgresql
def test_postgresql_has_the_sqlite_schema(pg_schema: str, tmp_path: Path) -> None:
    import psycopg

    SQLiteStore(tmp_path / "ref.db").close()
    want = _columns_sqlite(tmp_path / "ref.db")
    store = open_store(pg_schema)
    store.close()
    # PostgresStore skips SQLiteStore.__init__: it must set every attribute that one sets (but the file's)
    reference = SQLiteStore(":memory:")
    reference.close()
    assert set(vars(reference)) - {"_db"} <= set(vars(store))
    schema = pg_schema.rsplit("%3D", 1)[1]
    have: dict[str, list[tuple[str, bool]]] = {}
    with psycopg.connect(PG_URL) as conn:
        for table, column, nullable, key in conn.execute(
            "SELECT c.table_name, c.column_name, c.is_nullable, EXISTS (SELECT 1 FROM"
            " information_schema.key_column_usage k JOIN information_schema.table_constraints tc"
            " ON tc.constraint_name = k.constraint_name AND tc.table_schema = k.table_schema"
            " WHERE tc.constraint_type = 'PRIMARY KEY' AND k.table_schema = c.table_schema"
            " AND k.table_name = c.table_name AND k.column_name = c.column_name)"
            " FROM information_schema.columns c WHERE c.table_schema = %s ORDER BY c.table_name, c.ordinal_position",
            (schema,),
        ):
            have.setdefault(table, []).append((column, nullable == "NO" or key))
    assert have == want


@pytest.mark.postgresql
def test_both_stores_hand_the_engine_the_same_rows(pg_schema: str, tmp_path: Path) -> None:
    """Order matters to byte-identical diagnoses: text sorts by bytes and NULLs first, as in SQLite."""
    sqlite, pg = open_store(str(tmp_path / "s.db")), open_store(pg_schema)
    try:
        logs = [
            *_entries(None, "node-b", "Zeta.log", 5),
            *_entries(None, "node-b", "alpha.log", 5),
            *_entries(None, "node-B", "_kern", 5),
            *_entries(None, "node-b", "Éclair", 3),
            *_entries("9", "node-b", "b", 4),
            *_entries("9", "node-a", "B", 4),
        ]
        logs.append(
            Entry(
                workload="9",
                attempt=0,
                node=None,
                stream="events/x.json",
                kind="doc",
                body='{"a": 1}',
                time_ns=T0,
                line=None,
                dedup="nul-line",
            )
        )
        logs.append(
            Entry(
                workload="9",
                attempt=0,
                node="node-a",
                stream="B",
                kind="text",
                body="nul\x00byte",
                time_ns=T0,
                line=99,
                dedup="nul-byte",
            )
        )
        points = _points(None, "node-b", 6) + _points("9", None, 6)
        for s in (sqlite, pg):
            s.ingest(logs, points, time.time())
        nodes = ["node-B", "node-b"]
        a, b = sqlite.attempt("9", 0), pg.attempt("9", 0)
        assert a is not None and b is not None and a.nodes == b.nodes
        for name, read in (
            ("node_logs", lambda s, r: s.node_logs(nodes, T0, T0 + 10**12)),
            ("attempt_logs", lambda s, r: s.attempt_logs(r.id)),
            ("attempt_points", lambda s, r: s.attempt_points(r.id)),
            ("node_points", lambda s, r: s.node_points(nodes, T0, T0 + 10**12)),
        ):
            want, have = read(sqlite, a), read(pg, b)
            if name == "attempt_logs":  # PostgreSQL text holds no NUL: it is stored as U+FFFD
                want = [
                    w
                    if "\x00" not in w.body
                    else type(w)(
                        w.node, w.stream, w.kind, w.line, w.time_ns, w.body.replace("\x00", "\ufffd")
                    )
                    for w in want
                ]
            assert have == want, name
        assert sorted(sqlite.known_nodes()) == sorted(pg.known_nodes())
    finally:
        sqlite.close()
        pg.close()


def test_compaction_blanks_text_but_keeps_rows_and_retries_idempotent(open_url: Callable[[], Store]) -> None:
    store = open_url()
    rows = _entries("9", "node01", "train.log", 50)
    store.ingest(rows, [], now=1000.0, stalls=[("9", 0, T0 + 5)])
    assert store.compaction_due(cutoff=999.0, limit=10) == []  # nothing old enough yet
    (key,) = store.compaction_due(cutoff=1001.0, limit=10)
    lines = store.stream_lines(key)
    assert [x.line for x in lines] == list(range(1, 51))
    store.compact([x.id for x in lines[:40]], [x.id for x in lines[40:]])
    assert store.compaction_due(cutoff=1001.0, limit=10) == []
    after = store.stream_lines(key)
    assert [x.body for x in after[:40]] == [""] * 40 and all(x.compacted == 2 for x in after[:40])
    assert [x.body for x in after[40:]] == [r.body for r in rows[40:]]
    assert store.ingest(rows, [], now=2000.0) == 0  # a late retry of a blanked line is still a duplicate
    row = store.attempt("9", 0)
    assert row is not None and len(store.attempt_logs(row.id)) == 50
    # the stall makes the attempt due after the settle time, with no terminal state and no idle timeout
    assert [a.workload for a in store.attempts_due(now=2000.5, settle_s=0.1, idle_s=10**6)] == ["9"]


def test_blanked_runs_merge_into_one_row_that_keeps_the_count(open_url: Callable[[], Store]) -> None:
    store = open_url()
    store.ingest(_entries(None, "node01", "kern.log", 30), [], now=1000.0)
    (key,) = store.compaction_due(cutoff=1001.0, limit=10)
    lines = store.stream_lines(key)
    # lines 1-10 and 21-30 blanked, 11-20 kept as evidence: two runs around them
    store.compact([x.id for x in lines[:10] + lines[20:]], [x.id for x in lines[10:20]])
    assert store.collapse_due(cutoff=1000.5, limit=10) == [key]
    tomb = store.stream_tombstones(key)
    assert len(tomb) == 20
    by_line = {x.line: x.id for x in tomb}
    store.collapse(
        [
            (by_line[10], 10, [by_line[i] for i in range(1, 10)]),
            (by_line[30], 10, [by_line[i] for i in range(21, 30)]),
        ]
    )
    assert store.collapse_due(cutoff=1000.5, limit=10) == []
    rows = store.node_logs(["node01"], T0, T0 + 10**12)
    assert [(r.kind, r.line) for r in rows if r.kind == "gap"] == [("gap", 10), ("gap", 30)]
    assert sum(int(r.body) if r.kind == "gap" else 1 for r in rows) == 30
    assert len(store.stream_lines(key, live_only=True)) == 10


def test_revisions_in_both_stores(open_url: Callable[[], Store]) -> None:
    store = open_url()
    store.set_context(
        "81234", 0, {"workload": {"id": "81234"}}, time.time(), {"source": "put", "client": "x"}
    )
    row = store.attempt("81234", 0)
    assert row is not None and row.scope_provenance == {"source": "put", "client": "x"}
    revs = [
        store.put_diagnosis(
            row.id,
            json.dumps({"id": "dx", "v": v}),
            _summary("dx", "81234"),
            False,
            time.time() + 1,
            {"source": src},
        )
        for v, src in ((1, "otlp"), (1, "bundle"), (2, "bundle"))
    ]
    assert revs == [1, 1, 2]
    got = store.get_diagnosis("dx")
    assert got is not None and got.revision == 2 and got.provenance == {"source": "bundle"}
    history = open_url().diagnosis_revisions("dx")  # another connection: committed
    assert [(r.revision, r.provenance["source"], json.loads(r.body)["v"]) for r in history] == [
        (1, "otlp", 1),
        (2, "bundle", 2),
    ]


def test_streams_reduced_on_arrival_keep_their_lines_and_drop_retries(open_url: Callable[[], Store]) -> None:
    """Extraction on arrival (server/arrival.py) over both stores: a 20,000-line node stream sent in
    batches keeps a few rows, not one per line; rebuilt from them it has every line number and the
    events of the whole stream; a retried batch is dropped by record number; a rotated file (line 1
    again, another text) is a new generation."""
    from bench.throughput import _CANDIDATES
    from hypocenter.engine import default_engine
    from hypocenter.lineformat import time_context
    from hypocenter.model import AttemptContext
    from hypocenter.server.arrival import Arrival
    from hypocenter.server.attempts import _generations, _text
    from hypocenter.sources import TextSource

    store = open_url()
    engine = default_engine()
    arrival = Arrival(engine.extractor)
    lines = [
        f"Nov  2 10:{i // 600 % 60:02d}:{i // 10 % 60:02d} n1 kernel: audit: type=1400 pid={i}"
        if i % 3 == 0
        else f"n1:1:2 [0] NCCL INFO Channel {i % 32:02d}/0 : 3[0] -> 4[0] [send] via NET/IB/0"
        for i in range(20_000)
    ]
    lines[12_345] = _CANDIDATES[0].format(m=20, s=30)
    entries = [
        Entry(
            workload=None,
            attempt=0,
            node="n1",
            stream="n1:/var/log/kern.log",
            kind="text",
            body=b,
            time_ns=T0 + i * 1_000_000,
            line=i + 1,
            dedup=f"n1|{i + 1}|{b}",
        )
        for i, b in enumerate(lines)
    ]
    batches = [entries[i : i + 5000] for i in range(0, 20_000, 5000)]
    for batch in [*batches, batches[1]]:  # the last one: a collector's retry of the second
        reduced = arrival.split(store, batch, 2000.0)
        store.ingest(reduced.rest, [], 2000.0, (), reduced.writes)
    rows = sorted(store.node_lines(["n1"], T0, T0 + 10**12), key=lambda r: r[-1])  # in arrival order
    assert 0 < len(rows) < 0.02 * len(lines), len(rows)
    text, count = _text(rows)
    assert count == len(lines) and text.count("\n") == len(lines)
    rebuilt = text.split("\n")[:-1]
    assert rebuilt[12_345] == lines[12_345]
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": "w"},
            "nodes": ["n1"],
            "window": {"start": "2026-11-02T00:00:00Z", "end": "2026-11-03T00:00:00Z"},
        }
    )
    tctx = time_context(ctx)
    whole = engine.extractor.extract(
        [TextSource("kern.log", "\n".join(lines) + "\n", node="n1")], ctx, tctx
    ).events
    again = engine.extractor.extract([TextSource("kern.log", text, node="n1")], ctx, tctx).events
    assert whole and [e.model_dump() for e in again] == [e.model_dump() for e in whole]
    state = store.arrival_state(None, 0, "n1", "n1:/var/log/kern.log")
    assert state.ranges == [(1, 20_000)] and state.lines == 20_000

    # logrotate: the file starts again at line 1 with new lines
    rotated = [
        Entry(
            workload=None,
            attempt=0,
            node="n1",
            stream="n1:/var/log/kern.log",
            kind="text",
            body=f"Nov  2 11:00:{i:02d} n1 kernel: after rotation {i}",
            time_ns=T0 + 10**11 + i,
            line=i + 1,
            dedup=f"n1|rotated|{i + 1}",
        )
        for i in range(50)
    ]
    reduced = arrival.split(store, rotated, 2100.0)
    store.ingest(reduced.rest, [], 2100.0, (), reduced.writes)
    generations = _generations(
        {("n1", "kern.log", "text"): sorted(store.node_lines(["n1"], T0, T0 + 10**12), key=lambda r: r[-1])}
    )
    assert sorted(s for _, s, _ in generations) == ["kern.log", "kern.log.1"]
    assert _text(generations[("n1", "kern.log", "text")])[1] == 50
    assert _text(generations[("n1", "kern.log.1", "text")])[1] == len(lines)
