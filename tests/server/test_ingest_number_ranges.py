"""Numbers a client sends outside the store's signed 64-bit range are refused for their record alone.

An attempt of 2^63-1 (which float rounding makes 2^63), "1e30" or "inf", or a timeUnixNano of 2^63 or
more used to overflow SQLite's INTEGER at commit, failing every request batched into the same
transaction (503, retried forever). Now: such a record is rejected at the edge (OTLP partial success;
a request holding nothing else is a 400 / INVALID_ARGUMENT, which clients do not retry), and a value
that still reaches the store fails only its own request.
"""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from postgres_support import fresh_schema
from server_support import ServerProcess

from hypocenter.collector import otlp
from hypocenter.errors import InputError
from hypocenter.server.service import IngestQueue
from hypocenter.store import open_store
from hypocenter.store.base import Entry

pytestmark = pytest.mark.slow

PB = "application/x-protobuf"
LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
T0 = 1_796_282_000_000_000_000


def _request(
    workload: str, attempt: str | None, times: list[int], *, line_attr: str | None = None
) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    attrs = {"host.name": "n1", "hypocenter.workload.id": workload}
    if attempt is not None:
        attrs["hypocenter.workload.attempt"] = attempt
    for k, v in attrs.items():
        rl.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    sl = rl.scope_logs.add()
    for i, t in enumerate(times):
        lr = sl.log_records.add()
        lr.time_unix_nano = t
        lr.body.string_value = f"line {i}"
        if line_attr is not None:
            lr.attributes.append(
                KeyValue(key="log.file.record_number", value=AnyValue(string_value=line_attr))
            )
    return req


@pytest.mark.parametrize(
    ("attempt", "times", "line_attr", "says"),
    [
        (str(2**63 - 1), [T0], None, "attempt '9223372036854775807'"),
        ("1e30", [T0], None, "attempt '1e30'"),
        ("inf", [T0], None, "attempt 'inf'"),
        ("0", [2**63], None, "past 2\\^63-1 ns"),
        ("0", [2**64 - 1], "3", "past 2\\^63-1 ns"),
        ("0", [T0], "9" * 30, "log.file.record_number"),
    ],
)
def test_an_out_of_range_request_is_bad_data(
    attempt: str, times: list[int], line_attr: str | None, says: str
) -> None:
    body = _request("w-poison", attempt, times, line_attr=line_attr).SerializeToString()
    with pytest.raises(InputError, match=says):
        otlp.receive("logs", body, PB)


def test_an_out_of_range_record_among_good_ones_is_a_partial_success() -> None:
    req = _request("w-mixed", "0", [T0, 2**63 + 5, T0 + 1])
    tagged, _ = otlp.receive("logs", req.SerializeToString(), PB)
    response = otlp.export_response("logs", tagged)
    assert isinstance(response, ExportLogsServiceResponse)
    assert tagged.count == 2 and response.partial_success.rejected_log_records == 1
    assert "past 2^63-1 ns" in response.partial_success.error_message


def test_out_of_range_metric_points_are_refused() -> None:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="n1")))
    rm.resource.attributes.append(
        KeyValue(key="hypocenter.workload.attempt", value=AnyValue(double_value=1e30))
    )
    m = rm.scope_metrics.add().metrics.add()
    m.name = "gpu_temp"
    m.gauge.data_points.add(time_unix_nano=T0, as_double=1.0)
    with pytest.raises(InputError, match="attempt '10000000"):
        otlp.receive("metrics", req.SerializeToString(), PB)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("ranges") / "store.db").start()
    yield srv
    srv.stop()


