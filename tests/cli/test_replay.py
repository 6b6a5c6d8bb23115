"""`hypocenter replay`: what it sends, how it is tagged (contract 2), and that resending is idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_support import REPO, ServerProcess, replay

from hypocenter.cli.replay import plan, state_record

pytestmark = pytest.mark.slow

NVLINK = REPO / "examples" / "nvlink-xid149"


def test_plan_tags_node_logs_node_scoped_and_app_logs_with_the_workload() -> None:
    ctx, node_streams, app_streams, metrics = plan(NVLINK)
    assert node_streams and all(set(s.resource) == {"host.name", "service.name"} for s in node_streams)
    kern = next(s for s in node_streams if s.lines[0].attributes["log.file.path"] == "logs/node02/kern.log")
    assert kern.resource["host.name"] == "node02"
    assert [ln.attributes["log.file.record_number"] for ln in kern.lines] == list(
        range(1, len(kern.lines) + 1)
    )
    assert all(ln.time_ns > 0 for ln in kern.lines)
    job = next(
        s for s in app_streams if s.lines[0].attributes["log.file.path"] == "logs/_job/slurm-81234.out"
    )
    assert job.resource["hypocenter.workload.id"] == "81234" and "host.name" not in job.resource
    assert job.resource["hypocenter.attempt.window.start"] == "2026-11-02T10:00:00Z"
    events = [s for s in app_streams if str(s.lines[0].attributes["log.file.path"]).startswith("events/")]
    assert events and isinstance(events[0].lines[0].body, dict)
    assert metrics and all("hypocenter.source" in res for res, _ in metrics)
    assert {res.get("host.name") for res, _ in metrics} >= {"node02"}
    state = state_record(ctx)
    assert state.lines[0].attributes["hypocenter.attempt.state"] == "FAILED"
    assert state.lines[0].attributes["hypocenter.attempt.exit_code"] == 1


def test_replay_twice_stores_once_and_bad_bundles_fail_cleanly(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "s.db").start()
    try:
        for _ in range(2):
            r = replay(NVLINK, srv.http, "--http")
            assert r.returncode == 0, r.stderr
        with srv.client() as c:
            info = c.get("/v1/attempts/81234/0").json()
        _, _, app_streams, _ = plan(NVLINK)
        assert info["log_records"] == sum(len(s.lines) for s in app_streams) + 1  # + the state record
        missing = replay(tmp_path / "nope", srv.grpc)
        assert (
            missing.returncode == 2
            and "no such bundle" in missing.stderr
            and "Traceback" not in missing.stderr
        )
    finally:
        srv.stop()
    down = replay(NVLINK, srv.grpc, "--timeout", "2")  # the server is gone: a clear failure, not a traceback
    assert down.returncode == 1 and "replay to" in down.stderr
