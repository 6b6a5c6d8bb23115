"""The store: what the server accepted, the attempts it knows, and the diagnoses it made.

    Store (protocol)       what the server needs
    SQLiteStore(path)      the embedded default: one file, WAL, versioned migrations.
                           `SQLiteStore(":memory:")` is the in-memory double for tests.
    PostgresStore(url)     store/postgres.py: these same queries and migrations on PostgreSQL,
                           for replicas that share one database (`open_store("postgresql://…")`)

Tables (migration 1): `attempts` (scope per workload attempt), `attempt_nodes`, `log_entries`
(accepted log records: workload-scoped ones carry `attempt_id`; node-scoped ones only `node`, and
are joined to attempts by node and time when an attempt is analysed), `metric_points` (likewise),
`stream_drops` (lines removed by retention, reported in coverage), `diagnoses` (+ `diagnosis_nodes`).
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
    LogRow,
    PendingExport,
    Point,
    PointRow,
    Retention,
    StoreError,
    StreamKey,
    StreamLine,
)
from hypocenter.store.migrations import MIGRATIONS


class SQLiteStore:
    """The embedded store. One connection behind a lock: SQLite has one writer at a time anyway."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise StoreError(f"{self.path}: directory {parent} does not exist")
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

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def migrate(self) -> int:
        """Apply the migrations this file does not have yet; returns the schema version."""
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied REAL NOT NULL)")
            have = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
            if have > len(MIGRATIONS):
                raise StoreError(f"{self.path}: schema version {have} is newer than this hypocenter "
                                 f"knows ({len(MIGRATIONS)}): upgrade hypocenter")
            for version in range(have + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
        return len(MIGRATIONS)

    def schema_version(self) -> int:
        return int(self._rows("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----------------------------------------------------------------------------------- ingest

    def _attempt_id(self, db: sqlite3.Connection, workload: str, attempt: int, now: float) -> int:
        row = db.execute("SELECT id FROM attempts WHERE workload=? AND attempt=?", (workload, attempt)).fetchone()
        if row is not None:
            return int(row[0])
        cur = db.execute("INSERT INTO attempts (workload, attempt, activity) VALUES (?, ?, ?)", (workload, attempt, now))
        return int(cur.lastrowid or 0)

    def arrival_state(self, workload: str | None, attempt: int, node: str | None, stream: str,
                      from_line: int = 0) -> ArrivalState:
        rows = self._rows("SELECT * FROM stream_state WHERE workload=? AND attempt=? AND node=? AND stream=?",
                          (workload or "", attempt, node or "", stream))
        if not rows:
            return ArrivalState()
        r = rows[0]
        state = ArrivalState(generation=r["generation"], since_id=r["since_id"], head=r["head"],
                             ranges=[(lo, hi) for lo, hi in json.loads(r["ranges"])], lines=r["lines"], bytes=r["bytes"])
        aid = None
        if workload is not None:
            found = self._rows("SELECT id FROM attempts WHERE workload=? AND attempt=?", (workload, attempt))
            if not found:
                return state
            aid = int(found[0][0])
        where = ["stream = ?", "id > ?", "line >= ?", "attempt_id IS NULL" if aid is None else "attempt_id = ?",
                 "node IS NULL" if node is None else "node = ?"]
        args: list[Any] = [stream, state.since_id, from_line, *([] if aid is None else [aid]),
                           *([] if node is None else [node])]
        state.rows = [StreamLine(x["id"], x["line"], x["body"], x["received"], x["compacted"]) for x in self._rows(
            f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)}"
            " AND line IS NOT NULL ORDER BY line, id", args)]
        return state

    def _arrive(self, db: sqlite3.Connection, w: ArrivalWrite, aid: int | None, now: float) -> int:
        """Apply one stream's `ArrivalWrite` inside the ingest transaction; returns the lines it stored."""
        since = w.state.since_id
        if w.rotate:
            since = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM log_entries").fetchone()[0])
        for i in range(0, len(w.deletes), 500):
            part = w.deletes[i:i + 500]
            db.execute(f"DELETE FROM log_entries WHERE id IN ({','.join('?' * len(part))})", part)
        if w.updates:
            db.executemany("UPDATE log_entries SET kind=?, body=?, compacted=? WHERE id=?",
                           [(kind, body, compacted, rid) for rid, kind, body, compacted in w.updates])
        if w.inserts:
            db.executemany(
                "INSERT OR IGNORE INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup,"
                " compacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(aid, e.node, e.stream, kind, e.line, e.time_ns, body, now, e.dedup, compacted)
                 for e, kind, body, compacted in w.inserts])
        st = w.state
        db.execute(
            "INSERT INTO stream_state (workload, attempt, node, stream, generation, since_id, head, ranges, lines, bytes,"
            " first_ns, last_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (workload, attempt, node, stream) DO UPDATE SET generation=excluded.generation,"
            " since_id=excluded.since_id, head=excluded.head, ranges=excluded.ranges, lines=excluded.lines,"
            " bytes=excluded.bytes, first_ns=CASE WHEN stream_state.first_ns IS NULL OR excluded.first_ns < stream_state.first_ns"
            " THEN excluded.first_ns ELSE stream_state.first_ns END, last_ns=CASE WHEN stream_state.last_ns IS NULL"
            " OR excluded.last_ns > stream_state.last_ns THEN excluded.last_ns ELSE stream_state.last_ns END",
            (w.workload or "", w.attempt, w.node or "", w.stream, st.generation, since, st.head,
             json.dumps(st.ranges, separators=(",", ":")), st.lines, st.bytes, w.first_ns, w.last_ns))
        return len(w.entries)

    def ingest(self, logs: Sequence[Entry], points: Sequence[Point], now: float,
               stalls: Sequence[tuple[str, int, int]] = (), arrivals: Sequence[ArrivalWrite] = ()) -> int:
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

            def touch(aid: int | None, node: str | None, t: int, scope: dict[str, str], terminal: bool) -> None:
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

            rows = []
            for e in logs:
                aid = attempt_of(e.workload, e.attempt)
                rows.append((aid, e.node, e.stream, e.kind, e.line, e.time_ns, e.body, now, e.dedup))
                touch(aid, e.node, e.time_ns, e.scope, "state" in e.scope or "banner_state" in e.scope)
            for w in arrivals:
                aid = attempt_of(w.workload, w.attempt)
                new += self._arrive(db, w, aid, now)
                for e in w.entries:
                    touch(aid, e.node, e.time_ns, e.scope, "state" in e.scope or "banner_state" in e.scope)
            if rows:
                cur = db.executemany(
                    "INSERT OR IGNORE INTO log_entries (attempt_id, node, stream, kind, line, time_ns, body, received, dedup)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
                new += max(0, cur.rowcount)
            for p in points:
                aid = attempt_of(p.workload, p.attempt)
                labels = json.dumps(p.labels, sort_keys=True, separators=(",", ":"))
                dedup = f"{aid}\x1f{p.node}\x1f{p.source}\x1f{p.name}\x1f{labels}\x1f{p.time_ns}"
                cur = db.execute(
                    "INSERT OR IGNORE INTO metric_points (attempt_id, node, source, name, labels, time_ns, value, received, dedup)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (aid, p.node, p.source, p.name, labels, p.time_ns, p.value, now, dedup))
                new += cur.rowcount
                touch(aid, None if aid is not None else p.node, p.time_ns, p.scope, False)  # metric labels name no attempt node
            for aid, (lo, hi, term, sc, nodes) in touched.items():
                row = db.execute("SELECT scope, first_ns, last_ns, terminal_ns FROM attempts WHERE id=?", (aid,)).fetchone()
                scope = json.loads(row["scope"])
                scope.update(sc)
                first = min(x for x in (row["first_ns"], lo) if x is not None) if (row["first_ns"] or lo) else None
                last = max(x for x in (row["last_ns"], hi) if x is not None) if (row["last_ns"] or hi) else None
                db.execute("UPDATE attempts SET scope=?, first_ns=?, last_ns=?, terminal_ns=COALESCE(?, terminal_ns),"
                           " activity=?, dirty=1 WHERE id=?",
                           (json.dumps(scope, sort_keys=True), first, last, term, now, aid))
                db.executemany("INSERT OR IGNORE INTO attempt_nodes VALUES (?, ?)", [(aid, n) for n in sorted(nodes)])
            for workload, attempt, t in stalls:
                aid = attempt_of(workload, attempt)
                db.execute("UPDATE attempts SET stalled_ns=COALESCE(stalled_ns, ?) WHERE id=?", (t, aid))
            for node, (lo, hi) in node_times.items():
                # Late node-scoped data re-opens the attempts that ran on that node at that time.
                db.execute(
                    "UPDATE attempts SET dirty=1, activity=? WHERE id IN (SELECT attempt_id FROM attempt_nodes WHERE node=?)"
                    " AND analyzed_at IS NOT NULL AND COALESCE(first_ns, 0) <= ? + 3600000000000"
                    " AND COALESCE(last_ns, ?) >= ? - 3600000000000",
                    (now, node, hi, hi, lo))
        return new

    def set_context(self, workload: str, attempt: int, context: dict[str, Any], now: float) -> None:
        """Pin an attempt's scope (an uploaded attempt.yaml, validated by the caller)."""
        with self._tx() as db:
            aid = self._attempt_id(db, workload, attempt, now)
            db.execute("UPDATE attempts SET context=?, activity=?, dirty=1 WHERE id=?",
                       (json.dumps(context, sort_keys=True, default=str), now, aid))

    # ----------------------------------------------------------------------------------- attempts

    def _attempt_row(self, row: sqlite3.Row) -> AttemptRow:
        nodes = [r[0] for r in self._rows("SELECT node FROM attempt_nodes WHERE attempt_id=? ORDER BY node", (row["id"],))]
        return AttemptRow(id=row["id"], workload=row["workload"], attempt=row["attempt"], scope=json.loads(row["scope"]),
                          context=json.loads(row["context"]) if row["context"] else None, nodes=nodes,
                          first_ns=row["first_ns"], last_ns=row["last_ns"], terminal_ns=row["terminal_ns"],
                          activity=row["activity"], dirty=bool(row["dirty"]), analyzed_at=row["analyzed_at"])

    def attempt(self, workload: str, attempt: int) -> AttemptRow | None:
        rows = self._rows("SELECT * FROM attempts WHERE workload=? AND attempt=?", (workload, attempt))
        return self._attempt_row(rows[0]) if rows else None

    def attempts_due(self, now: float, settle_s: float, idle_s: float) -> list[AttemptRow]:
        """Dirty attempts that ended `settle_s` ago, that reported a watchdog / heartbeat timeout and
        then went quiet for `settle_s` (a hang: provisional), or that have been quiet for `idle_s`."""
        rows = self._rows(
            "SELECT * FROM attempts WHERE dirty=1 AND ((terminal_ns IS NOT NULL OR context IS NOT NULL"
            " OR stalled_ns IS NOT NULL) AND activity <= ? OR activity <= ?) ORDER BY activity, id",
            (now - settle_s, now - idle_s))
        return [self._attempt_row(r) for r in rows]

    def attempt_logs(self, attempt_id: int) -> list[LogRow]:
        return [LogRow(r["node"], r["stream"], r["kind"], r["line"], r["time_ns"], r["body"]) for r in self._rows(
            "SELECT node, stream, kind, line, time_ns, body FROM log_entries WHERE attempt_id=? ORDER BY stream, id",
            (attempt_id,))]

    def node_logs(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[LogRow]:
        if not nodes:
            return []
        # A node stream joins whole (what retention kept of it) when any of its records falls in the
        # range: its earlier lines carry the boot stamps that anchor uptime-only kernel lines, and
        # the engine itself tells old faults from the attempt's.
        marks = ",".join("?" * len(nodes))
        return [LogRow(r["node"], r["stream"], r["kind"], r["line"], r["time_ns"], r["body"]) for r in self._rows(
            f"SELECT e.node, e.stream, e.kind, e.line, e.time_ns, e.body FROM log_entries e JOIN ("
            f"  SELECT DISTINCT node, stream FROM log_entries WHERE attempt_id IS NULL AND node IN ({marks})"
            f"  AND time_ns BETWEEN ? AND ?"
            # a stream reduced on arrival may have no row left in the range: its recorded times tell
            f"  UNION SELECT node, stream FROM stream_state WHERE workload = '' AND node IN ({marks})"
            f"  AND first_ns <= ? AND last_ns >= ?) s ON e.node = s.node AND e.stream = s.stream"
            f" WHERE e.attempt_id IS NULL ORDER BY e.node, e.stream, e.id",
            (*nodes, start_ns, end_ns, *nodes, end_ns, start_ns))]

    def attempt_points(self, attempt_id: int) -> list[PointRow]:
        return [self._point(r) for r in self._rows(
            "SELECT * FROM metric_points WHERE attempt_id=? ORDER BY source, name, labels, time_ns", (attempt_id,))]

    def node_points(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[PointRow]:
        if not nodes:
            return []
        marks = ",".join("?" * len(nodes))
        return [self._point(r) for r in self._rows(
            f"SELECT * FROM metric_points WHERE attempt_id IS NULL AND node IN ({marks}) AND time_ns BETWEEN ? AND ?"
            " ORDER BY source, name, labels, time_ns", (*nodes, start_ns, end_ns))]

    @staticmethod
    def _point(r: sqlite3.Row) -> PointRow:
        return PointRow(r["node"], r["source"], r["name"], json.loads(r["labels"]), r["time_ns"], r["value"])

    def known_nodes(self) -> list[str]:
        """Nodes that have node-scoped data (for matching FQDNs and aliases to an attempt's names)."""
        return [r[0] for r in self._rows(
            "SELECT DISTINCT node FROM log_entries WHERE attempt_id IS NULL AND node IS NOT NULL"
            " UNION SELECT DISTINCT node FROM metric_points WHERE attempt_id IS NULL AND node IS NOT NULL")]

    def drops(self, attempt_id: int, nodes: Sequence[str]) -> dict[tuple[str, str], int]:
        marks = ",".join("?" * len(nodes)) or "''"
        return {(r["node"], r["stream"]): r["dropped"] for r in self._rows(
            f"SELECT node, stream, dropped FROM stream_drops WHERE scope=? OR (scope='' AND node IN ({marks}))",
            (str(attempt_id), *nodes))}

    # ----------------------------------------------------------------------------------- compaction

    def compaction_due(self, cutoff: float, limit: int) -> list[StreamKey]:
        """Text streams with lines received before `cutoff` that compaction has not looked at."""
        return [StreamKey(r["attempt_id"], r["node"], r["stream"]) for r in self._rows(
            "SELECT DISTINCT attempt_id, node, stream FROM log_entries WHERE compacted = 0 AND kind = 'text'"
            " AND received < ? ORDER BY attempt_id, node, stream LIMIT ?", (cutoff, limit))]

    def stream_lines(self, key: StreamKey, *, live_only: bool = False) -> list[StreamLine]:
        """A text stream's rows in arrival order; `live_only`: without the blanked ones (tombstones)."""
        where = ["stream = ?", "kind = 'text'", "attempt_id IS NULL" if key.attempt_id is None else "attempt_id = ?",
                 "node IS NULL" if key.node is None else "node = ?"]
        args: list[Any] = [key.stream, *([] if key.attempt_id is None else [key.attempt_id]),
                           *([] if key.node is None else [key.node])]
        if live_only:
            where.append("compacted < 2")
        return [StreamLine(r["id"], r["line"], r["body"], r["received"], r["compacted"]) for r in self._rows(
            f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)} ORDER BY id",
            args)]

    def compact(self, blank: Sequence[int], keep: Sequence[int]) -> None:
        """Blank the text of lines no extraction can read (the row stays: its line number, time and
        dedup key keep line references, coverage counts and retries exact) and mark the rest kept."""
        with self._tx() as db:
            for i in range(0, len(blank), 500):
                part = blank[i:i + 500]
                db.execute(f"UPDATE log_entries SET body = '', compacted = 2 WHERE id IN ({','.join('?' * len(part))})",
                           part)
            for i in range(0, len(keep), 500):
                part = keep[i:i + 500]
                db.execute(f"UPDATE log_entries SET compacted = 1 WHERE id IN ({','.join('?' * len(part))})", part)

    def collapse_due(self, cutoff: float, limit: int) -> list[StreamKey]:
        """Streams with lines blanked before `cutoff` not yet merged into gap rows."""
        return [StreamKey(r["attempt_id"], r["node"], r["stream"]) for r in self._rows(
            "SELECT DISTINCT attempt_id, node, stream FROM log_entries WHERE compacted = 2 AND received < ?"
            " AND line IS NOT NULL"
            " ORDER BY attempt_id, node, stream LIMIT ?", (cutoff, limit))]

    def stream_tombstones(self, key: StreamKey) -> list[StreamLine]:
        """A stream's blanked lines and gap rows (compacted 2 and 3), arrival order."""
        where = ["stream = ?", "compacted >= 2", "attempt_id IS NULL" if key.attempt_id is None else "attempt_id = ?",
                 "node IS NULL" if key.node is None else "node = ?"]
        args: list[Any] = [key.stream, *([] if key.attempt_id is None else [key.attempt_id]),
                           *([] if key.node is None else [key.node])]
        return [StreamLine(r["id"], r["line"], r["body"], r["received"], r["compacted"]) for r in self._rows(
            f"SELECT id, line, body, received, compacted FROM log_entries WHERE {' AND '.join(where)} ORDER BY id",
            args)]

    def collapse(self, runs: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        """Each run (row kept, lines it stands for, rows merged into it): the kept row becomes the run's
        gap row, the others go."""
        with self._tx() as db:
            for keep, lines, drop in runs:
                db.execute("UPDATE log_entries SET kind = 'gap', body = ?, compacted = 3 WHERE id = ?",
                           (str(lines), keep))
                for i in range(0, len(drop), 500):
                    part = list(drop[i:i + 500])
                    db.execute(f"DELETE FROM log_entries WHERE id IN ({','.join('?' * len(part))})", part)

    # ----------------------------------------------------------------------------------- diagnoses

    def put_diagnosis(self, attempt_id: int, body: str, summary: dict[str, Any], provisional: bool,
                      analyzed_from: float) -> None:
        """Store the attempt's diagnosis (replacing the previous one) and clear its dirty flag unless
        data arrived after `analyzed_from` (the wall time the analysis read the store)."""
        with self._tx() as db:
            db.execute("DELETE FROM diagnoses WHERE attempt_id=? OR id=?", (attempt_id, summary["id"]))
            db.execute(
                "INSERT INTO diagnoses (id, attempt_id, workload, attempt, cluster, outcome, domain, subdomain,"
                " terminal_state, provisional, window_start_ns, window_end_ns, created, body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (summary["id"], attempt_id, summary["workload"], summary["attempt"], summary.get("cluster"),
                 summary["outcome"], summary.get("domain"), summary.get("subdomain"), summary.get("terminal_state"),
                 int(provisional), summary.get("window_start_ns"), summary.get("window_end_ns"), time.time(), body))
            db.executemany("INSERT OR IGNORE INTO diagnosis_nodes VALUES (?, ?, ?)",
                           [(summary["id"], n, "culprit") for n in summary.get("culprits", [])]
                           + [(summary["id"], n, "affected") for n in summary.get("affected", [])])
            now = time.time()  # the outbox: a re-analysed diagnosis is sent again, afresh
            db.executemany("INSERT INTO exports (diagnosis_id, exporter, created, due) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT (diagnosis_id, exporter) DO UPDATE SET created=excluded.created,"
                           " due=excluded.due, attempts=0, last_error=NULL",
                           [(summary["id"], name, now, now) for name in self.exporters])
            db.execute("UPDATE attempts SET analyzed_at=?, dirty=CASE WHEN activity > ? THEN 1 ELSE 0 END WHERE id=?",
                       (time.time(), analyzed_from, attempt_id))

    def _diag(self, r: sqlite3.Row) -> DiagnosisRow:
        nodes = [x[0] for x in self._rows(
            "SELECT node FROM diagnosis_nodes WHERE diagnosis_id=? AND role='culprit' ORDER BY node", (r["id"],))]
        return DiagnosisRow(id=r["id"], workload=r["workload"], attempt=r["attempt"], cluster=r["cluster"],
                            outcome=r["outcome"], domain=r["domain"], subdomain=r["subdomain"],
                            provisional=bool(r["provisional"]), created=r["created"], body=r["body"], nodes=nodes)

    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRow | None:
        rows = self._rows("SELECT * FROM diagnoses WHERE id=?", (diagnosis_id,))
        return self._diag(rows[0]) if rows else None

    def list_diagnoses(self, flt: DiagnosisFilter) -> list[DiagnosisRow]:
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("cluster", flt.cluster), ("outcome", flt.outcome), ("domain", flt.domain),
                              ("workload", flt.workload)):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        if flt.node is not None:
            where.append("id IN (SELECT diagnosis_id FROM diagnosis_nodes WHERE node=? AND role='culprit')")
            args.append(flt.node)
        if flt.since_ns is not None:
            where.append("COALESCE(window_end_ns, 0) >= ?")
            args.append(flt.since_ns)
        if flt.until_ns is not None:
            where.append("COALESCE(window_start_ns, 0) <= ?")
            args.append(flt.until_ns)
        sql = "SELECT * FROM diagnoses" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY window_end_ns DESC, id LIMIT ?"
        args.append(max(1, min(flt.limit, 1000)))
        return [self._diag(r) for r in self._rows(sql, args)]

    # ----------------------------------------------------------------------------------- retention

    def sweep(self, now: float, retention: Retention) -> int:
        """Apply retention; returns rows removed. Lines cut from a stream are counted for coverage."""
        removed = 0
        with self._tx() as db:
            cutoff = now - retention.max_age_s
            removed += db.execute("DELETE FROM log_entries WHERE received < ?", (cutoff,)).rowcount
            removed += db.execute("DELETE FROM metric_points WHERE received < ?", (cutoff,)).rowcount
            over = db.execute(
                "SELECT COALESCE(attempt_id, '') AS scope, COALESCE(node, '') AS node, stream, COUNT(*) AS n"
                " FROM log_entries GROUP BY attempt_id, node, stream HAVING n > ?",
                (retention.max_lines_per_stream,)).fetchall()
            for r in over:
                extra = r["n"] - retention.max_lines_per_stream
                scope_sql = "attempt_id IS NULL" if r["scope"] == "" else "attempt_id = ?"
                scope_args: tuple[Any, ...] = () if r["scope"] == "" else (int(r["scope"]),)
                ids = db.execute(
                    f"SELECT id FROM log_entries WHERE {scope_sql} AND COALESCE(node, '') = ? AND stream = ?"
                    " ORDER BY time_ns, line, id LIMIT ?", (*scope_args, r["node"], r["stream"], extra)).fetchall()
                db.executemany("DELETE FROM log_entries WHERE id=?", [(i[0],) for i in ids])
                db.execute("INSERT INTO stream_drops VALUES (?, ?, ?, ?) ON CONFLICT (scope, node, stream)"
                           " DO UPDATE SET dropped = dropped + excluded.dropped",
                           (str(r["scope"]), r["node"], r["stream"], len(ids)))
                removed += len(ids)
            removed += db.execute("DELETE FROM diagnoses WHERE created < ?",
                                  (now - retention.diagnoses_max_age_s,)).rowcount
            removed += db.execute(
                "DELETE FROM attempts WHERE activity < ? AND id NOT IN (SELECT attempt_id FROM diagnoses"
                " WHERE attempt_id IS NOT NULL)", (cutoff,)).rowcount
        return removed

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in ("attempts", "log_entries", "metric_points", "diagnoses"):
            out[table] = int(self._rows(f"SELECT COUNT(*) FROM {table}")[0][0])
        # log records held: a gap row stands for the run of lines it replaced (server/arrival.py)
        out["log_rows"] = out["log_entries"]
        out["log_entries"] = int(self._rows(
            "SELECT COALESCE(SUM(CASE WHEN kind = 'gap' THEN CAST(body AS INTEGER) ELSE 1 END), 0) FROM log_entries")[0][0])
        # awaiting a verdict: never analysed, or data arrived since the last analysis
        out["attempts_open"] = int(self._rows(
            "SELECT COUNT(*) FROM attempts WHERE dirty=1 OR analyzed_at IS NULL")[0][0])
        return out

    # ----------------------------------------------------------------------------------- outbox

    def claim_exports(self, exporter: str, now: float, limit: int, lease_s: float) -> list[PendingExport]:
        """The oldest due rows of one exporter, leased for `lease_s` so another replica skips them."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM exports WHERE exporter=? AND due<=? ORDER BY created, id LIMIT ?",
                              (exporter, now, limit)).fetchall()
            db.executemany("UPDATE exports SET due=? WHERE id=?", [(now + lease_s, r["id"]) for r in rows])
        return [PendingExport(id=r["id"], exporter=r["exporter"], diagnosis_id=r["diagnosis_id"], created=r["created"],
                              attempts=r["attempts"], diagnosis=self.get_diagnosis(r["diagnosis_id"])) for r in rows]

    def finish_exports(self, ids: Sequence[int]) -> None:
        """Delivered, or given up on: the rows leave the outbox."""
        with self._tx() as db:
            db.executemany("DELETE FROM exports WHERE id=?", [(i,) for i in ids])

    def retry_exports(self, ids: Sequence[int], due: float, error: str) -> None:
        with self._tx() as db:
            db.executemany("UPDATE exports SET due=?, attempts=attempts+1, last_error=? WHERE id=?",
                           [(due, error[:500], i) for i in ids])

    def export_backlog(self) -> dict[str, tuple[int, float]]:
        """Per exporter: rows waiting, and the time the oldest of them was stored."""
        return {r[0]: (int(r[1]), float(r[2])) for r in self._rows(
            "SELECT exporter, COUNT(*), MIN(created) FROM exports GROUP BY exporter")}

    def diagnosis_facts(self, since: float) -> list[DiagnosisFacts]:
        """Final diagnoses stored since `since`, with their culprit nodes and root-cause components."""
        culprits: dict[str, list[str]] = {}
        for r in self._rows("SELECT n.diagnosis_id, n.node FROM diagnosis_nodes n JOIN diagnoses d ON d.id = n.diagnosis_id"
                            " WHERE n.role='culprit' AND d.created >= ? AND d.provisional=0 ORDER BY n.node", (since,)):
            culprits.setdefault(r[0], []).append(r[1])
        out: list[DiagnosisFacts] = []
        for r in self._rows("SELECT id, cluster, outcome, domain, subdomain,"
                            " json_extract(body, '$.root_cause.components') AS components"
                            " FROM diagnoses WHERE created >= ? AND provisional=0 ORDER BY id", (since,)):
            comps = json.loads(r["components"]) if r["components"] else []
            out.append(DiagnosisFacts(
                id=r["id"], cluster=r["cluster"], outcome=r["outcome"], domain=r["domain"], subdomain=r["subdomain"],
                culprits=culprits.get(r["id"], []),
                components=[(str(c.get("node")), str(c.get("kind")), str(c.get("id"))) for c in comps]))
        return out
