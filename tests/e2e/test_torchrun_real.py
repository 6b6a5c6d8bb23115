"""Diagnoses of real torchrun failures (torch 2.13 CPU, gloo, 4 ranks; recorded by bench/realruns/record.py).

Rank 2 fails in every recording but the rank0-checkpoint ones (rank 0 saves a checkpoint alone past
the others' collective timeout); the other ranks fail on the broken communicator or are SIGTERM'd by
the agent. Abstaining is right where the logs do not say why rank 2 died, but the diagnosis must
still name rank 2 first, with its signal, and the causes it weighed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from engine_support import analyze_bundle

from hypocenter.model import Diagnosis

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures" / "torchrun"


def _diagnose(tmp_path: Path, mode: str) -> Diagnosis:
    (tmp_path / "logs" / "_job").mkdir(parents=True)
    shutil.copy(FIXTURES / mode / "out.log", tmp_path / "logs" / "_job" / "out.log")
    (tmp_path / "attempt.yaml").write_text(
        yaml.safe_dump(
            {
                "workload": {"id": mode, "attempt": 0, "scheduler": "none"},
                "window": {"start": "2026-12-03T07:00:00Z", "end": "2026-12-03T08:00:00Z"},
                "state": "FAILED",
                "exit_code": 1,
                "nodes": ["localhost"],
                "ranks": {"localhost": "0-3"},
                "timezone": "UTC",
            }
        )
    )
    return analyze_bundle(tmp_path)


def test_fixtures_record_their_torch_version() -> None:
    for run in FIXTURES.glob("*/run.yaml"):
        meta = yaml.safe_load(run.read_text())
        assert meta["torch"].startswith("2.13.0") and meta["culprit_rank"] == (
            0 if "rank0" in run.parent.name else 2
        )


@pytest.mark.parametrize(
    ("mode", "signal"),
    [("sigkill", "SIGKILL"), ("sigkill-tee", "SIGKILL"), ("sigsegv", "SIGSEGV"), ("sigabrt", "SIGABRT")],
)
def test_killed_rank_is_named_first_not_a_sigtermed_one(tmp_path: Path, mode: str, signal: str) -> None:
    d = _diagnose(tmp_path, mode)
    assert d.outcome == "unattributed"
    ff = d.first_failure
    assert ff is not None and (ff.rank, ff.node, ff.signal) == (2, "localhost", signal)
    assert ff.action == "INVESTIGATE" and "rank 2 on localhost" in ff.next_step
    assert any("first failure: rank 2" in r for r in d.quality.reasons)
    # The child_failed example shown is rank 2's Root Cause entry, not a SIGTERM'd rank's.
    example = next(s.example for s in d.symptoms if s.kind == "child_failed")
    assert "SIGTERM" not in example and f"({signal})" in example
    host_oom = [c for c in d.candidates if (c.domain, c.subdomain) == ("resource", "host_oom")]
    assert (len(host_oom) == 1) == (signal == "SIGKILL")  # weighed, with why it falls short
    if host_oom:
        assert host_oom[0].nodes == ["localhost"] and "falls short" in host_oom[0].summary


def test_exception_on_one_rank_is_the_cause(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "exception")
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.subdomain, d.root_cause.action) == ("user_code", "FIX_CODE")
    assert "KeyError: 'input_ids'" in d.root_cause.summary


def test_gloo_collective_timeout_points_at_the_silent_rank(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "collective-timeout")
    assert d.outcome == "unattributed"  # the timeouts are symptoms, not the program's bug
    hang = [c for c in d.candidates if c.subdomain == "hang"]
    assert hang and "rank 2" in hang[0].summary
    assert d.first_failure is not None and "rank 2 never reached the collective" in d.first_failure.next_step


def test_dataloader_worker_killed_suggests_host_oom(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "dataloader-killed")
    assert d.outcome == "unattributed"
    assert d.first_failure is not None and d.first_failure.rank == 2
    assert [c.subdomain for c in d.candidates] == ["host_oom"]


@pytest.mark.parametrize("mode", ["rank0-checkpoint", "rank0-checkpoint-tee"])
def test_rank_working_alone_past_the_timeout_is_a_candidate_with_its_lines(tmp_path: Path, mode: str) -> None:
    d = _diagnose(tmp_path, mode)
    assert (
        d.outcome == "unattributed"
    )  # no error line says the timeout was too short: offered, not attributed
    [cand] = d.candidates
    assert (cand.domain, cand.subdomain, cand.rule) == ("software", "configuration", "solo-work")
    assert "rank 0 on localhost was still saving checkpoint" in cand.summary and "falls short" in cand.summary
    shown = [e for e in d.evidence if e.rule == "solo-work"]
    assert shown and all(e.role == "context" and "saving checkpoint shard" in e.text for e in shown)
    assert d.first_failure is not None and "rank 0 was still working on its own" in d.first_failure.next_step
    assert d.quality.level == "low" and any("configuration lines alone" in r for r in d.quality.reasons)
