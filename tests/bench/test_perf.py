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
    assert {(x["shape"], x["protocol"], x["threads"]) for x in runs} == {
        ("numbered", "grpc", 1),
        ("numbered", "grpc", 4),
        ("numbered", "http", 1),
        ("numbered", "http", 4),
        ("unnumbered", "grpc", 4),
        ("dense", "grpc", 4),
    }
    assert all(
        x["records_per_s"] > 0 and x["ratio_to_decode_body"] > 0 and x["ratio_to_decode"] > 0 for x in runs
    )
    # decode + body is the stricter reference: faster than decode turning attributes into objects
    assert all(x["decode_body_records_per_s"] > x["decode_records_per_s"] for x in runs)
    dense = next(x for x in runs if x["shape"] == "dense")
    assert dense["candidates"] * 12 > doc["ingest"]["records"]  # one line in ten is a candidate
    assert doc["store"]["bytes_per_healthy_line"] >= 0 and doc["store"]["line_bytes"] > 50
    assert set(doc["store_by_shape"]) == {"numbered", "unnumbered", "dense"}
    rest = doc["rest"]
    assert rest["echo_p50_ms"] > 0
    assert rest["requests"][0]["what"] == "GET /readyz"
    assert all(x["p50_ms"] > 0 for x in rest["requests"])
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
    shapes = len(doc["store_by_shape"])
    assert table.count("\n| ") == len(runs) + shapes + len(doc["analyze"]) + 1 + len(rest["requests"])
