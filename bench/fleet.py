"""A generated fleet with planted recurring culprits, and how well fleet memory finds them.

    python -m bench.fleet [--workloads N] [--seed S] [--k K] [--out DIR] [--json OUT.json]

The generator's bundles (bench/generate.py) are diagnosed by the engine, then placed on a fleet of
`fleet-nNNN` nodes, each with one HCA port (mlx5_0/1) cabled to a leaf switch (8 hosts a leaf).
Three culprits are planted, each recurring across different workloads among random unrelated
failures and healthy runs:

- a lemon GPU: application-class Xid workloads (user bugs, one at a time) that all land on it;
- a bad GPU: hardware GPU failures (Xid 79 / 94 / 48) on one GPU of one node;
- a bad leaf switch: fabric link failures on different hosts cabled to it.

A decoy workload restarts many times on an unrelated hardware failure (one workload, many attempts).
Placement maps each bundle's *true* culprit (truth.yaml) onto the planted node / GPU / port, and its
other nodes onto random fleet nodes; the engine's own verdict is what fleet memory reads, so a
misattribution costs a point. Reported: precision of the top-k findings (k = number of planted
culprits by default), against a reference ranking that counts attempts instead of distinct
workloads, computed on the same marks in the same run. `--out` also writes the bundles, placed,
as a fleet (bundles/ and truth.yaml) for `hypocenter rules backtest --bundles`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from random import Random
from typing import Any

import yaml

from bench.generate import build, scenario_seed, write_bundle
from bench.scenarios import MODES
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.engine.fleet import findings, marks_of, suspects
from hypocenter.engine.topology import Link, Topology
from hypocenter.store.base import FleetMark

DAY = 86400.0
NOW = 1_800_000_000.0  # a fixed "now": the report does not depend on the clock
FLEET_NODES = 1024
LEMON_MODES = ("app-xid31-13-illegal-memory-access",)
GPU_MODES = ("s01-xid79-fallen-off-bus", "xid94-contained-ecc", "s02-hbm-dbe-xid48-rowremap")
FABRIC_MODES = ("s04-ib-link-flap",)
NOISE_EXCLUDE = set(LEMON_MODES) | {"ib-leaf-switch-fault"}


def fleet_topology() -> Topology:
    return Topology(
        Link(f"fleet-n{i:03d}", "mlx5_0/1", f"leaf-{i // 8:02d}", str(i % 8 + 1)) for i in range(FLEET_NODES)
    )


def _place(
    diagnosis: dict[str, Any],
    truth: dict[str, Any],
    node_map: dict[str, str],
    gpu: str | None,
    port: str | None,
) -> dict[str, Any]:
    """The diagnosis with every bundle node renamed onto the fleet; the true culprit's GPU (or every
    GPU named on it, for an application fault) becomes `gpu` and its port `port`."""
    text = json.dumps(diagnosis)
    culprits = set(truth.get("nodes") or [])
    if gpu is not None:
        for c in truth.get("components") or []:
            if c.get("kind") == "gpu":
                text = text.replace(str(c["id"]), gpu)
        if not truth.get("components"):  # an application fault: the Xid'd GPUs of the faulting node
            for ev in diagnosis.get("evidence") or []:
                if ev.get("node") in culprits:
                    for pci in re.findall(r"Xid \((?:PCI:)?([0-9a-fA-F:]{10})", str(ev.get("text"))):
                        text = text.replace(pci, gpu)
    if port is not None:
        for c in truth.get("components") or []:
            if c.get("kind") == "port":
                for name in [str(c["id"]), *(str(a) for a in c.get("aliases") or [])]:
                    text = re.sub(rf'(?<=")({re.escape(name)})(?=")', port, text)
    for old in sorted(node_map, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(old)}(?![\w-])", node_map[old], text)
    placed: dict[str, Any] = json.loads(text)
    return placed


def _diagnose(mode: str, seed: int, tmp: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    files = build(MODES[mode], seed, 8)
    where = tmp / f"{mode}-{seed}"
    write_bundle(where, files)
    b = load_bundle(where)
    d = default_engine().analyze(b)
    return json.loads(d.to_json()), yaml.safe_load(files["truth.yaml"]), files


def make_fleet(
    workloads: int, seed: int, out: Path | None = None
) -> tuple[list[FleetMark], set[tuple[str, str]], int]:
    """Marks of a generated fleet, the planted truth as (kind, name) suspects, and the analyses run."""
    rng = Random(f"fleet:{seed}")
    pool = [f"fleet-n{i:03d}" for i in range(FLEET_NODES)]
    lemon_node, bad_node = pool[3], pool[77]
    lemon_gpu, bad_gpu = "0000:3b:00", "0000:9b:00"
    switch_hosts = pool[8 * 20 : 8 * 20 + 8]  # leaf-20
    planted = {
        ("gpu", f"{lemon_node}/{lemon_gpu}"),
        ("gpu", f"{bad_node}/{bad_gpu}"),
        ("node", bad_node),
        ("switch", "leaf-20"),
    }
    reserved = {lemon_node, bad_node, *switch_hosts}
    free = [n for n in pool if n not in reserved]
    noise_modes = sorted(m for m in MODES if m not in NOISE_EXCLUDE)
    plan: list[tuple[str, str]] = [("lemon", rng.choice(LEMON_MODES)) for _ in range(4)]
    plan += [("gpu", rng.choice(GPU_MODES)) for _ in range(3)]
    plan += [("switch", rng.choice(FABRIC_MODES)) for _ in range(4)]
    plan += [("decoy", "s01-xid79-fallen-off-bus")]
    plan += [("noise", rng.choice(noise_modes)) for _ in range(max(0, workloads - len(plan)))]
    rng.shuffle(plan)
    marks: list[FleetMark] = []
    with tempfile.TemporaryDirectory(prefix="hypocenter-fleet-") as tmpdir:
        for i, (role, mode) in enumerate(plan):
            d, truth, files = _diagnose(mode, scenario_seed(seed, i), Path(tmpdir))
            nodes = list(d["attempt"]["nodes"])
            others = rng.sample(free, len(nodes))
            node_map = dict(zip(nodes, others, strict=True))
            culprits = [n for n in truth.get("nodes") or [] if n in node_map]
            gpu = port = None
            if role in ("lemon", "gpu") and culprits:
                node_map[culprits[0]] = lemon_node if role == "lemon" else bad_node
                gpu = lemon_gpu if role == "lemon" else bad_gpu
            elif role == "switch":
                hosts = rng.sample(switch_hosts, len(culprits))
                node_map.update(zip(culprits, hosts, strict=True))
                port = "mlx5_0/1"
            at = NOW - rng.uniform(0.5, 30) * DAY
            restarts = 8 if role == "decoy" else rng.choice((1, 1, 1, 2, 3))
            for attempt in range(restarts):
                placed = _place(d, truth, node_map, gpu, port)
                placed["id"] = f"dx-fleet-{i}-{attempt}"
                placed["attempt"]["workload_id"] = f"wl-{i:04d}"
                placed["attempt"]["attempt"] = attempt
                when = at + attempt * 900
                if placed.get("root_cause"):
                    placed["root_cause"]["first_seen"] = time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)
                    )
                marks.extend(marks_of(placed))
            if out is not None:
                write_bundle(out / "bundles" / f"{i:04d}-{role}-{mode}", files)
    if out is not None:
        (out / "truth.yaml").write_text(yaml.safe_dump({"planted": sorted(f"{k} {n}" for k, n in planted)}))
    return marks, planted, len(plan)


def _attempt_ranking(marks: Sequence[FleetMark], topology: Topology) -> list[tuple[str, str]]:
    """The reference: rank by attempts behind each suspect (what /metrics' recent_* counters show)."""
    ranked = suspects(marks, NOW, half_life_s=1e12, topology=topology)
    return [
        (s.kind, s.name)
        for s in sorted(ranked, key=lambda s: (-s.attempts, s.kind, s.name))
        if s.attempts >= 2 and not (s.kind in ("switch", "switch_port", "cable") and len(s.hosts) < 2)
    ]


def precision(ranked: Sequence[tuple[str, str]], truth: set[tuple[str, str]], k: int) -> float:
    top = list(ranked)[:k]
    return sum(1 for s in top if s in truth) / k if k else 0.0


def run(workloads: int, seed: int, k: int, out: Path | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    marks, planted, analysed = make_fleet(workloads, seed, out)
    topology = fleet_topology()
    t1 = time.perf_counter()
    ranked = findings(suspects(marks, NOW, topology=topology))
    t2 = time.perf_counter()
    ours = [(s.kind, s.name) for s in ranked]
    reference = _attempt_ranking(marks, topology)
    return {
        "workloads": analysed,
        "marks": len(marks),
        "planted": sorted(f"{a} {b}" for a, b in planted),
        "k": k,
        "precision_at_k": precision(ours, planted, k),
        "reference_precision_at_k": precision(reference, planted, k),
        "top": [f"{a} {b}" for a, b in ours[:k]],
        "reference_top": [f"{a} {b}" for a, b in reference[:k]],
        "kinds": dict(Counter(kind for kind, _ in ours)),
        "generate_and_analyse_s": round(t1 - t0, 2),
        "rank_s": round(t2 - t1, 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--workloads", type=int, default=60, help="workloads in the fleet (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--k", type=int, default=4, help="top-k findings scored (default: the 4 planted suspects)")
    p.add_argument("--out", type=Path, help="also write the fleet's bundles and truth here")
    p.add_argument("--json", type=Path, help="write the report as JSON")
    args = p.parse_args(argv)
    report = run(args.workloads, args.seed, args.k, args.out)
    print(
        f"fleet: {report['workloads']} workloads, {report['marks']} marks, planted: {', '.join(report['planted'])}"
    )
    print(
        f"  fleet memory   precision@{report['k']} = {report['precision_at_k']:.2f}   top: {', '.join(report['top'])}"
    )
    print(
        f"  attempt counts precision@{report['k']} = {report['reference_precision_at_k']:.2f}   top: "
        f"{', '.join(report['reference_top'])}"
    )
    print(f"  generate+analyse {report['generate_and_analyse_s']} s, rank {report['rank_s']} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
