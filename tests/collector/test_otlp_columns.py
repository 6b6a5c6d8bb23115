"""OTLP records read as columns (collector/otlp_columns.py, `RecordBlock`) are stored exactly as the
same records read one `Entry` at a time: the same rows, stream state, attempt bookkeeping,
compaction counts and ingest events — for consecutive requests, retries (whole or overlapping new
records), requests out of order, a rotated file, two requests of one stream in one batch,
non-ASCII text and srun labels — and records outside the usual shape still take the per-record
path. A request in the usual shape is never decoded whole, and one that is malformed is refused
as the whole decode refuses it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from hypocenter.collector import otlp
from hypocenter.engine import default_engine
from hypocenter.server.arrival import Arrival
from hypocenter.server.service import IngestEvents
from hypocenter.store.base import RecordBlock
from hypocenter.store.sqlite import SQLiteStore

NODE = {"host.name": "gpu0007", "log.file.path": "/var/log/kern.log"}
JOB = {"hypocenter.workload.id": "job-42", "hypocenter.workload.attempt": "1", "host.name": "gpu0003"}
T0 = 1_793_000_000_000_000_000


def _line(i: int, seed: str = "") -> str:
    if i % 97 == 50:
        return f"Nov  2 10:00:{i % 60:02d} gpu0007 kernel: [{i}.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    if i % 89 == 7:
        return f"{i % 4}: [rank{i % 4}]: step {i} loss 1.25{seed}"
    if i % 83 == 3:
        return f"[{i}.5] rtc_cmos 00:01: setting system clock to 2026-11-02T10:00:00 UTC{seed}"
    if i % 71 == 11:
        return f"unstamped continuation — ünïcödé {i}{seed}"
    return f"Nov  2 10:00:{i % 60:02d} gpu0007 kernel: [{i}.100000] audit: type=1400 pid={i}{seed}"


def _request(
    resource: dict[str, str],
    first: int,
    count: int,
    *,
    seed: str = "",
    record: dict[str, Any] | None = None,
    odd: int | None = None,
    no_time: bool = False,
) -> bytes:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for k, v in resource.items():
        rl.resource.attributes.add(key=k).value.string_value = v
    sl = rl.scope_logs.add()
    sl.scope.name = "filelog"
    for n in range(first, first + count):
        lr = sl.log_records.add()
        if not no_time:
            lr.time_unix_nano = T0 + n * 1000
        lr.observed_time_unix_nano = T0 + 10**12
        lr.body.string_value = _line(n, seed)
        for k, v in (record or {}).items():
            lr.attributes.add(key=k).value.string_value = v
        lr.attributes.add(key="log.file.record_number").value.int_value = n
        if n == odd:  # an attribute that changes tagging: the group goes record by record
            lr.attributes.add(key="log.record.uid").value.string_value = f"u{n}"
    return req.SerializeToString()


class _Pipeline:
    """What the ingest queue does with one batch, with records as entries or as blocks."""

    def __init__(self, path: Path, columns: bool) -> None:
        engine = default_engine([], builtin=True)
        self.store = SQLiteStore(path)
        self.path = path
        self.columns = columns
        self.events = IngestEvents(engine.extractor, _Activity())  # type: ignore[arg-type]
        self.compacted: list[tuple[int, int]] = []
        self.arrival = Arrival(engine.extractor, lambda n, b: self.compacted.append((n, b)))
        self.blocks = 0
        self.stalls: list[Any] = []

    def batch(self, bodies: list[bytes], now: float) -> None:
        logs: list[Any] = []
        blocks: list[Any] = []
        for body in bodies:
            tagged, _ = otlp.receive("logs", body, "application/x-protobuf")
            if not self.columns:
                tagged = otlp.log_entries(otlp.decode_logs(body, "application/x-protobuf")[0])
            logs.extend(tagged.accepted)
            blocks.extend(tagged.blocks)
            self.blocks += len(tagged.blocks)
        scans = self.arrival.scans()
        reduced = self.arrival.split(self.store, logs, now, blocks, scans)
        stalls, committed = self.events(logs, blocks, scans)
        self.stalls.extend(stalls)
        self.store.ingest(reduced.rest, [], now, stalls, reduced.writes)
        self.arrival.committed(reduced)
        committed()

    def dump(self) -> dict[str, Any]:
        self.store.close()
        db = sqlite3.connect(self.path)
        out = {
            "rows": db.execute(
                "SELECT attempt_id, node, stream, kind, line, time_ns, body, dedup FROM log_entries"
                " ORDER BY node, stream, line, kind, id"
            ).fetchall(),
            "state": db.execute(
                "SELECT workload, attempt, node, stream, generation, head, ranges, lines, bytes, first_ns,"
                " last_ns FROM stream_state ORDER BY 1, 2, 3, 4"
            ).fetchall(),
            "attempts": db.execute(
                "SELECT workload, attempt, scope, first_ns, last_ns, terminal_ns, stalled_ns"
                " FROM attempts ORDER BY 1, 2"
            ).fetchall(),
            "nodes": db.execute("SELECT * FROM attempt_nodes ORDER BY 1, 2").fetchall(),
            "compacted": self.compacted,
            "extracted": self.events._activity.kinds,  # type: ignore[attr-defined]
        }
        db.close()
        return out


class _Activity:
    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}

    def extracted(self, kinds: dict[str, int]) -> None:
        for k, n in kinds.items():
            self.kinds[k] = self.kinds.get(k, 0) + n


SCENARIOS: dict[str, list[list[bytes]]] = {
    "consecutive, then a retry of each": [
        [_request(NODE, 1, 400)],
        [_request(NODE, 401, 400)],
        [_request(NODE, 801, 400)],
        [_request(NODE, 401, 400)],
        [_request(NODE, 1, 400)],
    ],
    "retries overlapping new records": [
        [_request(NODE, 1, 400)],
        [_request(NODE, 301, 400)],
        [_request(NODE, 701, 300)],
        [_request(NODE, 650, 450)],
        [_request(NODE, 1, 1100)],
        [_request(NODE, 1, 1200)],
    ],
    "out of order and overlapping": [
        [_request(NODE, 801, 300)],
        [_request(NODE, 1, 500)],
        [_request(NODE, 301, 600)],
        [_request(NODE, 501, 300)],
    ],
    "rotated: line 1 again, other text": [
        [_request(NODE, 1, 300)],
        [_request(NODE, 301, 300)],
        [_request(NODE, 1, 200, seed=" (new file)")],
        [_request(NODE, 201, 200, seed=" (new file)")],
    ],
    "two requests of one stream in one batch, in either order": [
        [_request(NODE, 301, 300), _request(NODE, 1, 300)],
        [_request(NODE, 601, 300), _request(NODE, 901, 300)],
        [_request(NODE, 1201, 100), _request(NODE, 1250, 100)],
    ],
    "job stream named by record attributes, and a node stream in one batch": [
        [
            _request(
                JOB, 1, 250, record={"log.file.name": "out.log", "log.file.path": "logs/job-42/out.log"}
            ),
            _request(NODE, 1, 250),
        ],
        [
            _request(
                JOB, 251, 250, record={"log.file.name": "out.log", "log.file.path": "logs/job-42/out.log"}
            ),
            _request(NODE, 251, 250),
        ],
    ],
    "a record outside the shape, records without a time": [
        [_request(NODE, 1, 300, odd=150)],
        [_request(NODE, 301, 300, no_time=True)],
        [_request(NODE, 601, 300)],
    ],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_columns_store_what_entries_store(tmp_path: Path, name: str) -> None:
    entries, columns = _Pipeline(tmp_path / "entries.db", False), _Pipeline(tmp_path / "columns.db", True)
    for i, batch in enumerate(SCENARIOS[name]):
        for p in (entries, columns):
            p.batch(batch, now=1_793_000_100.0 + i)
    assert entries.blocks == 0 and columns.blocks > 0
    want, got = entries.dump(), columns.dump()
    assert want["rows"] and want["state"]
    assert got == want
    assert want["compacted"] and sum(n for n, _ in want["compacted"]) > 0


def test_usual_shape_is_read_as_columns_and_the_rest_per_record() -> None:
    tagged, _ = otlp.receive("logs", _request(NODE, 1, 50), "application/x-protobuf")
    assert tagged.accepted == [] and len(tagged.blocks) == 1 and tagged.count == 50
    block = tagged.blocks[0]
    assert (block.node, block.stream, block.lines[:3]) == ("gpu0007", "gpu0007:/var/log/kern.log", [1, 2, 3])
    entries = otlp.log_entries(otlp.decode_logs(_request(NODE, 1, 50), "application/x-protobuf")[0]).accepted
    assert block.entries() == entries
    odd, _ = otlp.receive("logs", _request(NODE, 1, 50, odd=10), "application/x-protobuf")
    assert odd.blocks == [] and len(odd.accepted) == 50
    job = {**JOB, "hypocenter.attempt.state": "FAILED"}  # the terminal-state marker is tagged per record
    assert otlp.receive("logs", _request(job, 1, 5), "application/x-protobuf")[0].blocks == []


def test_retries_stay_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector's retry (what is stored already, perhaps with new records after it) is dropped
    as columns: no block is expanded to an `Entry` per record."""
    expanded: list[int] = []
    entries = RecordBlock.entries
    monkeypatch.setattr(RecordBlock, "entries", lambda self: expanded.append(len(self)) or entries(self))
    p = _Pipeline(tmp_path / "columns.db", True)
    for i, batch in enumerate(
        SCENARIOS["consecutive, then a retry of each"] + SCENARIOS["retries overlapping new records"][3:]
    ):
        p.batch(batch, now=1_793_000_100.0 + i)
    assert p.blocks == 8 and expanded == []
    rows = p.dump()["state"]
    assert [(r[6], r[7]) for r in rows] == [("[[1,1200]]", 1200)]


