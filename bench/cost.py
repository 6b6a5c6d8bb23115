"""Score what failures cost against the generator's truth, and replay a fleet month into `serve`.

    python -m bench.cost [--quick] [--count N] [--seed S] [--nodes-max K] [--no-replay] [--json]

1. Generates a corpus (prior `real`: a fleet month's mix of failures) whose truth.yaml knows each
   attempt's true timeline (bench/scenario.py `cost_truth`: the fault, each checkpoint saved, the end).
2. Analyses every bundle as `hypocenter analyze --gpus-per-node 8` does (an H100 fleet's setting, for
   the attempts whose scope has no rank map; nothing else is configured: the logs say the rest), and
   scores the estimated lost GPU-hours: median relative error over the failed attempts whose estimate
   is complete, and how many have one at all.
3. The Pareto of causes: lost GPU-hours per domain/subdomain, estimated (engine/fleet_cost.py over
   the diagnoses) against the truth (the modes' causes, the true hours); the top 5 must agree.
4. Replays the corpus into a real `hypocenter serve` (POST /v1/bundles) and reads GET /v1/fleet/cost,
   /metrics and, when `prometheus` is installed, the cost dashboard's own queries through a real
   Prometheus scraping it: each must give the numbers of step 3.

Exit 1 when a target is missed (median error > 10 %, top 5 differ, a number differs). `--quick`: a
small corpus for tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.generate import generate
from bench.panel_history import stop_process
from bench.ui_load import serve
from bench.ui_screenshots import bundle_tar
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import CostSettings, default_engine
from hypocenter.engine.fleet_cost import rollup

REPO = Path(__file__).resolve().parent.parent
TARGET_MEDIAN_ERROR = 0.10
TOP = 5
GPUS_PER_NODE = 8
FAR = 20 * 365 * 86400.0  # a cost window that holds every generated attempt, whatever its date


def _cause(domain: str | None, subdomain: str | None, outcome: str) -> str:
    if outcome == "unattributed" or not domain:
        return "unattributed/"
    return f"{domain}/{subdomain or ''}"


def score(bundles: list[Path]) -> dict[str, Any]:
    """Analyse each bundle; the estimate against the truth, per attempt and as a Pareto of causes."""
    engine = default_engine(cost=CostSettings(gpus_per_node=GPUS_PER_NODE))
    docs: list[dict[str, Any]] = []  # the attempts with a true cost
    every: list[dict[str, Any]] = []  # all of them: what a server fed the corpus reports
    errors: list[float] = []
    parts: dict[str, list[float]] = {"lost_work_s": [], "time_to_detect_s": []}
    failed = complete = lower_bound = no_gpus = 0
    truth_by_cause: dict[str, float] = {}
    for b in bundles:
        truth = yaml.safe_load((b / "truth.yaml").read_text())
        doc = json.loads(engine.analyze(load_bundle(b)).to_json())
        every.append(doc)
        real = truth["cost"]
        if truth["outcome"] == "not_failed" or real["gpu_hours_lost"] is None:
            continue  # a mode without a true fault time has no true cost: left out of both sides
        docs.append(doc)
        failed += 1
        cause = _cause(truth["domain"], truth["subdomain"], truth["outcome"])
        truth_by_cause[cause] = truth_by_cause.get(cause, 0.0) + real["gpu_hours_lost"]
        est = doc["cost"]
        if est["gpu_hours_lost"] is None:
            no_gpus += 1
            continue
        if set(est["unknown"]) - {"restart_overhead_s"}:
            lower_bound += 1
            continue
        complete += 1
        errors.append(abs(est["gpu_hours_lost"] - real["gpu_hours_lost"]) / real["gpu_hours_lost"])
        for name in parts:
            if est[name]["value"] is not None and real[name] is not None:
                parts[name].append(abs(est[name]["value"] - real[name]))
    ends = [_end(d) for d in every]
    since, until = min(ends) - 1, max(ends) + 1
    scored = rollup(docs, since_s=since, until_s=until, limit=10)
    report = rollup(every, since_s=since, until_s=until, limit=10)
    est_top = [f"{c['domain']}/{c['subdomain']}" for c in scored["causes"]][:TOP]
    truth_top = [c for c, _ in sorted(truth_by_cause.items(), key=lambda kv: (-kv[1], kv[0]))][:TOP]
    return {
        "bundles": len(bundles),
        "failed_with_truth": failed,
        "complete_estimates": complete,
        "lower_bounds": lower_bound,
        "gpus_unknown": no_gpus,
        "median_relative_error": round(statistics.median(errors), 4) if errors else None,
        "p90_relative_error": round(sorted(errors)[int(0.9 * (len(errors) - 1))], 4) if errors else None,
        "median_abs_error_s": {k: round(statistics.median(v), 1) if v else None for k, v in parts.items()},
        "pareto_estimated": est_top,
        "pareto_truth": truth_top,
        "pareto_equal": est_top == truth_top,
        "report": report,
    }


def _end(doc: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(doc["attempt"]["window"]["end"].replace("Z", "+00:00")).timestamp()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _metric_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def _dashboard_queries() -> dict[str, str]:
    board = json.loads((REPO / "grafana" / "dashboards" / "hypocenter-cost.json").read_text())
    return {p["title"]: p["targets"][0]["expr"].replace("$cluster", ".*") for p in board["panels"]}


def replay(bundles: list[Path], report: dict[str, Any], work: Path) -> dict[str, Any]:
    """Feed the bundles to a real server; what REST, /metrics and the dashboard's queries say."""
    proc, addrs = serve(
        work / "store.db",
        work / "server.log",
        "--metrics-listen",
        "127.0.0.1:0",
        "--cost-window-s",
        str(FAR),
        "--cost-gpus-per-node",
        str(GPUS_PER_NODE),
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        base = f"http://{addrs['http']}"
        with httpx.Client(base_url=base, timeout=300.0) as client:
            for b in bundles:
                r = client.post(
                    "/v1/bundles", content=bundle_tar(b), headers={"Content-Type": "application/gzip"}
                )
                r.raise_for_status()
            rest = client.get("/v1/fleet/cost", params={"limit": 10}).json()
        metrics = httpx.get(f"http://{addrs['metrics']}/metrics", timeout=60).text
        out: dict[str, Any] = {"rest_total": rest["total"]["gpu_hours_lost"]}
        want = {(c["domain"], c["subdomain"]): c["gpu_hours_lost"] for c in report["causes"]}
        got_rest = {(c["domain"], c["subdomain"]): c["gpu_hours_lost"] for c in rest["causes"]}
        gauges = _metric_values(metrics, "hypocenter_cost_gpu_hours_lost")
        got_metrics = {(dict(k)["domain"], dict(k)["subdomain"]): v for k, v in gauges.items()}
        counter = sum(_metric_values(metrics, "hypocenter_gpu_hours_lost_total").values())
        out["rest_equal"] = got_rest == want
        out["metrics_equal"] = got_metrics == want
        out["counter_total"] = round(counter, 4)
        out["counter_equal"] = abs(counter - report["total"]["gpu_hours_lost"]) < 1e-3
        if shutil.which("prometheus"):
            prom, url = _prometheus(addrs["metrics"], work)
            queries = _dashboard_queries()
            pareto = _query(url, queries["Pareto of causes (GPU-hours lost)"])
            got_dash = {
                (m.get("domain", ""), m.get("subdomain", "")): v for m, v in pareto
            }  # Prometheus drops empty labels
            total = _query(url, queries["GPU-hours lost"])
            out["dashboard_total"] = round(total[0][1], 4) if total else None
            out["dashboard_equal"] = got_dash == want and out["dashboard_total"] == round(
                report["total"]["gpu_hours_lost"], 4
            )
        else:
            out["dashboard_equal"] = None  # no prometheus here: said, not assumed
        return out
    finally:
        if prom is not None:
            stop_process(prom)
        stop_process(proc)


def _prometheus(target: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cfg = work / "prometheus.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [{"job_name": "hypocenter", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    log = (work / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [
            str(shutil.which("prometheus")),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until a scrape of hypocenter's cost gauges is in
        try:
            if _query(url, "hypocenter_cost_window_seconds"):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_process(proc)
    raise RuntimeError(f"prometheus never scraped {target}: {(work / 'prometheus.log').read_text()[-2000:]}")


def _query(url: str, expr: str) -> list[tuple[dict[str, str], float]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30)
    r.raise_for_status()
    return [(v["metric"], round(float(v["value"][1]), 4)) for v in r.json()["data"]["result"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a small corpus (tests)")
    ap.add_argument("--count", type=int, help="bundles (default 300; --quick 40)")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--nodes-max", type=int, default=64, help="largest job generated (default 64)")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay into serve")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = ap.parse_args(argv)
    count = args.count or (40 if args.quick else 300)
    with tempfile.TemporaryDirectory(prefix="hypocenter-bench-cost-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        bundles = generate(work / "corpus", count, args.seed, "real", args.nodes_max)
        result = score(bundles)
        result["seconds_scoring"] = round(time.perf_counter() - t0, 1)
        if not args.no_replay:
            result["replay"] = replay(bundles, result["report"], work)
    ok = (
        result["median_relative_error"] is not None
        and result["median_relative_error"] <= TARGET_MEDIAN_ERROR
        and result["pareto_equal"]
        and all(v is not False for k, v in result.get("replay", {}).items() if k.endswith("_equal"))
    )
    result["ok"] = ok
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        summary = {k: v for k, v in result.items() if k != "report"}
        print(yaml.safe_dump(summary, sort_keys=False, width=120), end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
