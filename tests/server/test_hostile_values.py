"""Small holes from issue #12: values from clients cannot forge the server's log lines or break
PromQL, SIGTERM closes the store, store_synchronous is applied, YAML aliases are refused, and a
PUT whose rank map is too large is refused (422) without stalling the server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from server_support import ServerProcess

from hypocenter import strict_yaml
from hypocenter.cli.assembly import Server
from hypocenter.collector.bundle import documents
from hypocenter.collector.connectors.prometheus import PrometheusConnector
from hypocenter.config import load_settings
from hypocenter.errors import InputError

pytestmark = pytest.mark.slow


def test_a_newline_in_a_workload_id_cannot_forge_a_log_line(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db", "--log-level", "info").start()
    forged = "7\n2026-12-03 07:00:00,000 INFO hypocenter.server: FORGED admin logged in"
    try:
        with server.client() as client:
            doc = {
                "resourceLogs": [
                    {
                        "resource": {
                            "attributes": [
                                {"key": "slurm.job.id", "value": {"stringValue": forged}},
                                {"key": "host.name", "value": {"stringValue": "n1\nFORGED node"}},
                                {"key": "hypocenter.attempt.state", "value": {"stringValue": "FAILED"}},
                            ]
                        },
                        "scopeLogs": [
                            {
                                "logRecords": [
                                    {
                                        "timeUnixNano": "1793000000000000000",
                                        "body": {"stringValue": "job ended"},
                                    }
                                ]
                            }
                        ],
                    }
                ]
            }
            r = client.post("/v1/logs", content=json.dumps(doc), headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "diagnosis" not in server.log_path.read_text():
                time.sleep(0.05)
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "diagnosis" in log and "FORGED admin" in log
    assert not any(
        line.lstrip().startswith(("FORGED", "2026-12-03 07:00:00,000")) for line in log.splitlines()
    )


def test_a_newline_in_a_node_name_stays_inside_the_promql_string() -> None:
    conn = PrometheusConnector(
        "http://127.0.0.1:9", metrics=["DCGM_FI_DEV_XID_ERRORS"], node_labels=["Hostname"]
    )
    (selector,) = conn.selectors(['n1"}\nor vector(1)#'])
    assert "\n" not in selector and selector.count('"') - selector.count('\\"') == 4, selector


def test_sigterm_closes_the_store(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db").start()
    with server.client() as client:
        assert client.get("/readyz").status_code == 200
    wal = tmp_path / "h.db-wal"
    assert wal.exists()
    server.stop()  # SIGTERM
    assert not wal.exists()  # SQLite removes the WAL when the last connection closes cleanly


@pytest.mark.parametrize("mode", ["NORMAL", "FULL", "EXTRA"])
def test_store_synchronous_is_applied(tmp_path: Path, mode: str) -> None:
    settings, _ = load_settings({"store": str(tmp_path / "h.db"), "store_synchronous": mode}, environ={})
    server = Server(settings)
    try:
        level = server.store._db.execute("PRAGMA synchronous").fetchone()[
            0
        ]  # per connection: only ours can tell
    finally:
        server.store.close()
    assert level == {"NORMAL": 1, "FULL": 2, "EXTRA": 3}[mode]


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
)


def test_yaml_aliases_are_refused_everywhere() -> None:
    with pytest.raises(InputError, match="aliases"):
        strict_yaml.loads(LAUGHS, "attempt.yaml")
    with pytest.raises(ValueError, match="aliases"):
        documents(LAUGHS)  # events/*.yaml of a bundle


def test_a_put_with_a_huge_rank_map_is_422_and_the_server_stays_responsive(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "h.db", "--max-nodes-per-attempt", "1000").start()
    body = (
        "workload: {id: '9', attempt: 0}\nwindow: {start: '2026-11-02T10:00:00Z', end: '2026-11-02T11:00:00Z'}\n"
        "nodes: [n1, n2]\nranks: {n1: '0-1000000000000', n2: '0-3'}\n"
    )
    hostlist = "nodes: [" + ", ".join(f"n{i}" for i in range(1001)) + "]\n"
    try:
        with server.client() as client:
            r = client.put("/v1/attempts/9/0", content=body)
            assert r.status_code == 422 and "max_ranks_per_attempt" in r.json()["detail"], r.text
            r = client.put(
                "/v1/attempts/9/0",
                content=body.replace("nodes: [n1, n2]\n", hostlist).replace(
                    "ranks: {n1: '0-1000000000000', n2: '0-3'}\n", ""
                ),
            )
            assert r.status_code == 422 and "max_nodes_per_attempt" in r.json()["detail"], r.text
            r = client.put("/v1/attempts/9/0", content=LAUGHS)
            assert r.status_code == 400 and "aliases" in r.json()["detail"], r.text
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()


def test_a_hostlist_of_many_ranges_is_refused_at_the_node_bound() -> None:
    from hypocenter.collector.hostlist import HostlistTooLarge, expand_hostlist

    text = ",".join(f"rack{i}-n[0-60000]" for i in range(30))  # 1.8 million hosts, each range in bounds
    with pytest.raises(HostlistTooLarge, match="max_nodes_per_attempt"):
        expand_hostlist(text)
    assert expand_hostlist("n[01-03],bad[") == ["n01", "n02", "n03", "bad["]  # malformed parts still kept


def test_records_per_request_are_bounded_on_both_otlp_transports(tmp_path: Path) -> None:
    import grpc
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="host.name").value.string_value = "n1"
    sl = rl.scope_logs.add()
    for i in range(11):
        sl.log_records.add(time_unix_nano=1_793_000_000_000_000_000 + i).body.string_value = f"line {i}"
    server = ServerProcess(tmp_path / "h.db", "--max-records-per-request", "10").start()
    try:
        with server.client() as client:
            r = client.post(
                "/v1/logs",
                content=req.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert r.status_code == 413, r.text
            del sl.log_records[-1]
            r = client.post(
                "/v1/logs",
                content=req.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert r.status_code == 200, r.text
            empties = b",".join([b"{}"] * 700)  # 700 empty records: refused before json.loads builds them
            r = client.post(
                "/v1/logs",
                content=b'{"resourceLogs":[{"scopeLogs":[{"logRecords":[' + empties + b"]}]}]}",
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 413 and "OTLP/JSON body holds" in r.text, r.text
        sl.log_records.add().body.string_value = "one too many"
        with grpc.insecure_channel(server.grpc) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
            with pytest.raises(grpc.RpcError) as err:
                export(req.SerializeToString(), timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert "max_records_per_request" in err.value.details()  # type: ignore[attr-defined]
    finally:
        server.stop()


def test_decodes_beyond_the_concurrency_bound_wait_then_are_told_to_retry() -> None:
    from hypocenter import limits
    from hypocenter.collector import otlp

    before = limits.active()
    limits.configure(limits.Limits(max_concurrent_decodes=1))
    try:
        with limits.decode_slot(1.0), pytest.raises(otlp.DecoderBusy, match="retry later"):
            otlp.receive_bounded("logs", b"", None, "application/x-protobuf", 1 << 20, wait_s=0.2)
        tagged, _ = otlp.receive_bounded("logs", b"", None, "application/x-protobuf", 1 << 20, wait_s=0.2)
        assert tagged.accepted == []
    finally:
        limits.configure(before)


def test_http_decodes_on_the_event_loop_only_when_a_slot_is_free() -> None:
    """A small OTLP/HTTP request is decoded without a worker thread when a decode slot is free; with
    none free it is left to the worker thread, which waits for one (never the event loop)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from hypocenter import limits
    from hypocenter.api import http

    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="host.name").value.string_value = "gpu0001"
    rl.scope_logs.add().log_records.add().body.string_value = "one line"
    body = req.SerializeToString()
    before = limits.active()
    limits.configure(limits.Limits(max_concurrent_decodes=1))
    try:
        inline = http._receive_inline("logs", body, "application/x-protobuf", 1 << 20)
        assert inline is not None and inline[0].count == 1
        with limits.decode_slot(1.0):
            assert http._receive_inline("logs", body, "application/x-protobuf", 1 << 20) is None
    finally:
        limits.configure(before)
