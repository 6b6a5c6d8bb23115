"""What this process did since it started: records taken and refused, analyses, exports.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from hypocenter.engine.report import diagnosis_id
from hypocenter.exporter.cardinality import LabelLimit
from hypocenter.model import Diagnosis

# Seconds; an analysis reads the attempt's records from the store, extracts, correlates, decides.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# Verdicts already counted, by diagnosis id: a re-analysis that reaches the same verdict (an explicit
# trigger racing the settle timer, late data that changes nothing) is not a second diagnosis.
COUNTED_MAX = 100_000

# Why a request or a record was refused. Requests refused whole are retried by OTLP clients
# (backpressure, store_unavailable) or are lost at the client (the others).
REQUEST_REASONS = ("malformed", "too_large", "unsupported_media_type", "backpressure", "store_unavailable")
RECORD_REASONS = ("no_node_or_workload", "unknown_state", "unsupported_metric_type")


@dataclass(frozen=True, slots=True)
class Exemplar:
    """The last diagnosis that moved a series: its id, and when."""

    diagnosis_id: str
    value: float
    time: float


@dataclass(slots=True)
class Latency:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    exemplars: list[Exemplar | None] = field(default_factory=lambda: [None] * (len(LATENCY_BUCKETS) + 1))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent copy of every tally, taken under the lock."""

    ingested_records: dict[tuple[str, str], int]
    ingested_bytes: dict[tuple[str, str], int]
    refused_requests: dict[tuple[str, str, str], int]
    rejected_records: dict[tuple[str, str], int]
    diagnoses: dict[tuple[str, str, str, str], tuple[int, Exemplar | None]]
    provisional: int
    symptom_events: dict[str, int]
    extracted_events: dict[str, int]
    compacted_lines: int
    compacted_bytes: int
    latency: Latency
    exported: dict[str, int]
    export_failures: dict[tuple[str, str], int]
    export_dropped: dict[tuple[str, str], int]
    started: float
    analysis_failures: dict[str, int] = field(default_factory=dict)
    gpu_hours_lost: dict[tuple[str, str, str], float] = field(default_factory=dict)


