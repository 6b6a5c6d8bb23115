"""Streams of an example bundle cut into OTLP requests, in-process replicas (an ingest queue with
extraction on arrival over a store of their own), and what a store holds of the streams, for the
concurrent-ingest tests (tests/test_stream_state_concurrency.py, tests/test_ingest_interleaving.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import test_server_crash

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


def stream_requests(bundle: Path, per_request: int = 16) -> dict[str, list[Request]]:
    """Each log file of the bundle (node logs, the job's, scheduler records) as requests of
    `per_request` records, in order (the terminal-state record left out)."""
    out: dict[str, list[Request]] = {}
    for body, keys in test_server_crash._requests(bundle, per_request)[:-1]:
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
