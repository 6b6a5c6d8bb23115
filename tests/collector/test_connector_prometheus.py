"""The Prometheus pull connector against a real Prometheus (Debian `prometheus`) whose TSDB was
backfilled with recorded series by `promtool tsdb create-blocks-from openmetrics`: it pulls exactly
the series the metric rules read, for the attempt's nodes and window, and the engine draws the
same conclusions from them as from the recorded files. Faults a real server will not produce on
demand are put in front of it with httpx.MockTransport."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
from engine_support import QUERIES
from prometheus_support import PrometheusProcess, backfilled_prometheus, needs_prometheus, needs_promtool

from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.collector.connectors.prometheus import MAX_POINTS, PrometheusConnector, plan
from hypocenter.engine import default_engine
from hypocenter.model import AttemptContext
from hypocenter.sources import AttemptInput, MetricSource, Series

pytestmark = [needs_prometheus, needs_promtool]

FAST = RetryPolicy(timeout_s=5.0, attempts=3, backoff_s=0.01, max_backoff_s=0.02)
A = datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)  # attempt A: an Xid 79 on gpu-a02 at 10:20
B = datetime(2026, 11, 3, 14, 0, tzinfo=timezone.utc)  # attempt B: gpu-a03's IB port goes down at 14:25


def scrape(
    start: datetime, hours: float, value: float | list[tuple[datetime, float]], every_s: int = 30
) -> list[tuple[datetime, float]]:
    """Samples every `every_s` seconds; `value` is a constant or [(from, value)] steps."""
    steps = [(start, value)] if isinstance(value, float | int) else value
    out = []
    for i in range(int(hours * 3600 // every_s)):
        t = start + timedelta(seconds=i * every_s)
        out.append((t, float(next(v for since, v in reversed(steps) if since <= t))))
    return out


def dcgm(host: str, gpu: str, name: str, samples: list[tuple[datetime, float]]) -> Series:
    return Series(
        name=name,
        labels={
            "Hostname": host,
            "gpu": gpu,
            "UUID": f"GPU-{host}-{gpu}",
            "pci_bus_id": f"00000000:{18 + int(gpu):02X}:00.0",
            "instance": f"{host}:9400",
            "job": "dcgm-exporter",
            "modelName": "NVIDIA B200",
        },
        samples=samples,
    )


def ib(host: str, samples: list[tuple[datetime, float]]) -> Series:
    return Series(
        name="node_infiniband_link_downed_total",
        labels={"instance": f"{host}.cluster.local:9100", "job": "node", "device": "mlx5_3", "port": "1"},
        samples=samples,
    )


XID = "DCGM_FI_DEV_XID_ERRORS"
RECORDED = [
    # attempt A: gpu-a02 GPU 3 reports Xid 79; its other GPU and gpu-a01 stay at 0
    dcgm(
        "gpu-a02",
        "3",
        XID,
        scrape(A - timedelta(hours=2), 4, [(A - timedelta(hours=2), 0.0), (A + timedelta(minutes=20), 79.0)]),
    ),
    dcgm("gpu-a02", "0", XID, scrape(A - timedelta(hours=2), 4, 0.0)),
    dcgm("gpu-a01", "0", XID, scrape(A - timedelta(hours=2), 4, 0.0)),
    # a series no rule reads, on an attempt node
    dcgm("gpu-a02", "3", "DCGM_FI_DEV_GPU_UTIL", scrape(A - timedelta(hours=2), 4, 97.0)),
    # a rule metric on a node outside every attempt
    dcgm(
        "gpu-z99",
        "1",
        XID,
        scrape(A - timedelta(hours=2), 4, [(A - timedelta(hours=2), 0.0), (A + timedelta(minutes=5), 48.0)]),
    ),
    # attempt B: node_exporter's link-downed counter on gpu-a03 (instance is FQDN:port) goes 3 → 4
    ib(
        "gpu-a03",
        scrape(B - timedelta(hours=2), 4, [(B - timedelta(hours=2), 3.0), (B + timedelta(minutes=25), 4.0)]),
    ),
    ib("gpu-a04", scrape(B - timedelta(hours=2), 4, 0.0)),
]


def attempt(start: datetime, nodes: list[str], minutes: int = 60) -> AttemptContext:
    return AttemptContext.model_validate(
        {
            "workload": {"id": "81234", "attempt": 0},
            "state": "FAILED",
            "exit_code": 1,
            "nodes": nodes,
            "window": {"start": start.isoformat(), "end": (start + timedelta(minutes=minutes)).isoformat()},
        }
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    prom = backfilled_prometheus(tmp_path_factory.mktemp("prometheus"), RECORDED)
    yield prom
    prom.stop()


def _series(collected: list[MetricSource]) -> dict[tuple[str, str, str], Series]:
    return {
        (s.name, s.labels.get("Hostname") or s.labels["instance"], s.labels.get("gpu", "")): s
        for src in collected
        for s in src.series
    }


def test_it_pulls_exactly_the_rule_series_of_the_attempts_nodes_and_window(
    prometheus: PrometheusProcess,
) -> None:
    ctx = attempt(A, ["gpu-a01", "gpu-a02"])
    got = PrometheusConnector(prometheus.url, queries=QUERIES, policy=FAST).collect(ctx)
    sources = [s for s in got.sources if isinstance(s, MetricSource)]
    assert [s.name for s in sources] == [f"prometheus/{XID}"]
    series = _series(sources)
    assert sorted(series) == [(XID, "gpu-a01", "0"), (XID, "gpu-a02", "0"), (XID, "gpu-a02", "3")]
    lo, hi = A - timedelta(hours=1), A + timedelta(minutes=70)
    for s in series.values():
        assert s.labels["Hostname"] and "__name__" not in s.labels
        times = [t for t, _ in s.samples]
        assert lo <= times[0] and times[-1] <= hi and times == sorted(times)
        steps = {(b - a).total_seconds() for a, b in pairwise(times)}
        assert steps == {15.0}  # the default resolution, one sample per step, none twice
    assert (
        len(series[(XID, "gpu-a02", "3")].samples) == 130 * 4 + 1
    )  # 130 minutes at 15 s, both ends included
    assert {c.source: (c.status, c.observations) for c in got.coverage} == {
        "prometheus/gpu-a01": ("ok", 521),
        "prometheus/gpu-a02": ("ok", 1042),
    }


def test_the_engine_reads_the_pulled_xid_as_the_gpu_fault(prometheus: PrometheusProcess) -> None:
    ctx = attempt(A, ["gpu-a01", "gpu-a02"])
    got = PrometheusConnector(prometheus.url, queries=QUERIES, policy=FAST).collect(ctx)
    d = default_engine().analyze(AttemptInput(ctx, got.sources, got.coverage))
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        "hardware",
        "gpu",
        ["gpu-a02"],
    )
    [xid] = [e for e in d.evidence if e.role == "root_cause"]
    assert xid.time == "2026-11-02T10:20:00Z" and "79" in xid.text


def test_the_engine_reads_the_pulled_link_down_counter_as_a_fabric_fault(
    prometheus: PrometheusProcess,
) -> None:
    ctx = attempt(B, ["gpu-a03", "gpu-a04", "gpu-a05"])
    got = PrometheusConnector(prometheus.url, queries=QUERIES, policy=FAST).collect(ctx)
    d = default_engine().analyze(AttemptInput(ctx, got.sources, got.coverage))
    assert d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        "network",
        "fabric",
        ["gpu-a03"],
    )
    cov = {c.source: c.status for c in got.coverage}
    assert cov == {"prometheus/gpu-a03": "ok", "prometheus/gpu-a04": "ok", "prometheus/gpu-a05": "missing"}


@pytest.mark.parametrize("hours", [1, 24 * 7, 24 * 60, 24 * 365])
def test_step_and_pieces_stay_under_11000_points_and_tile_the_window(hours: int) -> None:
    start = A.timestamp()
    end = start + hours * 3600
    step, spans = plan(start, end, resolution_s=15)
    assert step == max(15, math.ceil(hours * 3600 / (MAX_POINTS * 8 - 1)))
    assert len(spans) <= 8
    assert spans[0][0] == start and spans[-1][1] >= end - step
    for (_, b), (c, _) in pairwise(spans):
        assert c == b + step  # the next piece's first instant is the one after this piece's last
    assert all((b - a) // step + 1 <= MAX_POINTS for a, b in spans)


def test_a_long_window_is_accepted_by_prometheus(prometheus: PrometheusProcess) -> None:
    """60 days at a 15 s step would be 345,600 points: the real server refuses more than 11,000 per
    series, so the connector must have split (and coarsened) the query."""
    ctx = attempt(A - timedelta(days=59), ["gpu-a02"], minutes=60 * 24 * 60)
    connector = PrometheusConnector(prometheus.url, queries=QUERIES, policy=FAST)
    got = connector.collect(ctx)
    assert {c.status for c in got.coverage} == {"ok"}
    assert connector.api.calls == len(connector.node_labels) * 8


def test_a_bad_query_is_permanent_with_prometheus_message(prometheus: PrometheusProcess) -> None:
    connector = PrometheusConnector(
        prometheus.url, queries=QUERIES, policy=FAST, metrics=[XID], node_labels=["not-a-label"]
    )
    [cov] = connector.collect(attempt(A, ["gpu-a02"])).coverage
    assert cov.status == "failed" and "bad_data" in (cov.reason or "") and "parse error" in (cov.reason or "")
    assert connector.api.calls == 1


@pytest.fixture
def real() -> Iterator[httpx.HTTPTransport]:
    transport = httpx.HTTPTransport()
    yield transport
    transport.close()


def _in_front(real: httpx.HTTPTransport, answers: list[tuple[int, dict[str, str]]]) -> httpx.MockTransport:
    """Canned answers first, then the real server."""
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            canned = answers.pop(0) if answers else None
        if canned is not None:
            return httpx.Response(canned[0], json=canned[1])
        request.read()
        response = real.handle_request(request)
        response.read()
        return response

    return httpx.MockTransport(handler)


def test_prometheus_timeouts_and_overload_are_retried(
    prometheus: PrometheusProcess, real: httpx.HTTPTransport
) -> None:
    timeout = {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}
    transport = _in_front(
        real,
        [
            (503, timeout),
            (429, {"status": "error", "errorType": "unavailable", "error": "too many requests"}),
        ],
    )
    connector = PrometheusConnector(
        prometheus.url,
        queries=QUERIES,
        policy=FAST,
        transport=transport,
        metrics=[XID],
        node_labels=["Hostname"],
    )
    got = connector.collect(attempt(A, ["gpu-a02"]))
    assert [c.status for c in got.coverage] == ["ok"] and connector.api.calls == 3


def test_auth_failures_are_reported_as_such(prometheus: PrometheusProcess, real: httpx.HTTPTransport) -> None:
    transport = _in_front(
        real, [(401, {"status": "error", "errorType": "unauthorized", "error": "bad token"})]
    )
    connector = PrometheusConnector(
        prometheus.url,
        queries=QUERIES,
        policy=FAST,
        transport=transport,
        metrics=[XID],
        node_labels=["Hostname"],
        token="t0ken",
    )
    [cov] = connector.collect(attempt(A, ["gpu-a02"])).coverage
    assert cov.status == "failed" and "HTTP 401" in (cov.reason or "") and connector.api.calls == 1


def test_a_silent_server_is_a_timeout() -> None:
    with socket.socket() as black_hole:  # accepts connections, never answers
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(8)
        url = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
        policy = RetryPolicy(timeout_s=0.2, attempts=2, backoff_s=0.01, max_backoff_s=0.01)
        began = time.monotonic()
        [cov] = (
            PrometheusConnector(url, queries=QUERIES, policy=policy, metrics=[XID], node_labels=["Hostname"])
            .collect(attempt(A, ["gpu-a02"]))
            .coverage
        )
        assert cov.status == "failed" and "within 0.2 s" in (cov.reason or "")
        assert time.monotonic() - began < 2.0


def test_openmetrics_backfill_round_trips(tmp_path: Path) -> None:
    """The fixture path itself: what promtool wrote is what Prometheus serves, sample for sample."""
    series = [dcgm("n1", "0", XID, scrape(A, 0.5, [(A, 0.0), (A + timedelta(minutes=7), 43.0)]))]
    prom = backfilled_prometheus(tmp_path, series)
    try:
        r = httpx.get(
            f"{prom.url}/api/v1/query", params={"query": f"{XID}[1h]", "time": str(A.timestamp() + 1800)}
        )
        [got] = r.json()["data"]["result"]
        assert [(float(t), float(v)) for t, v in got["values"]] == [
            (t.timestamp(), v) for t, v in series[0].samples
        ]
        assert json.loads(json.dumps(got["metric"]))["Hostname"] == "n1"
    finally:
        prom.stop()
