"""The generator's `ambiguous-cross-domain-double-fault` mode: two independent faults on two hosts in
two domains (GPU and fabric, GPU and storage, host memory and GPU) within the ambiguity window, with
every rank's collective timing out. The engine must list both, never answer one confident cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.accuracy import evaluate, format_report
from bench.generate import build, scenario_seed, write_bundle
from bench.scenarios import MODES

pytestmark = pytest.mark.slow

MODE = "ambiguous-cross-domain-double-fault"
# Bundles of this mode that include a GPU lost to nvidia-smi beside a host OOM kill or a lost Lustre
# server on another host (what one cause's rule once swallowed), and some of the other pairs.
INDICES = (0, 1, 2, 10, 17, 41, 48, 53, 58)


def test_every_bundle_is_ambiguous_with_both_culprit_nodes(tmp_path: Path) -> None:
    for i in INDICES:
        write_bundle(tmp_path / f"{i:04d}-{MODE}", build(MODES[MODE], scenario_seed(777, i), 16))
    summary, results = evaluate(tmp_path, jobs=1)
    report = format_report(summary)
    assert summary["errors"] == 0, report
    assert summary["exact_match"] == 1.0, report
    for r in results:
        assert r.pred is not None and r.pred.outcome == "ambiguous", r.bundle
        assert len(r.pred.nodes) == 2, r.bundle
