"""Records without `log.file.record_number` (the filelog receiver's default, SDK handlers, journald,
Fluent Bit, Vector) take the stream's next numbers on arrival and are stored as their evidence, like
record-numbered ones: the diagnosis of every example sent that way is byte-identical to the one made
of the same records sent with their numbers (which the replay tests hold equal to `hypocenter
analyze`), the store holds far fewer rows than one per record (what this path stored before), every stored line has its number (the UI's context lines read them), and a
retried request — to the same replica or another on the same store — is stored once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from interleave_support import EXTRACTOR, otlp_requests, stored
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from postgres_support import NO_PG, PG_URL, fresh_schema
from server_support import REPO

from hypocenter.api.ui.context import evidence_context
from hypocenter.collector import otlp
from hypocenter.engine import default_engine
from hypocenter.server.arrival import Arrival
from hypocenter.server.attempts import assemble
from hypocenter.server.service import IngestQueue, _Batch
from hypocenter.store import open_store
from hypocenter.store.sql import sql

EXAMPLES = sorted(p.parent.name for p in (REPO / "examples").glob("*/expected.yaml"))
ENGINE = default_engine()


def unnumbered(bundle: Path, per_request: int = 20, sdk: bool = False) -> list[bytes]:
    """The bundle's records as OTLP requests, the record numbers left out (the state record keeps its
    own: it is tagged per record, as a terminal state is); `sdk`: each record with attributes of its
    own besides, as an SDK logging handler sends them (its code line, its thread)."""
    out: list[bytes] = []
    for body, _ in otlp_requests(bundle, per_request):
        req = ExportLogsServiceRequest.FromString(body)
        for rl in req.resource_logs:
            if any(kv.key == "hypocenter.attempt.state" for kv in rl.resource.attributes):
                continue
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    keep = [kv for kv in lr.attributes if kv.key != "log.file.record_number"]
                    del lr.attributes[:]
                    lr.attributes.extend(keep)
                    if sdk:
                        lr.attributes.add(key="code.lineno").value.int_value = len(lr.body.string_value)
                        lr.attributes.add(key="thread.name").value.string_value = "MainThread"
        out.append(req.SerializeToString())
    return out


def _send(queue: IngestQueue, body: bytes) -> None:
    tagged, _ = otlp.receive("logs", body, "application/x-protobuf")
    queue.submit(tagged.accepted, [], tagged.blocks).result(60)


def numbered(bundle: Path, per_request: int = 20) -> list[bytes]:
    return [body for body, _ in otlp_requests(bundle, per_request)]


def _diagnose(url: str, requests: list[bytes], *, every_line: bool = False) -> tuple[str, int, list[Any]]:
    """(diagnosis JSON, rows stored, text rows without a number) of `requests` sent one by one; the
    UI's evidence context of the diagnosis must show the lines it cites."""
    store = open_store(url)
    queue = IngestQueue(store, 1_000_000, 1.0, arrival=None if every_line else Arrival(EXTRACTOR))
    try:
        for body in requests:
            _send(queue, body)
        [workload] = [r[0] for r in store._tuples(sql("SELECT workload FROM attempts"))]
        row = store.attempt(workload, 0) or store.attempt(workload, 1)
        assert row is not None
        inp = assemble(
            store, row, lookback_s=3600, slack_s=600, now=datetime(2030, 1, 1, tzinfo=timezone.utc)
        )
        body = ENGINE.analyze(inp).to_json()
        if not every_line:
            context = evidence_context(store, body, 3)
            for e in json.loads(body)["evidence"]:
                stream, _, line = str(e.get("ref") or "").rpartition(":")
                if stream.startswith("logs/") and line.isdigit():
                    cited = {c.line: c.text for c in context.files[stream]}
                    assert e["text"].rstrip("…").strip()[:80] in cited[int(line)], e
        rows = store._tuples(sql("SELECT COUNT(*) FROM log_entries"))[0][0]
        bare = store._tuples(sql("SELECT stream FROM log_entries WHERE kind = 'text' AND line IS NULL"))
        return body, int(rows), [b[0] for b in bare]
    finally:
        queue.close()
        store.close()


