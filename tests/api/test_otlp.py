"""The OTLP receivers against bad and odd input: clear OTLP errors or partial success, and the
server keeps serving. Also OTLP/JSON's hex ids, gzip, both transports' partial success, and
back-pressure (UNAVAILABLE + RetryInfo, 503 + Retry-After)."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from server_support import ServerProcess

from hypocenter.collector import otlp

pytestmark = pytest.mark.slow

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def _logs(*records: tuple[dict[str, Any], dict[str, Any], Any]) -> logs_service_pb2.ExportLogsServiceRequest:
    """(resource attrs, record attrs, body) → an export request, one resource per record."""
    req = logs_service_pb2.ExportLogsServiceRequest()
    for rattrs, lattrs, body in records:
        rl = req.resource_logs.add()
        for k, v in rattrs.items():
            kv = rl.resource.attributes.add(key=k)
            kv.value.string_value = str(v)
        lr = rl.scope_logs.add().log_records.add()
        lr.time_unix_nano = 1_793_000_000_000_000_000
        lr.body.string_value = body
        for k, v in lattrs.items():
            kv = lr.attributes.add(key=k)
            if isinstance(v, int):
                kv.value.int_value = v
            else:
                kv.value.string_value = str(v)
    return req


JOB = {"hypocenter.workload.id": "otlp-test", "hypocenter.workload.attempt": "0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("otlp") / "store.db", "--max-message-bytes", str(1 << 20)
    ).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c
    # whatever the test sent, the server still serves
    assert server.alive()
    with server.client() as c:
        assert c.get("/healthz").status_code == 200


def test_protobuf_logs_are_accepted(client: httpx.Client) -> None:
    req = _logs((JOB, {"log.file.path": "logs/_job/out", "log.file.record_number": 1}, "hello"))
    r = client.post("/v1/logs", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-protobuf"
    resp = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
    assert not resp.HasField("partial_success")


def test_json_with_hex_trace_id_and_gzip(client: httpx.Client) -> None:
    doc = {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-json"}}]},
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "timeUnixNano": "1793000000000000000",
                                "body": {"stringValue": "NVRM: Xid (PCI:0000:3b:00): 79"},
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "attributes": [
                                    {"key": "log.file.path", "value": {"stringValue": "/var/log/kern.log"}}
                                ],
                                "someFutureField": 1,
                            }
                        ]
                    }
                ],
            }
        ]
    }
    body = gzip.compress(json.dumps(doc).encode())
    r = client.post("/v1/logs", content=body, headers={**JS, "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    # the decoder itself: hex ids become the 16/8 bytes they spell, not base64 garbage
    req, _ = otlp.decode_logs(json.dumps(doc).encode(), "application/json")
    lr = req.resource_logs[0].scope_logs[0].log_records[0]
    assert lr.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert lr.span_id.hex() == "eee19b7ec3c1b174"


def test_records_without_node_or_workload_are_partial_success(client: httpx.Client) -> None:
    req = _logs((JOB, {}, "kept"), ({"service.name": "orphan"}, {}, "dropped"), ({}, {}, "dropped too"))
    r = client.post("/v1/logs", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 200
    ps = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content).partial_success
    assert ps.rejected_log_records == 2
    assert "neither a node" in ps.error_message and "host.name" in ps.error_message
    js = client.post(
        "/v1/logs",
        content=json.dumps(
            {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "x"}}]}]}]}
        ),
        headers=JS,
    )
    assert js.status_code == 200
    assert js.json()["partialSuccess"]["rejectedLogRecords"] == "1"


def test_malformed_protobuf_is_400_with_a_status(client: httpx.Client) -> None:
    r = client.post("/v1/logs", content=b"\xff\xff\xff\x0f garbage", headers=PB)
    assert r.status_code == 400
    st = status_pb2.Status.FromString(r.content)
    assert st.code == 3 and "malformed protobuf" in st.message


def test_malformed_json_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/metrics", content=b'{"resourceMetrics": [', headers=JS)
    assert r.status_code == 400
    assert "malformed OTLP/JSON" in r.json()["message"]
    r = client.post(
        "/v1/logs",
        content=b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}',
        headers=JS,
    )
    assert r.status_code == 400


def test_invalid_utf8(client: httpx.Client) -> None:
    good = _logs((JOB, {}, "hello")).SerializeToString()
    bad = good.replace(b"hello", b"h\xffllo")
    r = client.post("/v1/logs", content=bad, headers=PB)
    assert r.status_code == 400
    assert "UTF-8" in status_pb2.Status.FromString(r.content).message
    # JSON: undecodable bytes are replaced and the request accepted with a warning
    doc = json.dumps(
        {
            "resourceLogs": [
                {
                    "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "n1"}}]},
                    "scopeLogs": [{"logRecords": [{"body": {"stringValue": "PLACEHOLDER"}}]}],
                }
            ]
        }
    ).encode()
    r = client.post("/v1/logs", content=doc.replace(b"PLACEHOLDER", b"caf\xe9"), headers=JS)
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert "UTF-8" in ps["errorMessage"] and ps.get("rejectedLogRecords", "0") in ("0", 0)


def test_wrong_content_type_is_415(client: httpx.Client) -> None:
    for ctype in ("text/plain", "application/xml", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = client.post("/v1/logs", content=b"hello", headers=headers)
        assert r.status_code == 415, ctype
        assert "application/x-protobuf" in r.json()["message"]


def test_unknown_content_encoding_is_415_and_bad_gzip_400(client: httpx.Client) -> None:
    r = client.post("/v1/logs", content=b"x", headers={**PB, "Content-Encoding": "br"})
    assert r.status_code == 415
    r = client.post("/v1/logs", content=b"not gzip", headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 400


def test_oversize_is_413_also_after_decompression(client: httpx.Client) -> None:
    big = b"\x00" * ((1 << 20) + 10)
    r = client.post("/v1/logs", content=big, headers=PB)
    assert r.status_code == 413
    bomb = gzip.compress(b"\x00" * (4 << 20))  # small on the wire, 4 MiB inflated
    assert len(bomb) < (1 << 20)
    r = client.post("/v1/logs", content=bomb, headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 413


def test_grpc_partial_success_and_errors(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)
        resp = stub.Export(_logs((JOB, {}, "a"), ({"x": "y"}, {}, "b")), timeout=10)
        assert resp.partial_success.rejected_log_records == 1
        raw = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\x0f garbage", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed protobuf" in (err.value.details() or "")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\x0a" + b"\x00" * ((1 << 20) + 64), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        mstub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        mreq = metrics_service_pb2.ExportMetricsServiceRequest()
        m = mreq.resource_metrics.add().scope_metrics.add().metrics.add(name="h")
        m.histogram.data_points.add(count=1)
        assert mstub.Export(mreq, timeout=10).partial_success.rejected_data_points == 1


# --------------------------------------------------------------------------------------------- back-pressure


class _SlowStore:
    """A store whose writes wait for `release`, so the ingest queue fills up."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.release = threading.Event()

    def ingest(self, *args: Any) -> int:
        self.release.wait(20)
        result: int = self.inner.ingest(*args)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_full_queue_answers_unavailable_with_retry_info(tmp_path: Path) -> None:
    from hypocenter.cli.assembly import serve_in_thread
    from hypocenter.config import load_settings
    from hypocenter.store.sqlite import SQLiteStore

    settings, _ = load_settings(
        {
            "grpc_listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "metrics_listen": "127.0.0.1:0",
            "ingest_queue_records": 2,
            "retry_after_s": 2,
            "log_level": "error",
        },
        environ={},
    )
    store = _SlowStore(SQLiteStore(tmp_path / "s.db"))
    server, thread = serve_in_thread(settings, store)  # type: ignore[arg-type]
    try:
        body = _logs((JOB, {"log.file.record_number": 1}, "first")).SerializeToString()
        first: list[int] = []
        t = threading.Thread(
            target=lambda: first.append(
                httpx.post(
                    f"http://{server.http_address}/v1/logs", content=body, headers=PB, timeout=30
                ).status_code
            )
        )
        t.start()
        deadline = 100
        while server.service.queue.pending == 0 and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        more = _logs((JOB, {"log.file.record_number": 2}, "a"), (JOB, {"log.file.record_number": 3}, "b"))
        r = httpx.post(
            f"http://{server.http_address}/v1/logs", content=more.SerializeToString(), headers=PB, timeout=10
        )
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "2"
        with grpc.insecure_channel(server.grpc_address) as channel:
            with pytest.raises(grpc.RpcError) as err:
                logs_service_pb2_grpc.LogsServiceStub(channel).Export(more, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            details = dict(err.value.trailing_metadata() or ())["grpc-status-details-bin"]
            status = status_pb2.Status.FromString(details)
            retry = error_details_pb2.RetryInfo()
            assert status.details[0].Unpack(retry)
            assert retry.retry_delay.seconds == 2
        store.release.set()
        t.join(20)
        assert first == [200]
        r = httpx.post(
            f"http://{server.http_address}/v1/logs", content=more.SerializeToString(), headers=PB, timeout=10
        )
        assert r.status_code == 200
    finally:
        store.release.set()
        server.shutdown()
        thread.join(30)
