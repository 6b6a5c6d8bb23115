"""`python -m bench.perf --quick`: the performance benchmark runs end to end and prints every figure
beside its reference (sizes too small to mean anything; no timing is asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from server_support import REPO, clean_env

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep (Debian `ripgrep`) is the analyze reference")
def test_bench_perf_quick_prints_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "perf.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench.perf", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    runs = doc["ingest"]["runs"]
    assert {(x["protocol"], x["threads"]) for x in runs} == {
        ("grpc", 1),
        ("grpc", 4),
        ("http", 1),
        ("http", 4),
    }
    assert all(x["records_per_s"] > 0 and x["ratio_to_decode"] > 0 for x in runs)
    assert doc["ingest"]["decode_records_per_s"] > 0
    assert doc["store"]["bytes_per_healthy_line"] >= 0 and doc["store"]["line_bytes"] > 50
    assert len(doc["analyze"]) >= 2
    for row in doc["analyze"]:
        assert (
            row["seconds"] > 0 and row["rg_seconds"] > 0 and row["max_rss_mb"] > 0 and row["ratio_to_rg"] > 0
        )
        assert row["outcome"] == "attributed hardware/nvlink"  # the bundle's one fault, found
    trigger = doc["trigger"]
    assert trigger["diagnosis_after_ack_s"] > 0 and trigger["analyze_bundle_s"] > 0
    # the server's diagnosis of the streamed attempt is the one `analyze` makes of it as a bundle
    assert trigger["outcome"] == trigger["analyze_outcome"] == "attributed hardware/nvlink"
    table = r.stdout.split("| what | figure | reference (same run) | ratio |", 1)[1]
    assert table.count("\n| ") == len(runs) + 1 + len(doc["analyze"]) + 1
