"""Any interleaving of one attempt's batches across replicas stores what one replica storing them in
order stores. Hypothesis draws the order of every request of `examples/nvlink-xid149`'s streams
(the job log in 16-record requests, the node logs, the scheduler records), requests sent again
(a collector's retry, to the same replica or another), and which of three replicas takes each;
four senders send them at once. Three in-process replicas (each an ingest queue with extraction on
arrival over its own connection, as `serve` runs them) share one PostgreSQL schema. The stored
lines, gap rows and stream states must be byte-identical to one replica's in order.

Needs HYPOCENTER_TEST_POSTGRES_URL (CI sets it); tests/server/test_ingest_replicas_killed.py does the same
with real `serve` processes, one of them killed mid-batch."""

from __future__ import annotations

import queue
import threading
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from interleave_support import Replica, in_order, stored, stream_requests
from postgres_support import NO_PG, PG_URL, fresh_schema
from server_support import REPO

from hypocenter.store import open_store

BUNDLE = REPO / "examples" / "nvlink-xid149"
REQUESTS = [r.body for rs in stream_requests(BUNDLE).values() for r in rs]
REPLICAS = 3
SENDERS = 4

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.skipif(not PG_URL, reason=NO_PG)]


@cache
def _in_order(tmp: str) -> dict[str, Any]:
    return in_order(str(Path(tmp) / "in-order.db"), REQUESTS)


def _send_all(replicas: list[Replica], plan: list[tuple[int, int]]) -> None:
    """`plan`'s (replica, request) pairs taken in order by SENDERS threads at once."""
    work: queue.Queue[tuple[int, int]] = queue.Queue()
    for item in plan:
        work.put(item)
    errors: list[BaseException] = []

    def sender() -> None:
        while True:
            try:
                replica, request = work.get_nowait()
            except queue.Empty:
                return
            try:
                replicas[replica].send(REQUESTS[request])
            except BaseException as exc:  # reported below: a refused request is a failure here
                errors.append(exc)

    threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors


@settings(
    max_examples=20,
    deadline=None,
    # every example runs three replicas on a fresh schema: a failure is reported as drawn, not shrunk
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_order_retries_and_replicas_store_what_one_replica_stores_in_order(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    n = len(REQUESTS)
    order = data.draw(st.permutations(range(n)), label="order")
    again = data.draw(st.lists(st.integers(0, n - 1), max_size=n // 3), label="sent again")
    for k, request in enumerate(again):
        at = data.draw(st.integers(0, len(order)), label=f"retry {k} at")
        order = [*order[:at], request, *order[at:]]
    plan = [(data.draw(st.integers(0, REPLICAS - 1)), request) for request in order]
    note(f"(replica, request) in the order taken: {plan}")
    want = _in_order(str(tmp_path_factory.getbasetemp()))

    schema = fresh_schema()
    url = next(schema)
    stores = [open_store(url) for _ in range(REPLICAS)]
    replicas = [Replica(s) for s in stores]
    try:
        _send_all(replicas, plan)
        got = stored(stores[0])
    finally:
        for r in replicas:
            r.close()
        for s in stores:
            s.close()
        next(schema, None)
    assert got["state"] == want["state"]
    assert got["rows"] == want["rows"]
