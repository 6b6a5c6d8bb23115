"""Analyse anywhere, once: two replicas on one PostgreSQL, one attempt's node streams ingested by one
and its job's streams by the other (as a gateway routing by host.name splits them), both trigger
loops looking for due attempts every 50 ms. The attempt is analysed by the replica that claims it in
the database, from the streams both stored, exactly once per verdict, and equals `analyze`.

Needs HYPOCENTER_TEST_POSTGRES_URL (CI sets it)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.cli.replay import ReplayReport, Sender, plan, state_record
from hypocenter.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

BUNDLE = REPO / "examples" / "nvlink-xid149"
FLAGS = ("--settle-s", "1", "--tick-s", "0.05", "--log-level", "info")
VERDICT = re.compile(r"diagnosis (dx-\w+) for workload '([^']+)' attempt \d+: \w+(?! \(provisional\))$")


@pytest.fixture()
def pg_url() -> Iterator[str]:
    yield from fresh_schema()


def _send(endpoint: str, streams: list, metric_groups: list, report: ReplayReport) -> None:  # type: ignore[type-arg]
    sender = Sender(endpoint, False, 10)
    try:
        for res, series in metric_groups:
            sender.send_metrics(res, series, report)
        for stream in streams:
            sender.send_logs(stream, report)
    finally:
        sender.close()


def _final_analyses(log: Path, workload: str) -> int:
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if (m := VERDICT.search(line.rstrip())) and m.group(2) == workload
    )


def test_an_attempt_split_over_two_replicas_is_analysed_once(pg_url: str, tmp_path: Path) -> None:
    expected = analyze(BUNDLE)
    ctx, node_streams, app_streams, metric_groups = plan(BUNDLE)
    a = ServerProcess(pg_url, *FLAGS, log=tmp_path / "a.log").start()
    b = ServerProcess(pg_url, *FLAGS, log=tmp_path / "b.log").start()
    wl = ctx.workload.id
    try:
        report = ReplayReport()
        _send(a.grpc, node_streams, [], report)  # the nodes' agents → A
        _send(b.grpc, [*app_streams, state_record(ctx)], metric_groups, report)  # the job's → B
        with a.client() as ca, b.client() as cb:
            got = wait_for_diagnosis(ca, wl, timeout=60)
            assert wait_for_diagnosis(cb, wl) == got
        time.sleep(3)  # both loops run on: a second analysis of the same data would show by now
    finally:
        a.stop()
        b.stop()
    assert essence(got) == essence(expected) and got["id"] == expected["id"]
    per_replica = [_final_analyses(tmp_path / n, wl) for n in ("a.log", "b.log")]
    assert sum(per_replica) == 1, f"final analyses per replica: {per_replica}"
    store = open_store(pg_url)
    try:
        row = store.attempt(wl, ctx.workload.attempt)
        assert row is not None and store.analysing_by(row.id) is None  # the claim was let go
    finally:
        store.close()
