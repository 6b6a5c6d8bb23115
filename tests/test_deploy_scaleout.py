"""Scale-out: two `hypocenter serve` replicas share one PostgreSQL database. One attempt's telemetry
arrives split across them (the node agents' streams at one, the job's streams, metrics and end-of-job
record at the other), the analysis is triggered at one of them while both trigger loops run, and the
attempt gets exactly one diagnosis, equal to `hypocenter analyze` on the bundle, readable from either,
and pushed to Loki once.

Runs when HYPOCENTER_TEST_POSTGRES_URL is set (CI sets it; see tests/test_store_contract.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from observability_fakes import FakeLoki
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.replay import ReplayReport, Sender, plan, state_record

BUNDLE = REPO / "examples" / "nvlink-xid149"


@pytest.fixture()
def pg_schema() -> Iterator[str]:
    yield from fresh_schema()


@pytest.fixture()
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki().start()
    yield fake
    fake.stop()


def _send(endpoint: str, streams: list, metric_groups: list, report: ReplayReport) -> None:  # type: ignore[type-arg]
    sender = Sender(endpoint, False, 10)
    try:
        for stream in streams:
            sender.send_logs(stream, report)
        for res, series in metric_groups:
            sender.send_metrics(res, series, report)
    finally:
        sender.close()


def test_two_replicas_one_database_one_diagnosis(pg_schema: str, loki: FakeLoki, tmp_path: Path) -> None:
    expected = analyze(BUNDLE)
    ctx, node_streams, app_streams, metric_groups = plan(BUNDLE)
    a = ServerProcess(pg_schema, "--loki-url", loki.url, log=tmp_path / "a.log").start()
    b = ServerProcess(pg_schema, "--loki-url", loki.url, log=tmp_path / "b.log").start()
    try:
        report = ReplayReport()
        _send(a.grpc, node_streams, [], report)                                   # node agents → replica A
        _send(b.grpc, [*app_streams, state_record(ctx)], metric_groups, report)   # the job's streams → B
        wl = ctx.workload.id
        with a.client() as ca, b.client() as cb:
            # both replicas see everything that was accepted, whichever took it
            assert ca.get("/readyz").json()["log_entries"] == cb.get("/readyz").json()["log_entries"] \
                == report.log_records
            # the explicit trigger (what the Slurm epilog calls) at A, while both trigger loops run
            r = ca.post(f"/v1/attempts/{wl}/{ctx.workload.attempt}/analyze")
            assert r.status_code == 200, r.text
            got_a, got_b = wait_for_diagnosis(ca, wl), wait_for_diagnosis(cb, wl)
            # exports: the diagnosis and its evidence, each once, however many replicas analysed
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(loki.entries) < 1 + len(expected["evidence"]):
                time.sleep(0.1)
            time.sleep(3)  # long enough for a second replica's loop (tick 0.05 s, settle 0.3 s) to act
            rows_a = ca.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
            rows_b = cb.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
            backlog = [cx.get("/readyz").json() for cx in (ca, cb)]
    finally:
        a.stop()
        b.stop()
    assert got_a == got_b
    assert essence(got_a) == essence(expected) and got_a["id"] == expected["id"]
    assert len(rows_a) == len(rows_b) == 1 and rows_a[0]["id"] == expected["id"]
    heads = [e for e in loki.entries if e.metadata["record"] == "diagnosis"]
    evidence = [e for e in loki.entries if e.metadata["record"] == "evidence"]
    assert [e.metadata["diagnosis_id"] for e in heads] == [expected["id"]], (
        backlog, [(e.ts_ns, e.metadata, e.line[:3000]) for e in heads])
    assert len(evidence) == len(expected["evidence"])


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_same_verdict_again_is_not_exported_again(kind: str, tmp_path: Path) -> None:
    """What a second replica (or a repeated trigger) does to the store: the same body and flag change
    nothing, once delivered it stays delivered; a changed verdict, or provisional → final, is sent."""
    import json

    from test_metrics import store_diagnosis

    from hypocenter.exporter.store import open_store

    doc = analyze(BUNDLE)
    if kind == "postgresql":
        gen = fresh_schema()
        url = next(gen)
    store = open_store(url if kind == "postgresql" else str(tmp_path / "s.db"))
    try:
        store.exporters = ("loki",)

        def deliver() -> int:
            claimed = store.claim_exports("loki", time.time(), 10, 30.0)
            store.finish_exports([c.id for c in claimed])
            return len(claimed)

        store_diagnosis(store, doc, provisional=True)
        assert deliver() == 1
        store_diagnosis(store, doc, provisional=True)
        assert deliver() == 0                      # the same provisional verdict: nothing new to send
        store_diagnosis(store, doc)
        assert deliver() == 1                      # final now
        store_diagnosis(store, doc)
        assert deliver() == 0
        store_diagnosis(store, {**doc, "quality": {"level": "low", "reasons": ["changed"]}})
        assert deliver() == 1                      # a different body is a different verdict
        row = store.get_diagnosis(doc["id"])
        assert row is not None and json.loads(row.body)["quality"]["level"] == "low"
    finally:
        store.close()
        if kind == "postgresql":
            next(gen, None)
