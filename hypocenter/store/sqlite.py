"""The store: what the server accepted, the attempts it knows, and the diagnoses it made.

    Store (protocol)       what the server needs
    SQLiteStore(path)      the embedded default: one file, WAL, versioned migrations.
                           `SQLiteStore(":memory:")` is the in-memory double for tests.
    PostgresStore(url)     store/postgres.py: these same queries and migrations on PostgreSQL,
                           for replicas that share one database (`open_store("postgresql://…")`)

Every statement is written once, for both, with store/sql.py: `sql("… ? …")` (or a statement
composed with its constructs, e.g. `json_text`), SQL that SQLite 3.30+ and PostgreSQL both take.

Tables (migration 1): `attempts` (scope per workload attempt), `attempt_nodes`, `log_entries`
(accepted log records: workload-scoped ones carry `attempt_id`; node-scoped ones only `node`, and
are joined to attempts by node and time when an attempt is analysed), `metric_points` (likewise),
`stream_drops` (lines removed by retention, reported in coverage), `diagnoses` (+ `diagnosis_nodes`).
Migration 7: `diagnosis_revisions`, every verdict each attempt had with its provenance (the
`diagnoses` row is the current one, its `revision` and `provenance` beside it).
Migration 3: `exports`, the outbox: one row per diagnosis and configured exporter (Loki, Grafana),
written in the diagnosis' own transaction and deleted once delivered (exporter/outbox.py).

Durability: `ingest` commits before it returns, and the server acknowledges a request only after
that, so an acknowledged record survives a crash (SIGKILL, power loss with `synchronous=FULL`).
Records are idempotent: an exporter retry of an acknowledged batch is stored once (`dedup` key).

The store knows nothing about the engine or OTLP wire formats: it keeps tagged rows and JSON.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypocenter.store.base import (
    ArrivalState,
    ArrivalWrite,
    AttemptRow,
    DiagnosisFacts,
    DiagnosisFilter,
    DiagnosisRow,
    Entry,
    FleetMark,
    LogLine,
    LogRow,
    PendingExport,
    Point,
    PointRow,
    Retention,
    RevisionRow,
    StoreError,
    StreamConflict,
    StreamKey,
    StreamLine,
    log_lines,
)
from hypocenter.store.coordination import REPLICA_LEASE, Coordination
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.sql import json_text, placeholders, sql


def _node_streams(n: int) -> str:
    """The join that picks the node streams of `n` nodes (placeholders: the nodes, start, end, the
    nodes, end, start) an attempt's window reaches. A node stream joins whole (what retention kept of
    it) when any of its records falls in the range: its earlier lines carry the boot stamps that
    anchor uptime-only kernel lines, and the engine itself tells old faults from the attempt's."""
    in_nodes = placeholders(n)
    return (
        f" JOIN (SELECT DISTINCT node, stream FROM log_entries WHERE attempt_id IS NULL AND node IN ({in_nodes})"
        "  AND time_ns BETWEEN ? AND ?"
        # a stream reduced on arrival may have no row left in the range: its recorded times tell
        f"  UNION SELECT node, stream FROM stream_state WHERE workload = '' AND node IN ({in_nodes})"
        "  AND first_ns <= ? AND last_ns >= ?) s ON e.node = s.node AND e.stream = s.stream"
    )


BATCH_MEMORY_S = (
    3600.0  # how long a group's digest is kept (stream_batches): its retries are dropped meanwhile
)
# base.LogLine's columns of `log_entries e` (placeholders: the range's start and end), and the rows it reads
_LOG_LINE = (
    "e.node, e.stream, CASE WHEN e.kind = 'doc' THEN 1 ELSE 0 END, CASE WHEN e.kind = 'gap' THEN 1 ELSE 0 END,"
    " e.line, CASE WHEN e.time_ns BETWEEN ? AND ? THEN 1 ELSE 0 END, e.body, e.id"
)
_ASSEMBLED = " AND e.kind IN ('text', 'gap', 'doc')"


