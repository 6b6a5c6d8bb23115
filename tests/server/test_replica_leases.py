"""Replicas on one PostgreSQL act once: one polls each scheduler and one delivers the outbox (a lease
per role, server/leadership.py), one analyses an attempt at a time (a claim), and when the holder
dies another takes its roles over and its claims back. SQLite (one process) holds every role.

The store-level tests run on SQLite and, when HYPOCENTER_TEST_POSTGRES_URL is set, on PostgreSQL;
the process tests need PostgreSQL (CI sets it)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from observability_fakes import FakeLoki
from postgres_support import fresh_schema
from server_support import ServerProcess, analyze, replay, wait_for_diagnosis

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.outbox import InMemoryExporter, Outbox
from hypocenter.server.leadership import OUTBOX, SLURM_POLL, Leadership
from hypocenter.store import open_store
from hypocenter.store.base import StoreUnavailable
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import NVLINK, store_diagnosis

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

KINDS = ["sqlite", "postgresql"]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    if request.param == "sqlite":
        s = open_store(str(tmp_path / "s.db"))
        yield s
        s.close()
        return
    for url in fresh_schema():
        s = open_store(url)
        yield s
        s.close()


@pytest.fixture
def pg_store() -> Iterator[SQLiteStore]:
    for url in fresh_schema():
        s = open_store(url)
        yield s
        s.close()


def until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


# ------------------------------------------------------------------------------------------ the store


def test_a_lease_has_one_holder_until_it_expires(store: SQLiteStore) -> None:
    t = 1000.0
    assert store.acquire_lease("outbox", "a", t, 10.0)
    assert not store.acquire_lease("outbox", "b", t + 1, 10.0)  # a holds it
    assert store.acquire_lease("outbox", "a", t + 5, 10.0)  # renewed: now until t + 15
    assert not store.acquire_lease("outbox", "b", t + 14, 10.0)
    assert store.lease_holder("outbox", t + 14) == "a"
    assert store.acquire_lease("outbox", "b", t + 15, 10.0)  # a stopped renewing: b takes it
    assert not store.acquire_lease("outbox", "a", t + 16, 10.0)
    store.release_lease("outbox", "a")  # not a's to give: nothing happens
    assert store.lease_holder("outbox", t + 16) == "b"
    store.release_lease("outbox", "b")
    assert store.lease_holder("outbox", t + 16) is None
    assert store.acquire_lease("outbox", "a", t + 16, 10.0)


def test_an_analysis_is_claimed_by_one_replica_at_a_time(store: SQLiteStore) -> None:
    store.set_context("w", 0, {"workload": {"id": "w"}}, time.time())
    row = store.attempt("w", 0)
    assert row is not None
    assert store.claim_analysis(row.id, "a", 1.0)
    assert not store.claim_analysis(row.id, "b", 2.0)
    assert store.analysing_by(row.id) == "a"
    assert store.claim_analysis(row.id, "a", 3.0)  # its own again
    store.mark_analysing(row.id, None)  # a's analysis ended (a transient failure)
    assert store.claim_analysis(row.id, "b", 4.0)


def test_a_replica_whose_claim_was_given_to_another_leaves_the_other_s_alone(store: SQLiteStore) -> None:
    store.set_context("w", 0, {"workload": {"id": "w"}}, time.time())
    row = store.attempt("w", 0)
    assert row is not None
    assert store.claim_analysis(row.id, "a", 1.0)
    store.mark_analysing(row.id, None)  # a's claim taken back (a was paused past its lease) …
    assert store.claim_analysis(row.id, "b", 4.0)  # … and given to b
    # a resumes: its transient failure and its quarantine are of a claim it no longer holds
    store.mark_analysing(row.id, None, ("a", 1.0))
    store.fail_analysis(row.id, "boom", 5.0, 1.0, "a")
    again = store.attempt("w", 0)
    assert again is not None and again.failure is None
    assert store.analysing_by(row.id) == "b"
    assert not store.claim_analysis(row.id, "c", 6.0)  # b's analysis is still under way
    store.fail_analysis(row.id, "bad input", 7.0, 4.0, "b")  # b's own failure is recorded
    failed = store.attempt("w", 0)
    assert failed is not None and failed.failure == "bad input"


def test_the_claim_of_a_replica_that_is_gone_is_taken_back(pg_store: SQLiteStore) -> None:
    store = pg_store
    store.set_context("w", 0, {"workload": {"id": "w"}}, time.time())
    row = store.attempt("w", 0)
    assert row is not None
    now = time.time()
    assert store.acquire_lease("replica:a", "a", now, 5.0)
    assert store.claim_analysis(row.id, "a", now)
    # a is live: its analysis is under way, not interrupted
    assert store.recover_interrupted(now + 1, 2, live_replicas=True) == []
    assert not store.claim_analysis(row.id, "b", now + 1)
    # a stopped renewing its lease (it died): its claim is counted and freed
    store.recover_interrupted(now + 6, 2, live_replicas=True)
    assert store.analysing_by(row.id) is None
    assert store.claim_analysis(row.id, "b", now + 6)


def test_leadership_fails_over_when_the_holder_stops_renewing(pg_store: SQLiteStore) -> None:
    clock = [1000.0]
    a = Leadership(pg_store, [OUTBOX, SLURM_POLL], holder="a", lease_s=3.0, clock=lambda: clock[0])
    b = Leadership(pg_store, [OUTBOX, SLURM_POLL], holder="b", lease_s=3.0, clock=lambda: clock[0])
    a.renew()
    b.renew()
    assert a.held() == [OUTBOX, SLURM_POLL] and b.held() == []
    clock[0] += 1.0
    b.renew()  # a has not renewed for a second: still a's
    assert not b.holds(OUTBOX)
    clock[0] += 2.5  # a is gone: three seconds since its last renewal
    assert not a.holds(OUTBOX)  # a paused process does not act on an expired lease either
    b.renew()
    assert b.held() == [OUTBOX, SLURM_POLL]
    a.renew()  # a comes back: b keeps the roles
    assert a.held() == [] and b.holds(SLURM_POLL)
    b.close()  # a clean stop gives the roles up at once
    a.renew()
    assert a.held() == [OUTBOX, SLURM_POLL]


def test_on_sqlite_one_process_holds_every_role_and_writes_no_lease(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s.db"))
    lead = Leadership(store, [OUTBOX, SLURM_POLL], lease_s=3.0)
    lead.start()
    try:
        assert lead.held() == [OUTBOX, SLURM_POLL]
        assert store._rows("SELECT COUNT(*) FROM leases")[0][0] == 0
    finally:
        lead.close()
        store.close()


def test_replicas_that_are_not_leader_export_nothing(pg_store: SQLiteStore) -> None:
    doc = analyze(NVLINK)
    pg_store.exporters = ("memory",)
    a = Leadership(pg_store, [OUTBOX], holder="a", lease_s=30.0)
    b = Leadership(pg_store, [OUTBOX], holder="b", lease_s=30.0)
    a.renew()
    b.renew()
    sent_a, sent_b = InMemoryExporter(), InMemoryExporter()
    boxes = [
        Outbox(pg_store, [e], Activity(), poll_s=0.05, active=lambda lead=lead: lead.holds(OUTBOX))  # type: ignore[misc]
        for e, lead in ((sent_a, a), (sent_b, b))
    ]
    for box in boxes:
        box.start()
    try:
        store_diagnosis(pg_store, doc)
        assert until(lambda: len(sent_a.sent) == 1, 15)
        time.sleep(0.5)  # b's thread has had ten rounds
        assert sent_b.calls == 0
    finally:
        for box in boxes:
            box.close()


# ------------------------------------------------------------------------------------------ processes

FAKE_SACCT = """#!/bin/sh
# the replica that polls Slurm accounting: its process id, once per poll
echo "$PPID" >> "{log}"
echo '{{"jobs": []}}'
"""


def _ready(server: ServerProcess) -> dict:  # type: ignore[type-arg]
    with server.client() as c:
        r = c.get("/readyz")
        return r.json() if r.status_code == 200 else {}


def test_two_replicas_poll_once_and_the_survivor_takes_over(tmp_path: Path) -> None:
    gen = fresh_schema()
    url = next(gen)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "sacct.calls"
    sacct = bindir / "sacct"
    sacct.write_text(FAKE_SACCT.format(log=calls))
    sacct.chmod(sacct.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    loki = FakeLoki().start()
    lease = 3.0
    flags = ("--slurm-poll-s", "0.2", "--lease-s", str(lease), "--loki-url", loki.url, "--settle-s", "0.5")
    a = ServerProcess(url, *flags, log=tmp_path / "a.log", env=env).start()
    b = ServerProcess(url, *flags, log=tmp_path / "b.log", env=env).start()
    try:
        assert a.proc is not None and b.proc is not None
        pids = {a.proc.pid: a, b.proc.pid: b}
        assert until(lambda: calls.exists() and len(calls.read_text().split()) >= 10, 30)
        pollers = set(calls.read_text().split())
        assert len(pollers) == 1, f"both replicas polled Slurm: {pollers}"
        holder = pids[int(pollers.pop())]
        other = b if holder is a else a
        assert set(_ready(holder)["leases"]) == {OUTBOX, SLURM_POLL}
        assert _ready(other)["leases"] == []

        holder.kill()  # SIGKILL: no lease is given up
        calls.write_text("")
        assert until(lambda: set(_ready(other)["leases"]) == {OUTBOX, SLURM_POLL}, lease * 4), (
            "the survivor did not take the roles over"
        )
        assert until(lambda: bool(calls.read_text().split()), 10)
        assert set(calls.read_text().split()) == {str(other.proc.pid)}  # type: ignore[union-attr]

        # the survivor analyses and exports, once
        expected = analyze(NVLINK)
        r = replay(NVLINK, other.grpc)
        assert r.returncode == 0, r.stderr
        with other.client() as c:
            got = wait_for_diagnosis(c, expected["attempt"]["workload_id"], timeout=60)
        assert got["id"] == expected["id"]
        final = lambda: [  # noqa: E731
            e
            for e in loki.entries
            if e.metadata["record"] == "diagnosis" and e.metadata.get("provisional") == "false"
        ]
        assert until(lambda: len(final()) >= 1, 30)
        time.sleep(2)  # time for a second delivery, were there one
        assert len(final()) == 1
    finally:
        a.stop()
        b.stop()
        loki.stop()
        next(gen, None)


class _Unreachable:
    """A shared store whose database is away while `down` is set (every call raises `error`: what
    psycopg raises, or the `StoreUnavailable` a store that logs its own outages raises)."""

    shared = True

    def __init__(self, store: SQLiteStore, error: Exception) -> None:
        self.store = store
        self.error = error
        self.down = False

    def acquire_lease(self, name: str, holder: str, now: float, ttl_s: float) -> bool:
        if self.down:
            raise self.error
        return self.store.acquire_lease(name, holder, now, ttl_s)

    def release_lease(self, name: str, holder: str) -> None:
        self.store.release_lease(name, holder)


@pytest.mark.parametrize("store_logs_outages", [False, True])
def test_an_unreachable_database_is_logged_once_per_change(
    pg_store: SQLiteStore, caplog: pytest.LogCaptureFixture, store_logs_outages: bool
) -> None:
    """While the database is away the replica acts on nothing; the outage is one line when it starts
    and one when it ends — the store's own when it logs outages (PostgresStore), else the lease
    keeper's — and a replica that gets its roles back logs no lease change for them."""
    error = (
        StoreUnavailable("store unavailable: refused") if store_logs_outages else ConnectionError("refused")
    )
    flaky = _Unreachable(pg_store, error)
    clock = [1000.0]
    lead = Leadership(flaky, [OUTBOX, SLURM_POLL], holder="a", lease_s=3.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    caplog.set_level("INFO", logger="hypocenter.server")
    lead.renew()
    assert lead.holds(OUTBOX)
    flaky.down = True
    for _ in range(10):  # ten renewals while the database is away: it stops acting, says so once
        clock[0] += 1.0
        lead.renew()
    assert not lead.holds(OUTBOX) and lead.held() == []
    flaky.down = False
    clock[0] += 1.0
    lead.renew()
    assert lead.holds(OUTBOX)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("took the outbox lease" in m for m in messages) == 1
    assert sum("took the poll:slurm lease" in m for m in messages) == 1
    outage = [m for m in messages if "took the" not in m]
    if store_logs_outages:
        assert outage == []  # the store's two lines are the outage's
    else:
        assert len(outage) == 2 and "unreachable" in outage[0] and "reachable again" in outage[1], outage

    # an outage during which another replica took a role: that change is logged, once
    caplog.clear()
    flaky.down = True
    clock[0] += 1.0
    lead.renew()
    clock[0] += 3.0
    assert pg_store.acquire_lease(OUTBOX, "b", clock[0], 100.0)
    flaky.down = False
    for _ in range(3):
        clock[0] += 1.0
        lead.renew()
    assert not lead.holds(OUTBOX) and lead.holds(SLURM_POLL)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("no longer holds the outbox lease" in m for m in messages) == 1
    assert not any("poll:slurm" in m for m in messages)
