"""Two real `hypocenter serve` replicas on one PostgreSQL schema take one attempt's batches in a
random order, with retries, from four concurrent senders — each request first to replica A or B in
turn — and A is killed with SIGKILL part way, in the middle of batches: the senders send what A did
not acknowledge to B, as collectors retry. Nothing acknowledged is lost (checked right after the
kill), and in the end the stored lines, gap rows and stream states are byte-identical to what one
replica storing the same requests in order stores, and the diagnosis is byte-identical to that
replica's, and equal to `hypocenter analyze` on the bundle.

Needs HYPOCENTER_TEST_POSTGRES_URL (CI sets it)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from interleave_support import Request, Senders, lines_held, post, send_rest, stored, stream_requests
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.store import open_store

BUNDLE = REPO / "examples" / "nvlink-xid149"

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]


@pytest.fixture()
def pg_schema() -> Iterator[str]:
    yield from fresh_schema()


def _held(url: str) -> dict[str, list[tuple[Any, ...]]]:
    store = open_store(url)
    try:
        held = stored(store)
    finally:
        store.close()
    held["rows"] = [r for r in held["rows"] if r[1] != "hypocenter/attempt-state"]
    return held


def _diagnosis(srv: ServerProcess, workload: str) -> dict[str, Any]:
    with srv.client() as client:
        r = client.post(f"/v1/attempts/{workload}/0/analyze")
        assert r.status_code == 200, r.text
        got = wait_for_diagnosis(client, workload)
        assert len(client.get("/v1/diagnoses", params={"workload": workload}).json()["diagnoses"]) == 1
        return got


def _one_replica_in_order(requests: list[Request], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    db = tmp_path / "in-order.db"
    srv = ServerProcess(db).start()
    try:
        for r in requests:
            assert post(srv.base, r.body)
        diagnosis = _diagnosis(srv, send_rest(BUNDLE, srv.grpc))
    finally:
        srv.stop()
    return _held(str(db)), diagnosis


@pytest.mark.parametrize("seed", [1, 2])
def test_two_replicas_one_killed_store_what_one_stores_in_order(
    pg_schema: str, tmp_path: Path, seed: int
) -> None:
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    rnd = random.Random(seed)
    order = [*requests, *rnd.choices(requests, k=len(requests) // 4)]  # a quarter sent twice
    rnd.shuffle(order)
    want, want_diagnosis = _one_replica_in_order(requests, tmp_path)

    a = ServerProcess(pg_schema, log=tmp_path / "a.log").start()
    b = ServerProcess(pg_schema, log=tmp_path / "b.log").start()
    try:

        def target(k: int, tries: int) -> str:
            first = a if (k + tries) % 2 == 0 else b
            return first.base if first.alive() else b.base

        senders = Senders(target, order).start()
        deadline = time.monotonic() + 120
        while len(senders.acked) < len(order) // 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        a.kill()  # mid-batch: four senders are sending
        acked = list(senders.acked)
        held = _held(pg_schema)
        senders.join()
        diagnosis = _diagnosis(b, send_rest(BUNDLE, b.grpc))
        held_end = _held(pg_schema)
    finally:
        a.stop()
        b.stop()
    assert acked and len(acked) < len(order), "the kill did not fall mid-ingest"
    lost = {(r.path, r.first + i) for r in acked for i in range(r.count)} - lines_held(held["rows"])
    assert not lost, f"acknowledged, then lost: {sorted(lost)[:5]}"
    assert held_end == want
    assert diagnosis == want_diagnosis
    expected = analyze(BUNDLE)
    assert essence(diagnosis) == essence(expected) and diagnosis["id"] == expected["id"]