def test_a_poison_tenant_does_not_fail_a_benign_one(server: ServerProcess) -> None:
    """Poison requests interleaved with a benign tenant's, from parallel clients: every benign request
    is stored (200), every poison one is a 400 over HTTP and INVALID_ARGUMENT over gRPC."""
    poison = [
        _request("w-poison", str(2**63 - 1), [T0]),
        _request("w-poison", "1e30", [T0]),
        _request("w-poison", "inf", [T0]),
        _request("w-poison", "0", [2**63 + 1]),
    ]
    benign = [_request("w-benign", "0", [T0 + i * 1000 + k for k in range(20)]) for i in range(60)]

    def post(req: ExportLogsServiceRequest) -> int:
        r = httpx.post(
            f"{server.base}/v1/logs",
            content=req.SerializeToString(),
            headers={"Content-Type": PB},
            timeout=60,
        )
        return r.status_code

    with ThreadPoolExecutor(8) as pool:
        jobs: list[tuple[str, Future[int]]] = []
        for i, req in enumerate(benign):
            jobs.append(("benign", pool.submit(post, req)))
            if i % 3 == 0:
                jobs.append(("poison", pool.submit(post, poison[i % len(poison)])))
        answers = [(kind, f.result()) for kind, f in jobs]
    assert {code for kind, code in answers if kind == "benign"} == {200}
    assert {code for kind, code in answers if kind == "poison"} == {400}
    with grpc.insecure_channel(server.grpc) as ch:
        call = ch.unary_unary(LOGS, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            call(poison[1].SerializeToString(), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1e30" in (err.value.details() or "")
    with server.client() as c:
        stored = c.get("/v1/attempts/w-benign/0").json()["log_records"]
    assert stored == 60 * 20


class _HeldStore:
    """A real store whose first commit waits, so that the next requests are grouped into one."""

    def __init__(self, url: str) -> None:
        self.store = open_store(url)
        self.release = threading.Event()
        self.first = True

    def ingest(self, *args: Any, **kwargs: Any) -> Any:
        if self.first:
            self.first = False
            self.release.wait(30)
        return self.store.ingest(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _entry(workload: str, time_ns: int, n: int) -> Entry:
    return Entry(
        workload=workload,
        attempt=0,
        node="n1",
        stream="app.log",
        kind="doc",
        body=f'{{"n": {n}}}',
        time_ns=time_ns,
        line=None,
        dedup=f"{workload}-{n}",
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "s.db")
    else:
        yield from fresh_schema()


def test_a_value_the_store_refuses_fails_only_its_own_request(store_url: str) -> None:
    """Defence behind the edge: a record that still overflows the store at commit, grouped into one
    transaction with others, fails its own request with a permanent error; the others are stored."""
    held = _HeldStore(store_url)
    queue = IngestQueue(held, capacity=10_000, retry_after=1.0)
    try:
        first = queue.submit([_entry("w-first", T0, 0)], [])
        good = [queue.submit([_entry("w-good", T0 + n, n)], []) for n in range(1, 6)]
        bad = queue.submit([_entry("w-bad", 2**64, 99)], [])
        more = [queue.submit([_entry("w-good", T0 + n, n)], []) for n in range(6, 9)]
        held.release.set()
        assert first.result(30) == 1
        assert [f.result(30) for f in good + more] == [1] * 8
        with pytest.raises(InputError, match="cannot keep"):
            bad.result(30)
        row = held.store.attempt("w-good", 0)
        assert row is not None and len(held.store.attempt_logs(row.id)) == 8
        assert held.store.attempt("w-bad", 0) is None
    finally:
        queue.close()
        held.store.close()


def test_rest_attempt_numbers_out_of_range_are_refused(server: ServerProcess, tmp_path: Path) -> None:
    big = str(2**64)
    yaml = (Path(__file__).resolve().parents[2] / "examples" / "nvlink-xid149" / "attempt.yaml").read_text()
    with server.client() as c:
        assert c.get(f"/v1/attempts/w/{big}").status_code == 422
        assert c.post(f"/v1/attempts/w/{big}/analyze").status_code == 422
        assert c.put(f"/v1/attempts/w/{big}", content=yaml).status_code == 422
        assert (
            c.post(f"/v1/attempts/w/{big}/artifacts", params={"name": "x.txt"}, content=b"x\n").status_code
            == 422
        )
        workload = yaml.split('id: "', 1)[1].split('"', 1)[0]
        bad = yaml.replace("attempt: 0", f"attempt: {big}")
        assert bad != yaml
        r = c.put(f"/v1/attempts/{workload}/0", content=bad)
        assert r.status_code in (400, 422) and "attempt" in r.text, r.text
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            data = bad.encode()
            info = tarfile.TarInfo("b/attempt.yaml")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        r = c.post("/v1/bundles", content=buf.getvalue())
        assert 400 <= r.status_code < 500, r.text
        assert c.get("/healthz").status_code == 200