def _two_resources(body: str = "x", severity: str = "") -> bytes:
    req = ExportLogsServiceRequest()
    for node in ("gpu0001", "gpu0002"):
        rl = req.resource_logs.add()
        rl.resource.attributes.add(key="host.name").value.string_value = node
        rl.scope_logs.add().scope.name = "empty"
        for scope in ("filelog", ""):
            sl = rl.scope_logs.add()
            sl.scope.name = scope
            for n in (1, 2, 3):
                lr = sl.log_records.add(time_unix_nano=T0 + n, severity_text=severity)
                lr.body.string_value = f"{body} {n}"
                lr.attributes.add(key="log.file.record_number").value.int_value = n
                lr.attributes.add(key="log.file.name").value.string_value = f"{scope or 'none'}.log"
    return req.SerializeToString()


def test_usual_shape_is_not_decoded_whole_and_malformed_is_refused_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = _two_resources()
    whole = otlp.log_entries(otlp.decode_logs(body, "application/x-protobuf")[0], body)
    assert len(whole.blocks) == 4 and not whole.accepted

    def refused(*args: Any) -> Any:
        raise AssertionError("decoded whole")

    with monkeypatch.context() as m:
        m.setattr(otlp, "decode_logs", refused)
        tagged, warnings = otlp.receive("logs", body, "application/x-protobuf")
    assert (tagged, warnings) == (whole, [])
    assert [(b.node, b.stream) for b in tagged.blocks] == [
        ("gpu0001", "gpu0001:filelog.log"),
        ("gpu0001", "gpu0001:none.log"),
        ("gpu0002", "gpu0002:filelog.log"),
        ("gpu0002", "gpu0002:none.log"),
    ]
    # invalid UTF-8 where the whole decode checks it: in a body, a resource attribute, a severity text
    for good, bad in ((b"x 1", b"\xff 1"), (b"gpu0002", b"gpu\xff02"), (b"WARN", b"WAR\xff")):
        raw = _two_resources(severity="WARN").replace(good, bad, 1)
        assert raw != body
        with pytest.raises(otlp.OTLPDecodeError) as exc:
            otlp.receive("logs", raw, "application/x-protobuf")
        assert "malformed protobuf ExportLogsServiceRequest" in str(exc.value)


