"""The outbox: deliver every stored diagnosis to each configured exporter, without ever holding up analysis.

The store is the source of truth. `put_diagnosis` writes one `exports` row per configured exporter
in the diagnosis' own transaction, so a diagnosis is never stored without its pending exports, and
a crash between storing and sending loses nothing: the rows are still there at the next start. One
thread here claims due rows (a lease, so a second replica on the same database skips them), sends
them, and deletes them once delivered (at least once: Loki drops an identical entry it already
has, and an annotation may repeat after a crash mid-send). Replicas sharing PostgreSQL each run
this thread, but only the one holding the outbox lease delivers (server/leadership.py).

One verdict per attempt: what each exporter delivered for an attempt is kept (a receipt: the
diagnosis id, its revision and the receiver's id for it), and a `RevisingExporter` gets it with
the next verdict of that attempt, so a final diagnosis replaces the provisional one it delivered
(Grafana: the same annotation, updated; Loki: an entry that names the one it supersedes).

Failures, as exporters raise them:

    HypocenterError
    ├── InputError
    │   └── ExportRejected      permanent (HTTP 4xx but 401/403/408/429): counted by reason, logged, dropped. A batch
    │                           that is rejected is retried one diagnosis at a time first, so one bad
    │                           diagnosis never takes its neighbours down with it.
    └── TransientError
        └── ExportUnavailable   transient (5xx, 408, 429, connection refused, timeout; 401/403, which an
                                operator fixes without losing anything): the rows are
                                retried with exponential back-off and jitter (Retry-After wins), and
                                the exporter pauses, so a down Loki costs one request per back-off.

Rows older than `max_age_s` are dropped as `expired` (Loki refuses entries older than a week by
default); rows whose diagnosis was replaced under another id or removed by retention are dropped as
`superseded`. Every outcome is counted in `Activity` (→ /metrics) and nothing here raises into the
analysis: the thread outlives any exporter error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hypocenter.errors import InputError, TransientError
from hypocenter.exporter.activity import Activity
from hypocenter.store.base import Delivered, DiagnosisRow, ExportQueue, PendingExport, StoreUnavailable

log = logging.getLogger("hypocenter.outbox")


class ExportRejected(InputError):
    """The receiver refused the payload; sending it again will not help. `reason` labels the drop
    (hypocenter_export_dropped_total): `rejected`, or what the exporter knows, e.g. Loki's `too_old`."""

    def __init__(self, message: str, reason: str = "rejected") -> None:
        super().__init__(message)
        self.reason = reason


class ExportUnavailable(TransientError):
    """The receiver could not take the payload now; `retry_after` seconds, when it said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def classify_status(
    status: int, body: str, retry_after: str | None = None
) -> ExportRejected | ExportUnavailable:
    """The error an HTTP answer that is not a success means (shared by the HTTP exporters)."""
    text = f"HTTP {status}: {body.strip()[:300]}"
    if status in (401, 403):  # credentials or permissions: fixable by an operator, keep the diagnoses
        return ExportUnavailable(f"{text} (check the exporter's credentials)")
    if status in (408, 429) or status >= 500:
        delay: float | None = None
        if retry_after is not None and retry_after.strip().isdigit():
            delay = float(retry_after.strip())
        return ExportUnavailable(text, delay)
    return ExportRejected(text)


class Exporter(Protocol):
    """Where diagnoses go. `send` delivers all of `batch` or raises one of the two errors above."""

    name: str
    max_batch: int

    def send(self, batch: Sequence[DiagnosisRow]) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class RevisingExporter(Protocol):
    """An exporter that shows one verdict per attempt: `revise` delivers each row with what was
    delivered for its attempt before (None the first time), so a final diagnosis replaces the
    provisional one (Grafana: the same annotation, updated; Loki: an entry that says what it
    supersedes), and returns the receiver's id for each row ('' when it gives none)."""

    name: str
    max_batch: int

    def revise(self, batch: Sequence[tuple[DiagnosisRow, Delivered | None]]) -> list[str]: ...


