"""The attempt's window follows the job, not the sender.

The official OpenTelemetry Python SDK stamps a record when the program emits it, so a job's logs sent
at its end all carry the same few milliseconds. A GPU that fell off the bus fifteen minutes before the
job died is still this attempt's root cause: the window starts at the earliest stamp its lines carry.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from server_support import ServerProcess, serving, wait_for_diagnosis

pytestmark = pytest.mark.slow

WORKLOAD = "sdk-xid79"


def kern_log(at: datetime) -> list[str]:
    stamp = f"{at:%b} {at.day:2d} {at:%H:%M:%S}"
    return [
        f"{stamp} gpu-n07 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-3e51c7a0-9d24-4b8f-a6e2-0c7b19f4d835",
        f"{stamp} gpu-n07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        f"{stamp} gpu-n07 kernel: NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ]


RANK_OUTPUT = [
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 212, in <module>',
    "    loss.backward()",
    "[rank3]: RuntimeError: CUDA error: unspecified launch failure",
    "gpu-n08:2214878:2215709 [1] misc/socket.cc:47 NCCL WARN socketProgressOpt: Call to recv from"
    " 10.10.0.7<48733> failed : Connection reset by peer",
    "gpu-n08:2214878:2215709 [1] NCCL WARN [Service thread] Error encountered progressing operation=Connect,"
    " res=3, closing connection",
]


def send_with_sdk(endpoint: str, host: str, path: str, lines: list[str], state: str | None = None) -> None:
    """What a training script's or a node agent's SDK does: one provider per process (its resource
    names the node and the workload), records emitted now, batched and exported over OTLP/HTTP."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    provider = LoggerProvider(
        resource=Resource.create(
            {"host.name": host, "hypocenter.workload.id": WORKLOAD, "hypocenter.workload.attempt": 0}
        )
    )
    provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=endpoint)))
    logger = provider.get_logger("train")
    for line in lines:
        logger.emit(body=line, attributes={"log.file.path": path})
    if state is not None:
        logger.emit(body=f"job ended {state}", attributes={"hypocenter.attempt.state": state})
    provider.shutdown()  # flushes the batch


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(tmp_path / "store.db") as s:
        yield s


def test_an_xid_fifteen_minutes_before_the_sdk_sent_the_logs_is_attributed(server: ServerProcess) -> None:
    endpoint = f"{server.base}/v1/logs"
    xid_at = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=15)
    send_with_sdk(endpoint, "gpu-n07", "/var/log/kern.log", kern_log(xid_at))
    send_with_sdk(endpoint, "gpu-n08", "/workspace/rank3.out", RANK_OUTPUT)
    send_with_sdk(endpoint, "gpu-n07", "/workspace/rank0.out", [], state="FAILED")
    with server.client() as client:
        d = wait_for_diagnosis(client, WORKLOAD)
    assert d["outcome"] == "attributed", (d["outcome"], d["quality"]["reasons"])
    assert (d["root_cause"]["domain"], d["root_cause"]["subdomain"]) == ("hardware", "gpu")
    assert d["root_cause"]["nodes"] == ["gpu-n07"]
    assert d["root_cause"]["first_seen"].startswith(xid_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert d["attempt"]["window"]["start"].startswith(xid_at.strftime("%Y-%m-%dT%H:%M:%S"))