class SQLiteStore(Coordination):
    """The embedded store. One connection behind a lock: SQLite has one writer at a time anyway."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise StoreError(f"{self.path}: directory {parent} does not exist")
        if sqlite3.sqlite_version_info < (3, 30):  # NULLS FIRST / LAST (store/sql.py)
            raise StoreError(
                f"{self.path}: the store needs SQLite 3.30 or newer; this Python has {sqlite3.sqlite_version}"
            )
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the store: {exc}") from None
        self._lock = threading.RLock()
        # Exporters each new diagnosis is queued for, in its own transaction (set by the server).
        self.exporters: tuple[str, ...] = ()
        self._db.row_factory = sqlite3.Row
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self.migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"{self.path}: not a usable hypocenter store: {exc}") from None

    # ----------------------------------------------------------------------------------- plumbing

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, statement: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(statement, args).fetchall())

    def _tuples(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:
        """Rows as plain tuples (sqlite3.Row costs an object per row where tens of thousands are read)."""
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            return cur.execute(statement, args).fetchall()

    def migrate(self) -> int:
        """Apply the migrations this file does not have yet; returns the schema version."""
        with self._tx() as db:
            db.execute(
                sql(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied REAL NOT NULL)"
                )
            )
            have = db.execute(sql("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")).fetchone()[0]
            if have > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path}: schema version {have} is newer than this hypocenter "
                    f"knows ({len(MIGRATIONS)}): upgrade hypocenter"
                )
            for version in range(have + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1].sqlite:
                    db.execute(statement)
                db.execute(sql("INSERT INTO schema_migrations VALUES (?, ?)"), (version, time.time()))
        return len(MIGRATIONS)

    def schema_version(self) -> int:
        return int(self._rows(sql("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))[0][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----------------------------------------------------------------------------------- ingest

    def _attempt_id(self, db: sqlite3.Connection, workload: str, attempt: int, now: float) -> int:
        row = db.execute(
            sql("SELECT id FROM attempts WHERE workload=? AND attempt=?"), (workload, attempt)
        ).fetchone()
        if row is not None:
            return int(row[0])
        cur = db.execute(
            sql("INSERT INTO attempts (workload, attempt, activity) VALUES (?, ?, ?)"),
            (workload, attempt, now),
        )
        return int(cur.lastrowid or 0)

    def arrival_state(
        self,
        workload: str | None,
        attempt: int,
        node: str | None,
        stream: str,
        from_line: int = 0,
        *,
        tail: int | None = None,
        digests: Sequence[str] = (),
    ) -> ArrivalState:
        """The stream's state with its rows from record number `from_line` on — or, with `tail`, from
        `tail` lines before its next record number — and which of `digests` it has stored."""
        key = (workload or "", attempt, node or "", stream)
        rows = self._rows(
            sql("SELECT * FROM stream_state WHERE workload=? AND attempt=? AND node=? AND stream=?"), key
        )
        if not rows:
            return ArrivalState()
        r = rows[0]
        state = ArrivalState(
            version=r["version"],
            generation=r["generation"],
            since_id=r["since_id"],
            head=r["head"],
            ranges=[(lo, hi) for lo, hi in json.loads(r["ranges"])],
            lines=r["lines"],
            bytes=r["bytes"],
        )
        if digests:
            state.batches = {
                x[0]
                for x in self._tuples(
                    sql(
                        "SELECT digest FROM stream_batches WHERE workload=? AND attempt=? AND node=? AND stream=?"
                        f" AND digest IN ({placeholders(len(digests))})"
                    ),
                    (*key, *digests),
                )
            }
        if tail is not None:
            from_line = (state.ranges[-1][1] if state.ranges else 0) + 1 - tail
        aid = None
        if workload is not None:
            found = self._rows(
                sql("SELECT id FROM attempts WHERE workload=? AND attempt=?"), (workload, attempt)
            )
            if not found:
                return state
            aid = int(found[0][0])
        where = [
            "stream = ?",
            "id > ?",
            "line >= ?",
            "attempt_id IS NULL" if aid is None else "attempt_id = ?",
            "node IS NULL" if node is None else "node = ?",
        ]
        args: list[Any] = [
            stream,
            state.since_id,
            from_line,
            *([] if aid is None else [aid]),
            *([] if node is None else [node]),
        ]
        state.rows = [
            StreamLine(x["id"], x["line"], x["body"], x["received"], x["compacted"])
            for x in self._rows(
                sql(
                    f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)}"
                    " AND line IS NOT NULL ORDER BY line, id"
                ),
                args,
            )
        ]
        return state

    def _arrive(self, db: sqlite3.Connection, w: ArrivalWrite, aid: int | None, now: float) -> int:
        """Apply one stream's `ArrivalWrite` inside the ingest transaction; returns the lines it stored.

        The write was computed from the stream's state as read before the transaction (the reduction
        runs outside it: no lock is held while it computes), so it applies only if that state is
        still the stored one: the state row's `version` is checked and bumped first, which also
        takes the row's lock (PostgreSQL) before any of the stream's rows is touched; SQLite's
        BEGIN IMMEDIATE already makes the transaction the only writer. Otherwise `StreamConflict`
        rolls the whole batch back, to be reduced again. Last writer wins would drop the other's
        ranges and gap rows; a merge that commutes does not exist for the gap rows (which lines a
        batch keeps depends on its neighbours), and locking before reducing would hold the lock
        (for SQLite: every writer of the file) for the whole reduction."""
        st = w.state
        key = (w.workload or "", w.attempt, w.node or "", w.stream)
        if not (w.entries or w.block or w.rotate or w.inserts or w.updates or w.deletes or w.digests):
            # a retry of stored records: nothing to write, as long as the state read is still the stored one
            row = db.execute(
                sql(
                    "SELECT version FROM stream_state WHERE workload=? AND attempt=? AND node=? AND stream=?"
                ),
                key,
            ).fetchone()
            if (row[0] if row is not None else 0) != w.version:
                raise StreamConflict(
                    f"stream {w.stream!r} of node {w.node!r} changed while its batch was reduced"
                )
            return w.records()
        values = (
            st.generation,
            st.since_id,
            st.head,
            json.dumps(st.ranges, separators=(",", ":")),
            st.lines,
            st.bytes,
        )
        if w.version == 0:
            cur = db.execute(
                sql(
                    "INSERT INTO stream_state (workload, attempt, node, stream, version, generation, since_id, head,"
                    " ranges, lines, bytes, first_ns, last_ns) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (workload, attempt, node, stream) DO NOTHING"
                ),
                (*key, *values, w.first_ns, w.last_ns),
            )
        else:
            cur = db.execute(
                sql(
                    "UPDATE stream_state SET version=version+1, generation=?, since_id=?, head=?, ranges=?, lines=?,"
                    " bytes=?, first_ns=CASE WHEN first_ns IS NULL OR ? < first_ns THEN ? ELSE first_ns END,"
                    " last_ns=CASE WHEN last_ns IS NULL OR ? > last_ns THEN ? ELSE last_ns END"
                    " WHERE workload=? AND attempt=? AND node=? AND stream=? AND version=?"
                ),
                (*values, w.first_ns, w.first_ns, w.last_ns, w.last_ns, *key, w.version),
            )
        if cur.rowcount != 1:
            raise StreamConflict(
                f"stream {w.stream!r} of node {w.node!r} changed while its batch was reduced"
            )
        if w.rotate:
            since = int(db.execute(sql("SELECT COALESCE(MAX(id), 0) FROM log_entries")).fetchone()[0])
            db.execute(
                sql(
                    "UPDATE stream_state SET since_id=? WHERE workload=? AND attempt=? AND node=? AND stream=?"
                ),
                (since, *key),
            )
        if w.digests:
            db.executemany(
                sql(
                    "INSERT INTO stream_batches (workload, attempt, node, stream, digest, received)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                ),
                [(*key, d, now) for d in w.digests],
            )
        for i in range(0, len(w.deletes), 500):
            part = w.deletes[i : i + 500]
            db.execute(sql(f"DELETE FROM log_entries WHERE id IN ({placeholders(len(part))})"), part)
        if w.updates:
            db.executemany(
                sql("UPDATE log_entries SET kind=?, body=?, compacted=? WHERE id=?"),
                [(kind, body, compacted, rid) for rid, kind, body, compacted in w.updates],
            )
        if w.inserts:
            self._insert_entries(
                db,
                [
                    (aid, e.node, e.stream, kind, e.line, e.time_ns, body, now, e.dedup, compacted)
                    for e, kind, body, compacted in w.inserts
                ],
            )
        return w.records()

    def _insert_entries(self, db: Any, rows: list[tuple[Any, ...]]) -> None:
        """Insert log_entries rows (attempt_id, node, stream, kind, line, time_ns, body, received, dedup,
        compacted), in order, skipping a dedup key already stored (PostgresStore: one statement)."""
        db.executemany(
            sql(
                "INSERT INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup,"
                " compacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
            ),
            rows,
        )

    def ingest(
        self,
        logs: Sequence[Entry],
        points: Sequence[Point],
        now: float,
        stalls: Sequence[tuple[str, int, int]] = (),
        arrivals: Sequence[ArrivalWrite] = (),
    ) -> int:
        """Store what is new in one transaction; returns how many rows were new (retries are not).
        `stalls`: (workload, attempt, time) of watchdog / heartbeat timeouts found in these records.
        `arrivals`: record-numbered text streams already reduced to their evidence (server/arrival.py)."""
        new = 0
        with self._tx() as db:
            ids: dict[tuple[str, int], int] = {}
            touched: dict[int, tuple[int | None, int | None, int | None, dict[str, str], set[str]]] = {}
            node_times: dict[str, tuple[int, int]] = {}

            def attempt_of(workload: str | None, attempt: int) -> int | None:
                if workload is None:
                    return None
                key = (workload, attempt)
                if key not in ids:
                    ids[key] = self._attempt_id(db, workload, attempt, now)
                return ids[key]

            def touch(
                aid: int | None, node: str | None, t: int, scope: dict[str, str], terminal: bool
            ) -> None:
                if aid is None:
                    if node is not None and t:
                        lo, hi = node_times.get(node, (t, t))
                        node_times[node] = (min(lo, t), max(hi, t))
                    return
                alo, ahi, term, sc, nodes = touched.get(aid, (None, None, None, {}, set()))
                if t:
                    alo = t if alo is None else min(alo, t)
                    ahi = t if ahi is None else max(ahi, t)
                if terminal:
                    term = t or int(now * 1e9)
                sc.update(scope)
                if node is not None:
                    nodes.add(node)
                touched[aid] = (alo, ahi, term, sc, nodes)

            # Rows are locked in one order by every writer (attempts, then streams, each sorted), so two
            # replicas' batches wait for each other instead of deadlocking.
            for key in sorted(
                {(e.workload, e.attempt) for e in logs if e.workload is not None}
                | {(w.workload, w.attempt) for w in arrivals if w.workload is not None}
                | {(p.workload, p.attempt) for p in points if p.workload is not None}
            ):
                attempt_of(*key)
            arrivals = sorted(arrivals, key=lambda w: (w.workload or "", w.attempt, w.node or "", w.stream))
            rows = []
            for e in logs:
                aid = attempt_of(e.workload, e.attempt)
                rows.append((aid, e.node, e.stream, e.kind, e.line, e.time_ns, e.body, now, e.dedup))
                touch(aid, e.node, e.time_ns, e.scope, "state" in e.scope or "banner_state" in e.scope)
            for w in arrivals:
                aid = attempt_of(w.workload, w.attempt)
                new += self._arrive(db, w, aid, now)
                for t, scope, terminal in w.touches():
                    touch(aid, w.node, t, scope, terminal)
            if rows:
                cur = db.executemany(
                    sql(
                        "INSERT INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    rows,
                )
                new += max(0, cur.rowcount)
            for p in points:
                aid = attempt_of(p.workload, p.attempt)
                labels = json.dumps(p.labels, sort_keys=True, separators=(",", ":"))
                dedup = f"{aid}\x1f{p.node}\x1f{p.source}\x1f{p.name}\x1f{labels}\x1f{p.time_ns}"
                cur = db.execute(
                    sql(
                        "INSERT INTO metric_points (attempt_id, node, source, name, labels, time_ns, value, received, dedup)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    (aid, p.node, p.source, p.name, labels, p.time_ns, p.value, now, dedup),
                )
                new += cur.rowcount
                touch(
                    aid, None if aid is not None else p.node, p.time_ns, p.scope, False
                )  # metric labels name no attempt node
            for aid, (lo, hi, term, sc, nodes) in sorted(touched.items(), key=lambda t: t[0]):
                row = db.execute(
                    sql("SELECT scope, first_ns, last_ns, terminal_ns FROM attempts WHERE id=?"), (aid,)
                ).fetchone()
                scope = json.loads(row["scope"])
                scope.update(sc)
                first = (
                    min(x for x in (row["first_ns"], lo) if x is not None)
                    if (row["first_ns"] or lo)
                    else None
                )
                last = (
                    max(x for x in (row["last_ns"], hi) if x is not None) if (row["last_ns"] or hi) else None
                )
                db.execute(
                    sql(
                        "UPDATE attempts SET scope=?, first_ns=?, last_ns=?, terminal_ns=COALESCE(?, terminal_ns),"
                        " activity=?, dirty=1 WHERE id=?"
                    ),
                    (json.dumps(scope, sort_keys=True), first, last, term, now, aid),
                )
                db.executemany(
                    sql("INSERT INTO attempt_nodes VALUES (?, ?) ON CONFLICT DO NOTHING"),
                    [(aid, n) for n in sorted(nodes)],
                )
            for workload, attempt, t in stalls:
                aid = attempt_of(workload, attempt)
                db.execute(sql("UPDATE attempts SET stalled_ns=COALESCE(stalled_ns, ?) WHERE id=?"), (t, aid))
            for node, (lo, hi) in node_times.items():
                # Late node-scoped data re-opens the attempts that ran on that node at that time.
                db.execute(
                    sql(
                        "UPDATE attempts SET dirty=1, activity=? WHERE id IN (SELECT attempt_id FROM attempt_nodes WHERE node=?)"
                        " AND analyzed_at IS NOT NULL AND COALESCE(first_ns, 0) <= ? + 3600000000000"
                        " AND COALESCE(last_ns, ?) >= ? - 3600000000000"
                    ),
                    (now, node, hi, hi, lo),
                )
        return new

    def set_context(
        self,
        workload: str,
        attempt: int,
        context: dict[str, Any],
        now: float,
        provenance: dict[str, Any] | None = None,
    ) -> None:
        """Pin an attempt's scope (an uploaded attempt.yaml, validated by the caller), and who set it."""
        with self._tx() as db:
            aid = self._attempt_id(db, workload, attempt, now)
            db.execute(
                sql("UPDATE attempts SET context=?, activity=?, dirty=1, scope_provenance=? WHERE id=?"),
                (
                    json.dumps(context, sort_keys=True, default=str),
                    now,
                    json.dumps(provenance, sort_keys=True) if provenance else None,
                    aid,
                ),
            )

    # ----------------------------------------------------------------------------------- attempts

    def _attempt_row(self, row: sqlite3.Row) -> AttemptRow:
        nodes = [
            r[0]
            for r in self._rows(
                sql("SELECT node FROM attempt_nodes WHERE attempt_id=? ORDER BY node"), (row["id"],)
            )
        ]
        return AttemptRow(
            id=row["id"],
            workload=row["workload"],
            attempt=row["attempt"],
            scope=json.loads(row["scope"]),
            context=json.loads(row["context"]) if row["context"] else None,
            nodes=nodes,
            first_ns=row["first_ns"],
            last_ns=row["last_ns"],
            terminal_ns=row["terminal_ns"],
            activity=row["activity"],
            dirty=bool(row["dirty"]),
            analyzed_at=row["analyzed_at"],
            scope_provenance=json.loads(row["scope_provenance"]) if row["scope_provenance"] else None,
            failure=row["failure"],
            failed_at=row["failed_at"],
        )

    def attempt(self, workload: str, attempt: int) -> AttemptRow | None:
        rows = self._rows(sql("SELECT * FROM attempts WHERE workload=? AND attempt=?"), (workload, attempt))
        return self._attempt_row(rows[0]) if rows else None

    def attempts_due(self, now: float, settle_s: float, idle_s: float) -> list[AttemptRow]:
        """Dirty attempts that ended `settle_s` ago, that reported a watchdog / heartbeat timeout and
        then went quiet for `settle_s` (a hang: provisional), or that have been quiet for `idle_s`."""
        rows = self._rows(
            sql(
                "SELECT * FROM attempts WHERE dirty=1 AND ((terminal_ns IS NOT NULL OR context IS NOT NULL"
                " OR stalled_ns IS NOT NULL) AND activity <= ? OR activity <= ?) ORDER BY activity, id"
            ),
            (now - settle_s, now - idle_s),
        )
        return [self._attempt_row(r) for r in rows]

    def attempt_logs(self, attempt_id: int) -> list[LogRow]:
        return [
            LogRow(*r)
            for r in self._rows(
                sql(
                    "SELECT node, stream, kind, line, time_ns, body FROM log_entries WHERE attempt_id=? ORDER BY stream, id"
                ),
                (attempt_id,),
            )
        ]

    def node_logs(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[LogRow]:
        if not nodes:
            return []
        return [
            LogRow(*r)
            for r in self._rows(
                sql(
                    "SELECT e.node, e.stream, e.kind, e.line, e.time_ns, e.body FROM log_entries e",
                    _node_streams(len(nodes)),
                    " WHERE e.attempt_id IS NULL ORDER BY e.node, e.stream, e.id",
                ),
                (*nodes, start_ns, end_ns, *nodes, end_ns, start_ns),
            )
        ]

    def attempt_lines(self, attempt_id: int, start_ns: int, end_ns: int) -> list[LogLine]:
        """The rows of `attempt_logs` as the assembly reads them (base.LogLine: unsorted)."""
        return log_lines(
            self._tuples(
                sql("SELECT ", _LOG_LINE, " FROM log_entries e WHERE e.attempt_id=?", _ASSEMBLED),
                (start_ns, end_ns, attempt_id),
            )
        )

    def node_lines(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[LogLine]:
        """The rows of `node_logs` as the assembly reads them (base.LogLine: unsorted)."""
        if not nodes:
            return []
        return log_lines(
            self._tuples(
                sql(
                    "SELECT ",
                    _LOG_LINE,
                    " FROM log_entries e",
                    _node_streams(len(nodes)),
                    " WHERE e.attempt_id IS NULL",
                    _ASSEMBLED,
                ),
                (start_ns, end_ns, *nodes, start_ns, end_ns, *nodes, end_ns, start_ns),
            )
        )

    def attempt_points(self, attempt_id: int) -> list[PointRow]:
        return [
            self._point(r)
            for r in self._rows(
                sql("SELECT * FROM metric_points WHERE attempt_id=? ORDER BY source, name, labels, time_ns"),
                (attempt_id,),
            )
        ]

    def node_points(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[PointRow]:
        if not nodes:
            return []
        in_nodes = placeholders(len(nodes))
        return [
            self._point(r)
            for r in self._rows(
                sql(
                    f"SELECT * FROM metric_points WHERE attempt_id IS NULL AND node IN ({in_nodes}) AND time_ns BETWEEN ? AND ?"
                    " ORDER BY source, name, labels, time_ns"
                ),
                (*nodes, start_ns, end_ns),
            )
        ]

    @staticmethod
    def _point(r: sqlite3.Row) -> PointRow:
        return PointRow(r["node"], r["source"], r["name"], json.loads(r["labels"]), r["time_ns"], r["value"])

    def known_nodes(self) -> list[str]:
        """Nodes that have node-scoped data (for matching FQDNs and aliases to an attempt's names)."""
        return [
            r[0]
            for r in self._rows(
                sql(
                    "SELECT DISTINCT node FROM log_entries WHERE attempt_id IS NULL AND node IS NOT NULL"
                    " UNION SELECT DISTINCT node FROM metric_points WHERE attempt_id IS NULL AND node IS NOT NULL"
                )
            )
        ]

    def drops(self, attempt_id: int, nodes: Sequence[str]) -> dict[tuple[str, str], int]:
        in_nodes = placeholders(len(nodes)) if nodes else "''"
        return {
            (r["node"], r["stream"]): r["dropped"]
            for r in self._rows(
                sql(
                    f"SELECT node, stream, dropped FROM stream_drops WHERE scope=? OR (scope='' AND node IN ({in_nodes}))"
                ),
                (str(attempt_id), *nodes),
            )
        }

    # ----------------------------------------------------------------------------------- compaction

    def compaction_due(self, cutoff: float, limit: int) -> list[StreamKey]:
        """Text streams with lines received before `cutoff` that compaction has not looked at."""
        return [
            StreamKey(r["attempt_id"], r["node"], r["stream"])
            for r in self._rows(
                sql(
                    "SELECT DISTINCT attempt_id, node, stream FROM log_entries WHERE compacted = 0 AND kind = 'text'"
                    " AND received < ? ORDER BY attempt_id NULLS FIRST, node NULLS FIRST, stream LIMIT ?"
                ),
                (cutoff, limit),
            )
        ]

    def stream_lines(self, key: StreamKey, *, live_only: bool = False) -> list[StreamLine]:
        """A text stream's rows in arrival order; `live_only`: without the blanked ones (tombstones)."""
        where = [
            "stream = ?",
            "kind = 'text'",
            "attempt_id IS NULL" if key.attempt_id is None else "attempt_id = ?",
            "node IS NULL" if key.node is None else "node = ?",
        ]
        args: list[Any] = [
            key.stream,
            *([] if key.attempt_id is None else [key.attempt_id]),
            *([] if key.node is None else [key.node]),
        ]
        if live_only:
            where.append("compacted < 2")
        return [
            StreamLine(r["id"], r["line"], r["body"], r["received"], r["compacted"])
            for r in self._rows(
                sql(
                    f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)} ORDER BY id"
                ),
                args,
            )
        ]

    def compact(self, blank: Sequence[int], keep: Sequence[int]) -> None:
        """Blank the text of lines no extraction can read (the row stays: its line number, time and
        dedup key keep line references, coverage counts and retries exact) and mark the rest kept."""
        with self._tx() as db:
            for i in range(0, len(blank), 500):
                part = blank[i : i + 500]
                db.execute(
                    sql(
                        f"UPDATE log_entries SET body = '', compacted = 2 WHERE id IN ({placeholders(len(part))})"
                    ),
                    part,
                )
            for i in range(0, len(keep), 500):
                part = keep[i : i + 500]
                db.execute(
                    sql(f"UPDATE log_entries SET compacted = 1 WHERE id IN ({placeholders(len(part))})"), part
                )

    def collapse_due(self, cutoff: float, limit: int) -> list[StreamKey]:
        """Streams with lines blanked before `cutoff` not yet merged into gap rows."""
        return [
            StreamKey(r["attempt_id"], r["node"], r["stream"])
            for r in self._rows(
                sql(
                    "SELECT DISTINCT attempt_id, node, stream FROM log_entries WHERE compacted = 2 AND received < ?"
                    " AND line IS NOT NULL"
                    " ORDER BY attempt_id NULLS FIRST, node NULLS FIRST, stream LIMIT ?"
                ),
                (cutoff, limit),
            )
        ]

    def stream_tombstones(self, key: StreamKey) -> list[StreamLine]:
        """A stream's blanked lines and gap rows (compacted 2 and 3), arrival order."""
        where = [
            "stream = ?",
            "compacted >= 2",
            "attempt_id IS NULL" if key.attempt_id is None else "attempt_id = ?",
            "node IS NULL" if key.node is None else "node = ?",
        ]
        args: list[Any] = [
            key.stream,
            *([] if key.attempt_id is None else [key.attempt_id]),
            *([] if key.node is None else [key.node]),
        ]
        return [
            StreamLine(r["id"], r["line"], r["body"], r["received"], r["compacted"])
            for r in self._rows(
                sql(
                    f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)} ORDER BY id"
                ),
                args,
            )
        ]

    def collapse(self, runs: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        """Each run (row kept, lines it stands for, rows merged into it): the kept row becomes the run's
        gap row, the others go."""
        with self._tx() as db:
            for keep, lines, drop in runs:
                db.execute(
                    sql("UPDATE log_entries SET kind = 'gap', body = ?, compacted = 3 WHERE id = ?"),
                    (str(lines), keep),
                )
                for i in range(0, len(drop), 500):
                    part = list(drop[i : i + 500])
                    db.execute(sql(f"DELETE FROM log_entries WHERE id IN ({placeholders(len(part))})"), part)

    # ----------------------------------------------------------------------------------- diagnoses

    def put_diagnosis(
        self,
        attempt_id: int,
        body: str,
        summary: dict[str, Any],
        provisional: bool,
        analyzed_from: float,
        provenance: dict[str, Any] | None = None,
        claim: str | None = None,
    ) -> int | None:
        """Store the attempt's current diagnosis and clear its dirty flag unless data arrived after
        `analyzed_from` (the wall time the analysis read the store). A verdict that differs from the
        attempt's last one is kept as a new revision with its `provenance`; the same verdict again
        keeps the revision (and provenance) it had. The very same diagnosis again (same body, same
        provisional flag: another replica, or a repeated trigger, analysed the same data) changes
        nothing and is not exported twice. Returns the revision now current. `claim`: the analysis
        was claimed by this holder at `analyzed_from` (`claim_analysis`); when that claim is no longer
        its own (the replica was paused past its lease and another took the attempt back) nothing is
        stored and None is returned."""
        prov = json.dumps(provenance or {"source": "unknown"}, sort_keys=True)
        with self._tx() as db:
            # Lock the attempt's row first (PostgreSQL: replicas analysing one attempt at once queue
            # here, and the second then sees the first's diagnosis; SQLite has one writer anyway).
            if claim is None:
                db.execute(sql("UPDATE attempts SET analyzed_at=analyzed_at WHERE id=?"), (attempt_id,))
            elif (
                db.execute(
                    sql(
                        "UPDATE attempts SET analyzed_at=analyzed_at WHERE id=? AND analysing_by=?"
                        " AND analysing_since=?"
                    ),
                    (attempt_id, claim, analyzed_from),
                ).rowcount
                != 1
            ):
                return None
            last = db.execute(
                sql(
                    "SELECT revision, body, provenance FROM diagnosis_revisions WHERE workload=? AND attempt=?"
                    " ORDER BY revision DESC LIMIT 1"
                ),
                (summary["workload"], summary["attempt"]),
            ).fetchone()
            if last is not None and last["body"] == body:
                revision, prov = int(last["revision"]), last["provenance"]
            else:
                revision = 1 if last is None else int(last["revision"]) + 1
                db.execute(
                    sql(
                        "INSERT INTO diagnosis_revisions (workload, attempt, revision, diagnosis_id, outcome, domain,"
                        " subdomain, provisional, created, provenance, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    ),
                    (
                        summary["workload"],
                        summary["attempt"],
                        revision,
                        summary["id"],
                        summary["outcome"],
                        summary.get("domain"),
                        summary.get("subdomain"),
                        int(provisional),
                        time.time(),
                        prov,
                        body,
                    ),
                )
            prev = db.execute(
                sql("SELECT body, provisional FROM diagnoses WHERE attempt_id=? AND id=?"),
                (attempt_id, summary["id"]),
            ).fetchone()
            if prev is None or prev[0] != body or bool(prev[1]) != provisional:
                self._replace_diagnosis(db, attempt_id, body, summary, provisional, revision, prov)
            db.execute(
                sql(
                    "UPDATE attempts SET analyzed_at=?, dirty=CASE WHEN activity > ? THEN 1 ELSE 0 END,"
                    " failure=NULL, failed_at=NULL, analysing_since=NULL, interrupted=0 WHERE id=?"
                ),
                (time.time(), analyzed_from, attempt_id),
            )
        return revision

    # ----------------------------------------------------------------------------------- quarantine

    def mark_analysing(
        self, attempt_id: int, since: float | None, claim: tuple[str, float] | None = None
    ) -> None:
        """Mark the attempt as being analysed since `since` (committed), so that a process that dies in
        the analysis is noticed at the next start; None clears the mark. With `claim` (holder, since:
        `claim_analysis`), only while that claim is still the attempt's: a replica whose claim was
        taken back and given to another clears nothing of the other's."""
        with self._tx() as db:
            if claim is None:
                db.execute(sql("UPDATE attempts SET analysing_since=? WHERE id=?"), (since, attempt_id))
            else:
                db.execute(
                    sql(
                        "UPDATE attempts SET analysing_since=? WHERE id=? AND analysing_by=? AND analysing_since=?"
                    ),
                    (since, attempt_id, *claim),
                )

    def fail_analysis(
        self, attempt_id: int, reason: str, now: float, analyzed_from: float, holder: str | None = None
    ) -> None:
        """Record why the analysis failed; the attempt is not due again unless data arrived after
        `analyzed_from` (the wall time the analysis read the store). With `holder`, only while the
        attempt is still claimed by it from `analyzed_from` (`claim_analysis`)."""
        claimed = "" if holder is None else " AND analysing_by=? AND analysing_since=?"
        with self._tx() as db:
            db.execute(
                sql(
                    "UPDATE attempts SET failure=?, failed_at=?, analysing_since=NULL, interrupted=0,"
                    f" dirty=CASE WHEN activity > ? THEN 1 ELSE 0 END WHERE id=?{claimed}"
                ),
                (
                    reason,
                    now,
                    analyzed_from,
                    attempt_id,
                    *(() if holder is None else (holder, analyzed_from)),
                ),
            )

    def recover_interrupted(
        self, now: float, quarantine_after: int, live_replicas: bool = False
    ) -> list[AttemptRow]:
        """At start: attempts whose analysis a previous process died in. Each is counted; one that
        has now been interrupted `quarantine_after` times in a row is failed (not due) with the
        reason. Returns the attempts quarantined now. `live_replicas` (a shared store): only the
        analyses of replicas that no longer hold their lease (store/coordination.py) were interrupted."""
        with self._tx() as db:
            db.execute(
                sql(
                    "UPDATE attempts SET interrupted=interrupted+1, analysing_since=NULL"
                    " WHERE analysing_since IS NOT NULL AND (? = 0 OR analysing_by IS NULL OR NOT EXISTS"
                    " (SELECT 1 FROM leases WHERE leases.name = ? || attempts.analysing_by AND leases.expires > ?))"
                ),
                (int(live_replicas), REPLICA_LEASE, now),
            )
            ids = [
                r[0]
                for r in db.execute(
                    sql("SELECT id FROM attempts WHERE interrupted >= ? AND failure IS NULL"),
                    (quarantine_after,),
                ).fetchall()
            ]
            for aid in ids:
                db.execute(
                    sql("UPDATE attempts SET failure=?, failed_at=?, dirty=0, interrupted=0 WHERE id=?"),
                    (
                        f"the server stopped during the analysis of this attempt {quarantine_after} times in a "
                        "row (out of memory or killed): not analysed again until new data arrives or it is "
                        "asked for",
                        now,
                        aid,
                    ),
                )
        return [
            self._attempt_row(r)
            for aid in ids
            for r in self._rows(sql("SELECT * FROM attempts WHERE id=?"), (aid,))
        ]

    def failed_attempts(self, limit: int) -> list[AttemptRow]:
        """Attempts whose last analysis failed, newest failure first."""
        return [
            self._attempt_row(r)
            for r in self._rows(
                sql(
                    "SELECT * FROM attempts WHERE failure IS NOT NULL ORDER BY failed_at DESC NULLS LAST, id LIMIT ?"
                ),
                (limit,),
            )
        ]

    def _replace_diagnosis(
        self,
        db: Any,
        attempt_id: int,
        body: str,
        summary: dict[str, Any],
        provisional: bool,
        revision: int,
        prov: str,
    ) -> None:
        db.execute(sql("DELETE FROM diagnoses WHERE attempt_id=? OR id=?"), (attempt_id, summary["id"]))
        db.execute(
            sql(
                "INSERT INTO diagnoses (id, attempt_id, workload, attempt, cluster, outcome, domain, subdomain,"
                " terminal_state, provisional, window_start_ns, window_end_ns, created, body, revision, provenance)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            (
                summary["id"],
                attempt_id,
                summary["workload"],
                summary["attempt"],
                summary.get("cluster"),
                summary["outcome"],
                summary.get("domain"),
                summary.get("subdomain"),
                summary.get("terminal_state"),
                int(provisional),
                summary.get("window_start_ns"),
                summary.get("window_end_ns"),
                time.time(),
                body,
                revision,
                prov,
            ),
        )
        _insert_marks(db, summary["id"], summary.get("marks", []))
        db.executemany(
            sql("INSERT INTO diagnosis_nodes VALUES (?, ?, ?) ON CONFLICT DO NOTHING"),
            [(summary["id"], n, "culprit") for n in summary.get("culprits", [])]
            + [(summary["id"], n, "affected") for n in summary.get("affected", [])],
        )
        now = time.time()  # the outbox: a changed diagnosis is sent again, afresh
        db.executemany(
            sql(
                "INSERT INTO exports (diagnosis_id, exporter, created, due) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (diagnosis_id, exporter) DO UPDATE SET created=excluded.created,"
                " due=excluded.due, attempts=0, last_error=NULL"
            ),
            [(summary["id"], name, now, now) for name in self.exporters],
        )

    def _diag(self, r: sqlite3.Row) -> DiagnosisRow:
        nodes = [
            x[0]
            for x in self._rows(
                sql("SELECT node FROM diagnosis_nodes WHERE diagnosis_id=? AND role='culprit' ORDER BY node"),
                (r["id"],),
            )
        ]
        return DiagnosisRow(
            id=r["id"],
            workload=r["workload"],
            attempt=r["attempt"],
            cluster=r["cluster"],
            outcome=r["outcome"],
            domain=r["domain"],
            subdomain=r["subdomain"],
            provisional=bool(r["provisional"]),
            created=r["created"],
            body=r["body"],
            nodes=nodes,
            window_start_ns=r["window_start_ns"],
            window_end_ns=r["window_end_ns"],
            revision=int(r["revision"]),
            provenance=json.loads(r["provenance"]) if r["provenance"] else None,
        )

    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRow | None:
        rows = self._rows(sql("SELECT * FROM diagnoses WHERE id=?"), (diagnosis_id,))
        return self._diag(rows[0]) if rows else None

    def diagnosis_revisions(self, diagnosis_id: str) -> list[RevisionRow]:
        """Every revision of the attempt a diagnosis id (current or superseded) belongs to, oldest first."""
        owner = self._rows(
            sql(
                "SELECT workload, attempt FROM diagnosis_revisions WHERE diagnosis_id=?"
                " ORDER BY revision DESC LIMIT 1"
            ),
            (diagnosis_id,),
        )
        if not owner:
            return []
        return [
            RevisionRow(
                revision=int(r["revision"]),
                diagnosis_id=r["diagnosis_id"],
                workload=r["workload"],
                attempt=int(r["attempt"]),
                outcome=r["outcome"],
                domain=r["domain"],
                subdomain=r["subdomain"],
                provisional=bool(r["provisional"]),
                created=r["created"],
                provenance=json.loads(r["provenance"]),
                body=r["body"],
            )
            for r in self._rows(
                sql("SELECT * FROM diagnosis_revisions WHERE workload=? AND attempt=? ORDER BY revision"),
                (owner[0]["workload"], owner[0]["attempt"]),
            )
        ]

    def list_diagnoses(self, flt: DiagnosisFilter) -> list[DiagnosisRow]:
        """Newest window end first, then by id; `flt.after` continues a page where the last one ended."""
        where, args = self._diagnosis_where(flt)
        if flt.after is not None:
            end, last = flt.after
            if end is None:  # NULL windows sort last
                where.append("(window_end_ns IS NULL AND id > ?)")
                args.append(last)
            else:
                where.append("(window_end_ns < ? OR (window_end_ns = ? AND id > ?) OR window_end_ns IS NULL)")
                args.extend((end, end, last))
        # NULL windows last, as SQLite orders a descending column by itself
        statement = sql(
            "SELECT * FROM diagnoses"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY window_end_ns DESC NULLS LAST, id LIMIT ?"
        )
        args.append(max(1, min(flt.limit, 1000)))
        return [self._diag(r) for r in self._rows(statement, args)]

    def count_diagnoses(self, flt: DiagnosisFilter) -> int:
        """How many diagnoses match the filter (paging and `limit` aside)."""
        where, args = self._diagnosis_where(flt)
        statement = sql("SELECT COUNT(*) FROM diagnoses" + (" WHERE " + " AND ".join(where) if where else ""))
        return int(self._rows(statement, args)[0][0])

    def diagnoses_version(self) -> str:
        """Changes whenever a diagnosis is stored, replaced or removed: an ETag for diagnosis lists."""
        r = self._rows(sql("SELECT COUNT(*), MAX(created) FROM diagnoses"))[0]
        return f"{int(r[0])}-{float(r[1] or 0):.6f}"

    @staticmethod
    def _diagnosis_where(flt: DiagnosisFilter) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        for column, value in (
            ("cluster", flt.cluster),
            ("outcome", flt.outcome),
            ("domain", flt.domain),
            ("workload", flt.workload),
        ):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        if flt.search:
            # LIKE with the pattern's own wildcards escaped; lower() on both sides because SQLite's
            # LIKE ignores ASCII case and PostgreSQL's does not
            pattern = flt.search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append("lower(workload) LIKE lower(?) ESCAPE '\\'")
            args.append(f"%{pattern}%")
        if flt.node is not None:
            where.append("id IN (SELECT diagnosis_id FROM diagnosis_nodes WHERE node=? AND role='culprit')")
            args.append(flt.node)
        if flt.since_ns is not None:
            where.append("COALESCE(window_end_ns, 0) >= ?")
            args.append(flt.since_ns)
        if flt.until_ns is not None:
            where.append("COALESCE(window_start_ns, 0) <= ?")
            args.append(flt.until_ns)
        return where, args

    def fleet_marks(self, since_s: float) -> list[FleetMark]:
        """The marks of final diagnoses whose failure happened at or after `since_s`, oldest first."""
        return [
            FleetMark(
                diagnosis_id=r["diagnosis_id"],
                workload=r["workload"],
                attempt=int(r["attempt"]),
                cluster=r["cluster"],
                time_s=float(r["time_s"]),
                role=r["role"],
                kind=r["kind"],
                node=r["node"],
                component=r["component"],
                domain=r["domain"],
                subdomain=r["subdomain"],
                rule=r["rule"],
                detail=r["detail"],
            )
            for r in self._rows(
                sql(
                    "SELECT m.* FROM fleet_marks m JOIN diagnoses d ON d.id = m.diagnosis_id"
                    " WHERE d.provisional=0 AND m.time_s >= ?"
                    " ORDER BY m.time_s, m.diagnosis_id, m.role, m.kind, m.node, m.component,"
                    " m.rule, m.detail"
                ),
                (since_s,),
            )
        ]

    def fleet_pending(self, limit: int) -> list[tuple[str, str]]:
        """(id, body) of diagnoses stored before fleet memory existed, not marked yet (migration 11)."""
        return [
            (r[0], r[1])
            for r in self._rows(
                sql(
                    "SELECT d.id, d.body FROM fleet_pending p JOIN diagnoses d"
                    " ON d.id = p.diagnosis_id ORDER BY d.id LIMIT ?"
                ),
                (limit,),
            )
        ]

    def put_fleet_marks(self, diagnosis_id: str, marks: Sequence[FleetMark]) -> None:
        """The marks of a diagnosis stored before fleet memory; it leaves the pending list."""
        with self._tx() as db:
            _insert_marks(db, diagnosis_id, marks)
            db.execute(sql("DELETE FROM fleet_pending WHERE diagnosis_id=?"), (diagnosis_id,))

    # ----------------------------------------------------------------------------------- retention

    def sweep(self, now: float, retention: Retention) -> int:
        """Apply retention; returns rows removed. Lines cut from a stream are counted for coverage."""
        removed = 0
        with self._tx() as db:
            cutoff = now - retention.max_age_s
            removed += db.execute(sql("DELETE FROM log_entries WHERE received < ?"), (cutoff,)).rowcount
            removed += db.execute(sql("DELETE FROM metric_points WHERE received < ?"), (cutoff,)).rowcount
            # a retry comes within minutes (exporters give up after 5); a group's digest is kept an hour
            db.execute(
                sql("DELETE FROM stream_batches WHERE received < ?"),
                (now - min(BATCH_MEMORY_S, retention.max_age_s),),
            )
            over = db.execute(
                sql(
                    "SELECT COALESCE(CAST(attempt_id AS TEXT), '') AS scope, COALESCE(node, '') AS node, stream, COUNT(*) AS n"
                    " FROM log_entries GROUP BY attempt_id, node, stream HAVING COUNT(*) > ?"
                ),
                (retention.max_lines_per_stream,),
            ).fetchall()
            for r in over:
                extra = r["n"] - retention.max_lines_per_stream
                scope_sql = "attempt_id IS NULL" if r["scope"] == "" else "attempt_id = ?"
                scope_args: tuple[Any, ...] = () if r["scope"] == "" else (int(r["scope"]),)
                ids = db.execute(
                    sql(
                        f"SELECT id FROM log_entries WHERE {scope_sql} AND COALESCE(node, '') = ? AND stream = ?"
                        " ORDER BY time_ns, line NULLS FIRST, id LIMIT ?"
                    ),
                    (*scope_args, r["node"], r["stream"], extra),
                ).fetchall()
                db.executemany(sql("DELETE FROM log_entries WHERE id=?"), [(i[0],) for i in ids])
                db.execute(
                    sql(
                        "INSERT INTO stream_drops VALUES (?, ?, ?, ?) ON CONFLICT (scope, node, stream)"
                        " DO UPDATE SET dropped = stream_drops.dropped + excluded.dropped"
                    ),
                    (str(r["scope"]), r["node"], r["stream"], len(ids)),
                )
                removed += len(ids)
            removed += db.execute(
                sql("DELETE FROM diagnoses WHERE created < ?"), (now - retention.diagnoses_max_age_s,)
            ).rowcount
            removed += db.execute(
                sql("DELETE FROM diagnosis_revisions WHERE created < ?"),
                (now - retention.diagnoses_max_age_s,),
            ).rowcount
            removed += db.execute(
                sql(
                    "DELETE FROM attempts WHERE activity < ? AND id NOT IN (SELECT attempt_id FROM diagnoses"
                    " WHERE attempt_id IS NOT NULL)"
                ),
                (cutoff,),
            ).rowcount
            # A stream's state outlives its lines only as long as something may still come for it: an
            # attempt's streams go with the attempt, a node's stream once retention took all its lines.
            removed += db.execute(
                sql(
                    "DELETE FROM stream_state WHERE (workload <> '' AND NOT EXISTS (SELECT 1 FROM attempts a"
                    " WHERE a.workload = stream_state.workload AND a.attempt = stream_state.attempt))"
                    " OR (workload = '' AND NOT EXISTS (SELECT 1 FROM log_entries e WHERE e.stream ="
                    " stream_state.stream AND COALESCE(e.node, '') = stream_state.node AND e.attempt_id IS NULL))"
                )
            ).rowcount
        return removed

    def ping(self) -> None:
        """One trivial query: raises (`StoreUnavailable` from PostgreSQL) when the store cannot answer."""
        self._rows(sql("SELECT 1"))

    def stats(self) -> dict[str, int]:
        """Counts over whole tables (a SUM over every log row): read them through store/stats.py."""
        out: dict[str, int] = {}
        for table in ("attempts", "log_entries", "metric_points", "diagnoses"):
            out[table] = int(self._rows(sql(f"SELECT COUNT(*) FROM {table}"))[0][0])
        # log records held: a gap row stands for the run of lines it replaced (server/arrival.py)
        out["log_rows"] = out["log_entries"]
        out["log_entries"] = int(
            self._rows(
                sql(
                    "SELECT COALESCE(SUM(CASE WHEN kind = 'gap' THEN CAST(body AS INTEGER) ELSE 1 END), 0) FROM log_entries"
                )
            )[0][0]
        )
        # awaiting a verdict: never analysed, or data arrived since the last analysis
        out["attempts_open"] = int(
            self._rows(sql("SELECT COUNT(*) FROM attempts WHERE dirty=1 OR analyzed_at IS NULL"))[0][0]
        )
        out["attempts_failed"] = int(
            self._rows(sql("SELECT COUNT(*) FROM attempts WHERE failure IS NOT NULL"))[0][0]
        )
        return out

    # ----------------------------------------------------------------------------------- outbox

    def claim_exports(self, exporter: str, now: float, limit: int, lease_s: float) -> list[PendingExport]:
        """The oldest due rows of one exporter, leased for `lease_s` so another replica skips them."""
        with self._tx() as db:
            rows = db.execute(
                sql("SELECT * FROM exports WHERE exporter=? AND due<=? ORDER BY created, id LIMIT ?"),
                (exporter, now, limit),
            ).fetchall()
            # Conditional, row by row: in PostgreSQL another replica may have selected the same rows; its
            # update waits for ours, then finds `due` in the future and takes nothing (no double delivery).
            rows = [
                r
                for r in rows
                if db.execute(
                    sql("UPDATE exports SET due=? WHERE id=? AND due<=?"), (now + lease_s, r["id"], now)
                ).rowcount
                == 1
            ]
        return [
            PendingExport(
                id=r["id"],
                exporter=r["exporter"],
                diagnosis_id=r["diagnosis_id"],
                created=r["created"],
                attempts=r["attempts"],
                diagnosis=self.get_diagnosis(r["diagnosis_id"]),
            )
            for r in rows
        ]

    def finish_exports(self, ids: Sequence[int]) -> None:
        """Delivered, or given up on: the rows leave the outbox."""
        with self._tx() as db:
            db.executemany(sql("DELETE FROM exports WHERE id=?"), [(i,) for i in ids])

    def retry_exports(self, ids: Sequence[int], due: float, error: str) -> None:
        with self._tx() as db:
            db.executemany(
                sql("UPDATE exports SET due=?, attempts=attempts+1, last_error=? WHERE id=?"),
                [(due, error[:500], i) for i in ids],
            )

    def export_backlog(self) -> dict[str, tuple[int, float]]:
        """Per exporter: rows waiting, and the time the oldest of them was stored."""
        return {
            r[0]: (int(r[1]), float(r[2]))
            for r in self._rows(sql("SELECT exporter, COUNT(*), MIN(created) FROM exports GROUP BY exporter"))
        }

    def diagnosis_facts(self, since: float) -> list[DiagnosisFacts]:
        """Final diagnoses stored since `since`, with their culprit nodes and root-cause components."""
        culprits: dict[str, list[str]] = {}
        for r in self._rows(
            sql(
                "SELECT n.diagnosis_id, n.node FROM diagnosis_nodes n JOIN diagnoses d ON d.id = n.diagnosis_id"
                " WHERE n.role='culprit' AND d.created >= ? AND d.provisional=0 ORDER BY n.node"
            ),
            (since,),
        ):
            culprits.setdefault(r[0], []).append(r[1])
        out: list[DiagnosisFacts] = []
        for r in self._rows(
            sql(
                "SELECT id, cluster, outcome, domain, subdomain, ",
                json_text("body", "root_cause", "components"),
                " AS components FROM diagnoses WHERE created >= ? AND provisional=0 ORDER BY id",
            ),
            (since,),
        ):
            comps = json.loads(r["components"]) if r["components"] else []
            out.append(
                DiagnosisFacts(
                    id=r["id"],
                    cluster=r["cluster"],
                    outcome=r["outcome"],
                    domain=r["domain"],
                    subdomain=r["subdomain"],
                    culprits=culprits.get(r["id"], []),
                    components=[(str(c.get("node")), str(c.get("kind")), str(c.get("id"))) for c in comps],
                )
            )
        return out


def _insert_marks(db: Any, diagnosis_id: str, marks: Sequence[FleetMark]) -> None:
    db.executemany(
        sql("INSERT INTO fleet_marks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
        [
            (
                diagnosis_id,
                m.workload,
                m.attempt,
                m.cluster,
                m.time_s,
                m.role,
                m.kind,
                m.node,
                m.component,
                m.domain,
                m.subdomain,
                m.rule,
                m.detail,
            )
            for m in marks
        ],
    )
