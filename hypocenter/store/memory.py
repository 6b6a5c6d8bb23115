"""In-memory doubles of the store's roles, for a component that needs only one of them.

    InMemoryDiagnoses    DiagnosisStore and FleetStore: diagnoses with their revisions, culprit
                         nodes and fleet marks, kept as `put_diagnosis` keeps them
    InMemoryExportQueue  ExportQueue: the outbox rows a stored diagnosis leaves for each exporter

    diagnoses = InMemoryDiagnoses(exporters=("loki",))
    Outbox(diagnoses.exports, [LokiExporter(url)], Activity())     # exporter/outbox.py

They behave like `SQLiteStore` on the methods they implement (tests/store/test_doubles.py runs the
same calls on both), the way OTel's `InMemorySpanExporter` stands in for an exporter. What lies
outside their roles they do not do: `put_diagnosis` takes any `attempt_id` and keeps no attempt
rows (no dirty flag, no quarantine); nothing is removed by age (no `sweep`); `fleet_pending` is
always empty (nothing here predates fleet memory). A test that needs those uses `SQLiteStore(":memory:")`.
Every method is safe to call from any thread, as the protocols require.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hypocenter.store.base import (
    Delivered,
    DiagnosisFacts,
    DiagnosisFilter,
    DiagnosisRow,
    DiagnosisStore,
    ExportQueue,
    FleetMark,
    FleetStore,
    PendingExport,
    RevisionRow,
)


@dataclass(slots=True)
class QueuedExport:
    """One outbox row: a diagnosis to deliver to one exporter."""

    id: int
    diagnosis_id: str
    exporter: str
    created: float
    due: float
    attempts: int = 0
    last_error: str | None = None


class InMemoryExportQueue:
    """The outbox: rows claimed under a lease, then finished (delivered or dropped) or retried later."""

    def __init__(self, lookup: Callable[[str], DiagnosisRow | None], exporters: Sequence[str] = ()) -> None:
        self.exporters: tuple[str, ...] = tuple(exporters)
        self.rows: dict[int, QueuedExport] = {}  # by id; a test may age a row by editing it
        self.receipts: dict[tuple[str, str, int], Delivered] = {}  # (exporter, workload, attempt)
        self._lookup = lookup
        self._next_id = 1
        self._lock = threading.RLock()

    def enqueue(self, diagnosis_id: str, now: float) -> None:
        """A diagnosis stored or changed: due now for every exporter, afresh (a row it had is reset)."""
        with self._lock:
            for exporter in self.exporters:
                row = next(
                    (
                        r
                        for r in self.rows.values()
                        if (r.diagnosis_id, r.exporter) == (diagnosis_id, exporter)
                    ),
                    None,
                )
                if row is None:
                    self.rows[self._next_id] = QueuedExport(self._next_id, diagnosis_id, exporter, now, now)
                    self._next_id += 1
                else:
                    row.created, row.due, row.attempts, row.last_error = now, now, 0, None

    def claim_exports(self, exporter: str, now: float, limit: int, lease_s: float) -> list[PendingExport]:
        with self._lock:
            due = sorted(
                (r for r in self.rows.values() if r.exporter == exporter and r.due <= now),
                key=lambda r: (r.created, r.id),
            )[:limit]
            for r in due:
                r.due = now + lease_s
            claimed = [(r.id, r.diagnosis_id, r.created, r.attempts) for r in due]
        return [
            PendingExport(
                id=i, exporter=exporter, diagnosis_id=d, created=c, attempts=a, diagnosis=self._lookup(d)
            )
            for i, d, c, a in claimed
        ]

    def finish_exports(self, ids: Sequence[int]) -> None:
        with self._lock:
            for i in ids:
                self.rows.pop(i, None)

    def retry_exports(self, ids: Sequence[int], due: float, error: str) -> None:
        with self._lock:
            for i in ids:
                row = self.rows.get(i)
                if row is not None:
                    row.due, row.attempts, row.last_error = due, row.attempts + 1, error[:500]

    def export_backlog(self) -> dict[str, tuple[int, float]]:
        with self._lock:
            out: dict[str, tuple[int, float]] = {}
            for r in self.rows.values():
                count, oldest = out.get(r.exporter, (0, r.created))
                out[r.exporter] = (count + 1, min(oldest, r.created))
            return out

    def delivered(self, exporter: str, workload: str, attempt: int) -> Delivered | None:
        with self._lock:
            return self.receipts.get((exporter, workload, attempt))

    def record_delivery(self, receipts: Sequence[Delivered]) -> None:
        with self._lock:
            for d in receipts:
                self.receipts[(d.exporter, d.workload, d.attempt)] = d


@dataclass(slots=True)
class _Stored:
    attempt_id: int
    row: DiagnosisRow
    marks: list[FleetMark]


class InMemoryDiagnoses:
    """The diagnoses made, their revisions and fleet marks; `exports` is the outbox they feed."""

    def __init__(self, exporters: Sequence[str] = ()) -> None:
        self._current: dict[str, _Stored] = {}  # by diagnosis id
        self._revisions: dict[tuple[str, int], list[RevisionRow]] = {}  # by (workload, attempt)
        self._lock = threading.RLock()
        self.exports = InMemoryExportQueue(self.get_diagnosis, exporters)

    # ------------------------------------------------------------------------------- DiagnosisStore

    def put_diagnosis(
        self,
        attempt_id: int,
        body: str,
        summary: dict[str, Any],
        provisional: bool,
        analyzed_from: float,
        provenance: dict[str, Any] | None = None,
        claim: str | None = None,  # one process: a claim is never taken back
    ) -> int | None:
        """As `SQLiteStore.put_diagnosis`: a changed verdict is a new revision; the very same diagnosis
        again changes nothing and is not queued for export again. Returns the revision now current."""
        prov: dict[str, Any] = provenance or {"source": "unknown"}
        key = (summary["workload"], summary["attempt"])
        with self._lock:
            revisions = self._revisions.setdefault(key, [])
            last = revisions[-1] if revisions else None
            if last is not None and last.body == body:
                revision, prov = last.revision, last.provenance
            else:
                revision = 1 if last is None else last.revision + 1
                revisions.append(
                    RevisionRow(
                        revision=revision,
                        diagnosis_id=summary["id"],
                        workload=summary["workload"],
                        attempt=summary["attempt"],
                        outcome=summary["outcome"],
                        domain=summary.get("domain"),
                        subdomain=summary.get("subdomain"),
                        provisional=provisional,
                        created=time.time(),
                        provenance=json.loads(json.dumps(prov, sort_keys=True)),
                        body=body,
                    )
                )
            prev = self._current.get(summary["id"])
            if (
                prev is None
                or prev.attempt_id != attempt_id
                or prev.row.body != body
                or prev.row.provisional != provisional
            ):
                self._replace(attempt_id, body, summary, provisional, revision, prov)
        return revision

    def _replace(
        self,
        attempt_id: int,
        body: str,
        summary: dict[str, Any],
        provisional: bool,
        revision: int,
        prov: dict[str, Any],
    ) -> None:
        for ident in [
            i for i, s in self._current.items() if s.attempt_id == attempt_id or i == summary["id"]
        ]:
            del self._current[ident]
        now = time.time()
        row = DiagnosisRow(
            id=summary["id"],
            workload=summary["workload"],
            attempt=summary["attempt"],
            cluster=summary.get("cluster"),
            outcome=summary["outcome"],
            domain=summary.get("domain"),
            subdomain=summary.get("subdomain"),
            provisional=provisional,
            created=now,
            body=body,
            nodes=sorted(set(summary.get("culprits", []))),
            window_start_ns=summary.get("window_start_ns"),
            window_end_ns=summary.get("window_end_ns"),
            revision=revision,
            provenance=json.loads(json.dumps(prov, sort_keys=True)),
        )
        self._current[row.id] = _Stored(attempt_id, row, _unique([], summary.get("marks", [])))
        self.exports.enqueue(row.id, now)

    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRow | None:
        with self._lock:
            stored = self._current.get(diagnosis_id)
            return replace(stored.row, nodes=list(stored.row.nodes)) if stored else None

    def diagnosis_revisions(self, diagnosis_id: str) -> list[RevisionRow]:
        with self._lock:
            owners = [r for revs in self._revisions.values() for r in revs if r.diagnosis_id == diagnosis_id]
            if not owners:
                return []
            owner = max(owners, key=lambda r: r.revision)
            return list(self._revisions[(owner.workload, owner.attempt)])

    def _matching(self, flt: DiagnosisFilter) -> list[DiagnosisRow]:
        rows = []
        for s in self._current.values():
            r = s.row
            if any(
                v is not None and getattr(r, k) != v
                for k, v in (
                    ("cluster", flt.cluster),
                    ("outcome", flt.outcome),
                    ("domain", flt.domain),
                    ("workload", flt.workload),
                )
            ):
                continue
            if flt.search and flt.search.lower() not in r.workload.lower():
                continue
            if flt.node is not None and flt.node not in r.nodes:
                continue
            if flt.since_ns is not None and (r.window_end_ns or 0) < flt.since_ns:
                continue
            if flt.until_ns is not None and (r.window_start_ns or 0) > flt.until_ns:
                continue
            rows.append(r)
        return rows

    def list_diagnoses(self, flt: DiagnosisFilter) -> list[DiagnosisRow]:
        """Newest window end first (no window last), then by id; `flt.after` continues a page."""
        with self._lock:
            rows = self._matching(flt)
            if flt.after is not None:
                end, last = flt.after
                if end is None:  # rows without a window sort last
                    rows = [r for r in rows if r.window_end_ns is None and r.id > last]
                else:
                    rows = [
                        r
                        for r in rows
                        if r.window_end_ns is None
                        or r.window_end_ns < end
                        or (r.window_end_ns == end and r.id > last)
                    ]
            rows.sort(key=lambda r: r.id)
            rows.sort(key=lambda r: (r.window_end_ns is not None, r.window_end_ns or 0), reverse=True)
            return [replace(r, nodes=list(r.nodes)) for r in rows[: max(1, min(flt.limit, 1000))]]

    def count_diagnoses(self, flt: DiagnosisFilter) -> int:
        with self._lock:
            return len(self._matching(flt))

    def diagnoses_version(self) -> str:
        with self._lock:
            return f"{len(self._current)}-{max((s.row.created for s in self._current.values()), default=0.0):.6f}"

    def diagnosis_facts(self, since: float) -> list[DiagnosisFacts]:
        with self._lock:
            out = []
            for ident in sorted(self._current):
                r = self._current[ident].row
                if r.provisional or r.created < since:
                    continue
                root = json.loads(r.body).get("root_cause") or {}
                comps = root.get("components") or []
                out.append(
                    DiagnosisFacts(
                        id=r.id,
                        cluster=r.cluster,
                        outcome=r.outcome,
                        domain=r.domain,
                        subdomain=r.subdomain,
                        culprits=list(r.nodes),
                        components=[
                            (str(c.get("node")), str(c.get("kind")), str(c.get("id"))) for c in comps
                        ],
                    )
                )
            return out

    # ----------------------------------------------------------------------------------- FleetStore

    def fleet_marks(self, since_s: float) -> list[FleetMark]:
        """The marks of current final diagnoses whose failure happened at or after `since_s`, oldest first."""
        with self._lock:
            return sorted(
                (
                    m
                    for s in self._current.values()
                    if not s.row.provisional
                    for m in s.marks
                    if m.time_s >= since_s
                ),
                key=FleetMark.sort_key,
            )

    def fleet_pending(self, limit: int) -> list[tuple[str, str]]:
        return []

    def put_fleet_marks(self, diagnosis_id: str, marks: Sequence[FleetMark]) -> None:
        with self._lock:
            stored = self._current.get(diagnosis_id)
            if stored is not None:
                stored.marks = _unique(stored.marks, marks)


def _unique(kept: Sequence[FleetMark], new: Sequence[FleetMark]) -> list[FleetMark]:
    """`kept` and the marks of `new` not already there, one per key of the store's table (the first wins)."""
    out = {(m.role, m.kind, m.node, m.component, m.rule, m.detail): m for m in kept}
    for m in new:
        out.setdefault((m.role, m.kind, m.node, m.component, m.rule, m.detail), m)
    return list(out.values())


if TYPE_CHECKING:  # mypy checks that the doubles take their roles' places

    def _roles(d: InMemoryDiagnoses) -> tuple[DiagnosisStore, FleetStore, ExportQueue]:
        return d, d, d.exports