class Activity:
    """Thread-safe tallies; every method is cheap and never raises into its caller."""

    def __init__(self, label_max_values: int = 100) -> None:
        self.labels = LabelLimit(label_max_values)  # cluster names as exported (exporter/cardinality.py)
        self._lock = threading.Lock()
        self.started = time.time()
        self._records: dict[tuple[str, str], int] = defaultdict(int)
        self._bytes: dict[tuple[str, str], int] = defaultdict(int)
        self._refused: dict[tuple[str, str, str], int] = defaultdict(int)
        self._rejected: dict[tuple[str, str], int] = defaultdict(int)
        self._diagnoses: dict[tuple[str, str, str, str], int] = defaultdict(int)
        self._diagnosis_exemplars: dict[tuple[str, str, str, str], Exemplar] = {}
        self._provisional = 0
        self._counted: OrderedDict[str, tuple[str, str, str, str]] = OrderedDict()
        self._symptoms: dict[str, int] = defaultdict(int)
        self._extracted: dict[str, int] = defaultdict(int)
        self._compacted = [0, 0]
        self._latency = Latency()
        self._exported: dict[str, int] = defaultdict(int)
        self._export_failures: dict[tuple[str, str], int] = defaultdict(int)
        self._export_dropped: dict[tuple[str, str], int] = defaultdict(int)
        self._analysis_failures: dict[str, int] = defaultdict(int)
        self._gpu_hours: dict[tuple[str, str, str], float] = defaultdict(float)

    # ------------------------------------------------------------------------------- ingest

    def ingested(
        self, signal: str, source: str, records: int, nbytes: int, rejected_by: dict[str, int] | None = None
    ) -> None:
        """A request was committed: `records` accepted, `nbytes` on the wire, some left out by reason."""
        with self._lock:
            self._records[(signal, source)] += records
            self._bytes[(signal, source)] += nbytes
            for reason, n in (rejected_by or {}).items():
                if n:
                    self._rejected[(signal, reason)] += n

    def extracted(self, kinds: dict[str, int]) -> None:
        """Events extracted from records as they were committed, by kind."""
        with self._lock:
            for kind, n in kinds.items():
                self._extracted[kind] += n

    def compacted(self, lines: int, nbytes: int) -> None:
        with self._lock:
            self._compacted[0] += lines
            self._compacted[1] += nbytes

    def refused(self, signal: str, source: str, reason: str) -> None:
        """A whole request was refused (see REQUEST_REASONS)."""
        with self._lock:
            self._refused[(signal, source, reason)] += 1

    # ------------------------------------------------------------------------------- analysis

    def analysed(self, diagnosis: Diagnosis, provisional: bool, seconds: float | None) -> None:
        """A diagnosis was stored; `seconds` is how long the analysis took (None: made elsewhere).

        Every analysis is timed; a final diagnosis is counted once per verdict (an attempt whose
        verdict changes on late data is counted under each), provisional ones only as provisional."""
        now = time.time()
        rc = diagnosis.root_cause
        cluster = self.labels.value("cluster", diagnosis.attempt.cluster or "", count=not provisional)
        key = (cluster, diagnosis.outcome, rc.domain if rc else "", rc.subdomain if rc else "")
        ident = diagnosis.id
        with self._lock:
            if seconds is not None:
                i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
                self._latency.counts[i] += 1
                self._latency.total += seconds
                self._latency.exemplars[i] = Exemplar(ident, seconds, now)
            if provisional:  # the attempt has not ended: its final diagnosis is counted when it comes
                self._provisional += 1
                return
            if self._counted.get(ident) == key:
                self._counted.move_to_end(ident)
                return
            self._counted[ident] = key
            if len(self._counted) > COUNTED_MAX:
                self._counted.popitem(last=False)
            self._diagnoses[key] += 1
            self._diagnosis_exemplars[key] = Exemplar(ident, 1.0, now)
            for s in diagnosis.symptoms:
                self._symptoms[s.kind] += s.count
            self._count_cost(diagnosis, key)

    def _count_cost(self, diagnosis: Diagnosis, key: tuple[str, str, str, str]) -> None:
        """Lost GPU-hours under the verdict's cause; and the restart overhead this attempt paid (its
        GPUs x startup) under the cause of the failed attempt before it, when that one was counted here."""
        cost = diagnosis.cost
        if cost is None:
            return
        cluster, outcome, domain, sub = key
        if cost.gpu_hours_lost and outcome != "not_failed":
            self._gpu_hours[(cluster, domain or outcome, sub)] += cost.gpu_hours_lost
        a = diagnosis.attempt
        prev = self._counted.get(
            diagnosis_id(a.cluster, a.workload_id, a.attempt - 1, diagnosis.engine.ruleset)
        )
        if prev is not None and prev[1] != "not_failed" and cost.gpus.value and cost.startup_s.value:
            self._gpu_hours[(prev[0], prev[2] or prev[1], prev[3])] += round(
                cost.gpus.value * cost.startup_s.value / 3600.0, 4
            )

    def analysis_failed(self, kind: str) -> None:
        """An attempt was quarantined: its analysis failed (`limit`, `error`) or the process died in it."""
        with self._lock:
            self._analysis_failures[kind] += 1

    # ------------------------------------------------------------------------------- exports

    def exported(self, exporter: str, n: int) -> None:
        with self._lock:
            self._exported[exporter] += n

    def export_failed(self, exporter: str, kind: str) -> None:
        """One failed delivery attempt: kind is `transient` (retried) or `permanent`."""
        with self._lock:
            self._export_failures[(exporter, kind)] += 1

    def export_dropped(self, exporter: str, reason: str, n: int = 1) -> None:
        """Diagnoses that will never reach this exporter: rejected (too_old, out_of_order), expired, superseded."""
        with self._lock:
            self._export_dropped[(exporter, reason)] += n

    # ------------------------------------------------------------------------------- reading

    def snapshot(self) -> Snapshot:
        with self._lock:
            lat = Latency(list(self._latency.counts), self._latency.total, list(self._latency.exemplars))
            return Snapshot(
                ingested_records=dict(self._records),
                ingested_bytes=dict(self._bytes),
                refused_requests=dict(self._refused),
                rejected_records=dict(self._rejected),
                diagnoses={k: (v, self._diagnosis_exemplars.get(k)) for k, v in self._diagnoses.items()},
                provisional=self._provisional,
                symptom_events=dict(self._symptoms),
                extracted_events=dict(self._extracted),
                compacted_lines=self._compacted[0],
                compacted_bytes=self._compacted[1],
                latency=lat,
                exported=dict(self._exported),
                export_failures=dict(self._export_failures),
                export_dropped=dict(self._export_dropped),
                started=self.started,
                analysis_failures=dict(self._analysis_failures),
                gpu_hours_lost=dict(self._gpu_hours),
            )
