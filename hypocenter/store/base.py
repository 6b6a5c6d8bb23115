"""What a store is: its protocols, split by role, and the rows it takes and gives.

    IngestStore     accepted records (`Entry`, `Point`) and attempts: ingest, compaction, assembly
    DiagnosisStore  the diagnoses made, for the APIs and /metrics
    FleetStore      what each final diagnosis says about nodes, GPUs and ports (engine/fleet.py)
    ExportQueue     the outbox of diagnoses to deliver to Loki / Grafana, and what each delivered
    Coordination    leases and analysis claims of replicas sharing the store
    Store           all of them, plus retention (`sweep`), `ping`, `stats` and `close`: what the server opens

Implementations: store/sqlite.py (`SQLiteStore(":memory:")` is the in-memory double of the whole),
store/postgres.py; store/memory.py has in-memory doubles of single roles (`InMemoryDiagnoses` for
DiagnosisStore and FleetStore, `InMemoryExportQueue` for ExportQueue) for tests of one component.
`Entry` and `Point` come from the OTLP receiver (collector/otlp.py); they live here, below both, so
that the store never imports the collector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol

from hypocenter.errors import InputError, TransientError
from hypocenter.fleet_mark import FleetMark as FleetMark  # re-exported: the stores name it from here


@dataclass(slots=True)
class Entry:
    """One accepted log record, tagged: text (a log line) or doc (a structured document body)."""

    workload: str | None
    attempt: int
    node: str | None
    stream: str
    kind: str  # "text" (a log line) | "doc" (a structured document) | "state" (the terminal-state marker)
    body: str  # the line, or the document as canonical JSON
    time_ns: int
    line: int | None
    dedup: str
    scope: dict[str, str] = field(default_factory=dict)


def line_dedup(
    workload: str | None,
    attempt: int,
    node: str | None,
    stream: str,
    line: int,
    time_unix_nano: int,
    text: str,
) -> str:
    """The dedup key of a record-numbered line: after rotation a file restarts at 1, so time and text
    tell the lines apart (contract 2; collector/otlp.py computes the same for `Entry`s)."""
    key = f"line\x1f{workload}\x1f{attempt}\x1f{node}\x1f{stream}\x1f{line}\x1f{time_unix_nano}\x1f{text}"
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(slots=True)
class RecordBlock:
    """The text records of one OTLP scope group that all belong to one stream, as columns: what an
    `Entry` per record would say, without an object per record. `entry(i)` builds the `Entry` of
    record `i` (its dedup key included) for the few records that are stored as rows.

    A group without record numbers (`digest` set: the records as sent, hashed) gets its numbers on
    arrival — the next ones of its stream (server/arrival.py) — and is stored like a numbered one;
    until then `lines` is empty and `entry(i)` is the record's `Entry` as the per-record path makes
    it (line None, the exporter-retry dedup key: `retry_key`'s stream prefix and attribute suffix
    around the record's times and body)."""

    workload: str | None
    attempt: int
    node: str | None
    stream: str
    scope: dict[str, str]
    lines: list[int]  # record numbers (> 0); empty until given on arrival for a group without them
    bodies: list[str]
    times: list[int]  # time_ns: time_unix_nano, else observed_time_unix_nano
    stamps: list[int]  # time_unix_nano as sent (part of the dedup key)
    digest: str = ""  # a group without record numbers: its records as sent, hashed (retries are dropped)
    observed: list[int] = field(default_factory=list)  # observed_time_unix_nano as sent (when `digest`)
    retry_key: tuple[str, str] = ("", "")  # when `digest`: the exporter-retry key around times and body
    banners: dict[int, str] = field(default_factory=dict)  # record → the state its Slurm banner names
    dedups: list[str] = field(default_factory=list)  # when `digest`, tagged per record: each record's key

    def __len__(self) -> int:
        return len(self.bodies)

    @property
    def key(self) -> tuple[str | None, int, str | None, str]:
        return self.workload, self.attempt, self.node, self.stream

    def entry(self, i: int) -> Entry:
        if not self.lines:  # no record numbers given (yet): the record as the per-record path keys it
            line = None
            if self.dedups:
                dedup = self.dedups[i]
            else:
                where, tail = self.retry_key
                key = f"{where}{self.stamps[i]}\x1f{self.observed[i]}\x1f{self.bodies[i]}{tail}"
                dedup = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        else:
            line = self.lines[i]
            dedup = line_dedup(
                self.workload, self.attempt, self.node, self.stream, line, self.stamps[i], self.bodies[i]
            )
        return Entry(
            workload=self.workload,
            attempt=self.attempt,
            node=self.node,
            stream=self.stream,
            kind="text",
            body=self.bodies[i],
            time_ns=self.times[i],
            line=line,
            dedup=dedup,
            scope={**self.scope, "banner_state": self.banners[i]} if i in self.banners else self.scope,
        )

    def entries(self) -> list[Entry]:
        return [self.entry(i) for i in range(len(self.bodies))]

    def after(self, k: int) -> RecordBlock:
        """Records k.. of this block."""
        return RecordBlock(
            self.workload,
            self.attempt,
            self.node,
            self.stream,
            self.scope,
            self.lines[k:],
            self.bodies[k:],
            self.times[k:],
            self.stamps[k:],
            self.digest,
            self.observed[k:],
            self.retry_key,
            {i - k: state for i, state in self.banners.items() if i >= k},
            self.dedups[k:],
        )


@dataclass(slots=True)
class Point:
    """One accepted metric sample, tagged like a log record."""

    workload: str | None
    attempt: int
    node: str | None
    source: str
    name: str
    labels: dict[str, str]
    time_ns: int
    value: float
    scope: dict[str, str] = field(default_factory=dict)


class StoreError(InputError):
    """A store that cannot be opened or migrated (a path to fix, a newer schema)."""


class StoreUnavailable(TransientError):
    """The database cannot be reached now (stopped, restarting, cut off). The store logs the change of
    state once, and again once when it answers; callers answer UNAVAILABLE / 503 meanwhile and do
    not log each refusal."""


class StreamConflict(TransientError):
    """A stream's state changed between the reduction's read and its write (another replica, or another
    writer, stored records of it first): nothing of the batch was written; reduce it again on the
    state as it is now (server/service.py's ingest queue does, a bounded number of times)."""


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: float = 7 * 86400.0  # accepted records older than this (by arrival) are removed
    max_lines_per_stream: int = 1_000_000  # oldest lines of a longer stream are removed
    diagnoses_max_age_s: float = 90 * 86400.0


@dataclass(slots=True)
class AttemptRow:
    id: int
    workload: str
    attempt: int
    scope: dict[str, str]
    context: dict[str, Any] | None
    nodes: list[str]
    first_ns: int | None
    last_ns: int | None
    terminal_ns: int | None
    activity: float
    dirty: bool
    analyzed_at: float | None
    scope_provenance: dict[str, Any] | None = None
    failure: str | None = None  # why its last analysis failed (quarantined), None when it did not
    failed_at: float | None = None


@dataclass(slots=True)
class LogRow:
    node: str | None
    stream: str
    kind: str
    line: int | None
    time_ns: int
    body: str


class LogLine(NamedTuple):
    """One stored log row as an attempt's assembly reads it (`IngestStore.attempt_lines` / `node_lines`).
    A tuple (the database's own row, retyped in C by `log_lines`): tens of thousands per attempt at
    1,024 nodes. Only text, gap and doc rows are read, in no particular order (the database does not
    sort the rows' texts: the assembly puts each stream's few rows in order)."""

    node: str | None
    stream: str
    doc: int  # 1 for a structured document, else 0 (a text line or a gap row)
    gap: int  # 1 for a gap row: its body says how many blanked lines it stands for
    line: int | None  # log.file.record_number
    in_range: int  # 1 when the record's time lies in the range asked for
    body: str
    id: int  # the row's, ascending in arrival order


_as_log_line = partial(tuple.__new__, LogLine)  # a C call, where LogLine._make is a Python one


def log_lines(rows: Iterable[tuple[Any, ...]]) -> list[LogLine]:
    """Database rows in `LogLine`'s column order as `LogLine`s, with no Python step per row."""
    return list(map(_as_log_line, rows))


@dataclass(slots=True)
class PointRow:
    node: str | None
    source: str
    name: str
    labels: dict[str, str]
    time_ns: int
    value: float


@dataclass(slots=True)
class DiagnosisFilter:
    cluster: str | None = None
    outcome: str | None = None
    domain: str | None = None
    node: str | None = None  # a culprit node (root cause or candidate)
    workload: str | None = None
    since_ns: int | None = None  # the attempt's window overlaps [since, until]
    until_ns: int | None = None
    limit: int = 100
    search: str | None = None  # a case-insensitive substring of the workload id
    after: tuple[int | None, str] | None = None  # keyset paging: rows after this (window_end_ns, id)


@dataclass(slots=True)
class PendingExport:
    """An outbox row claimed for delivery; `diagnosis` is None when it was superseded or expired."""

    id: int
    exporter: str
    diagnosis_id: str
    created: float
    attempts: int
    diagnosis: DiagnosisRow | None


@dataclass(frozen=True, slots=True)
class Delivered:
    """What an exporter delivered last for an attempt: the verdict (id and revision) and the receiver's
    id for it (`ref`: a Grafana annotation id; '' when the receiver gives none), so that a later
    verdict of the attempt replaces it instead of standing beside it."""

    exporter: str
    workload: str
    attempt: int
    diagnosis_id: str
    revision: int
    ref: str = ""


@dataclass(slots=True)
class DiagnosisFacts:
    """What /metrics aggregates over recent diagnoses (no body)."""

    id: str
    cluster: str | None
    outcome: str
    domain: str | None
    subdomain: str | None
    culprits: list[str]
    components: list[tuple[str, str, str]]  # (node, kind, id) of the root cause, e.g. a GPU or a port


@dataclass(frozen=True, slots=True)
class StreamKey:
    attempt_id: int | None  # None: a node-scoped stream
    node: str | None
    stream: str


@dataclass(slots=True)
class StreamLine:
    id: int
    line: int | None
    body: str
    received: float
    compacted: int


@dataclass(slots=True)
class ArrivalState:
    """What the store knows of one text stream that arrives through extraction on arrival
    (server/arrival.py; records without numbers are given them there): the record numbers already
    stored of its current generation (a
    rotated file restarts at 1: a new generation), the dedup key of its line 1, and the rows of
    that generation that are not final — kept lines and gap rows from `from_line` on, in
    record-number order. `version` counts the writes of the stream's state (0: none yet): a write
    made from this state applies only while the stored version is still this one (`StreamConflict`)."""

    version: int = 0
    generation: int = 0
    since_id: int = 0  # the generation's rows have larger ids
    head: str | None = None
    ranges: list[tuple[int, int]] = field(default_factory=list)
    rows: list[StreamLine] = field(default_factory=list)
    lines: int = 0
    bytes: int = 0
    batches: set[str] = field(default_factory=set)  # digests asked for that are stored: retries


@dataclass(slots=True)
class ArrivalWrite:
    """What one batch does to one stream (`entries`: its new records, for the attempt's bookkeeping):
    rows to insert (entry, kind, body, compacted), to update (id, kind, body, compacted) and to
    delete, and the stream's new state. `rotate`: a new generation starts with this batch."""

    workload: str | None
    attempt: int
    node: str | None
    stream: str
    entries: list[Entry]
    state: ArrivalState
    rotate: bool = False
    inserts: list[tuple[Entry, str, str, int]] = field(default_factory=list)
    updates: list[tuple[int, str, str, int]] = field(default_factory=list)
    deletes: list[int] = field(default_factory=list)
    first_ns: int | None = None
    last_ns: int | None = None
    block: int = 0  # when `entries` is empty: the records of a `RecordBlock` (all with `block_scope`)
    block_scope: dict[str, str] = field(default_factory=dict)
    digests: list[str] = field(default_factory=list)  # groups without record numbers stored by this write
    banners: list[tuple[int, str]] = field(default_factory=list)  # (time, state) of a block's Slurm banners
    version: int = field(init=False)  # the state's version this write was computed from

    def __post_init__(self) -> None:
        self.version = self.state.version

    def records(self) -> int:
        return self.block or len(self.entries)

    def touches(self) -> list[tuple[int, dict[str, str], bool]]:
        """(time, scope, terminal) the attempt's bookkeeping reads: one per entry, or a block's first
        and last time (its records share one scope, with no terminal marker)."""
        if self.block:
            return [(t, self.block_scope, False) for t in (self.first_ns or 0, self.last_ns or 0)] + [
                (t, {**self.block_scope, "banner_state": state}, True) for t, state in self.banners
            ]
        return [(e.time_ns, e.scope, "state" in e.scope or "banner_state" in e.scope) for e in self.entries]


@dataclass(slots=True)
class DiagnosisRow:
    id: str
    workload: str
    attempt: int
    cluster: str | None
    outcome: str
    domain: str | None
    subdomain: str | None
    provisional: bool
    created: float
    body: str
    nodes: list[str] = field(default_factory=list)
    window_start_ns: int | None = None
    window_end_ns: int | None = None
    revision: int = 1
    provenance: dict[str, Any] | None = None


@dataclass(slots=True)
class RevisionRow:
    """One verdict an attempt had: `revision` counts from 1; the highest is the current diagnosis."""

    revision: int
    diagnosis_id: str
    workload: str
    attempt: int
    outcome: str
    domain: str | None
    subdomain: str | None
    provisional: bool
    created: float
    provenance: dict[str, Any]
    body: str


class IngestStore(Protocol):
    """Accepted records and the attempts they belong to: ingest, compaction, assembly of an attempt."""

    def ingest(
        self,
        logs: Sequence[Entry],
        points: Sequence[Point],
        now: float,
        stalls: Sequence[tuple[str, int, int]] = (),
        arrivals: Sequence[ArrivalWrite] = (),
    ) -> int: ...
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
    ) -> ArrivalState: ...
    def compaction_due(self, cutoff: float, limit: int) -> list[StreamKey]: ...
    def stream_lines(self, key: StreamKey, *, live_only: bool = False) -> list[StreamLine]: ...
    def compact(self, blank: Sequence[int], keep: Sequence[int]) -> None: ...
    def collapse_due(self, cutoff: float, limit: int) -> list[StreamKey]: ...
    def stream_tombstones(self, key: StreamKey) -> list[StreamLine]: ...
    def collapse(self, runs: Sequence[tuple[int, int, Sequence[int]]]) -> None: ...
    def set_context(
        self,
        workload: str,
        attempt: int,
        context: dict[str, Any],
        now: float,
        provenance: dict[str, Any] | None = None,
    ) -> None: ...
    def attempt(self, workload: str, attempt: int) -> AttemptRow | None: ...
    def attempts_due(self, now: float, settle_s: float, idle_s: float) -> list[AttemptRow]: ...
    def attempt_logs(self, attempt_id: int) -> list[LogRow]: ...
    def node_logs(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[LogRow]: ...
    def attempt_lines(self, attempt_id: int, start_ns: int, end_ns: int) -> list[LogLine]: ...
    def node_lines(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[LogLine]: ...
    def attempt_points(self, attempt_id: int) -> list[PointRow]: ...
    def node_points(self, nodes: Sequence[str], start_ns: int, end_ns: int) -> list[PointRow]: ...
    def known_nodes(self) -> list[str]: ...
    def drops(self, attempt_id: int, nodes: Sequence[str]) -> dict[tuple[str, str], int]: ...
    # quarantine of poison attempts (server/quarantine.py)
    def mark_analysing(
        self, attempt_id: int, since: float | None, claim: tuple[str, float] | None = None
    ) -> None: ...
    def fail_analysis(
        self, attempt_id: int, reason: str, now: float, analyzed_from: float, holder: str | None = None
    ) -> None: ...
    def recover_interrupted(
        self, now: float, quarantine_after: int, live_replicas: bool = False
    ) -> list[AttemptRow]: ...
    def failed_attempts(self, limit: int) -> list[AttemptRow]: ...


class DiagnosisStore(Protocol):
    """The diagnoses made: written by the analysis, read by the APIs and /metrics (exporter/prometheus.py)."""

    def put_diagnosis(
        self,
        attempt_id: int,
        body: str,
        summary: dict[str, Any],
        provisional: bool,
        analyzed_from: float,
        provenance: dict[str, Any] | None = None,
        claim: str | None = None,
    ) -> int | None: ...
    def get_diagnosis(self, diagnosis_id: str) -> DiagnosisRow | None: ...
    def diagnosis_revisions(self, diagnosis_id: str) -> list[RevisionRow]: ...
    def list_diagnoses(self, flt: DiagnosisFilter) -> list[DiagnosisRow]: ...
    def count_diagnoses(self, flt: DiagnosisFilter) -> int: ...
    def diagnoses_version(self) -> str: ...
    def diagnosis_facts(self, since: float) -> list[DiagnosisFacts]: ...


class FinalDiagnoses:
    """The bodies of a store's final (not provisional) diagnoses since a time, read page by page: what
    the cost roll-up (engine/fleet_cost.py `CostView`) reads, handed to it so the engine reads no store."""

    PAGE = 1000

    def __init__(self, store: DiagnosisStore) -> None:
        self.store = store

    def version(self) -> str:
        return self.store.diagnoses_version()

    def bodies(self, since_ns: int) -> list[str]:
        out: list[str] = []
        after: tuple[int | None, str] | None = None
        while True:
            rows = self.store.list_diagnoses(DiagnosisFilter(since_ns=since_ns, limit=self.PAGE, after=after))
            out.extend(row.body for row in rows if not row.provisional)
            if len(rows) < self.PAGE:
                return out
            after = (rows[-1].window_end_ns, rows[-1].id)


class FleetStore(Protocol):
    """Fleet memory: the marks of final diagnoses, kept with them (put_diagnosis takes `summary["marks"]`)."""

    def fleet_marks(self, since_s: float) -> list[FleetMark]: ...
    def fleet_pending(self, limit: int) -> list[tuple[str, str]]: ...
    def put_fleet_marks(self, diagnosis_id: str, marks: Sequence[FleetMark]) -> None: ...


class ExportQueue(Protocol):
    """The outbox (exporter/outbox.py): one row per diagnosis and exporter, claimed, then finished or retried."""

    exporters: tuple[str, ...]

    def claim_exports(self, exporter: str, now: float, limit: int, lease_s: float) -> list[PendingExport]: ...
    def finish_exports(self, ids: Sequence[int]) -> None: ...
    def retry_exports(self, ids: Sequence[int], due: float, error: str) -> None: ...
    def export_backlog(self) -> dict[str, tuple[int, float]]: ...
    def delivered(self, exporter: str, workload: str, attempt: int) -> Delivered | None: ...
    def record_delivery(self, receipts: Sequence[Delivered]) -> None: ...


class Coordination(Protocol):
    """What replicas sharing the store agree on through it (store/coordination.py): leases and claims.
    `shared` is False for a store one process uses (SQLite): then every lease is that process'."""

    shared: bool

    def acquire_lease(self, name: str, holder: str, now: float, ttl_s: float) -> bool: ...
    def release_lease(self, name: str, holder: str) -> None: ...
    def lease_holder(self, name: str, now: float) -> str | None: ...
    def claim_analysis(self, attempt_id: int, holder: str, now: float, *, due_only: bool = False) -> bool: ...
    def analysing_by(self, attempt_id: int) -> str | None: ...


class Store(IngestStore, DiagnosisStore, FleetStore, ExportQueue, Coordination, Protocol):
    """What the server needs from a store: all three roles, retention and housekeeping.
    Every method is safe to call from any thread."""

    def sweep(self, now: float, retention: Retention) -> int: ...
    def ping(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
