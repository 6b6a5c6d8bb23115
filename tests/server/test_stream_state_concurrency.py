"""Two replicas storing one stream at once: each reduces a batch against the stream's state as it
read it, and the other's batch is stored in between. The stream must end up stored exactly as one
replica storing every batch in order stores it — no acknowledged line lost into a gap row, no range
forgotten (a retry would come back as a phantom rotation) — on SQLite (two connections to one file)
and on PostgreSQL (two stores on one schema; needs HYPOCENTER_TEST_POSTGRES_URL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from interleave_support import EXTRACTOR, Replica, in_order, stored, stream_requests
from postgres_support import fresh_schema
from server_support import REPO

from hypocenter.collector import otlp
from hypocenter.server.arrival import Arrival
from hypocenter.store import open_store

BUNDLE = REPO / "examples" / "nvlink-xid149"
JOB = "logs/_job/slurm-81234.out"


class _Between:
    """A store whose next `ingest` first runs `then` (another replica's whole batch): the write of a
    reduction made before that batch was stored."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.then: Callable[[], object] | None = None

    def ingest(self, *args: Any, **kwargs: Any) -> int:
        then, self.then = self.then, None
        if then is not None:
            then()
        return int(self._store.ingest(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
    else:
        yield from fresh_schema()


def test_a_batch_stored_between_anothers_read_and_write_is_kept(url: str, tmp_path: Path) -> None:
    requests = [r.body for r in stream_requests(BUNDLE)[JOB]]
    assert len(requests) > 20
    a_store, b_store = open_store(url), open_store(url)
    between = _Between(a_store)
    a, b = Replica(between), Replica(b_store)
    try:
        for k in range(0, len(requests), 2):
            if k + 1 < len(requests):
                between.then = lambda body=requests[k + 1]: b.send(body)
            a.send(requests[k])
        got = stored(a_store)
    finally:
        a.close()
        b.close()
        a_store.close()
        b_store.close()
    want = in_order(str(tmp_path / "one.db"), requests)
    assert got["state"] == want["state"]
    assert got["rows"] == want["rows"]


def test_a_retry_and_later_records_in_one_group_are_all_stored(tmp_path: Path) -> None:
    """One commit group holding a stream's stored records again and, apart from them, records not
    stored yet (a collector's retry queued beside a later request): the later records are stored and
    the lines between them are not taken as stored."""
    requests = stream_requests(BUNDLE)[JOB]
    store = open_store(str(tmp_path / "s.db"))
    arrival = Arrival(EXTRACTOR)

    def group(*bodies: bytes) -> None:
        logs: list[Any] = []
        blocks: list[Any] = []
        for body in bodies:
            tagged, _ = otlp.receive("logs", body, "application/x-protobuf")
            logs.extend(tagged.accepted)
            blocks.extend(tagged.blocks)
        reduced = arrival.split(store, logs, 1_793_000_000.0, blocks)
        store.ingest(reduced.rest, [], 1_793_000_000.0, (), reduced.writes)

    try:
        for r in requests[:3]:
            group(r.body)
        group(requests[2].body, requests[5].body)  # lines 33–48 again, and 81–96
        state = store.arrival_state("81234", 0, None, JOB)
    finally:
        store.close()
    assert state.ranges == [(1, 48), (81, 96)]
    assert state.lines == 64