@pytest.mark.parametrize("sdk", [False, True], ids=["filelog", "sdk"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_sent_without_record_numbers_diagnoses_as_sent_with_them(
    example: str, sdk: bool, tmp_path: Path
) -> None:
    bundle = REPO / "examples" / example
    want, _, _ = _diagnose(str(tmp_path / "numbered.db"), numbered(bundle))
    got, rows, bare = _diagnose(str(tmp_path / "arrival.db"), unnumbered(bundle, sdk=sdk))
    _, every_row, _ = _diagnose(str(tmp_path / "rows.db"), unnumbered(bundle, sdk=sdk), every_line=True)
    assert got == want
    assert rows <= every_row
    # every line stored has its number (only the terminal-state record, tagged per record, has none)
    assert all(s.endswith("hypocenter.attempt.state") or "/" not in s for s in bare), bare


def _kern_requests(lines: list[str], per_request: int, numbered: bool) -> list[bytes]:
    out: list[bytes] = []
    for first in range(0, len(lines), per_request):
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        rl.resource.attributes.add(key="host.name").value.string_value = "gpu0007"
        sl = rl.scope_logs.add()
        for i, text in enumerate(lines[first : first + per_request], start=first + 1):
            lr = sl.log_records.add(observed_time_unix_nano=1_793_613_600_000_000_000 + i)
            lr.body.string_value = text
            lr.attributes.add(key="log.file.path").value.string_value = "/var/log/kern.log"
            if numbered:
                lr.attributes.add(key="log.file.record_number").value.int_value = i
        out.append(req.SerializeToString())
    return out


def test_a_long_unnumbered_stream_is_stored_as_the_same_stream_with_numbers(tmp_path: Path) -> None:
    lines = [
        f"Nov  2 10:{i // 60 % 60:02d}:{i % 60:02d} gpu0007 kernel: audit: type=1400 apparmor=STATUS pid={i}"
        for i in range(6_000)
    ]
    lines[3_500] = (
        "Nov  2 10:58:20 gpu0007 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    held = {}
    for shape in (True, False):
        store = open_store(str(tmp_path / f"{shape}.db"))
        queue = IngestQueue(store, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR))
        for body in _kern_requests(lines, 500, shape):
            _send(queue, body)
        queue.close()
        held[shape] = stored(store)
        store.close()
    assert held[False] == held[True]
    assert len(held[False]["rows"]) < len(lines) // 10
    assert any("Xid" in str(r) for r in held[False]["rows"])


def _retried(reference: str, shared: str, sdk: bool = False) -> None:
    """Each request of a bundle sent to replica A, and sent again — after the next one — to replica B
    (its own connection to the same store), as an exporter retries a request it saw no answer to:
    what is stored is what one replica storing each request once stores (at `reference`)."""
    requests = unnumbered(REPO / "examples" / "nvlink-xid149", per_request=16, sdk=sdk)
    one = open_store(reference)
    queue = IngestQueue(one, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR))
    for body in requests:
        _send(queue, body)
    queue.close()
    want = stored(one)
    one.close()
    assert want["rows"]

    stores = [open_store(shared), open_store(shared)]
    a, b = (IngestQueue(s, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR)) for s in stores)
    try:
        for i, body in enumerate(requests):
            _send(a, body)
            if i:
                _send(b, requests[i - 1])
        _send(b, requests[-1])
        got = stored(stores[0])
    finally:
        a.close()
        b.close()
        for s in stores:
            s.close()
    assert got == want


@pytest.mark.parametrize("sdk", [False, True], ids=["filelog", "sdk"])
def test_a_retried_unnumbered_request_is_stored_once(tmp_path: Path, sdk: bool) -> None:
    _retried(str(tmp_path / "once.db"), str(tmp_path / "shared.db"), sdk)


@pytest.fixture()
def pg_urls() -> Iterator[tuple[str, str]]:
    if not PG_URL:
        pytest.skip(NO_PG)
    first, second = fresh_schema(), fresh_schema()
    yield next(first), next(second)
    for gen in (first, second):
        next(gen, None)


