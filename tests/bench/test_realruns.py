"""Program-level failures recorded under torchrun (torch 2.13 CPU, gloo; bench/realruns/record.py):
a host allocation refused, a bare MemoryError, ranks that took different collectives, a rank that
finished early, and one node started with another rendezvous port. Each is named, with its node."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.realruns.score import EXPECT, bundle, judge, run
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.model import Diagnosis

FIXTURES = Path(__file__).parents[1] / "fixtures" / "torchrun"


def _diagnose(tmp_path: Path, mode: str) -> Diagnosis:
    return default_engine().analyze(load_bundle(bundle(FIXTURES / mode, tmp_path)))


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("cpu-alloc", "DefaultCPUAllocator: can't allocate memory"),
        ("memory-error", "MemoryError on localhost"),
    ],
)
def test_host_memory_seen_from_inside_pytorch_is_host_oom(tmp_path: Path, mode: str, said: str) -> None:
    d = _diagnose(tmp_path, mode)
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain) == ("resource", "host_oom")
    assert d.root_cause.action == "ADD_RESOURCES" and said in d.root_cause.summary
    # The other ranks' broken gloo connections are consequences, not causes.
    assert not [c for c in d.candidates if c.subdomain == "user_code"]


def test_desync_without_flight_recorder_names_the_odd_rank(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "desync")
    assert d.root_cause is not None and d.root_cause.rule == "traceback-desync"
    assert "rank 2's traceback stops in broadcast" in d.root_cause.summary
    assert "ranks 0, 1, 3 stop in all_reduce" in d.root_cause.summary


def test_rank_that_finished_early_is_the_suspect(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "early-exit")
    assert d.root_cause is not None and d.root_cause.rule == "early-finish"
    assert "rank 2 finished on its own" in d.root_cause.summary and d.root_cause.action == "FIX_CODE"


def test_wrong_rendezvous_port_on_one_node_is_that_nodes_configuration(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "wrong-port")
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.subdomain, d.root_cause.nodes) == ("configuration", ["node1"])
    assert "could not reach the rendezvous store at 127.0.0.1:" in d.root_cause.summary
    # node0's bare RendezvousTimeoutError is the consequence, not a bug in the program.
    assert all(c.subdomain != "user_code" for c in d.candidates)


def test_every_recorded_run_scores_right_and_names_its_node() -> None:
    rows = run(FIXTURES)
    assert {r.mode for r in rows} == set(EXPECT)
    assert [r.mode for r in rows if not r.right] == []
    assert not any(r.false_confident for r in rows) and all(r.points_at_node for r in rows)


def test_scorer_counts_a_wrong_confident_class_as_false_confidence(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "desync")
    scored = judge("cpu-alloc", d)  # the desync diagnosis judged against another mode's truth
    assert not scored.right and scored.false_confident
