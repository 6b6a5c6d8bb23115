"""OTLP/protobuf requests are bounded in attributes too (`max_attributes_per_request`), counted on the
wire before decoding: an empty attribute takes two bytes of body and a message object once decoded,
so a body within `max_message_bytes` could hold tens of millions of them (30 MiB cost 0.9 GB and
16 s). Attributes nested in key-value lists, array values and data-point attributes count alike."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from hypocenter import limits
from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

BOUND = 1000
NODE = KeyValue(key="host.name", value=AnyValue(string_value="n1"))
JOB = KeyValue(key="hypocenter.workload.id", value=AnyValue(string_value="pb-attrs"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv, thread = serve_in_thread(
        settings(tmp_path_factory.mktemp("pbattrs"), max_attributes_per_request=BOUND)
    )
    yield srv
    srv.shutdown()
    thread.join(30)
    limits.configure(limits.DEFAULT)


def _logs(record: LogRecord) -> bytes:
    resource = Resource(attributes=[NODE, JOB])
    req = ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(resource=resource, scope_logs=[ScopeLogs(log_records=[record])])]
    )
    return req.SerializeToString()


def _flat(n: int) -> LogRecord:
    return LogRecord(
        time_unix_nano=1, body=AnyValue(string_value="line"), attributes=[KeyValue() for _ in range(n)]
    )


def _nested(n: int) -> LogRecord:
    inner = AnyValue()
    inner.kvlist_value.values.extend(KeyValue(key=f"k{i}") for i in range(n))
    return LogRecord(
        time_unix_nano=1, body=AnyValue(string_value="line"), attributes=[KeyValue(key="x", value=inner)]
    )


def _array_body(n: int) -> LogRecord:
    body = AnyValue()
    body.array_value.values.extend(AnyValue() for _ in range(n))
    return LogRecord(time_unix_nano=1, body=body)


def _post(server: Server, body: bytes) -> httpx.Response:
    return httpx.post(
        f"http://{server.http_address}/v1/logs",
        content=body,
        headers={"Content-Type": "application/x-protobuf"},
        timeout=30,
    )


@pytest.mark.parametrize("shape", [_flat, _nested, _array_body], ids=["record", "kvlist", "array"])
def test_too_many_protobuf_attributes_are_refused_before_decoding(server: Server, shape: object) -> None:
    make = shape  # a function of the attribute count
    assert callable(make)
    r = _post(server, _logs(make(BOUND + 10)))
    assert r.status_code == 413, r.content
    assert b"max_attributes_per_request" in r.content
    ok = _post(server, _logs(make(BOUND - 10)))
    assert ok.status_code == 200, ok.content


def test_data_point_attributes_count_over_grpc(server: Server) -> None:
    def request(n: int) -> ExportMetricsServiceRequest:
        point = NumberDataPoint(time_unix_nano=1, as_double=1.0, attributes=[KeyValue() for _ in range(n)])
        metric = Metric(name="m", gauge=Gauge(data_points=[point]))
        return ExportMetricsServiceRequest(
            resource_metrics=[
                ResourceMetrics(
                    resource=Resource(attributes=[NODE, JOB]), scope_metrics=[ScopeMetrics(metrics=[metric])]
                )
            ]
        )

    with grpc.insecure_channel(server.grpc_address) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=ExportMetricsServiceRequest.SerializeToString,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as refused:
            export(request(BOUND + 10), timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_attributes_per_request" in (refused.value.details() or "")
        export(request(BOUND - 10), timeout=30)
