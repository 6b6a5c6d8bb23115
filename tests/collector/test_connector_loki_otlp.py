"""Logs sent to Loki's own `/otlp/v1/logs` keep `log.file.path` as structured metadata: the pull
names each pulled stream after its file from that metadata, one source per file, as it does with a
promtail `filename` label (before, every file of a node came back as one `unknown_service`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx
from observability_fakes import FakeLoki
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.collector.connectors.loki import LokiConnector
from hypocenter.engine import default_engine
from hypocenter.model import AttemptContext

START = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=30)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
LINK = "mlx5_core 0000:5c:00.0 mlx5_3: Port module event: module 3, Cable unplugged"


def _otlp(records: list[tuple[str, str, str, int]]) -> bytes:
    """One resource per node, no service.name (as a filelog receiver sends), file path per record."""
    request = ExportLogsServiceRequest()
    for host in sorted({r[0] for r in records}):
        rl = request.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "host.name", host
        scope = rl.scope_logs.add()
        for node, path, line, offset_s in records:
            if node != host:
                continue
            rec = scope.log_records.add()
            rec.time_unix_nano = int((START + timedelta(seconds=offset_s)).timestamp()) * 10**9
            rec.body.string_value = line
            for key, value in (("log.file.path", path), ("log.file.name", path.rsplit("/", 1)[-1])):
                attr = rec.attributes.add()
                attr.key, attr.value.string_value = key, value
    return request.SerializeToString()


def test_streams_sent_over_otlp_are_named_after_their_files() -> None:
    loki = FakeLoki().start()
    try:
        body = _otlp(
            [
                ("node01", "/var/log/kern.log", XID, 60),
                ("node01", "/var/log/syslog", LINK, 90),
                ("node01", "/var/log/kern.log", XID.replace("79", "48"), 120),
            ]
        )
        answer = httpx.post(
            f"{loki.url}/otlp/v1/logs",
            content=body,
            headers={"Content-Type": "application/x-protobuf"},
            timeout=10,
        )
        assert answer.status_code == 204, answer.text
        connector = LokiConnector(
            loki.url,
            queries=default_engine().ruleset.queries(),
            policy=RetryPolicy(attempts=1, timeout_s=10),
            selector='service_name=~".+"',
            node_label="host_name",
            node_label_kind="metadata",
        )
        ctx = AttemptContext.model_validate(
            {
                "workload": {"id": "81234", "attempt": 0},
                "nodes": ["node01"],
                "window": {"start": START.isoformat(), "end": (START + timedelta(minutes=10)).isoformat()},
            }
        )
        collected = connector.collect(ctx)
    finally:
        loki.stop()
    names = sorted(s.name for s in collected.sources)
    assert names == ["loki/node01/kern.log", "loki/node01/syslog"], names
    kern = next(s for s in collected.sources if s.name.endswith("kern.log"))
    text = kern.text if isinstance(kern.text, str) else kern.text.decode()
    assert [line.split("] ", 1)[-1] for line in text.splitlines()] == [XID, XID.replace("79", "48")]
