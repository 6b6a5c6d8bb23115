"""The attribution service behind every API: accept tagged records, decide when to analyse, analyse.

    IngestQueue     bounded queue in front of the store; one writer thread commits batches (group
                    commit) and only then resolves the caller's future, so OTLP acknowledges what is
                    on disk. Full → `Backpressure` (UNAVAILABLE + RetryInfo / 503 + Retry-After).
    Attribution     owns the store, the engine and the trigger loop: an attempt is analysed when a
                    terminal state arrived and `settle_s` passed, when it was idle for
                    `idle_timeout_s` (provisional if it has not ended), or when asked to.

Errors, as the APIs map them:

    HypocenterError
    ├── InputError          bad request: OTLP INVALID_ARGUMENT / HTTP 400 (413, 415 for their subclasses)
    │   └── UnknownAttempt  no such attempt: NOT_FOUND / 404
    └── TransientError
        └── Backpressure    the ingest queue is full: UNAVAILABLE + RetryInfo / 503 + Retry-After

Nothing here knows a wire format: the gRPC and HTTP front ends translate.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hypocenter.collector.connectors import connector_class
from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy
from hypocenter.config import Settings
from hypocenter.engine import CostSettings, Engine, default_engine
from hypocenter.engine.extract import THINNED_KEEP, THINNED_KINDS, Extractor
from hypocenter.engine.fleet_cost import CostView
from hypocenter.engine.prefilter import joined
from hypocenter.errors import InputError, TransientError
from hypocenter.exporter.activity import Activity
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Diagnosis, Window, Workload
from hypocenter.server import quarantine
from hypocenter.server.arrival import Arrival, Reduced, Scans
from hypocenter.server.attempts import assemble, summary
from hypocenter.server.compaction import CompactionReport, compact
from hypocenter.server.fleet import backfill, fleet_view, with_history
from hypocenter.server.leadership import KUEUE_POLL, OUTBOX, SLURM_POLL, Leadership
from hypocenter.server.pulls import KueuePoller, Pulls, SlurmPoller, records_document
from hypocenter.sources import RecordSource, Source, TextSource, text_lines
from hypocenter.store.base import (
    AttemptRow,
    DiagnosisFilter,
    DiagnosisRow,
    Entry,
    FinalDiagnoses,
    Point,
    RecordBlock,
    Retention,
    Store,
    StoreUnavailable,
    StreamConflict,
)
from hypocenter.store.stats import StatsCache

log = logging.getLogger("hypocenter.server")


SERVER_CLIENT = {"client": "hypocenter", "role": "server"}  # the server's own triggers and pollers
# Reductions of one group lost to other writers of its streams before it is refused (the client retries).
# Each lost one means another writer's batch was stored: the streams move on.
CONFLICT_RETRIES = 50


def provenance(source: str, client: Mapping[str, str] | None, **extra: Any) -> dict[str, Any]:
    """Where a stored verdict or scope came from: `source` (otlp | bundle | put | scope | pull), the
    authenticated client and its role (the listeners' `Identity.provenance()`), and when."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {"source": source, **(client or SERVER_CLIENT), "time": when, **extra}


class Backpressure(TransientError):
    """The ingest queue is full: the client should retry after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"ingest queue is full: retry in {retry_after:g} s")
        self.retry_after = retry_after


class UnknownAttempt(InputError):
    """An attempt the server has no data and no scope for."""


@dataclass(slots=True)
class _Batch:
    logs: Sequence[Entry]
    points: Sequence[Point]
    future: Future[int]
    blocks: Sequence[RecordBlock] = ()

    @property
    def size(self) -> int:
        return len(self.logs) + len(self.points) + sum(len(b) for b in self.blocks)


class IngestEvents:
    """Records become events as they arrive: the same extraction rules as `hypocenter analyze`, run on
    each committed batch's candidate lines with the record's own node and stream.

    What these events are for: the extracted-events metric, and the hang trigger — a workload that
    reports a watchdog or heartbeat timeout is marked stalled, so it gets a provisional diagnosis
    as soon as it goes quiet instead of after the idle timeout. The verdict itself is made from the
    store with the attempt's scope (rank map, window, timezone), which a single record does not
    know; compaction keeps exactly the lines that verdict can read."""

    STALL_KINDS = frozenset({"watchdog_timeout", "heartbeat_timeout"})

    def __init__(self, extractor: Extractor, activity: Activity) -> None:
        self._extractor = extractor
        self._activity = activity

    def __call__(
        self, logs: Sequence[Entry], blocks: Sequence[RecordBlock] = (), scans: Scans | None = None
    ) -> tuple[list[tuple[str, int, int]], Callable[[], None]]:
        """(workload, attempt, time) of stalls, and what to call once the batch is committed (the
        metric counts only events of records that were stored: a refused batch is sent again).
        `scans`: the batch's blocks scanned, shared with the reduction on arrival."""
        scans = scans or Scans(self._extractor)
        texts = [e for e in logs if e.kind == "text" and e.body]
        # Per stream, its candidate lines' texts and times (records of a block: no Entry each).
        streams: dict[tuple[str | None, int, str | None, str], tuple[list[str], list[int]]] = defaultdict(
            lambda: ([], [])
        )
        for i in scans.of([e.body for e in texts]).candidates() if texts else ():
            e = texts[i]
            bodies, times = streams[(e.workload, e.attempt, e.node, e.stream)]
            bodies.append(e.body)
            times.append(e.time_ns)
        for block in blocks:
            found = scans.candidates(block)
            if found:
                bodies, times = streams[block.key]
                bodies.extend(block.bodies[i] for i in found)
                times.extend(block.times[i] for i in found)
        if not streams:
            return [], _nothing
        kinds: dict[str, int] = defaultdict(int)
        stalls: list[tuple[str, int, int]] = []
        for (workload, attempt, node, stream), (bodies, times) in streams.items():
            stamps = [t for t in times if t] or [time.time_ns()]
            lo = datetime.fromtimestamp(min(stamps) / 1e9, timezone.utc)
            hi = datetime.fromtimestamp(max(stamps) / 1e9, timezone.utc)
            ctx = AttemptContext(
                workload=Workload(id=workload or "-", attempt=attempt),
                window=Window(start=lo - timedelta(hours=1), end=hi + timedelta(hours=1)),
                nodes=[node] if node else [],
            )
            counted = self._counted(bodies, stream, node, ctx, scans.inert)
            if counted is not None:
                for kind, n in counted.items():
                    kinds[kind] += n
                continue
            src = TextSource(name=stream, text="\n".join(bodies), node=node)
            for ev in self._extractor.extract([src], ctx, time_context(ctx)).events:
                kinds[ev.kind] += 1
                if ev.kind in self.STALL_KINDS and workload is not None:
                    stalls.append(
                        (workload, attempt, int(ev.time.timestamp() * 1e9) if ev.time else max(stamps))
                    )
        return stalls, lambda: self._activity.extracted(kinds)

    def _counted(
        self,
        bodies: list[str],
        stream: str,
        node: str | None,
        ctx: AttemptContext,
        inert: dict[str, bool] | None = None,
    ) -> dict[str, int] | None:
        """The events of each kind the stream's candidate lines `bodies` give, each distinct line
        extracted once — or None when that would not be what extracting them together gives: a rule
        that reads lines around its own (which are the other candidates here) or makes a stall (whose
        time the lines before it give). Every other rule reads its line alone, so a line repeated
        (a storm of one WARN) gives its events again, and an `inert` line none (`inert`: lines the
        reduction on arrival told already)."""
        ex = self._extractor
        if not ex.tokens_exact:
            return None
        data, starts = joined(bodies)
        per_line: dict[int, list[int]] = {}
        for tok, at, _ in ex.scan(data):
            per_line.setdefault(bisect.bisect_right(starts, at) - 1, []).append(tok)
        alone: dict[tuple[int, ...], bool] = {}
        repeats: dict[str, int] = {}  # each distinct line → how often it came
        tokens: dict[str, tuple[int, ...]] = {}
        for i, found in per_line.items():
            key = tuple(sorted(set(found)))
            ok = alone.get(key)
            if ok is None:
                ok = alone[key] = ex.alone(key, self.STALL_KINDS)
            if not ok:
                return None
            body = bodies[i]
            if body in repeats:
                repeats[body] += 1
            else:
                repeats[body] = 1
                tokens[body] = key
        texts = list(repeats)
        told = ex.inert_lines(texts, [tokens[t] for t in texts], inert)  # the reduction's, mostly
        for text, quiet in zip(texts, told, strict=True):
            if quiet:
                del repeats[text]
        counted: dict[str, int] = defaultdict(int)
        if not repeats:
            return counted
        lines = list(repeats)
        if any("\n" in line for line in lines):  # a record of several lines: extraction numbers each
            return None
        src = TextSource(name=stream, text="\n".join(lines), node=node)
        for ev in ex.extract([src], ctx, time_context(ctx)).events:
            counted[ev.kind] += repeats[lines[int(ev.ref.rsplit(":", 1)[1]) - 1]]
        for kind in THINNED_KINDS & counted.keys():  # a stream keeps its first and last THINNED_KEEP
            counted[kind] = min(counted[kind], 2 * THINNED_KEEP)
        return counted


def _nothing() -> None:
    pass


# How often the analysis loop reads the attempts due again while it works through a long list.
DUE_REFRESH_S = 1.0


def tenant(row: AttemptRow) -> str:
    """Whose attempt this is, for fair turns: its cluster (attempt.yaml, `hypocenter.workload.cluster`
    or the scheduler's cluster attribute); '' when it names none."""
    workload = (row.context or {}).get("workload") or {}
    return str(workload.get("cluster") or row.scope.get("cluster") or "")


def fair_order(rows: Sequence[AttemptRow]) -> list[AttemptRow]:
    """`rows` (oldest first) interleaved by tenant: each tenant's oldest, then each one's next, …;
    tenants in the order of their oldest row."""
    queues: dict[str, deque[AttemptRow]] = {}
    for row in rows:
        queues.setdefault(tenant(row), deque()).append(row)
    out: list[AttemptRow] = []
    while queues:
        for key in list(queues):
            out.append(queues[key].popleft())
            if not queues[key]:
                del queues[key]
    return out


def _refusal(exc: Exception) -> Exception:
    """What a request whose records the store did not take is answered. A value the store cannot
    hold (DB-API `DataError`, which SQLite and psycopg raise for a number out of range, or Python's
    own conversion errors) fails again however often it is sent: INVALID_ARGUMENT / 400. Anything
    else is the store's trouble: UNAVAILABLE / 503, retried."""
    permanent = isinstance(exc, OverflowError | ValueError | TypeError) or any(
        c.__name__ == "DataError" for c in type(exc).__mro__
    )
    if permanent:
        log.warning("a request's records were refused by the store: %s", exc)
        return InputError(f"the store cannot keep a value of this request: {exc}")
    if not isinstance(exc, StoreUnavailable):  # an outage is logged by the store, once
        log.error("store write failed: %s", exc)
    return TransientError(f"store write failed: {exc}")


class IngestQueue:
    """Bounded by records waiting; a request larger than the whole queue is still taken when it is empty."""

    def __init__(
        self,
        store: Store,
        capacity: int,
        retry_after: float,
        on_commit: Callable[[], None] | None = None,
        events: Callable[
            [Sequence[Entry], Sequence[RecordBlock], Scans | None],
            tuple[list[tuple[str, int, int]], Callable[[], None]],
        ]
        | None = None,
        arrival: Arrival | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self._arrival = arrival
        self.capacity = capacity
        self.retry_after = retry_after
        self._on_commit = on_commit
        self._queue: deque[_Batch] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hypocenter-ingest", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._pending

    def submit(
        self, logs: Sequence[Entry], points: Sequence[Point], blocks: Sequence[RecordBlock] = ()
    ) -> Future[int]:
        batch = _Batch(logs, points, Future(), blocks)
        if batch.size == 0:
            batch.future.set_result(0)
            return batch.future
        with self._cond:
            if self._closed:
                raise Backpressure(self.retry_after)
            if self._pending and self._pending + batch.size > self.capacity:
                raise Backpressure(self.retry_after)
            self._queue.append(batch)
            self._pending += batch.size
            self._cond.notify()
        return batch.future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                batches: list[_Batch] = []
                size = 0
                while self._queue and (not batches or size + self._queue[0].size <= 50_000):
                    b = self._queue.popleft()
                    batches.append(b)
                    size += b.size
            try:
                self._commit(batches)
            except Exception as exc:
                refusal = _refusal(exc)
                if len(batches) == 1 or not isinstance(refusal, InputError):
                    for b in batches:  # the store failed: no request of the group is acknowledged
                        b.future.set_exception(refusal)
                else:  # a value it cannot keep: each request is tried alone, so that one request's
                    # unstorable record does not fail the others batched with it
                    for b in batches:
                        try:
                            self._commit([b])
                        except Exception as alone:
                            b.future.set_exception(_refusal(alone))
                        else:
                            b.future.set_result(b.size)
                            self._committed()
            else:
                for b in batches:
                    b.future.set_result(b.size)
                self._committed()
            finally:
                with self._cond:
                    self._pending -= size

    def _committed(self) -> None:
        if self._on_commit is not None:
            self._on_commit()

    def _commit(self, batches: list[_Batch]) -> None:
        """Reduce and store one group of requests. Another replica (or writer) may store records of the
        same stream between this reduction's read of the stream's state and its write: the write is
        then refused whole (`StreamConflict`) and the group reduced again on the state as it is now."""
        logs = [e for b in batches for e in b.logs]
        blocks = [k for b in batches for k in b.blocks]
        points = [p for b in batches for p in b.points]
        stalls: list[tuple[str, int, int]] = []
        committed = _nothing
        scans = self._arrival.scans() if self._arrival else None  # each block scanned once, for both
        for attempt in range(1, CONFLICT_RETRIES + 1):
            now = time.time()
            reduced = (
                self._arrival.split(self._store, logs, now, blocks, scans)
                if self._arrival
                else Reduced([*logs, *(e for k in blocks for e in k.entries())], [])
            )
            if self._events is not None and attempt == 1:
                try:
                    stalls, committed = self._events(logs, blocks, scans)
                except Exception:  # a trigger hint; the records themselves must still be stored
                    log.exception("extraction on ingest")
            try:
                self._store.ingest(reduced.rest, points, now, stalls, reduced.writes)
            except StreamConflict:
                if attempt == CONFLICT_RETRIES:
                    raise
                log.debug("stream state changed while reducing (attempt %d): reducing again", attempt)
                continue
            if self._arrival:
                self._arrival.committed(reduced)
            committed()
            return

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class Attribution:
    """The service: store + engine + ingest queue + the loop that fires the triggers."""

    def __init__(self, settings: Settings, store: Store, engine: Engine | None = None) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine or default_engine(
            [Path(p) for p in settings.rules],
            builtin=not settings.no_builtin_rules,
            cost=CostSettings(
                gpus_per_node=settings.cost_gpus_per_node,
                checkpoint_interval_steps=settings.cost_checkpoint_interval_steps,
            ),
        )
        self.retention = Retention(
            max_age_s=settings.retention_max_age_s,
            max_lines_per_stream=settings.retention_max_lines_per_stream,
            diagnoses_max_age_s=settings.retention_diagnoses_max_age_s,
        )
        self.activity = Activity(settings.label_max_values)  # what this process did, for /metrics
        self.stats = StatsCache(store)  # the store's counts for /readyz and /metrics, recounted off requests
        self.queue = IngestQueue(
            store,
            settings.ingest_queue_records,
            settings.retry_after_s,
            self._wake_loop,
            IngestEvents(self.engine.extractor, self.activity),
            None if settings.store_every_line else Arrival(self.engine.extractor, self.activity.compacted),
        )
        self.pulls = Pulls(settings, self.engine.ruleset)
        self.fleet = fleet_view(settings, store)
        roles = [OUTBOX]
        if settings.slurm_poll_s > 0:
            roles.append(SLURM_POLL)
        if settings.kube_poll_s > 0:
            roles.append(KUEUE_POLL)
        # Replicas on one PostgreSQL: one polls each scheduler and one runs the outbox (leases)
        self.leadership = Leadership(store, roles, holder=settings.replica_id, lease_s=settings.lease_s)
        self.cost = CostView(
            FinalDiagnoses(store), window_s=settings.cost_window_s, topology=self.fleet.topology
        )
        self.pollers: list[SlurmPoller | KueuePoller] = []
        if settings.slurm_poll_s > 0:
            self.pollers.append(
                SlurmPoller(settings, self.store_scope, active=lambda: self.leadership.holds(SLURM_POLL))
            )
        if settings.kube_poll_s > 0:
            self.pollers.append(
                KueuePoller(settings, self.store_scope, active=lambda: self.leadership.holds(KUEUE_POLL))
            )
        self._analysis = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._watchers: list[Callable[[DiagnosisRow], None]] = []
        self._watch_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.analyses = 0

    # ------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.leadership.start()
        self._recover()
        self._thread = threading.Thread(target=self._loop, name="hypocenter-triggers", daemon=True)
        self._thread.start()
        for poller in self.pollers:
            poller.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for poller in self.pollers:
            poller.close()
        self.queue.close()
        if self._thread is not None:
            self._thread.join(30.0)
        self.leadership.close()

    def _recover(self) -> None:
        """Analyses a process died in (at start), or, on a shared store, that a replica which is gone
        had claimed: counted, and quarantined when it keeps happening (server/quarantine.py)."""
        shared = self.leadership.shared
        for row in self.store.recover_interrupted(
            time.time(), quarantine.QUARANTINE_AFTER_INTERRUPTIONS, live_replicas=shared
        ):
            self.activity.analysis_failed("interrupted")
            log.warning("workload %r attempt %d quarantined: %s", row.workload, row.attempt, row.failure)

    def _wake_loop(self) -> None:
        if self.settings.settle_s == 0:
            self._wake.set()

    def _loop(self) -> None:
        last_sweep = last_recovery = 0.0
        try:  # diagnoses an older hypocenter stored join fleet memory once, before the first trigger
            backfill(self.store, self._stop.is_set)
        except StoreUnavailable:
            pass
        except Exception:
            log.exception("fleet memory backfill")
        while not self._stop.is_set():
            self._wake.wait(self.settings.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.time()
            try:
                if self.leadership.shared and now - last_recovery >= self.settings.lease_s:
                    self._recover()  # claims of replicas that are gone
                    last_recovery = now
                self._analyze_due()
                if self._stop.is_set():
                    return
                if now - last_sweep >= self.settings.retention_interval_s:
                    removed = self.store.sweep(now, self.retention)
                    last_sweep = now
                    if removed:
                        log.info("retention removed %d rows", removed)
                    self.compact(now)
            except StoreUnavailable:  # logged by the store, once per outage; the next tick retries
                pass
            except Exception:  # the loop must outlive one bad attempt; the next tick retries
                log.exception("trigger loop")

    def _analyze_due(self) -> None:
        """Analyse the attempts due, one cluster at a time in turn (`fair_order`), so that one
        cluster's flood of finished attempts does not hold back another's verdict; the list is read
        again every DUE_REFRESH_S, so an attempt that becomes due meanwhile takes its turn then."""
        done: set[tuple[str, int]] = set()
        while not self._stop.is_set():
            due = [
                row
                for row in self.store.attempts_due(
                    time.time(), self.settings.settle_s, self.settings.idle_timeout_s
                )
                if (row.workload, row.attempt) not in done
            ]
            if not due:
                return
            until = time.monotonic() + DUE_REFRESH_S
            for row in fair_order(due):
                if self._stop.is_set():
                    return
                done.add((row.workload, row.attempt))
                with contextlib.suppress(quarantine.AnalysisFailed):  # recorded and logged: go on
                    self._analyze_row(row.workload, row.attempt)
                if time.monotonic() >= until:
                    break

    def compact(self, now: float | None = None) -> CompactionReport:
        """Blank the raw lines no rule can read once they are `compact_after_s` old (see compaction)."""
        if self.settings.compact_after_s < 0:
            return CompactionReport()
        report = compact(
            self.store,
            self.engine.extractor,
            time.time() if now is None else now,
            self.settings.compact_after_s,
            collapse_after_s=self.settings.collapse_after_s,
        )
        self.activity.compacted(report.blanked, report.bytes_freed)
        return report

    # ------------------------------------------------------------------------------- analysis

    def analyze(
        self, workload: str, attempt: int, client: Mapping[str, str] | None = None
    ) -> tuple[Diagnosis, bool]:
        """Analyse now (the explicit trigger, by `client`). Returns the diagnosis and whether it is provisional."""
        out = self._analyze_row(workload, attempt, client, explicit=True)
        if out is None:
            raise UnknownAttempt(f"no data and no scope for workload {workload!r} attempt {attempt}")
        return out

    def _analyze_row(
        self, workload: str, attempt: int, client: Mapping[str, str] | None = None, *, explicit: bool = False
    ) -> tuple[Diagnosis, bool] | None:
        with self._analysis:
            row = self.store.attempt(workload, attempt)
            if row is None:
                return None
            claimed = self._claim(row.id, wait=explicit)
            if claimed is None:
                return None  # another replica is analysing it: its verdict is stored for all
            started = claimed
            try:
                inp = assemble(
                    self.store,
                    row,
                    lookback_s=self.settings.node_lookback_s,
                    slack_s=self.settings.node_slack_s,
                    now=datetime.now(timezone.utc),
                )
                if self.pulls:
                    pulled, covered = self.pulls.collect(inp)
                    inp.sources.extend(pulled)
                    inp.coverage.extend(covered)
                diagnosis = with_history(self.fleet, self.engine.analyze(inp))
            except TransientError:
                self.store.mark_analysing(row.id, None, (self.leadership.holder, started))
                raise
            except Exception as exc:  # a poison attempt: recorded with the reason, never retried into a crash
                reason = quarantine.describe(exc)
                self.store.fail_analysis(row.id, reason, time.time(), started, self.leadership.holder)
                self.activity.analysis_failed(quarantine.failure_kind(exc))
                log.warning(
                    "analysis of workload %r attempt %d failed, quarantined until new data arrives: %s",
                    workload,
                    attempt,
                    reason,
                    exc_info=not isinstance(exc, InputError),
                )
                raise quarantine.AnalysisFailed(workload, attempt, reason) from None
            provisional = inp.context.state is None
            body = diagnosis.to_json()
            # The verdict's source is where its scope came from (a PUT, a scope request, a poll), else
            # the records that arrived over OTLP; its client is who asked for it, else who set the scope.
            scope = row.scope_provenance or {}
            origin: dict[str, str] | None = {
                k: str(scope[k]) for k in ("client", "role") if k in scope
            } or None
            stored = self.store.put_diagnosis(
                row.id,
                body,
                summary(diagnosis.model_dump(by_alias=True), inp.context),
                provisional,
                started,
                provenance(
                    scope.get("source", "otlp"), client or origin, trigger="request" if client else "auto"
                ),
                claim=self.leadership.holder,
            )
            if stored is None:  # paused past its lease: another replica took the attempt back
                log.info(
                    "analysis of workload %r attempt %d dropped: replica %s lost its claim meanwhile",
                    workload,
                    attempt,
                    self.leadership.holder,
                )
                return (diagnosis, provisional) if explicit else None
            self.analyses += 1
            self.activity.analysed(diagnosis, provisional, time.time() - started)
        log.info(
            "diagnosis %s for workload %r attempt %d: %s%s",
            diagnosis.id,
            workload,
            attempt,
            diagnosis.outcome,
            " (provisional)" if provisional else "",
        )
        self._publish(diagnosis.id)
        return diagnosis, provisional

    def _claim(self, attempt_id: int, *, wait: bool) -> float | None:
        """Claim the attempt's analysis for this replica; returns when (the analysis reads the store
        from then on). Another replica's analysis under way: None, or, for an explicit request
        (`wait`), this replica's own once that one is over (the request is answered with a verdict)."""
        holder = self.leadership.holder
        deadline = time.monotonic() + self.settings.lease_s * 4
        while True:
            now = time.time()
            if self.store.claim_analysis(attempt_id, holder, now, due_only=not wait):
                return now
            if not wait or self._stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise TransientError(
                    f"replica {self.store.analysing_by(attempt_id)} is analysing this attempt: try again"
                )
            time.sleep(0.05)

    def analyze_context(
        self, context: AttemptContext, diagnosis: Diagnosis, client: Mapping[str, str] | None = None
    ) -> int:
        """Store a diagnosis made outside the stream (an uploaded bundle, by `client`) under its attempt,
        as a new revision when the attempt had another verdict. Returns the revision."""
        now = time.time()
        prov = provenance("bundle", client)
        self.store.set_context(
            context.workload.id, context.workload.attempt, context.model_dump(mode="json"), now, prov
        )
        row = self.store.attempt(context.workload.id, context.workload.attempt)
        assert row is not None
        before = self.store.get_diagnosis(diagnosis.id)
        revision = self.store.put_diagnosis(
            row.id,
            diagnosis.to_json(),
            summary(diagnosis.model_dump(by_alias=True), context),
            context.state is None,
            time.time() + 1e9,
            prov,
        )
        assert revision is not None  # no claim to lose: always stored
        if revision > 1 and (before is None or before.revision != revision):
            log.warning(
                "bundle upload by %s made revision %d of workload %s attempt %d",
                prov["client"],
                revision,
                context.workload.id,
                context.workload.attempt,
            )
        self.activity.analysed(diagnosis, context.state is None, None)
        self._publish(diagnosis.id)
        return revision

    def store_scope(
        self,
        context: AttemptContext,
        sources: Sequence[Source],
        source: str = "pull",
        client: Mapping[str, str] | None = None,
    ) -> bool:
        """Keep a scope connector's attempt as the attempt's own, with what it brought: scheduler
        records (one records document) and logs only it can reach (Kubernetes pod logs, line by
        line, as a collector would send them). False when the store already holds exactly this
        scope (a poll that saw the job again)."""
        scope = context.model_dump(mode="json")
        row = self.store.attempt(context.workload.id, context.workload.attempt)
        if row is not None and row.context == scope:
            return False
        wl, attempt = context.workload.id, context.workload.attempt
        end_ns = int(context.window.end.timestamp() * 1e9)

        def dedup(*parts: str) -> str:
            return hashlib.blake2b(
                "\x1f".join(parts).encode("utf-8", "surrogatepass"), digest_size=16
            ).hexdigest()

        entries: list[Entry] = []
        records = [s for s in sources if isinstance(s, RecordSource)]
        if records:
            body = json.dumps(
                records_document(records), sort_keys=True, separators=(",", ":"), ensure_ascii=False
            )
            entries.append(
                Entry(
                    workload=wl,
                    attempt=attempt,
                    node=None,
                    stream=f"{context.workload.scheduler or 'scheduler'}/records",
                    kind="doc",
                    body=body,
                    time_ns=end_ns,
                    line=None,
                    dedup=dedup("scope", wl, str(attempt), body),
                )
            )
        now = time.time()
        for src in sources:
            if isinstance(
                src, TextSource
            ):  # a pod log is read in pieces (a spooled file), stored 50,000 lines at a time
                for i, line in enumerate(text_lines(src), 1):
                    if line or i == 1:
                        entries.append(
                            Entry(
                                workload=wl,
                                attempt=attempt,
                                node=src.node,
                                stream=src.name,
                                kind="text",
                                body=line,
                                time_ns=end_ns,
                                line=i,
                                dedup=dedup("scope", wl, str(attempt), src.name, str(i), line),
                            )
                        )
                    if len(entries) == 50_000:
                        self.store.ingest(entries, [], now)
                        entries = []
        if entries:
            self.store.ingest(entries, [], now)
        self.store.set_context(wl, attempt, scope, now, provenance(source, client))
        self._wake_loop()
        return True

    def analyze_scope(
        self, kind: str, job: str, client: Mapping[str, str] | None = None
    ) -> tuple[Diagnosis, bool]:
        """The explicit trigger by scheduler id: scope the job with its connector (`slurm`, `kueue`,
        `k8s_job`), keep that scope, analyse now (with the pull connectors, if configured)."""
        policy = RetryPolicy(timeout_s=self.settings.pull_timeout_s)
        try:
            if kind == "slurm":
                connector = connector_class("slurm")(
                    job, policy=policy, rest_url=self.settings.slurm_rest_url or None
                )
            else:
                kubernetes = connector_class("kubernetes")
                kwargs = {
                    "kubeconfig": self.settings.kubeconfig or None,
                    "context": self.settings.kube_context or None,
                    "policy": policy,
                }
                connector = (
                    kubernetes.for_kueue(job, **kwargs)
                    if kind == "kueue"
                    else kubernetes.for_job(job, **kwargs)
                )
            scope = connector.scope()
        except ConnectorError as exc:
            if exc.kind == "not_found":
                raise UnknownAttempt(f"{kind} {job}: {exc}") from None
            raise ConnectorError(
                f"{kind} {job}: {exc}", kind=exc.kind
            ) from None  # transient or input, as it was
        self.store_scope(scope.context, scope.collected.sources, "scope", client)
        return self.analyze(scope.context.workload.id, scope.context.workload.attempt, client)

    def set_context(self, context: AttemptContext, client: Mapping[str, str] | None = None) -> None:
        self.store.set_context(
            context.workload.id,
            context.workload.attempt,
            context.model_dump(mode="json"),
            time.time(),
            provenance("put", client),
        )
        self._wake_loop()

    # ------------------------------------------------------------------------------- reading

    def diagnosis(self, diagnosis_id: str) -> DiagnosisRow | None:
        return self.store.get_diagnosis(diagnosis_id)

    def diagnoses(self, flt: DiagnosisFilter) -> list[DiagnosisRow]:
        return self.store.list_diagnoses(flt)

    def watch(self, callback: Callable[[DiagnosisRow], None]) -> Callable[[], None]:
        """Call `callback` with every diagnosis stored from now on; returns the unsubscribe function."""
        with self._watch_lock:
            self._watchers.append(callback)

        def cancel() -> None:
            with self._watch_lock:
                if callback in self._watchers:
                    self._watchers.remove(callback)

        return cancel

    def _publish(self, diagnosis_id: str) -> None:
        with self._watch_lock:
            watchers = list(self._watchers)
        if not watchers:
            return
        row = self.store.get_diagnosis(diagnosis_id)
        if row is None:
            return
        for w in watchers:
            try:
                w(row)
            except Exception:  # a slow or gone watcher never blocks analysis
                log.exception("diagnosis watcher")
