"""The contract every data connector passes, whatever its backend (issue 6):

1. no loss, no duplication: each of the N records the backend holds for the attempt's scope comes
   back exactly as often as it is held, across pages and splits (identical records included
   where the backend can hold them);
2. errors are classified: transient ones are retried and then, if they persist, reported as a
   failed coverage entry with the reason; permanent and auth errors are not retried and say so;
3. every call has a timeout: a backend that accepts the call and never answers is a transient
   timeout within the retry policy, never a hang;
4. `collect` never raises for a data source, even when the answer is garbage.

A backend is a `Harness` (below). Adding a connector to the contract is one class and one line in
HARNESSES: build the backend with given records, say which records came back, inject faults.
A fault a backend cannot have (a local directory does not answer 401) is listed out of `faults`
and its test is skipped for that harness, with the reason.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal, Protocol

import httpx
import pytest
from observability_fakes import FakeLoki, PushedEntry
from prometheus_support import PROMETHEUS, PROMTOOL, PrometheusProcess, backfilled_prometheus

from hypocenter.collector.connectors.base import Collected, DataConnector, RetryPolicy
from hypocenter.collector.connectors.files import FilesConnector
from hypocenter.collector.connectors.loki import LokiConnector, LokiLimits
from hypocenter.collector.connectors.prometheus import PrometheusConnector
from hypocenter.collector.connectors.scope import epoch_ns
from hypocenter.collector.sources import MetricSource, Series, TextSource
from hypocenter.model import AttemptContext

Fault = Literal["transient", "permanent", "auth", "stall", "garbage"]
START = datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)
NODES = ["node01", "node02", "node03"]
POLICY = RetryPolicy(timeout_s=2.0, attempts=3, backoff_s=0.01, max_backoff_s=0.02)
STALL_POLICY = RetryPolicy(timeout_s=0.3, attempts=2, backoff_s=0.01, max_backoff_s=0.01)


def attempt() -> AttemptContext:
    return AttemptContext.model_validate({
        "workload": {"id": "4242", "attempt": 0}, "state": "FAILED", "nodes": NODES,
        "window": {"start": START.isoformat(), "end": (START + timedelta(hours=1)).isoformat()}})


class Harness(Protocol):
    name: str
    faults: frozenset[Fault]  # the faults this backend can be made to show
    duplicates: bool  # whether the backend can hold two identical records

    def start(self, tmp_path: Path) -> None: ...
    def stop(self) -> None: ...
    def load(self, records: list[str]) -> Counter[str]:
        """Hold `records` for the attempt's scope (plus noise outside it); the records that a
        complete collection must return, each as often as it must return it."""
    def connector(self, policy: RetryPolicy) -> DataConnector: ...
    def records(self, collected: Collected) -> Counter[str]: ...
    def inject(self, fault: Fault, times: int) -> None:
        """The next `times` calls fail so (stall: the backend never answers any call)."""
    def requests(self) -> list[str]:
        """A fingerprint of every call the backend received, in order (a retry repeats one)."""


class FaultyTransport(httpx.MockTransport):
    """Canned failures in front of a real HTTP server; every request fingerprinted."""

    def __init__(self) -> None:
        self.real = httpx.HTTPTransport()
        self.queue: list[Fault] = []
        self.seen: list[str] = []
        self.lock = threading.Lock()
        super().__init__(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        with self.lock:
            self.seen.append(f"{request.method} {request.url} {body.decode(errors='replace')}")
            fault = self.queue.pop(0) if self.queue else None
        if fault == "transient":
            return httpx.Response(503, json={"status": "error", "errorType": "unavailable", "error": "injected"})
        if fault == "permanent":
            return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "injected"})
        if fault == "auth":
            return httpx.Response(401, text="injected: unauthorized")
        if fault == "garbage":
            return httpx.Response(200, text="<html>a proxy's login page</html>")
        response = self.real.handle_request(request)
        response.read()
        return response

    def close(self) -> None:
        self.real.close()


class BlackHole:
    """A server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


# ----------------------------------------------------------------------------------------- harnesses