@dataclass
class InMemoryExporter:
    """The test double: keeps what it was sent; `fail_with` errors are raised first, one per call."""

    name: str = "memory"
    max_batch: int = 100
    sent: list[DiagnosisRow] = field(default_factory=list)
    fail_with: list[Exception] = field(default_factory=list)
    calls: int = 0

    def send(self, batch: Sequence[DiagnosisRow]) -> None:
        self.calls += 1
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.sent.extend(batch)

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds before retry n (1, 2, …): base·2ⁿ⁻¹, capped, with ±20% jitter so replicas spread out."""

    base_s: float = 1.0
    max_s: float = 300.0

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_s)
        raw: float = min(self.base_s * 2.0 ** max(0, failures - 1), self.max_s)
        jitter: float = random.uniform(0.8, 1.2)
        return raw * jitter


class Outbox:
    """One delivery thread for all exporters; `wake()` after storing a diagnosis to send it now."""

    def __init__(
        self,
        store: ExportQueue,
        exporters: Sequence[Exporter],
        activity: Activity,
        *,
        backoff: Backoff | None = None,
        max_age_s: float = 6 * 86400.0,
        poll_s: float = 5.0,
        lease_s: float = 60.0,
        active: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self._active = active or (lambda: True)  # whether this replica delivers (server/leadership.py)
        self.exporters = list(exporters)
        self.activity = activity
        self.backoff = backoff or Backoff()
        self.max_age_s = max_age_s
        self.poll_s = poll_s
        self.lease_s = lease_s
        self._failures: dict[str, int] = {e.name: 0 for e in self.exporters}
        self._paused_until: dict[str, float] = {e.name: 0.0 for e in self.exporters}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hypocenter-outbox", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for e in self.exporters:
            try:
                e.close()
            except Exception:  # closing a client must not stop the others from closing
                log.exception("closing exporter %s", e.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = False
            for exporter in self.exporters if self._active() else ():
                if self._stop.is_set():
                    return
                try:
                    busy = self.deliver(exporter) or busy
                except StoreUnavailable:  # logged by the store, once per outage; the rows wait in it
                    pass
                except Exception:  # a store hiccup: the rows are still there next round
                    log.exception("outbox: %s", exporter.name)
            if not busy:
                now = time.time()
                resume = min((t for t in self._paused_until.values() if t > now), default=now + self.poll_s)
                self._wake.wait(max(0.01, min(self.poll_s, resume - now)))
                self._wake.clear()

    def deliver(self, exporter: Exporter) -> bool:
        """One round for one exporter; True when it sent something and may have more due."""
        now = time.time()
        if now < self._paused_until.get(exporter.name, 0.0):
            return False
        rows = self.store.claim_exports(exporter.name, now, exporter.max_batch, self.lease_s)
        if not rows:
            return False
        live: list[PendingExport] = []
        for r in rows:
            if r.diagnosis is None:
                self._drop(
                    exporter, [r], "superseded", "the diagnosis was replaced or removed before delivery"
                )
            elif r.created < now - self.max_age_s:
                self._drop(exporter, [r], "expired", f"not delivered within {self.max_age_s:g} s")
            else:
                live.append(r)
        if live:
            self._send(exporter, live, split=True)
        return True

    def _send(self, exporter: Exporter, rows: list[PendingExport], *, split: bool) -> None:
        batch = [r.diagnosis for r in rows if r.diagnosis is not None]
        try:
            if isinstance(exporter, RevisingExporter):
                before = [self.store.delivered(exporter.name, d.workload, d.attempt) for d in batch]
                refs = exporter.revise(list(zip(batch, before, strict=True)))
            else:
                exporter.send(batch)
                refs = [""] * len(batch)
        except ExportRejected as exc:
            self.activity.export_failed(exporter.name, "permanent")
            if split and len(rows) > 1:
                for i, r in enumerate(rows):
                    if time.time() < self._paused_until.get(exporter.name, 0.0):
                        self.store.retry_exports(
                            [x.id for x in rows[i:]],
                            self._paused_until[exporter.name],
                            "paused after a transient failure",
                        )
                        return
                    self._send(exporter, [r], split=False)
                return
            self._drop(exporter, rows, exc.reason, str(exc))
        except Exception as exc:  # ExportUnavailable, or an exporter bug: keep the rows, back off
            self.activity.export_failed(exporter.name, "transient")
            failures = self._failures.get(exporter.name, 0) + 1
            self._failures[exporter.name] = failures
            delay = self.backoff.delay(
                failures, exc.retry_after if isinstance(exc, ExportUnavailable) else None
            )
            due = time.time() + delay
            self._paused_until[exporter.name] = due
            self.store.retry_exports([r.id for r in rows], due, f"{type(exc).__name__}: {exc}")
            level = logging.WARNING if failures == 1 else logging.DEBUG
            if not isinstance(exc, ExportUnavailable):
                log.exception("exporter %s failed unexpectedly; retrying in %.1f s", exporter.name, delay)
            else:
                log.log(
                    level,
                    "exporter %s unavailable (%s); %d diagnosis(es) kept, retrying in %.1f s",
                    exporter.name,
                    exc,
                    len(rows),
                    delay,
                )
        else:
            if self._failures.get(exporter.name):
                log.info(
                    "exporter %s recovered after %d failure(s)", exporter.name, self._failures[exporter.name]
                )
            self._failures[exporter.name] = 0
            # what the receiver now shows for each attempt, before the rows leave the outbox: a crash
            # in between sends a row again, and it replaces what it already delivered
            self.store.record_delivery(
                [
                    Delivered(exporter.name, d.workload, d.attempt, d.id, d.revision, ref)
                    for d, ref in zip(batch, refs, strict=True)
                ]
            )
            self.store.finish_exports([r.id for r in rows])
            self.activity.exported(exporter.name, len(rows))

    def _drop(self, exporter: Exporter, rows: list[PendingExport], reason: str, detail: str) -> None:
        self.store.finish_exports([r.id for r in rows])
        self.activity.export_dropped(exporter.name, reason, len(rows))
        log.warning(
            "exporter %s: dropped %s (%s): %s",
            exporter.name,
            ", ".join(r.diagnosis_id for r in rows),
            reason,
            detail,
        )
