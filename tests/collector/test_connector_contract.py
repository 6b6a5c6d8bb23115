"""The contract every connector passes, whatever its backend (issue 6).

A data connector (Loki, Prometheus, local files: AttemptContext → Collected):

1. no loss, no duplication: each of the N records the backend holds for the attempt's scope comes
   back exactly as often as it is held, across pages and splits (identical records included
   where the backend can hold them);
2. errors are classified: transient ones are retried and then, if they persist, reported as a
   failed coverage entry with the reason; permanent and auth errors are not retried and say so;
3. every call has a timeout: a backend that accepts the call and never answers is a transient
   timeout within the retry policy, never a hang;
4. `collect` never raises for a data source, even when the answer is garbage;
5. nothing stays open: every HTTP client a call opened is closed when it returns (base.py, "Resources").

A scope connector (Slurm through its commands or slurmrestd, Kubernetes: job id → Scope) passes
the same five, with the one difference base.py documents: it raises `ConnectorError` when it cannot
name the attempt at all. So each fault is injected at one of two targets:

    "scope"      every source that could name the attempt (Slurm: accounting and the controller;
                 Kubernetes: the job object). A persistent fault there raises ConnectorError with
                 the fault's `kind` (transient ones after the policy's tries, saying how many;
                 garbage, an answer not understood, as permanent), never another exception.
    "evidence"   a source that only adds evidence (Slurm: node states; Kubernetes: pods, events,
                 node conditions, pod logs). A fault there never raises: the scope comes back, what
                 the other sources hold is complete and not repeated, and the failing source is a
                 failed (or partial) coverage entry with the reason.

A backend is a `Harness` or `ScopeHarness` (below). Adding a connector to the contract is one class
and one line in HARNESSES or SCOPE_HARNESSES: build the backend with given records, say which
records came back, inject faults. A fault a backend cannot have (a local directory does not answer
401) is listed out of `faults` and its test is skipped for that harness, with the reason.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import httpx
import pytest
from engine_support import QUERIES
from kube_fake import FakeKube
from observability_fakes import FakeLoki, PushedEntry
from prometheus_support import PROMETHEUS, PROMTOOL, PrometheusProcess, backfilled_prometheus
from resource_spies import record_clients

from hypocenter.collector.connectors.base import (
    Collected,
    ConnectorError,
    DataConnector,
    RetryPolicy,
    Scope,
    ScopeConnector,
)
from hypocenter.collector.connectors.files import FilesConnector
from hypocenter.collector.connectors.kube_api import KubeAPI
from hypocenter.collector.connectors.kube_credentials import Credentials
from hypocenter.collector.connectors.kubernetes import KubernetesConnector
from hypocenter.collector.connectors.loki import LokiConnector, LokiLimits
from hypocenter.collector.connectors.prometheus import PrometheusConnector
from hypocenter.collector.connectors.scope import epoch_ns
from hypocenter.collector.connectors.slurm import SlurmConnector, classify, run_command
from hypocenter.model import AttemptContext
from hypocenter.sources import MetricSource, RecordSource, Series, TextSource

Fault = Literal["transient", "permanent", "auth", "stall", "garbage"]
Target = Literal["scope", "evidence"]
START = datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)
NODES = ["node01", "node02", "node03"]
POLICY = RetryPolicy(timeout_s=2.0, attempts=3, backoff_s=0.01, max_backoff_s=0.02)
STALL_POLICY = RetryPolicy(timeout_s=0.3, attempts=2, backoff_s=0.01, max_backoff_s=0.01)


def attempt() -> AttemptContext:
    return AttemptContext.model_validate(
        {
            "workload": {"id": "4242", "attempt": 0},
            "state": "FAILED",
            "nodes": NODES,
            "window": {"start": START.isoformat(), "end": (START + timedelta(hours=1)).isoformat()},
        }
    )


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
            return httpx.Response(
                503, json={"status": "error", "errorType": "unavailable", "error": "injected"}
            )
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
    duplicates = False  # Loki stores an entry identical in stream, time and line once (ingester/stream.go)

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
            entries.append(
                PushedEntry(
                    {"host": node, "filename": "/var/log/kern.log"},
                    ts,
                    f"NVRM: Xid (PCI:0000:18:00): 79, {r}",
                    {},
                )
            )
        entries.append(
            PushedEntry(
                {"host": "node99", "filename": "/var/log/kern.log"}, base, "NVRM: Xid (x): 79, out", {}
            )
        )
        entries.append(
            PushedEntry(
                {"host": NODES[0], "filename": "/var/log/kern.log"},
                base - 10**13,
                "NVRM: Xid (x): 79, long before",
                {},
            )
        )
        self.fake.preload(entries)
        return Counter(records)

    def connector(self, policy: RetryPolicy) -> DataConnector:
        if self.fake.behaviour.stall_s:
            return LokiConnector(self.fake.url, queries=QUERIES, policy=policy)
        return LokiConnector(
            self.fake.url,
            queries=QUERIES,
            policy=policy,
            transport=self.transport,
            limits=LokiLimits(max_entries=10, max_query_length_s=1800),
        )

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
    marks = (pytest.mark.prometheus, pytest.mark.slow)
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
        series = [
            Series(
                name="DCGM_FI_DEV_XID_ERRORS",
                labels={"Hostname": NODES[i % len(NODES)], "gpu": r},
                samples=samples,
            )
            for i, r in enumerate(names)
        ]
        series.append(
            Series(name="DCGM_FI_DEV_XID_ERRORS", labels={"Hostname": "node99", "gpu": "x"}, samples=samples)
        )  # outside the scope
        series.append(
            Series(name="DCGM_FI_DEV_GPU_UTIL", labels={"Hostname": NODES[0], "gpu": "y"}, samples=samples)
        )  # no rule reads it
        self.prom = backfilled_prometheus(self.tmp_path / "prometheus", series)
        lo = int(START.timestamp()) - 3600
        hi = int(START.timestamp()) + 3600 + 600
        return Counter(f"{r}@{t}" for r in names for t in range(lo, hi + 1, self.STEP))

    def connector(self, policy: RetryPolicy) -> DataConnector:
        if self.black_hole is not None:
            return PrometheusConnector(self.black_hole.url, queries=QUERIES, policy=policy)
        assert self.prom is not None
        # 50 points a piece: the window takes ten pieces
        return PrometheusConnector(
            self.prom.url,
            queries=QUERIES,
            policy=policy,
            transport=self.transport,
            resolution_s=self.STEP,
            max_points=50,
            max_pieces=1000,
        )

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


class _Backend(Protocol):
    def start(self, tmp_path: Path) -> None: ...
    def stop(self) -> None: ...


B = TypeVar("B", bound=_Backend)


def running(make: Callable[[], B], tmp_path: Path) -> Iterator[B]:
    backend = make()
    backend.start(tmp_path)
    yield backend
    backend.stop()


@pytest.fixture(
    params=[pytest.param(h, marks=getattr(h, "marks", ())) for h in HARNESSES], ids=lambda h: h.name
)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    yield from running(request.param, tmp_path)


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
    assert not any(_says_what_twice(c.reason or "") for c in got.coverage), got.coverage
    seen = harness.requests()
    assert seen[: POLICY.attempts] == [seen[0]] * POLICY.attempts


def _says_what_twice(reason: str) -> bool:
    """`Loki query_range: Loki query_range: …`: the call named once by the connector, again by the retry."""
    what = reason.split(": ", 1)[0]
    return reason.startswith(f"{what}: {what}")


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
    assert got.coverage and any(c.status in ("failed", "partial", "skipped") for c in got.coverage), (
        got.coverage
    )


def test_nothing_stays_open_after_a_collect(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    harness.load(records(10, False))
    opened = record_clients(monkeypatch)
    collect(harness)
    assert all(c.is_closed for c in opened)


# ===================================================================================== scope connectors


class ScopeHarness(Protocol):
    name: str
    faults: Mapping[Target, frozenset[Fault]]  # the faults this backend can be made to show, per target
    duplicates: bool
    evidence: frozenset[str]  # the kinds of record (`kind:…`) that come from evidence sources
    auth_mark: str  # what an auth failure's message tells the user to look at

    def start(self, tmp_path: Path) -> None: ...
    def stop(self) -> None: ...
    def load(self, records: list[str]) -> Counter[str]:
        """Hold `records` for one job (plus noise of other jobs and nodes); what a complete scope
        returns, as `kind:name` keys, each as often as it must return it."""

    def connector(self, policy: RetryPolicy) -> ScopeConnector: ...
    def records(self, scope: Scope) -> Counter[str]: ...
    def inject(self, fault: Fault, times: int, target: Target, garbage: str = "") -> None:
        """The next `times` calls to `target` fail so (stall: every call to it never answers;
        garbage: answered with `garbage`)."""

    def requests(self) -> list[str]:
        """A fingerprint of every call the backend received, in order (a retry repeats one)."""


GARBAGE = [
    "<html>a proxy's login page</html>",
    "[]",
    "null",
    '{"jobs": "x", "nodes": "x", "items": "x", "metadata": [], "status": []}',
    '{"jobs": 5, "nodes": 5, "items": 5, "metadata": 5, "status": 5}',
    # the right keys with values of the wrong types, as a half-upgraded server might send
    json.dumps(
        {
            "jobs": [
                7,
                None,
                {
                    "job_id": 4242,
                    "state": {"current": 5},
                    "time": {"start": "x"},
                    "nodes": 5,
                    "exit_code": [1],
                    "restart_cnt": "x",
                    "steps": [5, {"step": 7}],
                },
            ],
            "nodes": [{"name": 5}, 3],
            "items": [
                {
                    "kind": "Pod",
                    "metadata": "x",
                    "spec": "x",
                    "status": {
                        "containerStatuses": [
                            {
                                "restartCount": "x",
                                "lastState": "y",
                                "state": {"terminated": {"exitCode": "abc"}},
                            }
                        ]
                    },
                },
                {
                    "metadata": {"name": "p"},
                    "spec": {"nodeName": ["x"], "containers": "x"},
                    "status": {"startTime": 5, "containerStatuses": "x"},
                },
            ],
            "status": {"conditions": "x", "restarts": "x", "requeueState": "x"},
        }
    ),
]


# --------------------------------------------------------------------------------------------- Slurm

SLURM_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "24.05"
JOB_ID = "4242"


def slurm_documents(records: list[str]) -> tuple[dict[str, str], Counter[str]]:
    """Recorded Slurm 24.05 documents grown to the records: even ones are job steps, odd ones
    drained nodes of the job (their drain reason names them); a job and nodes of no interest beside."""
    sacct = json.loads((SLURM_FIXTURES / "sacct-81234.json").read_text())
    ctl = json.loads((SLURM_FIXTURES / "scontrol-job-81234.json").read_text())
    node_doc = json.loads((SLURM_FIXTURES / "scontrol-node-81234.json").read_text())
    steps = [r for r in dict.fromkeys(records) if int(r[1:]) % 2 == 0]
    nodes = [r for r in dict.fromkeys(records) if int(r[1:]) % 2 == 1]
    hostlist = "node[" + ",".join(f"{int(r[1:]):04d}" for r in nodes) + "]"
    job = sacct["jobs"][0]
    step_template = job["steps"][0]
    job.update(job_id=int(JOB_ID), nodes=hostlist, steps=[])
    for r in steps:
        step = copy.deepcopy(step_template)
        step["step"] = {"id": f"{JOB_ID}.{int(r[1:])}", "name": r}  # a step id is a number
        job["steps"].append(step)
    other = copy.deepcopy(job)
    other.update(job_id=int(JOB_ID) + 1, steps=[])
    sacct["jobs"].append(other)
    ctl["jobs"][0].update(job_id=int(JOB_ID), nodes=hostlist)
    template = node_doc["nodes"][0]
    node_doc["nodes"] = [
        {**copy.deepcopy(template), "name": f"node{int(r[1:]):04d}", "state": ["IDLE", "DRAIN"], "reason": r}
        for r in nodes
    ]
    node_doc["nodes"].append({**copy.deepcopy(template), "name": "node9999", "reason": "not this job's"})
    want = Counter([f"job:{JOB_ID}", *(f"step:{int(r[1:])}" for r in steps), *(f"node:{r}" for r in nodes)])
    return {
        "accounting": json.dumps(sacct),
        "controller": json.dumps(ctl),
        "nodes": json.dumps(node_doc),
    }, want


def keyed(scope: Scope, patterns: Sequence[tuple[str, str]]) -> Counter[str]:
    """`kind:name` for each scheduler record and each line of a text source that one of `patterns`
    (kind, regex whose group is the name; kind `log` for lines of text sources) finds."""
    out: Counter[str] = Counter()
    for s in scope.collected.sources:
        if isinstance(s, TextSource):
            text = s.text.decode() if isinstance(s.text, bytes) else s.text
            lines, kinds = text.splitlines(), [p for p in patterns if p[0] == "log"]
        else:
            lines = [r.text for r in s.records] if isinstance(s, RecordSource) else []
            kinds = [p for p in patterns if p[0] != "log"]
        for line in lines:
            key = next((f"{kind}:{m[1]}" for kind, regex in kinds if (m := re.search(regex, line))), None)
            if key is not None:
                out[key] += 1
    return out


SLURM_RECORDS = [
    ("job", r"^slurm job (\S+) "),
    ("step", rf"^slurm step {JOB_ID}\.(\d+) "),
    ("node", r"^slurm node \S+ .*reason=(r\d{4})$"),
]


class FaultQueues:
    """Faults waiting per target, thread-safe, and the fingerprint of every call."""

    def __init__(self) -> None:
        self.queue: dict[Target, list[Fault]] = {"scope": [], "evidence": []}
        self.stalled: set[Target] = set()
        self.garbage = GARBAGE[0]
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def add(self, fault: Fault, times: int, target: Target, garbage: str) -> None:
        if fault == "stall":
            self.stalled.add(target)
        else:
            self.queue[target].extend([fault] * times)
        self.garbage = garbage or self.garbage

    def next(self, target: Target, fingerprint: str) -> Fault | None:
        with self.lock:
            self.seen.append(fingerprint)
            if target in self.stalled:
                return "stall"
            return self.queue[target].pop(0) if self.queue[target] else None


class ScopeBackend:
    """What the scope harnesses share: faults queued per target, and a stalled server as a socket
    that never answers (`black_hole`, for harnesses that speak HTTP)."""

    stalls_by_black_hole = True

    def start(self, tmp_path: Path) -> None:
        self.faults_ = FaultQueues()
        self.black_hole: BlackHole | None = None

    def stop(self) -> None:
        if self.black_hole is not None:
            self.black_hole.close()

    def inject(self, fault: Fault, times: int, target: Target, garbage: str = "") -> None:
        if fault == "stall" and self.stalls_by_black_hole:
            self.black_hole = BlackHole()
        self.faults_.add(fault, times, target, garbage)

    def requests(self) -> list[str]:
        return list(self.faults_.seen)


class SlurmHarness(ScopeBackend):
    """The Slurm client commands, answered from recorded output by an injected runner; a stalled
    command is a real process (a tiny script) that the real `run_command` must time out."""

    name = "slurm"
    faults: Mapping[Target, frozenset[Fault]] = dict.fromkeys(
        ("scope", "evidence"), frozenset({"transient", "permanent", "auth", "stall", "garbage"})
    )
    duplicates = False  # a step id or a node name is one record
    evidence = frozenset({"node"})
    auth_mark = "Access/permission denied"
    # what a Slurm command prints on stderr when it fails so (slurm/src/common/slurm_errno.c)
    MESSAGES: Mapping[Fault, Sequence[str]] = {
        "transient": [
            "slurm_load_jobs error: Socket timed out on send/recv operation",
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        ],
        "permanent": ["slurm_load_jobs error: Unexpected message received"],
        "auth": ["slurm_load_jobs error: Access/permission denied"],
    }

    stalls_by_black_hole = False

    def start(self, tmp_path: Path) -> None:
        super().start(tmp_path)
        self.docs: dict[str, str] = {}
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for tool in ("sacct", "scontrol"):
            script = self.bin / tool
            script.write_text("#!/bin/sh\nexec sleep 30\n")
            script.chmod(0o755)

    def load(self, records: list[str]) -> Counter[str]:
        self.docs, want = slurm_documents(records)
        return want

    def run(self, argv: Sequence[str], timeout: float) -> str:
        argv = list(argv)
        which = (
            "nodes"
            if argv[1:3] == ["show", "node"]
            else "controller"
            if argv[0] == "scontrol"
            else "accounting"
        )
        fault = self.faults_.next("evidence" if which == "nodes" else "scope", " ".join(argv))
        if fault == "stall":
            return run_command([str(self.bin / argv[0]), *argv[1:]], timeout)
        if fault == "garbage":
            return self.faults_.garbage
        if fault is not None:
            messages = self.MESSAGES[fault]
            raise classify(argv[0], messages[len(self.faults_.seen) % len(messages)])
        return self.docs[which]

    def connector(self, policy: RetryPolicy) -> ScopeConnector:
        return SlurmConnector(JOB_ID, runner=self.run, policy=policy)

    def records(self, scope: Scope) -> Counter[str]:
        return keyed(scope, SLURM_RECORDS)


class SlurmRestHarness(ScopeBackend):
    """slurmrestd, faked with httpx.MockTransport; a stalled one is a socket that never answers."""

    name = "slurmrestd"
    faults: Mapping[Target, frozenset[Fault]] = {
        "scope": frozenset({"transient", "permanent", "auth", "stall", "garbage"}),
        "evidence": frozenset({"transient", "permanent", "auth", "garbage"}),
    }
    duplicates = False
    evidence = frozenset({"node"})
    auth_mark = "SLURM_JWT"

    def start(self, tmp_path: Path) -> None:
        super().start(tmp_path)
        self.docs: dict[str, str] = {}

    def load(self, records: list[str]) -> Counter[str]:
        self.docs, want = slurm_documents(records)
        return want

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        which = {
            f"/slurmdb/v0.0.41/job/{JOB_ID}": "accounting",
            f"/slurm/v0.0.41/job/{JOB_ID}": "controller",
            "/slurm/v0.0.41/nodes": "nodes",
        }.get(path)
        if which is None:
            return httpx.Response(404, text="Not Found")
        fault = self.faults_.next("evidence" if which == "nodes" else "scope", f"GET {request.url}")
        if fault == "transient":  # slurmrestd relays the controller's error in its error list
            return httpx.Response(
                500,
                json={
                    "errors": [
                        {
                            "error": "Unable to contact slurm controller (connect failure)",
                            "error_number": 1007,
                        }
                    ],
                    "jobs": [],
                },
            )
        if fault == "permanent":
            return httpx.Response(400, text="Unable to parse query")
        if fault == "auth":
            return httpx.Response(401 if len(self.faults_.seen) % 2 else 403, text="Authentication failure")
        if fault == "garbage":
            return httpx.Response(200, text=self.faults_.garbage)
        return httpx.Response(200, text=self.docs[which])

    def connector(self, policy: RetryPolicy) -> ScopeConnector:
        if self.black_hole is not None:
            return SlurmConnector(JOB_ID, rest_url=self.black_hole.url, rest_token="jwt", policy=policy)
        return SlurmConnector(
            JOB_ID,
            rest_url="http://slurmrestd:6820",
            rest_token="jwt",
            policy=policy,
            transport=httpx.MockTransport(self.handle),
        )

    def records(self, scope: Scope) -> Counter[str]:
        return keyed(scope, SLURM_RECORDS)


# --------------------------------------------------------------------------------------------- Kubernetes


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesHarness(ScopeBackend):
    """The in-memory API server (kube_fake.py) behind a transport that injects faults; a stalled
    API server is a socket that never answers. Evidence: the pods list, events, node conditions and
    pod logs (only the job object is required). Records: even ones are events of the job's pods,
    odd ones log lines of its pods; the pods' terminated containers, the job's condition and its
    nodes' conditions come back too. Another job's pods and events are noise."""

    name = "kubernetes"
    faults: Mapping[Target, frozenset[Fault]] = {
        "scope": frozenset({"transient", "permanent", "auth", "stall", "garbage"}),
        "evidence": frozenset({"transient", "permanent", "auth", "garbage"}),
    }
    duplicates = True  # a log can hold a line twice, and two events can say the same thing
    evidence = frozenset({"pod", "event", "log", "node"})
    auth_mark = "credentials from"
    PODS = 12
    JOB_PATH = "/apis/batch/v1/namespaces/ml/jobs/train"

    def start(self, tmp_path: Path) -> None:
        super().start(tmp_path)
        self.fake = FakeKube([])
        self.apis: list[KubeAPI] = []

    def stop(self) -> None:
        for api in self.apis:
            api.close()
        super().stop()

    def load(self, records: list[str]) -> Counter[str]:
        end = START + timedelta(hours=1)
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "train",
                    "namespace": "ml",
                    "uid": "job-train",
                    "creationTimestamp": _iso(START),
                },
                "status": {
                    "startTime": _iso(START),
                    "conditions": [
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "lastTransitionTime": _iso(end),
                        }
                    ],
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "Workload",
                "metadata": {
                    "name": "job-train-5f2a1",
                    "namespace": "ml",
                    "uid": "wl-train",
                    "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-train"}],
                },
                "status": {
                    "conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": _iso(START)}]
                },
            },
        ]
        objects += [
            {
                "kind": "Node",
                "metadata": {"name": n},
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastTransitionTime": _iso(START),
                        }
                    ]
                },
            }
            for n in NODES
        ]
        pods = [f"train-p{k:02d}" for k in range(self.PODS)]
        for k, pod in enumerate([*pods, "other-p00"]):
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod,
                        "namespace": "ml",
                        "uid": f"uid-{pod}",
                        "labels": {"batch.kubernetes.io/job-name": pod.split("-")[0]},
                    },
                    "spec": {"nodeName": NODES[k % len(NODES)], "containers": [{"name": "trainer"}]},
                    "status": {
                        "phase": "Failed",
                        "startTime": _iso(START),
                        "containerStatuses": [
                            {
                                "name": "trainer",
                                "restartCount": 0,
                                "state": {
                                    "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": _iso(end)}
                                },
                            }
                        ],
                    },
                }
            )
        logs: dict[tuple[str, str | None, bool], str] = {
            (pod, None, False): "" for pod in [*pods, "other-p00"]
        }
        want: Counter[str] = Counter(
            ["job:train", *(f"pod:{p}" for p in pods), *(f"node:{n}" for n in NODES)]
        )
        for i, r in enumerate(records):
            n = int(r[1:])
            pod = pods[(n // 2) % self.PODS]  # every pod has events and log lines
            when = START + timedelta(seconds=7 * n)
            if n % 2 == 0:
                objects.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {"name": f"{pod}.{i:x}", "namespace": "ml", "uid": f"event-{i}"},
                        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "ml"},
                        "type": "Warning",
                        "reason": "BackOff",
                        "message": f"injected {r}",
                        "lastTimestamp": _iso(when),
                    }
                )
                want[f"event:{r}"] += 1
            else:
                logs[(pod, None, False)] += (
                    f"{when.isoformat().replace('+00:00', '.000000000Z')} step failed {r}\n"
                )
                want[f"log:{r}"] += 1
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "other", "namespace": "ml", "uid": "x"},
                "involvedObject": {"kind": "Pod", "name": "other-p00"},
                "message": "injected r9999",
            }
        )
        logs[("other-p00", None, False)] = "2026-11-02T10:00:00.000000000Z step failed r9998\n"
        self.fake = FakeKube(objects, logs)
        return want

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        target: Target | None = (
            "scope"
            if path == self.JOB_PATH
            else (
                "evidence"
                if path.endswith(("/pods", "/events", "/log")) or path.startswith("/api/v1/nodes/")
                else None
            )
        )
        fault = self.faults_.next(target or "scope", f"GET {request.url}") if target else None
        if target is None:
            self.faults_.seen.append(f"GET {request.url}")
        if fault in ("transient", "permanent", "auth"):
            code = {"transient": (429, 503), "permanent": (400, 400), "auth": (401, 403)}[fault][
                len(self.faults_.seen) % 2
            ]
            return httpx.Response(
                code,
                json={
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"injected {code}",
                    "code": code,
                },
            )
        if fault == "garbage":
            return httpx.Response(200, text=self.faults_.garbage)
        return self.fake.handle(request)

    def connector(self, policy: RetryPolicy) -> ScopeConnector:
        creds = Credentials(
            server=self.black_hole.url if self.black_hole else "https://k8s.test",
            headers={"Authorization": "Bearer fake-token"},
            origin="the test's kubeconfig",
        )
        api = KubeAPI(
            creds, policy=policy, transport=None if self.black_hole else httpx.MockTransport(self.handle)
        )
        self.apis.append(api)
        return KubernetesConnector.for_job("ml/job/train", api=api)

    def records(self, scope: Scope) -> Counter[str]:
        return keyed(
            scope,
            [
                ("log", r" step failed (r\d{4})$"),
                ("event", r"^k8s event .* message=injected (r\d{4})$"),
                ("pod", r"^k8s container (\S+)/trainer terminated"),
                ("node", r"^k8s node (\S+) condition"),
                ("job", r"^job (\S+) condition type=Failed"),
            ],
        )


SCOPE_HARNESSES: list[Callable[[], ScopeHarness]] = [SlurmHarness, SlurmRestHarness, KubernetesHarness]
TARGETS: list[Target] = ["scope", "evidence"]


@pytest.fixture(params=SCOPE_HARNESSES, ids=lambda h: h.name)
def scope_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ScopeHarness]:
    yield from running(request.param, tmp_path)


def needs_at(h: ScopeHarness, fault: Fault, target: Target) -> None:
    if fault not in h.faults[target]:
        pytest.skip(f"{h.name}: its {target} sources cannot be made to fail with {fault!r} here")


def survives(h: ScopeHarness, want: Counter[str], policy: RetryPolicy = POLICY) -> list[str]:
    """A fault in an evidence source: the scope comes back, nothing is invented or repeated, only
    evidence is missing, and every degraded source says why. Returns the degraded sources' reasons."""
    scope = h.connector(policy).scope()
    got = h.records(scope)
    assert not got - want, f"invented or repeated: {got - want}"
    assert {k.split(":")[0] for k in want - got} <= h.evidence, (
        f"lost beyond the failing source: {want - got}"
    )
    bad = [c for c in scope.collected.coverage if c.status in ("failed", "partial")]
    assert bad and all(c.reason for c in bad), scope.collected.coverage
    return [c.reason or "" for c in bad]


