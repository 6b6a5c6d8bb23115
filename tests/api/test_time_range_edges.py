"""Client times outside what the store keeps (signed 64-bit Unix nanoseconds: 1970 … 2262 here) are
refused or ignored at the edge: a `since` of year 9999 is a 400 naming the range, not a 500, and an
attempt whose `hypocenter.attempt.window.start` says 9999 is analysed with the window inferred from
its records, instead of failing in the store."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

T0 = 1_796_282_000_000_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv, thread = serve_in_thread(settings(tmp_path_factory.mktemp("times")))
    yield srv
    srv.shutdown()
    thread.join(30)


@pytest.mark.parametrize(
    "when", ["9999-12-31T23:59:59Z", "2262-04-12T00:00:00Z", "0001-01-01T00:00:00Z", "99999999999999999999"]
)
def test_query_times_out_of_range_are_a_clear_400(server: Server, when: str) -> None:
    for name in ("since", "until"):
        r = httpx.get(f"http://{server.http_address}/v1/diagnoses", params={name: when}, timeout=30)
        assert r.status_code == 400, r.text
        assert "between 1970 and 2262" in r.json()["detail"]
    ok = httpx.get(f"http://{server.http_address}/v1/diagnoses", params={"since": "2026-01-01T00:00:00Z"})
    assert ok.status_code == 200


def _finished(job: str, window: dict[str, str]) -> bytes:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    attrs = {"host.name": "n1", "slurm.job.id": job, "hypocenter.attempt.state": "FAILED", **window}
    rl.resource.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items())
    rec = rl.scope_logs.add().log_records.add()
    rec.time_unix_nano = T0
    rec.body.string_value = "job ended"
    return req.SerializeToString()


@pytest.mark.parametrize(
    "window",
    [
        {"hypocenter.attempt.window.start": "9999-12-31T23:59:59Z"},
        {"hypocenter.attempt.window.end": "9999-12-31T23:59:59Z"},
        {"hypocenter.attempt.window.start": "0001-01-01T00:00:00Z"},
        {"hypocenter.attempt.window.start": "99999999999999999999"},
    ],
    ids=["start-9999", "end-9999", "start-0001", "start-ns"],
)
def test_window_out_of_range_is_ignored_not_a_failed_analysis(server: Server, window: dict[str, str]) -> None:
    job = "edge-" + "-".join(window.values()).replace(":", "")
    r = httpx.post(
        f"http://{server.http_address}/v1/logs",
        content=_finished(job, window),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=30,
    )
    assert r.status_code == 200, r.content
    deadline = time.monotonic() + 60
    base = f"http://{server.http_address}"
    while True:
        row = httpx.get(f"{base}/v1/attempts/{job}/0", timeout=30).json()
        assert not row.get("failure"), row["failure"]
        found = httpx.get(f"{base}/v1/diagnoses", params={"workload": job}, timeout=30).json()
        if found["total"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found["total"] == 1, found
