"""Fleet roll-ups of what failures cost (engine/fleet_cost.py): the Pareto of causes, the worst
components, restart overhead joined from the next attempt, MTTF and ETTR; and that `hypocenter fleet
--cost`, GET /v1/fleet/cost and /metrics give the same numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_support import REPO, ServerProcess, clean_env

from hypocenter.engine.fleet import marks_of
from hypocenter.engine.fleet_cost import rollup
from hypocenter.exporter.activity import Activity
from hypocenter.model import Diagnosis
from hypocenter.store import open_store

pytestmark = pytest.mark.slow

NOW = time.time()
DAY = 86400.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fig(value: float | None) -> dict[str, Any]:
    return {"value": value, "uncertainty": None if value is None else 1.0, "method": "m", "ref": None}


def costed(
    workload: str,
    attempt: int = 0,
    *,
    end: float = NOW - DAY,
    run_s: float = 3600.0,
    outcome: str = "attributed",
    domain: str = "hardware",
    subdomain: str = "gpu",
    node: str = "n1",
    gpu: str | None = None,
    gpus: float | None = 16.0,
    lost_s: float | None = 1800.0,
    detect_s: float | None = 600.0,
    startup_s: float | None = 300.0,
    cluster: str = "eos",
) -> dict[str, Any]:
    """A diagnosis document with a cost, reduced to what the roll-up reads."""
    rc = (
        {
            "domain": domain,
            "subdomain": subdomain,
            "rule": "r",
            "summary": "s",
            "nodes": [node],
            "components": [{"node": node, "kind": "gpu", "id": gpu}] if gpu else [],
            "first_seen": _iso(end - 600),
            "action": "INVESTIGATE",
        }
        if outcome in ("attributed", "ambiguous")
        else None
    )
    failed = outcome != "not_failed"
    parts = [p for p in (lost_s, detect_s) if p is not None] if failed else []
    hours = None if gpus is None else round(gpus * sum(parts) / 3600.0, 4)
    return {
        "schema": "hypocenter.diagnosis/v1",
        "id": f"dx-{cluster}-{workload}-{attempt}",
        "attempt": {
            "workload_id": workload,
            "attempt": attempt,
            "scheduler": "slurm",
            "cluster": cluster,
            "window": {"start": _iso(end - run_s), "end": _iso(end)},
            "nodes": [node],
        },
        "terminal_state": "FAILED" if failed else "COMPLETED",
        "outcome": outcome,
        "root_cause": rc,
        "candidates": [],
        "affected_nodes": [node],
        "symptoms": [],
        "evidence": [],
        "quality": {"level": "high", "reasons": []},
        "coverage": [],
        "engine": {"version": "0", "ruleset": "sha256:x"},
        "cost": {
            "gpus": _fig(gpus),
            "lost_work_s": _fig(lost_s if failed else 0.0),
            "time_to_detect_s": _fig(detect_s if failed else 0.0),
            "restart_overhead_s": _fig(None if failed else 0.0),
            "startup_s": _fig(startup_s),
            "gpu_hours_lost": hours,
            "gpu_hours_uncertainty": None if hours is None else 0.01,
            "unknown": ["restart_overhead_s"] if failed else [],
        },
    }


# A month: a bad GPU behind two workloads' failures, a fabric port, a user bug, one without GPUs known.
FLEET = [
    costed(
        "a", 0, gpu="0000:3b:00", node="n7"
    ),  # 16 × 2400 s = 10.667 h, + restart of a/1: 16 × 300 s = 1.333 h
    costed("a", 1, outcome="not_failed", node="n7"),
    costed("b", 0, gpu="0000:3b:00", node="n7", lost_s=3600.0),  # 16 × 4200 s = 18.667 h
    costed("c", 0, domain="network", subdomain="fabric", node="n2", lost_s=600.0),  # 16 × 1200 s = 5.333 h
    costed(
        "d", 0, domain="software", subdomain="user_code", node="n3", lost_s=None
    ),  # 16 × 600 s, lower bound
    costed("e", 0, outcome="unattributed", gpus=None),  # no GPUs: no cost
]


def test_pareto_components_restart_mttf_and_ettr() -> None:
    doc = rollup(FLEET, since_s=NOW - 30 * DAY, until_s=NOW)
    causes = [(c["domain"], c["subdomain"], c["gpu_hours_lost"]) for c in doc["causes"]]
    assert causes == [
        ("hardware", "gpu", round(10.6667 + 1.3333 + 18.6667, 4)),
        ("network", "fabric", 5.3333),
        ("software", "user_code", 2.6667),
        ("unattributed", "", 0.0),
    ]
    assert doc["causes"][-1]["attempts_without_cost"] == 1 and doc["causes"][-1]["cumulative_share"] == 1.0
    assert doc["total"]["gpu_hours_lost"] == round(30.6667 + 5.3333 + 2.6667, 4)
    assert doc["total"]["restart_gpu_hours"] == 1.3333 and doc["total"]["attempts_without_cost"] == 1
    worst = [(c["kind"], c["name"], c["workloads"], c["gpu_hours_lost"]) for c in doc["components"][:3]]
    assert worst == [
        ("node", "n7", 2, 30.6667),
        ("gpu", "n7/0000:3b:00", 2, 30.6667),
        ("node", "n2", 1, 5.3333),
    ]
    hw = next(d for d in doc["domains"] if d["domain"] == "hardware")
    assert hw["failures"] == 2 and hw["mttf_s"] == 6 * 3600 / 2  # six attempts of an hour, two failures
    # ETTR of workload a: (3600 - 300 - 2400) + (3600 - 300) over 7200 s.
    a = next(w for w in doc["workloads"] if w["workload"] == "a")
    assert a["ettr"] == round((900 + 3300) / 7200, 4)
    assert "d" not in {w["workload"] for w in doc["workloads"]}  # its lost work is unknown


def test_the_rollup_is_deterministic_whatever_the_order() -> None:
    a = rollup(FLEET, since_s=NOW - 30 * DAY, until_s=NOW)
    b = rollup(list(reversed(FLEET)), since_s=NOW - 30 * DAY, until_s=NOW)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_the_counter_adds_the_restart_the_next_attempt_paid() -> None:
    """hypocenter_gpu_hours_lost_total: a's failure, then a/1's startup on a's cause."""
    activity = Activity()
    first = Diagnosis.model_validate(costed("a", 0, gpu="0000:3b:00", node="n7"))
    nxt = costed("a", 1, outcome="not_failed", node="n7")
    # ids are the engine's (cluster, workload, attempt, ruleset) hashes: the counter finds the attempt before.
    from hypocenter.engine.report import diagnosis_id

    first.id = diagnosis_id("eos", "a", 0, "sha256:x")
    nxt["id"] = diagnosis_id("eos", "a", 1, "sha256:x")
    activity.analysed(first, False, None)
    assert activity.snapshot().gpu_hours_lost == {("eos", "hardware", "gpu"): 10.6667}
    activity.analysed(Diagnosis.model_validate(nxt), False, None)
    activity.analysed(first, False, None)  # the same verdict again is not counted twice
    assert activity.snapshot().gpu_hours_lost == {("eos", "hardware", "gpu"): 12.0}


