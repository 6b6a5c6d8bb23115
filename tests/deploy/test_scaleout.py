"""Scale-out: two `hypocenter serve` replicas share one PostgreSQL database. One attempt's telemetry
arrives split across them (the node agents' streams at one, the job's streams, metrics and end-of-job
record at the other), the analysis is triggered at one of them while both trigger loops run, and the
attempt gets exactly one diagnosis, equal to `hypocenter analyze` on the bundle, readable from either,
and its final verdict pushed to Loki once.

Runs when HYPOCENTER_TEST_POSTGRES_URL is set (CI sets it; see tests/store/test_contract.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from observability_fakes import FakeLoki
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.cli.replay import ReplayReport, Sender, plan, state_record

pytestmark = pytest.mark.slow

BUNDLE = REPO / "examples" / "nvlink-xid149"
# Both trigger loops analyse the attempt 1 s after its end-of-job record (the test's sleep below covers
# that), on top of the explicit trigger; a pause in sending longer than that may also give a
# provisional diagnosis, which is published as such (provisional="true") and not counted here.
SETTINGS = ("--settle-s", "1", "--log-level", "info")


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
        for res, series in metric_groups:
            sender.send_metrics(res, series, report)
        for stream in streams:  # the end-of-job record last: once it is in, the attempt may be analysed
            sender.send_logs(stream, report)
    finally:
        sender.close()


@pytest.mark.postgresql
def test_two_replicas_one_database_one_diagnosis(pg_schema: str, loki: FakeLoki, tmp_path: Path) -> None:
    expected = analyze(BUNDLE)
    ctx, node_streams, app_streams, metric_groups = plan(BUNDLE)
    a = ServerProcess(pg_schema, "--loki-url", loki.url, *SETTINGS, log=tmp_path / "a.log").start()
    b = ServerProcess(pg_schema, "--loki-url", loki.url, *SETTINGS, log=tmp_path / "b.log").start()
    try:
        report = ReplayReport()
        _send(a.grpc, node_streams, [], report)  # node agents → replica A
        _send(b.grpc, [*app_streams, state_record(ctx)], metric_groups, report)  # the job's streams → B
        wl = ctx.workload.id
        with a.client() as ca, b.client() as cb:
            # both replicas see everything that was accepted, whichever took it
            assert (
                ca.get("/readyz").json()["log_entries"]
                == cb.get("/readyz").json()["log_entries"]
                == report.log_records
            )
            # the explicit trigger (what the Slurm epilog calls) at A, while both trigger loops run
            r = ca.post(f"/v1/attempts/{wl}/{ctx.workload.attempt}/analyze")
            assert r.status_code == 200, r.text
            got_a, got_b = wait_for_diagnosis(ca, wl), wait_for_diagnosis(cb, wl)
            # exports: the diagnosis and its evidence, each once, however many replicas analysed
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(loki.entries) < 1 + len(expected["evidence"]):
                time.sleep(0.1)
            time.sleep(3)  # long enough for both replicas' loops (settle 1 s) to analyse it again
            rows_a = ca.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
            rows_b = cb.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        a.stop()
        b.stop()
    assert got_a == got_b
    assert essence(got_a) == essence(expected) and got_a["id"] == expected["id"]
    assert len(rows_a) == len(rows_b) == 1 and rows_a[0]["id"] == expected["id"]
    final = [e for e in loki.entries if e.metadata.get("provisional") == "false"]
    heads = [e for e in final if e.metadata["record"] == "diagnosis"]
    if len(heads) != 1:
        (tmp_path / "heads.txt").write_text(repr([(e.ts_ns, e.metadata, e.line) for e in heads]))
        raise AssertionError(f"{len(heads)} pushes of the final diagnosis: {tmp_path / 'heads.txt'}")
    assert heads[0].metadata["diagnosis_id"] == expected["id"]
    # evidence entries carry no provisional flag: each push sends its own, a final one exactly once
    pushes = len([e for e in loki.entries if e.metadata["record"] == "diagnosis"])
    evidence = len([e for e in loki.entries if e.metadata["record"] == "evidence"])
    if pushes == 1:
        assert evidence == len(expected["evidence"])
    else:
        assert len(expected["evidence"]) <= evidence <= pushes * len(expected["evidence"])


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def test_the_same_verdict_again_is_not_exported_again(kind: str, tmp_path: Path) -> None:
    """What a second replica (or a repeated trigger) does to the store: the same body and flag change
    nothing, once delivered it stays delivered; a changed verdict, or provisional → final, is sent."""
    import json

    from hypocenter.store import open_store
    from tests.exporter.test_prometheus import store_diagnosis

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
        assert deliver() == 0  # the same provisional verdict: nothing new to send
        store_diagnosis(store, doc)
        assert deliver() == 1  # final now
        store_diagnosis(store, doc)
        assert deliver() == 0
        store_diagnosis(store, {**doc, "quality": {"level": "low", "reasons": ["changed"]}})
        assert deliver() == 1  # a different body is a different verdict
        row = store.get_diagnosis(doc["id"])
        assert row is not None and json.loads(row.body)["quality"]["level"] == "low"
    finally:
        store.close()
        if kind == "postgresql":
            next(gen, None)


@pytest.mark.postgresql
def test_replicas_claiming_the_outbox_at_once_never_take_the_same_row() -> None:
    """Two replicas' outboxes claim due exports from one PostgreSQL database at the same moment: each
    row goes to one of them (else both would push it to Loki)."""
    import threading

    from hypocenter.store import open_store
    from tests.exporter.test_prometheus import store_diagnosis

    gen = fresh_schema()
    url = next(gen)
    doc = analyze(BUNDLE)
    stores = [open_store(url), open_store(url)]
    try:
        for s in stores:
            s.exporters = ("loki",)
        for i in range(60):
            attempt = {**doc["attempt"], "workload_id": f"w{i}"}
            store_diagnosis(stores[0], {**doc, "id": f"dx-{i:04d}", "attempt": attempt})
        for _ in range(3):  # three rounds: release everything, then both claim at once
            claimed: list[set[int]] = [set(), set()]
            barrier = threading.Barrier(2)

            def claim(
                k: int, claimed: list[set[int]] = claimed, barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait()
                now = time.time()
                claimed[k] = {c.id for c in stores[k].claim_exports("loki", now, 60, 30.0)}

            threads = [threading.Thread(target=claim, args=(k,)) for k in (0, 1)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            assert not claimed[0] & claimed[1]
            assert len(claimed[0] | claimed[1]) == 60
            stores[0].retry_exports(sorted(claimed[0] | claimed[1]), 0.0, "again")  # due again
    finally:
        for s in stores:
            s.close()
        next(gen, None)
