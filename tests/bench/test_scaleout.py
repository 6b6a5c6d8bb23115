"""`python -m bench.scaleout --quick`: replicas on one PostgreSQL, the per-record CPU of a replica and of
PostgreSQL for healthy and evidence lines, 1 and 2 replicas on the same input, and the projected
ceiling of one PostgreSQL, all printed (sizes too small to mean anything; no timing is asserted).

Needs HYPOCENTER_TEST_POSTGRES_URL (CI sets it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from postgres_support import NO_PG, PG_URL
from server_support import REPO, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]


@pytest.mark.skipif(not PG_URL, reason=NO_PG)
def test_bench_scaleout_quick_measures_both_sides_of_a_record(tmp_path: Path) -> None:
    out = tmp_path / "scaleout.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench.scaleout", "--quick", "--postgres-url", PG_URL, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert {(x["replicas"], x["kind"], x["batch"]) for x in runs} == {
        (n, kind, batch)
        for n in (1, 2)
        for kind, batch in (("healthy", 512), ("healthy", 8192), ("evidence", 512))
    }
    # the same input through one and two replicas: every record acknowledged both times
    for kind, batch in (("healthy", 512), ("healthy", 8192), ("evidence", 512)):
        one, two = (
            next(x for x in runs if (x["replicas"], x["kind"], x["batch"]) == (n, kind, batch))
            for n in (1, 2)
        )
        assert one["records"] == two["records"] > 0
    assert all(x["replica_cpu_s"] > 0 and x["postgres_cpu_s"] >= 0 for x in runs)
    ceiling = doc["ceiling"]
    assert ceiling["goal_share"] == 0.05 and isinstance(ceiling["goal_met"], bool)
    assert set(ceiling) >= {"healthy_512", "healthy_8192", "evidence_512"}
    assert "PostgreSQL share" in r.stdout and ("met" in r.stdout.splitlines()[-1])
    # the replicas' PostgreSQL sessions were found (their CPU is what the PostgreSQL column reads)
    assert any(x["postgres_cpu_s"] > 0 for x in runs)
