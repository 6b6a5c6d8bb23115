"""`python -m bench.cost --quick`: the cost estimates against the generator's true timelines, the
Pareto of causes against the truth's, and a replay into a real `hypocenter serve` whose REST, /metrics
and (with prometheus installed) the cost dashboard's queries give the report's numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]


def test_bench_cost_quick_meets_its_targets() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run(
        [sys.executable, "-m", "bench.cost", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["median_relative_error"] <= 0.10
    assert result["complete_estimates"] >= 0.8 * result["failed_with_truth"]
    assert result["pareto_estimated"] == result["pareto_truth"] and len(result["pareto_truth"]) == 5
    replay = result["replay"]
    assert replay["rest_equal"] and replay["metrics_equal"] and replay["counter_equal"]
    assert replay["rest_total"] == result["report"]["total"]["gpu_hours_lost"]
    if shutil.which("prometheus"):
        assert replay["dashboard_equal"] is True