def _put(store: Any, d: dict[str, Any]) -> None:
    a = d["attempt"]
    store.set_context(a["workload_id"], a["attempt"], {}, NOW)
    row = store.attempt(a["workload_id"], a["attempt"])
    rc = d["root_cause"] or {}
    end = datetime.fromisoformat(a["window"]["end"].replace("Z", "+00:00")).timestamp()
    summary = {
        "id": d["id"],
        "workload": a["workload_id"],
        "attempt": a["attempt"],
        "cluster": a["cluster"],
        "outcome": d["outcome"],
        "domain": rc.get("domain"),
        "subdomain": rc.get("subdomain"),
        "window_start_ns": int((end - 3600) * 1e9),
        "window_end_ns": int(end * 1e9),
        "culprits": list(rc.get("nodes", [])),
        "affected": d["affected_nodes"],
        "marks": marks_of(d),
    }
    store.put_diagnosis(row.id, json.dumps(d), summary, False, NOW)


@pytest.fixture(scope="module")
def cost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("cost")
    store = open_store(str(tmp / "store.db"))
    try:
        for d in FLEET:
            _put(store, d)
    finally:
        store.close()
    srv = ServerProcess(tmp / "store.db").start()
    yield srv, tmp / "store.db"
    srv.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )


def test_rest_metrics_and_the_cli_give_the_same_numbers(cost_server: tuple[ServerProcess, Path]) -> None:
    srv, store = cost_server
    with srv.client() as c:
        doc = c.get("/v1/fleet/cost").json()
        assert c.get("/v1/fleet/cost", params={"limit": 0}).status_code == 422
    assert doc["schema"] == "hypocenter.cost/v1" and doc["total"]["gpu_hours_lost"] == 38.6667
    metrics = httpx.get(f"http://{srv.metrics}/metrics", timeout=30).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics)
        for s in fam.samples
    }
    for c in doc["causes"]:
        key = ("hypocenter_cost_gpu_hours_lost", (("domain", c["domain"]), ("subdomain", c["subdomain"])))
        assert samples[key] == c["gpu_hours_lost"]
    top = doc["components"][0]
    key = ("hypocenter_cost_component_gpu_hours_lost", (("component", top["name"]), ("kind", top["kind"])))
    assert samples[key] == top["gpu_hours_lost"]
    assert samples[("hypocenter_cost_mttf_seconds", (("domain", "hardware"),))] == 3 * 3600
    a = next(w for w in doc["workloads"] if w["workload"] == "a")
    assert samples[("hypocenter_cost_workload_ettr", (("cluster", "eos"), ("workload", "a")))] == a["ettr"]
    from_store = _cli("fleet", "--cost", "--store", str(store), "--format", "json")
    from_server = _cli("fleet", "--cost", "--server", srv.base, "--format", "json")
    assert from_store.returncode == 0 and from_server.returncode == 0, from_store.stderr + from_server.stderr
    for out in (from_store.stdout, from_server.stdout):
        got = json.loads(out)
        assert got["causes"] == doc["causes"] and got["components"] == doc["components"]
    import grpc

    from hypocenter.api.v1 import attribution_pb2 as pb
    from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc

    with grpc.insecure_channel(srv.grpc) as ch:
        reply = pb_grpc.AttributionStub(ch).GetFleetCost(pb.GetFleetCostRequest(), timeout=30)
    assert reply.gpu_hours_lost == doc["total"]["gpu_hours_lost"]
    assert [(c.domain, c.subdomain, c.gpu_hours_lost) for c in reply.causes] == [
        (c["domain"], c["subdomain"], c["gpu_hours_lost"]) for c in doc["causes"]
    ]
    assert [(c.kind, c.name) for c in reply.components] == [(c["kind"], c["name"]) for c in doc["components"]]
    text = _cli("fleet", "--cost", "--store", str(store)).stdout
    assert "38.6667 ± " in text and "hardware/gpu" in text and "gpu         n7/0000:3b:00" in text


