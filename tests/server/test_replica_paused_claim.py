"""A replica paused (SIGSTOP: a frozen VM, a stopped container) while it holds an attempt's analysis
claim: once its replica lease expires another replica takes the claim back and diagnoses the attempt,
once; the paused replica, continued, finishes its stale analysis but stores, logs and exports nothing
of it — the attempt keeps one verdict, one revision, one Loki entry, equal to `hypocenter analyze`.

Needs HYPOCENTER_TEST_POSTGRES_URL (CI sets it)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from observability_fakes import FakeLoki
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, replay, wait_for_diagnosis

from hypocenter.store import open_store
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import diagnosis_summary

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

BUNDLE = REPO / "examples" / "nvlink-xid149"
LEASE_S = 3.0
VERDICT = re.compile(r"diagnosis (dx-\w+) for workload '([^']+)' attempt \d+: \w+(?! \(provisional\))$")


@pytest.fixture()
def pg_url() -> Iterator[str]:
    yield from fresh_schema()


@pytest.fixture(params=["sqlite", "postgresql"])
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


def test_a_verdict_is_stored_only_under_the_claim_it_was_made_under(store: SQLiteStore) -> None:
    doc = analyze(BUNDLE)
    a = doc["attempt"]
    store.set_context(a["workload_id"], a["attempt"], {"workload": {"id": a["workload_id"]}}, time.time())
    row = store.attempt(a["workload_id"], a["attempt"])
    assert row is not None
    now = time.time()
    assert store.claim_analysis(row.id, "a", now)
    store.recover_interrupted(now + 1, 5, live_replicas=store.shared)  # a is gone (holds no lease)
    assert store.claim_analysis(row.id, "b", now + 2)
    body, summary = json.dumps(doc), diagnosis_summary(doc)
    assert store.put_diagnosis(row.id, body, summary, False, now, claim="a") is None  # a resumed
    assert store.get_diagnosis(doc["id"]) is None
    assert store.analysing_by(row.id) == "b"  # b's analysis is still under way
    assert store.put_diagnosis(row.id, body, summary, False, now + 2, claim="b") == 1
    assert store.get_diagnosis(doc["id"]) is not None
    assert store.analysing_by(row.id) is None


def _flags(replica: str, loki: str) -> tuple[str, ...]:
    return (
        "--replica-id",
        replica,
        "--lease-s",
        str(LEASE_S),
        "--loki-url",
        loki,
        "--settle-s",
        "2",
        "--log-level",
        "info",
    )


def _analyses(log: Path, workload: str) -> int:
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if (m := VERDICT.search(line.rstrip())) and m.group(2) == workload
    )


def test_a_replica_paused_while_it_holds_a_claim(pg_url: str, tmp_path: Path) -> None:
    expected = analyze(BUNDLE)
    wl = expected["attempt"]["workload_id"]
    loki = FakeLoki().start()
    store = open_store(pg_url)
    a = ServerProcess(pg_url, *_flags("replica-a", loki.url), log=tmp_path / "a.log").start()
    b: ServerProcess | None = None
    stopped = False
    try:
        assert a.proc is not None
        pid = a.proc.pid
        r = replay(BUNDLE, a.grpc)  # A alone: the attempt is due `settle_s` later, and A claims it
        assert r.returncode == 0, r.stderr
        row = store.attempt(wl, 0)
        assert row is not None
        caught = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # stop A until it is caught holding the claim
            os.kill(pid, signal.SIGSTOP)
            stopped = True
            if store.analysing_by(row.id) == "replica-a":
                caught = True
                break
            os.kill(pid, signal.SIGCONT)
            stopped = False
            if _analyses(tmp_path / "a.log", wl):
                break  # A finished before it was caught
            time.sleep(0.002)
        assert caught, "replica A was never caught holding the analysis claim"

        b = ServerProcess(pg_url, *_flags("replica-b", loki.url), log=tmp_path / "b.log").start()
        with b.client() as cb:  # A's lease expires; B takes the claim back and analyses
            got = wait_for_diagnosis(cb, wl, timeout=60)

        def final() -> list[object]:
            return [
                e
                for e in loki.entries
                if e.metadata["record"] == "diagnosis" and e.metadata.get("provisional") == "false"
            ]

        deadline = time.monotonic() + 30
        while not final() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(final()) == 1, "B's verdict was not exported"

        os.kill(pid, signal.SIGCONT)  # A resumes in the middle of its analysis
        stopped = False
        deadline = time.monotonic() + 30
        while store.analysing_by(row.id) == "replica-a" and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3 * LEASE_S)  # time for A to finish, store and export, were it to
        assert a.proc.poll() is None, "replica A died"
        with a.client() as ca:  # A answers, with B's verdict
            assert wait_for_diagnosis(ca, wl) == got
            listed = ca.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        a.stop()
        if b is not None:
            b.stop()
        loki.stop()
    try:
        revisions = store.diagnosis_revisions(got["id"])
    finally:
        store.close()
    assert essence(got) == essence(expected) and got["id"] == expected["id"]
    assert len(listed) == 1
    assert len(revisions) == 1, [(r.revision, r.diagnosis_id) for r in revisions]
    per_replica = [_analyses(tmp_path / n, wl) for n in ("a.log", "b.log")]
    assert per_replica == [0, 1], f"final analyses logged by A and B: {per_replica}"
    assert len(final()) == 1, "the attempt's verdict was exported twice"
    a_log = (tmp_path / "a.log").read_text(errors="replace")
    assert "Traceback" not in a_log, a_log[-3000:]
