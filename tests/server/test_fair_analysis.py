"""Analysis takes turns between clusters: one cluster's flood of finished attempts does not hold back
another cluster's verdict (the analysis loop used to work through every due attempt oldest first)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from server_support import ServerProcess

from hypocenter.store.base import AttemptRow

FLOOD = 300
T0 = 1_796_282_000_000_000_000


def _attempts(jobs: list[tuple[str, str]]) -> bytes:
    """One finished attempt per (job, cluster): a single log line with the terminal-state marker."""
    req = ExportLogsServiceRequest()
    for i, (job, cluster) in enumerate(jobs):
        rl = req.resource_logs.add()
        for k, v in {
            "host.name": "n1",
            "slurm.job.id": job,
            "hypocenter.workload.cluster": cluster,
            "hypocenter.attempt.state": "FAILED",
        }.items():
            rl.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
        rec = rl.scope_logs.add().log_records.add()
        rec.time_unix_nano = T0 + i
        rec.body.string_value = "job ended"
    return req.SerializeToString()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "store.db").start()
    yield srv
    srv.stop()


def _all(client: httpx.Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = client.get("/v1/diagnoses", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
        body = page.json()
        out.extend(body["diagnoses"] if isinstance(body, dict) else body)
        cursor = body.get("next_cursor") if isinstance(body, dict) else None
        if not cursor:
            return out


def test_a_flood_from_one_cluster_does_not_delay_another_clusters_verdict(server: ServerProcess) -> None:
    with server.client() as client:
        # one request, so that every attempt becomes due at once: the order of analysis is then
        # the loop's choice alone (bench/bombs.py --attack fairness sends the flood first)
        jobs = [(f"flood-{i}", "flood") for i in range(FLOOD)] + [("normal-1", "quiet")]
        r = client.post(
            "/v1/logs", content=_attempts(jobs), headers={"Content-Type": "application/x-protobuf"}
        )
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 600
        while len(found := _all(client)) < FLOOD + 1 and time.monotonic() < deadline:
            time.sleep(1.0)
    assert len(found) == FLOOD + 1
    order = [d["workload"] for d in sorted(found, key=lambda d: d["created"])]
    # the normal attempt takes its turn among the first, not after the flood drains
    assert order.index("normal-1") < 10, order.index("normal-1")  # oldest first, it would be last


def _row(n: int, cluster: str) -> AttemptRow:
    return AttemptRow(
        id=n,
        workload=f"w{n}",
        attempt=0,
        scope={"cluster": cluster} if cluster else {},
        context=None,
        nodes=[],
        first_ns=None,
        last_ns=None,
        terminal_ns=None,
        activity=float(n),
        dirty=True,
        analyzed_at=None,
    )


def test_fair_order_takes_clusters_in_turn_oldest_first() -> None:
    from hypocenter.server.service import fair_order

    rows = [_row(1, "a"), _row(2, "a"), _row(3, "a"), _row(4, "b"), _row(5, ""), _row(6, "b")]
    assert [r.id for r in fair_order(rows)] == [1, 4, 5, 2, 6, 3]