def test_evidence_marks_are_the_same_with_and_without_hyperscan() -> None:
    """Anchor tokens and srun labels found in one Hyperscan pass keep the lines `bytes.find` and
    `re` keep: overlapping anchors, labels inside a record's own newlines, non-ASCII text."""
    import random
    from datetime import datetime, timedelta, timezone

    from hypocenter.lineformat import TimeContext

    extractor = default_engine([], builtin=True).extractor
    marks = extractor._marks
    if marks is None:
        pytest.skip("Hyperscan is not installed here")
    when = datetime(2026, 11, 2, tzinfo=timezone.utc)
    tctx = TimeContext(tz=timezone.utc, start=when - timedelta(days=1), end=when)
    pieces = [
        "0: [rank0]: step 1",
        "12: x",
        "1234567: no",
        "\n3: inside",
        "rtc_cmos 00:01: setting system clock",
        "srun: error: gpu1: task 3: Exited",
        "rtc_cmosrun: error: x",
        "Nov  2 10:00:01 gpu1 kernel: [1.0] NVRM: Xid 79",
        "ünïcödé",
        "",
        "5: ",
        "x\n12: y",
        "[12.5] uptime only",
    ]
    rnd = random.Random(5)
    for _ in range(100):
        bodies = [
            "".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 3))) for _ in range(rnd.randint(1, 200))
        ]
        numbers = list(range(1, len(bodies) + 1))
        with_marks = extractor.evidence_columns(numbers, bodies, tctx)
        extractor._marks = None
        try:
            assert extractor.evidence_columns(numbers, bodies, tctx) == with_marks
        finally:
            extractor._marks = marks


def test_a_request_whose_shape_yields_no_record_is_decoded_whole() -> None:
    """Found by the fuzzer: a mutated request whose columns hold no record and a string field with
    invalid UTF-8 was acknowledged with nothing taken and nothing rejected; the whole decode refuses it."""
    import base64

    from hypocenter.collector import otlp
    from hypocenter.errors import InputError

    body = base64.b64decode(
        "CpQBCk4KEQoJaG9zdC5uYW1lEgQKAm4xChMKDHNsdXJtLmpvYi5pZBIDCgE3CiQKGGB5cG9jZW50ZXIuYXR0ZW1wdC5y"
        "YW5rcxIICgZuMT0wLTcSQgpACQCAABjiBCpGEjUKM05WUk06IFhpZCAoUENJOjAwMDA6M2I6MDApOiAxNDnU34+Wm8LO"
        "yyBuYW1lPXB5dGhvbg=="
    )
    with pytest.raises(InputError, match="invalid UTF-8"):
        otlp.receive("logs", body, "application/x-protobuf")
