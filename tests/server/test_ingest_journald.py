"""The journald receiver sends each journal entry as a map body of the entry's fields. Such an entry is
a log line (as `journalctl -o json` prints it, of the fields a line is read by), numbered on arrival
like any text record — not a structured document, which the analysis reads as scheduler or
Kubernetes records and would find none in. Sent that way, a node's kernel log gives the attempt the
diagnosis `hypocenter analyze` gives from the kernel log file."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from interleave_support import otlp_requests
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from server_support import REPO, analyze, essence

from hypocenter.collector import otlp
from tests.server.test_ingest_unnumbered import _diagnose

BUNDLE = REPO / "examples" / "nvlink-xid149"
PROTOBUF = "application/x-protobuf"
_SYSLOG = re.compile(r"^(\w{3} +\d+ [\d:]+) (\S+) kernel: (?:\[ *[\d.]+\] )?(.*)$")


def _entry(line: str, cursor: int) -> dict[str, str]:
    """A kernel log line as the journal holds it (every field the journald receiver sends)."""
    m = _SYSLOG.match(line)
    assert m is not None, line
    when = datetime.strptime(f"2026 {m.group(1)}", "%Y %b %d %H:%M:%S").replace(tzinfo=timezone.utc)
    return {
        "MESSAGE": m.group(3),
        "PRIORITY": "6",
        "SYSLOG_FACILITY": "0",
        "SYSLOG_IDENTIFIER": "kernel",
        "_BOOT_ID": "5b0c6e1f6a2c4a8f9a64f3e2b1d0c9a8",
        "_HOSTNAME": m.group(2),
        "_MACHINE_ID": "0e9b1c7d3f2a4b5c8d6e7f8091a2b3c4",
        "_SOURCE_MONOTONIC_TIMESTAMP": "294950412118",
        "_TRANSPORT": "kernel",
        "__CURSOR": f"s=5b0c;i={cursor:x}",
        "__MONOTONIC_TIMESTAMP": "294950412200",
        "__REALTIME_TIMESTAMP": str(int(when.timestamp() * 1_000_000)),
    }


def _journald_request(node: str, entries: list[dict[str, str]]) -> bytes:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="host.name").value.string_value = node
    sl = rl.scope_logs.add()
    for e in entries:
        lr = sl.log_records.add(time_unix_nano=int(e["__REALTIME_TIMESTAMP"]) * 1000)
        for k, v in e.items():
            lr.body.kvlist_value.values.add(key=k, value=AnyValue(string_value=v))
    return req.SerializeToString()


def test_a_journal_entry_is_a_log_line_of_the_fields_it_is_read_by() -> None:
    entry = _entry("Nov  2 10:51:03 node02 kernel: [294950.412118] NVRM: Xid (PCI:0000:3b:00): 149, x", 1)
    tagged, _ = otlp.receive("logs", _journald_request("node02", [entry]), PROTOBUF)
    [e] = [*tagged.accepted, *(x for b in tagged.blocks for x in b.entries())]
    assert e.kind == "text" and e.node == "node02"
    line = json.loads(e.body)
    assert line["MESSAGE"] == "NVRM: Xid (PCI:0000:3b:00): 149, x" and line["_TRANSPORT"] == "kernel"
    assert "__CURSOR" not in line and "_BOOT_ID" not in line  # fields no line is read by
    # a document that is no journal entry (a Kubernetes Event's lowercase message) stays a document
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="host.name").value.string_value = "node02"
    lr = rl.scope_logs.add().log_records.add(time_unix_nano=1)
    lr.body.kvlist_value.values.add(key="message", value=AnyValue(string_value="Back-off restarting"))
    tagged, _ = otlp.receive("logs", req.SerializeToString(), PROTOBUF)
    assert [e.kind for e in tagged.accepted] == ["doc"]


def test_a_kernel_log_sent_by_the_journald_receiver_diagnoses_as_the_file(tmp_path: Path) -> None:
    kern = (BUNDLE / "logs" / "node02" / "kern.log").read_text().splitlines()
    requests = [body for body, keys in otlp_requests(BUNDLE) if keys[0][0] != "logs/node02/kern.log"]
    journal = _journald_request("node02", [_entry(line, i) for i, line in enumerate(kern, 1)])
    got, _, bare = _diagnose(str(tmp_path / "store.db"), [journal, *requests[:-1], requests[-1]])
    doc: dict[str, Any] = json.loads(got)
    want = analyze(BUNDLE)
    assert doc["root_cause"]["nodes"] == ["node02"]
    assert (doc["outcome"], doc["root_cause"]["domain"], doc["root_cause"]["subdomain"]) == (
        want["outcome"],
        want["root_cause"]["domain"],
        want["root_cause"]["subdomain"],
    )
    assert essence(doc)["root_cause"] == essence(want)["root_cause"]
    cited = [e for e in doc["evidence"] if str(e.get("ref", "")).startswith("node02:otlp")]
    assert any("Xid (PCI:0000:3b:00): 149" in e["text"] for e in cited), doc["evidence"]
    assert not [s for s in bare if s.startswith("node02:")]  # numbered on arrival