def repeated(seen: list[str], times: int) -> bool:
    return any(seen[i : i + times] == [seen[i]] * times for i in range(len(seen)))


def test_scope_every_record_comes_back_exactly_once(scope_harness: ScopeHarness) -> None:
    want = scope_harness.load(records(240, scope_harness.duplicates))
    got = scope_harness.connector(POLICY).scope()
    assert scope_harness.records(got) == want
    assert {c.status for c in got.collected.coverage} <= {"ok"}, got.collected.coverage


def test_scope_nothing_stays_open(scope_harness: ScopeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    scope_harness.load(records(10, False))
    opened = record_clients(monkeypatch)
    scope_harness.connector(POLICY).scope()
    assert all(c.is_closed for c in opened)


@pytest.mark.parametrize("target", TARGETS)
def test_scope_transient_errors_are_retried_and_nothing_is_lost(
    scope_harness: ScopeHarness, target: Target
) -> None:
    needs_at(scope_harness, "transient", target)
    want = scope_harness.load(records(60, scope_harness.duplicates))
    scope_harness.inject("transient", POLICY.attempts - 1, target)
    got = scope_harness.connector(POLICY).scope()
    assert scope_harness.records(got) == want and {c.status for c in got.collected.coverage} <= {"ok"}
    assert repeated(scope_harness.requests(), POLICY.attempts)  # the same call, tried again


@pytest.mark.parametrize("target", TARGETS)
def test_scope_persistent_transient_errors_say_how_often_they_were_tried(
    scope_harness: ScopeHarness, target: Target
) -> None:
    needs_at(scope_harness, "transient", target)
    want = scope_harness.load(records(30, False))
    scope_harness.inject("transient", 10_000, target)
    tries = f"{POLICY.attempts} tries"
    if target == "scope":
        with pytest.raises(ConnectorError) as err:
            scope_harness.connector(POLICY).scope()
        assert err.value.kind == "transient" and tries in str(err.value), err.value
        assert not _says_what_twice(str(err.value)), err.value
    else:
        reasons = survives(scope_harness, want)
        assert all(tries in reason and not _says_what_twice(reason) for reason in reasons), reasons
    assert repeated(scope_harness.requests(), POLICY.attempts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fault", ["permanent", "auth"])
def test_scope_permanent_and_auth_errors_are_not_retried(
    scope_harness: ScopeHarness, fault: Fault, target: Target
) -> None:
    needs_at(scope_harness, fault, target)
    want = scope_harness.load(records(30, False))
    scope_harness.inject(fault, 10_000, target)
    if target == "scope":
        with pytest.raises(ConnectorError) as err:
            scope_harness.connector(POLICY).scope()
        assert err.value.kind == fault, err.value
        messages = [str(err.value)]
    else:
        messages = survives(scope_harness, want)
    if fault == "auth":
        assert all(scope_harness.auth_mark in m for m in messages), messages
    seen = scope_harness.requests()
    assert len(seen) == len(set(seen)), "a call that cannot succeed was repeated"


@pytest.mark.parametrize("target", TARGETS)
def test_scope_a_silent_backend_is_a_timeout_within_the_policy(
    scope_harness: ScopeHarness, target: Target
) -> None:
    needs_at(scope_harness, "stall", target)
    want = scope_harness.load(records(10, False))
    scope_harness.inject("stall", 1, target)
    within = f"within {STALL_POLICY.timeout_s:g} s"
    began = time.monotonic()
    if target == "scope":
        with pytest.raises(ConnectorError) as err:
            scope_harness.connector(STALL_POLICY).scope()
        assert err.value.kind == "transient" and within in str(err.value), err.value
    else:
        assert all(within in reason for reason in survives(scope_harness, want, STALL_POLICY))
    # two scope sources at most, each tried `attempts` times
    assert time.monotonic() - began < 2 * STALL_POLICY.attempts * (STALL_POLICY.timeout_s + 1) + 2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("garbage", range(len(GARBAGE)), ids=lambda i: f"garbage{i}")
def test_scope_garbage_answers_never_crash(scope_harness: ScopeHarness, target: Target, garbage: int) -> None:
    needs_at(scope_harness, "garbage", target)
    want = scope_harness.load(records(30, False))
    scope_harness.inject("garbage", 10_000, target, GARBAGE[garbage])
    if target == "evidence":  # may be taken for an answer (a log is any text), but never raises
        scope = scope_harness.connector(POLICY).scope()
        assert not scope_harness.records(scope) - want
        return
    try:
        scope = scope_harness.connector(POLICY).scope()
    except ConnectorError as exc:
        # an answer not understood: never transient (trying again gets the same garbage), never
        # not_found (no source said that the job does not exist)
        assert exc.kind == "permanent", exc
    else:
        assert scope.context.workload.id