def test_the_cost_dashboard_shows_pareto_time_series_components_and_time_to_detect() -> None:
    d = json.loads((REPO / "grafana" / "dashboards" / "hypocenter-cost.json").read_text())
    titles = {p["title"]: p for p in d["panels"]}
    assert {
        "Pareto of causes (GPU-hours lost)",
        "Lost GPU-hours over time, by domain",
        "Worst components (GPU-hours lost)",
        "Time to detect (median, by cause)",
    } <= set(titles)
    assert (
        "hypocenter_gpu_hours_lost_total"
        in titles["Lost GPU-hours over time, by domain"]["targets"][0]["expr"]
    )


@pytest.mark.chromium
def test_the_ui_cost_view_shows_the_rest_numbers(cost_server: tuple[ServerProcess, Path]) -> None:
    from bench.ui_screenshots import CHROMIUM, VIEWPORT, launch_chromium

    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing (Debian package `chromium`; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    srv, _ = cost_server
    with srv.client() as c:
        doc = c.get("/v1/fleet/cost").json()
    with sync_api.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{srv.base}/ui/#/cost")
            page.wait_for_selector("#cost-total")
            total = page.inner_text("#cost-total")
            first_row = page.locator("table.cost").first.locator("tbody tr").first.inner_text()
            assert page.get_attribute("a[data-nav=cost]", "aria-current") == "page"
        finally:
            browser.close()
    assert total.startswith(f"{doc['total']['gpu_hours_lost']:.1f} ± ")
    top = doc["causes"][0]
    assert (
        first_row.split()[0] == f"{top['domain']}/{top['subdomain']}"
        and f"{top['gpu_hours_lost']:.1f}" in first_row
    )
