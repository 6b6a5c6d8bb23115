"""Chaos around one `hypocenter serve` on PostgreSQL: the database goes away in the middle of an
attempt's ingest and comes back. Nothing acknowledged is lost, the collector's retries are answered
503 (retry) meanwhile, the stored streams are byte-identical to one replica storing them in order,
the attempt gets one diagnosis equal to `hypocenter analyze`, and the outage is logged once when it
starts and once when it ends — not a traceback per refused request.

The database is the test's own throwaway instance (tests/own_postgres.py: initdb and pg_ctl on a
free loopback port), so stopping it disturbs no other test."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from interleave_support import Senders, in_order, lines_held, send_rest, stored, stream_requests
from own_postgres import OwnPostgres
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.store import open_store

BUNDLE = REPO / "examples" / "nvlink-xid149"
OUTAGE_S = 15


@pytest.fixture()
def own_pg() -> Iterator[OwnPostgres]:
    pg = OwnPostgres().start()
    yield pg
    pg.destroy()


def test_postgresql_restarted_mid_ingest(own_pg: OwnPostgres, tmp_path: Path) -> None:
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    want = in_order(str(tmp_path / "in-order.db"), [r.body for r in requests])
    expected = analyze(BUNDLE)
    log = tmp_path / "server.log"
    srv = ServerProcess(own_pg.url, log=log).start()
    try:
        senders = Senders(lambda k, tries: srv.base, requests).start()
        deadline = time.monotonic() + 120
        while len(senders.acked) < len(requests) // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        own_pg.stop()
        acked_before = list(senders.acked)
        time.sleep(OUTAGE_S)  # the senders keep retrying: every request is refused meanwhile
        refused_during = senders.refused
        own_pg.start()
        senders.join()
        wl = send_rest(BUNDLE, srv.grpc)
        with srv.client() as client:
            r = client.post(f"/v1/attempts/{wl}/0/analyze")
            assert r.status_code == 200, r.text
            got = wait_for_diagnosis(client, wl)
            rows = client.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        srv.stop()
    assert acked_before and len(acked_before) < len(requests), "the outage did not fall mid-ingest"
    assert refused_during > 0, "no request was refused while the database was down"
    store = open_store(own_pg.url)
    try:
        held = stored(store)
    finally:
        store.close()
    acked_lines = {(r.path, r.first + i) for r in senders.acked for i in range(r.count)}
    assert acked_lines <= lines_held(held["rows"])
    held["rows"] = [r for r in held["rows"] if r[1] != "hypocenter/attempt-state"]  # sent last, by itself
    assert held == want
    assert essence(got) == essence(expected) and got["id"] == expected["id"]
    assert len(rows) == 1
    text = log.read_text(errors="replace")
    assert text.count("store unavailable") == 1, text[-3000:]
    assert text.count("store available again") == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def _in_transaction(pg: OwnPostgres, name: str) -> bool:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL",
            (name,),
        ).fetchone()
    return bool(row and row[0])


def test_a_replica_stopped_inside_a_transaction_holds_up_no_other(
    own_pg: OwnPostgres, tmp_path: Path
) -> None:
    """Replica A is stopped (SIGSTOP) while one of its transactions is open — holding row locks
    (a stream's state, the attempt) that replica B's batches may need. B finishes the whole ingest
    while A stays stopped, and the database ends A's transaction (idle in transaction), so its
    locks do not outlive it; A, continued, reconnects and answers; one diagnosis, equal to `analyze`."""
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    want = in_order(str(tmp_path / "in-order.db"), [r.body for r in requests])
    expected = analyze(BUNDLE)
    a = ServerProcess(f"{own_pg.url}?application_name=replica-a", log=tmp_path / "a.log").start()
    b = ServerProcess(f"{own_pg.url}?application_name=replica-b", log=tmp_path / "b.log").start()
    stopped = False
    try:
        assert a.proc is not None
        pid = a.proc.pid

        def target(k: int, tries: int) -> str:
            return (a if (k + tries) % 2 == 0 and not stopped else b).base

        senders = Senders(target, requests, timeout=5.0).start()
        caught = False
        for _ in range(2000):  # stop A until it is caught with its transaction open
            if len(senders.acked) == len(requests):
                break
            os.kill(pid, signal.SIGSTOP)
            stopped = True
            if _in_transaction(own_pg, "replica-a"):
                caught = True
                break
            os.kill(pid, signal.SIGCONT)
            stopped = False
            time.sleep(0.002)
        assert caught, "replica A was never caught inside a transaction"
        senders.join()  # every request acknowledged, by B, while A stays stopped
        deadline = time.monotonic() + 120
        while _in_transaction(own_pg, "replica-a") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _in_transaction(own_pg, "replica-a"), "A's transaction (and its locks) outlived it"
        os.kill(pid, signal.SIGCONT)
        stopped = False
        wl = send_rest(BUNDLE, b.grpc)
        with a.client() as client:  # A answers again, from the same database
            r = client.post(f"/v1/attempts/{wl}/0/analyze")
            assert r.status_code == 200, r.text
            got = wait_for_diagnosis(client, wl)
            rows = client.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        if stopped and a.proc is not None:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()
    store = open_store(own_pg.url)
    try:
        held = stored(store)
    finally:
        store.close()
    held["rows"] = [r for r in held["rows"] if r[1] != "hypocenter/attempt-state"]
    assert held == want
    assert essence(got) == essence(expected) and got["id"] == expected["id"]
    assert len(rows) == 1
    text = (tmp_path / "a.log").read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert text.count("store unavailable") <= 1 and text.count("store available again") <= 1, text[-3000:]
