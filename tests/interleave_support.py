"""Streams of an example bundle cut into OTLP requests, in-process replicas (an ingest queue with
extraction on arrival over a store of their own), and what a store holds of the streams, for the
concurrent-ingest tests (tests/server/test_stream_state_concurrency.py, test_ingest_*.py there)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.common._internal import _encode_value
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from hypocenter.cli.replay import ReplayReport, plan, state_record
from hypocenter.cli.replay import Sender as ReplaySender
from hypocenter.collector import otlp
from hypocenter.engine import default_engine
from hypocenter.server.arrival import Arrival
from hypocenter.server.service import IngestQueue
from hypocenter.store import open_store
from hypocenter.store.sql import sql

EXTRACTOR = default_engine([], builtin=True).extractor


@dataclass(frozen=True, slots=True)
class Request:
    """One OTLP/HTTP protobuf body: records `first`..`first + count - 1` of stream `path`."""

    path: str
    first: int
    count: int
    body: bytes


def otlp_requests(bundle: Path, per_request: int = 20) -> list[tuple[bytes, list[tuple[str, int]]]]:
    """The bundle's log records as OTLP/HTTP protobuf bodies of `per_request` records, state last."""
    ctx, node_streams, app_streams, _ = plan(bundle)
    out: list[tuple[bytes, list[tuple[str, int]]]] = []
    for stream in [*node_streams, *app_streams, state_record(ctx)]:
        for i in range(0, len(stream.lines), per_request):
            chunk = stream.lines[i : i + per_request]
            req = ExportLogsServiceRequest()
            rl = req.resource_logs.add()
            for k, v in stream.resource.items():
                rl.resource.attributes.add(key=k).value.string_value = str(v)
            sl = rl.scope_logs.add()
            keys: list[tuple[str, int]] = []
            for line in chunk:
                lr = sl.log_records.add(time_unix_nano=line.time_ns)
                if isinstance(line.body, str):
                    lr.body.string_value = line.body
                else:
                    lr.body.CopyFrom(_encode_value(line.body))
                for k, v in line.attributes.items():
                    kv = lr.attributes.add(key=k)
                    if isinstance(v, int):
                        kv.value.int_value = v
                    else:
                        kv.value.string_value = str(v)
                keys.append(
                    (
                        str(line.attributes["log.file.path"]),
                        int(line.attributes.get("log.file.record_number", 0)),
                    )
                )
            out.append((req.SerializeToString(), keys))
    return out


def stream_requests(bundle: Path, per_request: int = 16) -> dict[str, list[Request]]:
    """Each log file of the bundle (node logs, the job's, scheduler records) as requests of
    `per_request` records, in order (the terminal-state record left out)."""
    out: dict[str, list[Request]] = {}
    for body, keys in otlp_requests(bundle, per_request)[:-1]:
        path = keys[0][0]
        out.setdefault(path, []).append(Request(path, keys[0][1], len(keys), body))
    return out


class Replica:
    """What one `serve` process does with OTLP log requests, in this process: decode, then the ingest
    queue (group commit, extraction on arrival) over its own store."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.queue = IngestQueue(store, 1_000_000, 1.0, arrival=Arrival(EXTRACTOR))

    def send(self, body: bytes) -> int:
        tagged, _ = otlp.receive("logs", body, "application/x-protobuf")
        return self.queue.submit(tagged.accepted, [], tagged.blocks).result(60)

    def close(self) -> None:
        self.queue.close()


def stored(store: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The streams' rows (lines with their text, gap rows) and states, without ids or arrival times."""
    return {
        "rows": [
            tuple(r)
            for r in store._tuples(
                sql(
                    "SELECT COALESCE(node, ''), stream, kind, line, time_ns, body, dedup, compacted FROM log_entries"
                    " ORDER BY stream, node NULLS FIRST, line, kind, body"
                )
            )
        ],
        "state": [
            tuple(r)
            for r in store._tuples(
                sql(
                    "SELECT workload, attempt, node, stream, generation, head, ranges, lines, bytes, first_ns, last_ns"
                    " FROM stream_state ORDER BY workload, attempt, node, stream"
                )
            )
        ],
    }


def in_order(url: str, requests: list[bytes]) -> dict[str, Any]:
    """What one replica stores of `requests` sent one after another, into the store at `url`."""
    store = open_store(url)
    one = Replica(store)
    try:
        for body in requests:
            one.send(body)
        return stored(store)
    finally:
        one.close()
        store.close()


def post(base: str, body: bytes, timeout: float = 30.0) -> bool:
    """One OTLP/HTTP log request; True when the server acknowledged it (stored)."""
    try:
        r = httpx.post(
            f"{base}/v1/logs",
            content=body,
            headers={"Content-Type": "application/x-protobuf"},
            timeout=timeout,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


class Senders:
    """`count` threads taking requests in order, each sent until acknowledged — as a collector's
    exporter retries what was not acknowledged — to `target(request, try)` (a replica's base URL);
    `acked` lists the acknowledged requests, in the order they were."""

    def __init__(
        self,
        target: Callable[[int, int], str],
        requests: list[Request],
        count: int = 4,
        timeout: float = 30.0,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.requests = requests
        self.acked: list[Request] = []
        self.refused = 0
        self._next = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def start(self) -> Senders:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while True:
            with self._lock:
                k = self._next
                self._next += 1
            if k >= len(self.requests):
                return
            tries = 0
            while not post(self.target(k, tries), self.requests[k].body, self.timeout):
                tries += 1
                with self._lock:
                    self.refused += 1
                if time.monotonic() > deadline:
                    raise AssertionError(f"request {k} never acknowledged")
                time.sleep(0.2)
            with self._lock:
                self.acked.append(self.requests[k])

    def join(self) -> None:
        for t in self._threads:
            t.join(400)
        assert len(self.acked) == len(self.requests), "a sender gave up"


def lines_held(rows: list[tuple[Any, ...]]) -> set[tuple[str, int]]:
    """(stream, record number) of every record the `stored` rows hold: a row with its text (or a
    document), or one of the lines a gap row stands for (the run of lines ending at its number)."""
    out: set[tuple[str, int]] = set()
    for _, stream, kind, line, _, body, _, _ in rows:
        if line is None or kind not in ("text", "gap", "doc"):
            continue
        count = int(body) if kind == "gap" else 1
        out.update((stream, line - i) for i in range(count))
    return out


def send_rest(bundle: Path, endpoint: str) -> str:
    """The bundle's metrics (over OTLP/gRPC, the SDK exporter) and its terminal-state record; returns
    the workload id."""
    ctx, _, _, metric_groups = plan(bundle)
    report = ReplayReport()
    sender = ReplaySender(endpoint, False, 10)
    try:
        for res, series in metric_groups:
            sender.send_metrics(res, series, report)
        sender.send_logs(state_record(ctx), report)
    finally:
        sender.close()
    return ctx.workload.id