@pytest.mark.postgresql
def test_a_retry_to_another_replica_on_postgresql_is_stored_once(pg_urls: tuple[str, str]) -> None:
    _retried(*pg_urls)


@pytest.mark.slow
@pytest.mark.postgresql
def test_replicas_numbering_one_stream_at_once_lose_and_repeat_nothing(pg_urls: tuple[str, str]) -> None:
    """Three replicas on one PostgreSQL schema, four senders, each request of one unnumbered stream
    sent to one replica and a third of them sent again to another: the stream's numbers run 1..N
    without a hole or a repeat, each request's records are consecutive and in order, and every
    record is stored once (the order of the requests is their order of arrival)."""
    lines = [
        f"Nov  2 10:{i // 60 % 60:02d}:{i % 60:02d} gpu0007 kernel: audit: pid={i}" for i in range(4_000)
    ]
    lines[2_222] = (
        "Nov  2 10:37:02 gpu0007 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus."
    )
    requests = _kern_requests(lines, 100, numbered=False)
    plan = [(i % 3, body) for i, body in enumerate(requests)]
    plan += [((i + 1) % 3, body) for i, body in enumerate(requests) if i % 3 == 0]
    url, _ = pg_urls
    stores = [open_store(url) for _ in range(3)]
    queues = [IngestQueue(s, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR)) for s in stores]
    work = list(plan)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def sender() -> None:
        while True:
            with lock:
                if not work:
                    return
                replica, body = work.pop(0)
            try:
                _send(queues[replica], body)
            except BaseException as exc:  # reported below
                errors.append(exc)

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    try:
        assert not errors, errors
        state = stores[0]._tuples(sql("SELECT ranges, lines FROM stream_state"))
        rows = stores[0]._tuples(sql("SELECT line, kind, body FROM log_entries ORDER BY line"))
    finally:
        for q in queues:
            q.close()
        for s in stores:
            s.close()
    assert [tuple(r) for r in state] == [("[[1,4000]]", 4_000)]
    text = {line: body for line, kind, body in rows if kind == "text"}
    assert len({line for line, _, _ in rows}) == len(rows)  # no number twice
    # the Xid line and its stamp neighbours are kept, each request's records consecutive and in order
    xid = next(n for n, body in text.items() if "Xid" in body)
    start = xid - 22  # the 23rd record of its request
    for n, body in text.items():
        if start <= n < start + 100:
            assert body == lines[2_200 + n - start]


def test_groups_of_one_stream_tagged_differently_keep_each_scope(tmp_path: Path) -> None:
    """Two groups of one stream in one batch, the second naming the workload's cluster: both are
    numbered on arrival, in order, and the attempt learns what the second says."""

    def request(first: int, extra: dict[str, str]) -> bytes:
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        for k, v in {"hypocenter.workload.id": "job-7", "host.name": "n1", **extra}.items():
            rl.resource.attributes.add(key=k).value.string_value = v
        sl = rl.scope_logs.add()
        for i in range(first, first + 5):
            lr = sl.log_records.add(time_unix_nano=1_793_613_600_000_000_000 + i)
            lr.body.string_value = f"[2026-11-02 10:00:0{i % 10}] step {i} loss 2.0"
            lr.attributes.add(key="log.file.path").value.string_value = "/job/out.log"
        return req.SerializeToString()

    store = open_store(str(tmp_path / "store.db"))
    queue = IngestQueue(store, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR))
    try:
        batches = []
        for body in (request(0, {}), request(5, {"hypocenter.workload.cluster": "eos"})):
            tagged, _ = otlp.receive("logs", body, "application/x-protobuf")
            batches.append(_Batch(tagged.accepted, [], Future(), tagged.blocks))
        queue._commit(batches)
        row = store.attempt("job-7", 0)
        assert row is not None and row.scope.get("cluster") == "eos"
        lines = store._tuples(sql("SELECT line, body FROM log_entries WHERE kind = 'text' ORDER BY line"))
        assert [n for n, _ in lines] == sorted({n for n, _ in lines}) and all(n is not None for n, _ in lines)
        assert [b for _, b in lines if "step 0 " in b or "step 9 " in b]  # first and last kept, in order
    finally:
        queue.close()
        store.close()
