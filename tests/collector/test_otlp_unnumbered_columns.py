"""Records without `log.file.record_number` (the filelog receiver's default, SDK logging handlers,
journald, Fluent Bit, Vector) are read as columns and tagged once per scope group, not once per
record: each `Entry` — stream, scope, time, body and the exporter-retry dedup key — is the one the
per-record path makes of the same record; groups outside that shape still take the per-record path."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from bench.perf import _kv
from hypocenter.collector import otlp

PROTOBUF = "application/x-protobuf"
T0 = 1_793_613_600_000_000_000


def _request(
    resource: dict[str, str], records: list[tuple[str, int, int, dict[str, Any]]], scope: str = "filelog"
) -> bytes:
    """One resource, one scope; each record (body, time, observed time, attributes)."""
    rl = ResourceLogs()
    rl.resource.attributes.extend(_kv(k, v) for k, v in resource.items())
    sl = ScopeLogs()
    sl.scope.name = scope
    for body, t, observed, attrs in records:
        rec = LogRecord(time_unix_nano=t, observed_time_unix_nano=observed)
        rec.body.string_value = body
        rec.attributes.extend(_kv(k, v) for k, v in attrs.items())
        sl.log_records.append(rec)
    rl.scope_logs.append(sl)
    return ExportLogsServiceRequest(resource_logs=[rl]).SerializeToString()


def _lines(n: int, attrs: dict[str, Any], stamped: bool = True) -> list[tuple[str, int, int, dict[str, Any]]]:
    return [
        (
            f"Nov  2 10:00:{i % 60:02d} gpu0007 kernel: [{i}.000001] audit: type=1400 pid={i} naïve ☃",
            T0 + i if stamped or i % 2 else 0,
            T0 + 10**9 + i,
            attrs,
        )
        for i in range(n)
    ]


def _per_record(body: bytes) -> list[Any]:
    """The `Entry` of each record as the per-record path tags them (a group of one stream's text
    lines comes out of it as a block to be numbered on arrival: its records' entries)."""
    tagged = otlp.log_entries(otlp.decode_logs(body, PROTOBUF)[0])
    return [*tagged.accepted, *(e for b in tagged.blocks for e in b.entries())]


NODE = {"host.name": "gpu0007"}
JOB = {"hypocenter.workload.id": "job-9", "hypocenter.workload.attempt": "2", "host.name": "gpu0007"}

SHAPES = {
    "filelog default: the path on each record": (NODE, _lines(300, {"log.file.path": "/var/log/kern.log"})),
    "path and name": (
        NODE,
        _lines(300, {"log.file.path": "/var/log/kern.log", "log.file.name": "kern.log"}),
    ),
    "no attributes (an SDK handler)": (JOB, _lines(300, {})),
    "the path on the resource, records without a time of their own": (
        {**NODE, "log.file.path": "/var/log/syslog"},
        _lines(300, {}, stamped=False),
    ),
    "a workload's records with the path": (JOB, _lines(300, {"log.file.path": "/job/out.log"})),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_unnumbered_records_are_tagged_as_the_per_record_path_tags_them(name: str) -> None:
    resource, records = SHAPES[name]
    body = _request(resource, records)
    tagged, warnings = otlp.receive("logs", body, PROTOBUF)
    assert warnings == [] and tagged.count == len(records)
    # (a record without a time leaves its time column short: that group is tagged per record, and
    # numbered on arrival all the same)
    assert tagged.accepted == []
    [block] = tagged.blocks
    # numbers are given on arrival; until then each record is the per-record path's `Entry`
    assert block.lines == [] and block.entries() == _per_record(body)
    assert all(e.line is None and e.kind == "text" for e in block.entries())
    # an exporter's retry is the same records: the same digest (and dedup keys); other records another
    again, _ = otlp.receive("logs", body, PROTOBUF)
    assert again.blocks[0].digest == block.digest
    assert [e.dedup for e in again.blocks[0].entries()] == [e.dedup for e in block.entries()]
    assert len({e.dedup for e in block.entries()}) == len(records)
    other, _ = otlp.receive("logs", _request(resource, records[:-1]), PROTOBUF)
    assert other.blocks[0].digest != block.digest


def test_a_group_is_tagged_once_not_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = otlp.identify

    def counting(*maps: Any) -> otlp.Identity:
        nonlocal calls
        calls += 1
        return real(*maps)

    monkeypatch.setattr(otlp, "identify", counting)
    body = _request(NODE, _lines(2_000, {"log.file.path": "/var/log/kern.log"}))
    tagged, _ = otlp.receive("logs", body, PROTOBUF)
    assert tagged.count == 2_000 and len(tagged.blocks) == 1
    assert calls <= 3, f"identify ran {calls} times for one scope group"


def test_a_group_of_several_files_is_a_block_per_file() -> None:
    """The filelog receiver reading several files sends their lines in one group, each with its path:
    one block per file, each in the order its lines came, numbered on arrival."""
    a = _lines(10, {"log.file.path": "/var/log/a.log"})
    b = _lines(10, {"log.file.path": "/var/log/b.log"})
    body = _request(NODE, [x for pair in zip(a, b, strict=True) for x in pair])
    tagged, _ = otlp.receive("logs", body, PROTOBUF)
    assert tagged.accepted == []
    assert [blk.stream for blk in tagged.blocks] == ["gpu0007:/var/log/a.log", "gpu0007:/var/log/b.log"]
    per_record = _per_record(body)
    for blk in tagged.blocks:
        assert blk.entries() == [e for e in per_record if e.stream == blk.stream]
    # a uid per record: records resent with another time are told by it, one by one
    uids = [(t, s, o, {**attrs, "log.record.uid": f"u{i}"}) for i, (t, s, o, attrs) in enumerate(a)]
    tagged, _ = otlp.receive("logs", _request(NODE, uids), PROTOBUF)
    assert tagged.blocks == [] and len(tagged.accepted) == 10


def test_an_sdk_group_tagged_per_record_is_still_one_block() -> None:
    """An SDK handler's records carry attributes of their own (code.lineno, thread names): they are
    tagged one by one, and their group is still numbered on arrival as one block, each record with
    its own retry key."""
    records = [
        (body, t, o, {"log.file.path": "/var/log/a.log", "code.lineno": i, "thread.name": f"t{i % 3}"})
        for i, (body, t, o, _) in enumerate(_lines(10, {}))
    ]
    body = _request(JOB, records)
    tagged, _ = otlp.receive("logs", body, PROTOBUF)
    [block] = tagged.blocks
    assert tagged.accepted == [] and block.lines == [] and block.entries() == _per_record(body)
    assert len({e.dedup for e in block.entries()}) == 10
    again, _ = otlp.receive("logs", body, PROTOBUF)
    assert again.blocks[0].digest == block.digest
    records[3] = (records[3][0], records[3][1], records[3][2], {**records[3][3], "code.lineno": 99})
    other, _ = otlp.receive("logs", _request(JOB, records), PROTOBUF)
    assert other.blocks[0].digest != block.digest  # another record: another group


def test_a_slurm_banner_stays_in_its_group_and_names_the_state() -> None:
    banner = "slurmstepd: error: *** JOB 9 ON gpu0007 CANCELLED AT 2026-11-02T10:00:00 ***"
    records = [*_lines(5, {}), (banner, T0, T0, {})]
    body = _request(JOB, records)
    [block] = otlp.receive("logs", body, PROTOBUF)[0].blocks
    assert block.entries() == _per_record(body)
    assert block.entries()[-1].scope.get("banner_state") == "CANCELLED"