class LokiHarness:
    name = "loki"
    faults: frozenset[Fault] = frozenset({"transient", "permanent", "auth", "stall", "garbage"})
    duplicates = True

    def start(self, tmp_path: Path) -> None:
        # small pages and a short max_query_length, so that N records take many pages and pieces
        self.fake = FakeLoki(ties="random", max_query_length_s=1800).start()
        self.transport = FaultyTransport()

    def stop(self) -> None:
        self.fake.stop()
        self.transport.close()

    def load(self, records: list[str]) -> Counter[str]:
        base = epoch_ns(START)
        entries = []
        for r in records:  # up to 8 entries share a nanosecond, across streams and within one
            n = int(r[1:])
            node = NODES[n % len(NODES)]
            ts = base + (n // 6) * 7_000_000_000  # spread over the window and its lookback
            ts -= 3_000 * 10**9 if n % 5 == 0 else 0
            entries.append(PushedEntry({"host": node, "filename": "/var/log/kern.log"}, ts,
                                       f"NVRM: Xid (PCI:0000:18:00): 79, {r}", {}))
        entries.append(PushedEntry({"host": "node99", "filename": "/var/log/kern.log"}, base, "NVRM: Xid (x): 79, out", {}))
        entries.append(PushedEntry({"host": NODES[0], "filename": "/var/log/kern.log"}, base - 10**13,
                                   "NVRM: Xid (x): 79, long before", {}))
        self.fake.preload(entries)
        return Counter(records)

    def connector(self, policy: RetryPolicy) -> DataConnector:
        if self.fake.behaviour.stall_s:
            return LokiConnector(self.fake.url, policy=policy)
        return LokiConnector(self.fake.url, policy=policy, transport=self.transport,
                             limits=LokiLimits(max_entries=10, max_query_length_s=1800))

    def records(self, collected: Collected) -> Counter[str]:
        out: Counter[str] = Counter()
        for s in collected.sources:
            assert isinstance(s, TextSource) and isinstance(s.text, str)
            out.update(line.rsplit(", ", 1)[1] for line in s.text.splitlines())
        return out

    def inject(self, fault: Fault, times: int) -> None:
        if fault == "stall":
            self.fake.behaviour.stall_s = 5.0
        else:
            self.transport.queue.extend([fault] * times)

    def requests(self) -> list[str]:
        return list(self.transport.seen)


class PrometheusHarness:
    """Records are series; a series comes back once with one sample per evaluation instant, so a
    record is (series, instant) and each must come back exactly once."""

    name = "prometheus"
    faults: frozenset[Fault] = frozenset({"transient", "permanent", "auth", "stall", "garbage"})
    duplicates = False  # one series holds one sample per timestamp
    STEP = 15

    def start(self, tmp_path: Path) -> None:
        if PROMETHEUS is None or PROMTOOL is None:
            pytest.skip("prometheus and promtool are not installed (Debian package `prometheus`)")
        self.tmp_path = tmp_path
        self.transport = FaultyTransport()
        self.black_hole: BlackHole | None = None
        self.prom: PrometheusProcess | None = None

    def stop(self) -> None:
        if self.prom is not None:
            self.prom.stop()
        if self.black_hole is not None:
            self.black_hole.close()
        self.transport.close()

    def load(self, records: list[str]) -> Counter[str]:
        names = sorted(set(records))
        first = START - timedelta(hours=2)
        samples = [(first + timedelta(seconds=30 * k), 0.0) for k in range(6 * 120)]
        series = [Series(name="DCGM_FI_DEV_XID_ERRORS",
                         labels={"Hostname": NODES[i % len(NODES)], "gpu": r}, samples=samples)
                  for i, r in enumerate(names)]
        series.append(Series(name="DCGM_FI_DEV_XID_ERRORS", labels={"Hostname": "node99", "gpu": "x"},
                             samples=samples))  # outside the scope
        series.append(Series(name="DCGM_FI_DEV_GPU_UTIL", labels={"Hostname": NODES[0], "gpu": "y"},
                             samples=samples))  # no rule reads it
        self.prom = backfilled_prometheus(self.tmp_path / "prometheus", series)
        lo = int(START.timestamp()) - 3600
        hi = int(START.timestamp()) + 3600 + 600
        return Counter(f"{r}@{t}" for r in names for t in range(lo, hi + 1, self.STEP))

    def connector(self, policy: RetryPolicy) -> DataConnector:
        if self.black_hole is not None:
            return PrometheusConnector(self.black_hole.url, policy=policy)
        assert self.prom is not None
        # 50 points a piece: the window takes ten pieces
        return PrometheusConnector(self.prom.url, policy=policy, transport=self.transport,
                                   resolution_s=self.STEP, max_points=50, max_pieces=1000)

    def records(self, collected: Collected) -> Counter[str]:
        out: Counter[str] = Counter()
        for s in collected.sources:
            assert isinstance(s, MetricSource)
            for series in s.series:
                out.update(f"{series.labels['gpu']}@{int(t.timestamp())}" for t, _ in series.samples)
        return out

    def inject(self, fault: Fault, times: int) -> None:
        if fault == "stall":
            self.black_hole = BlackHole()
        else:
            self.transport.queue.extend([fault] * times)

    def requests(self) -> list[str]:
        return list(self.transport.seen)


class FilesHarness:
    """A local directory: nothing to page, and no transient, auth or timeout failures to have."""

    name = "files"
    faults: frozenset[Fault] = frozenset({"permanent", "garbage"})
    duplicates = True

    def start(self, tmp_path: Path) -> None:
        self.root = tmp_path / "collected"

    def stop(self) -> None:
        pass

    def load(self, records: list[str]) -> Counter[str]:
        for r in records:
            n = int(r[1:])
            path = self.root / "logs" / NODES[n % len(NODES)] / f"kern.log.{n % 2}"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(f"Nov  2 10:{n % 60:02d}:00 n kernel: NVRM: Xid (PCI:0000:18:00): 79, {r}\n")
        return Counter(records)

    def connector(self, policy: RetryPolicy) -> DataConnector:
        return FilesConnector(self.root)

    def records(self, collected: Collected) -> Counter[str]:
        out: Counter[str] = Counter()
        for s in collected.sources:
            if isinstance(s, TextSource):
                text = s.text.decode() if isinstance(s.text, bytes) else s.text
                out.update(line.rsplit(", ", 1)[1] for line in text.splitlines() if ", " in line)
        return out

    def inject(self, fault: Fault, times: int) -> None:
        if fault == "permanent":  # a log that cannot be read: its link points nowhere
            victim = self.root / "logs" / NODES[0] / "kern.log.0"
            victim.unlink()
            victim.symlink_to(self.root / "rotated-away")
        elif fault == "garbage":  # binary junk where a log should be
            (self.root / "logs" / NODES[1] / "kern.log.0").write_bytes(b"\x7fELF\x00\x01" * 500)

    def requests(self) -> list[str]:
        return []


HARNESSES: list[Callable[[], Harness]] = [LokiHarness, PrometheusHarness, FilesHarness]


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h: Harness = request.param()
    h.start(tmp_path)
    yield h
    h.stop()


def records(n: int, duplicates: bool) -> list[str]:
    out = [f"r{i:04d}" for i in range(n)]
    if duplicates:  # every seventh record twice: identical content, time and stream
        out += [f"r{i:04d}" for i in range(0, n, 7)]
    return out


def collect(h: Harness, policy: RetryPolicy = POLICY) -> Collected:
    return h.connector(policy).collect(attempt())  # must not raise, whatever happened


def needs(h: Harness, fault: Fault) -> None:
    if fault not in h.faults:
        pytest.skip(f"{h.name}: a backend of this kind cannot fail with {fault!r}")


# ----------------------------------------------------------------------------------------- the contract


def test_every_record_comes_back_exactly_once(harness: Harness) -> None:
    want = harness.load(records(240, harness.duplicates))
    got = collect(harness)
    assert harness.records(got) == want
    assert {c.status for c in got.coverage} <= {"ok"}, got.coverage


def test_transient_errors_are_retried_and_nothing_is_lost(harness: Harness) -> None:
    needs(harness, "transient")
    want = harness.load(records(60, harness.duplicates))
    harness.inject("transient", POLICY.attempts - 1)
    got = collect(harness)
    assert harness.records(got) == want and {c.status for c in got.coverage} <= {"ok"}
    seen = harness.requests()
    assert seen[0] == seen[POLICY.attempts - 1]  # the same call, tried again


def test_persistent_transient_errors_fail_the_coverage_not_the_call(harness: Harness) -> None:
    needs(harness, "transient")
    harness.load(records(30, False))
    harness.inject("transient", 10_000)
    got = collect(harness)
    assert got.coverage and {c.status for c in got.coverage} == {"failed"}
    assert all(f"{POLICY.attempts} tries" in (c.reason or "") for c in got.coverage), got.coverage
    seen = harness.requests()
    assert seen[:POLICY.attempts] == [seen[0]] * POLICY.attempts


@pytest.mark.parametrize("fault", ["permanent", "auth"])
def test_permanent_and_auth_errors_are_not_retried(harness: Harness, fault: Fault) -> None:
    needs(harness, fault)
    harness.load(records(30, False))
    harness.inject(fault, 10_000)
    got = collect(harness)
    bad = [c for c in got.coverage if c.status == "failed"]
    assert bad and all(c.reason for c in bad), got.coverage
    if fault == "auth":
        assert all("HTTP 401" in (c.reason or "") for c in bad)
    seen = harness.requests()
    assert len(seen) == len(set(seen)), "a call that cannot succeed was repeated"


def test_a_silent_backend_is_a_timeout_within_the_policy(harness: Harness) -> None:
    needs(harness, "stall")
    harness.load(records(10, False))
    harness.inject("stall", 1)
    began = time.monotonic()
    got = collect(harness, STALL_POLICY)
    elapsed = time.monotonic() - began
    assert got.coverage and {c.status for c in got.coverage} == {"failed"}
    assert all(f"within {STALL_POLICY.timeout_s:g} s" in (c.reason or "") for c in got.coverage), got.coverage
    assert elapsed < 10 * STALL_POLICY.attempts * STALL_POLICY.timeout_s + 2


def test_garbage_answers_never_raise(harness: Harness) -> None:
    needs(harness, "garbage")
    harness.load(records(30, False))
    harness.inject("garbage", 10_000)
    got = collect(harness)
    assert got.coverage and any(c.status in ("failed", "partial", "skipped") for c in got.coverage), got.coverage
