"""The accuracy benchmark (bench.accuracy): the engine against the issue's targets on a fixed corpus.

Targets from issue #3: exact match (outcome + domain + subdomain + culprit node set) >= 0.97,
culprit-node precision >= 0.99, and never attributed when the truth is unattributed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.accuracy import Label, Result, Thresholds, evaluate, format_report, main, score
from bench.generate import generate

pytestmark = pytest.mark.slow


def test_engine_meets_accuracy_targets(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    generate(corpus, 300, seed=20261102, prior="uniform", nodes_max=16, jobs=os.cpu_count() or 1)
    summary, _ = evaluate(corpus, jobs=os.cpu_count() or 1)
    report = format_report(summary)
    assert summary["scenarios"] == 300
    assert summary["errors"] == 0, report
    assert summary["exact_match"] >= 0.97, report
    assert summary["node_precision"] >= 0.99, report
    assert summary["false_confident_rate_unattributed"] == 0, report


def test_cli_exit_status_follows_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    generate(corpus, 3, seed=9, prior="uniform", nodes_max=2)
    out = tmp_path / "summary.json"
    assert main([str(corpus), "--jobs", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["scenarios"] == 3
    assert main([str(corpus), "--jobs", "1", "--min-exact", "1.01"]) == 1
    assert "FAIL: exact match" in capsys.readouterr().out


def _r(mode: str, truth: Label, pred: Label | None) -> Result:
    return Result(bundle=f"0000-{mode}", mode=mode, truth=truth, pred=pred, seconds=0.01)


def test_scoring_arithmetic() -> None:
    gpu = Label("attributed", "hardware", "gpu", ("n1",))
    results = [
        _r("a", gpu, gpu),
        _r("a", gpu, Label("attributed", "hardware", "gpu", ("n1", "n2"))),
        _r("b", Label("unattributed", None, None, ()), Label("attributed", "network", "fabric", ("n3",))),
        _r("c", Label("not_failed", None, None, ()), Label("not_failed", None, None, ())),
        _r("d", Label("attributed", "external", "preemption", ()), None),
    ]
    s = score(results, wall=1.0)
    assert s["exact_match"] == 0.4
    assert s["label_accuracy"] == 0.6
    assert s["node_precision"] == round(2 / 4, 4) and s["node_recall"] == 1.0
    assert s["false_confident_rate_unattributed"] == 1.0
    assert s["per_domain"]["hardware"]["precision"] == 1.0 and s["per_domain"]["network"]["precision"] == 0.0
    assert s["per_mode"]["a"]["exact"] == 0.5
    assert s["confusion"]["(unattributed)"] == {"network/fabric": 1}
    assert s["worst"][0]["predicted"] is None  # an engine error is the worst kind of miss
    assert "exact match 0.400" in format_report(s)
    missed = Thresholds(min_exact=0.97, max_false_confident_unattributed=0.0).missed(s)
    assert len(missed) == 2 and all(line.startswith("FAIL: ") for line in missed)


def test_the_heldout_command_reproduces_its_readme(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/heldout/README.md: `python -m bench.accuracy bench/heldout` scores the hand-written bundles
    against their expected.yaml, and prints the summary the README shows."""
    heldout = Path(__file__).resolve().parents[2] / "bench" / "heldout"
    assert main([str(heldout), "--jobs", "1"]) == 0
    summary = capsys.readouterr().out.splitlines()[:3]
    readme = (heldout / "README.md").read_text()
    for line in summary:  # scenarios and exact match; culprit nodes; false confidence and abstention
        assert line in readme, line
