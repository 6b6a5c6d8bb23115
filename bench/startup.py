"""`hypocenter analyze`'s fixed start-up, step by step, for two source trees side by side (issue #13).

    python -m bench.startup --before PATH [--after PATH] [--runs 10] [--point]

Each tree is measured as an installed copy runs: PYTHONPATH at the tree, its own bytecode cache
(PYTHONPYCACHEPREFIX) and rule-catalog cache (XDG_CACHE_HOME), both filled by a first run. The step
table gives the least CPU of `--runs` processes for each step of what `analyze` imports and does on
the smallest example (examples/nvlink-xid149), the two trees' runs alternating. `--point` adds
bench/perf's smallest analyze point (8 nodes, 50 MB): each tree's `analyze` and `rg -c -F -f <rule
tokens>` alternating, the fastest of five of each, and the ratio to rg. Compare figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.perf import REPO, run_measured, write_bundle

STEPS = """
import sys, time
marks = [("interpreter + site", time.process_time())]
def mark(name):
    marks.append((name, time.process_time()))
import re, json, datetime, gzip, mmap; mark("stdlib (re json datetime gzip mmap)")
import hyperscan; mark("hyperscan")
import yaml; mark("PyYAML")
import hypocenter.model; mark("hypocenter.model")
import hypocenter.engine; mark("hypocenter.engine (package: rules, extract, verdict …)")
import hypocenter.collector.bundle; mark("hypocenter.collector.bundle")
import hypocenter.cli.analyze; mark("hypocenter.cli.analyze")
from hypocenter.engine import default_engine
engine = default_engine(); mark("default_engine() (cached catalog)")
from hypocenter.collector.bundle import load_bundle
engine.analyze(load_bundle(__import__("pathlib").Path(sys.argv[1]))).to_json(); mark("analyze nvlink-xid149 + to_json")
pyd = sum(m.split(".")[0] in ("pydantic", "pydantic_core") for m in sys.modules)
print(json.dumps({"steps": marks, "pydantic_modules": pyd, "modules": len(sys.modules)}))
"""


def _env(tree: Path, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(tree)
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pyc")
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    return env


def _steps(tree: Path, env: dict[str, str], example: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", STEPS, str(example)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=True,
    )
    doc: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return doc


def step_table(trees: dict[str, Path], scratch: Path, runs: int) -> None:
    example = REPO / "examples" / "nvlink-xid149"
    envs = {name: _env(tree, scratch / name) for name, tree in trees.items()}
    for name in trees:  # fill the bytecode and catalog caches
        _steps(trees[name], envs[name], example)
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    extra: dict[str, dict[str, object]] = {}
    for _ in range(runs):
        for name, tree in trees.items():
            doc = _steps(tree, envs[name], example)
            prev = 0.0
            for step, t in doc["steps"]:  # type: ignore[attr-defined]
                cpu = (t - prev) * 1000
                best[name][step] = min(best[name].get(step, cpu), cpu)
                prev = t
            best[name]["total"] = min(best[name].get("total", prev * 1000), prev * 1000)
            extra[name] = {k: v for k, v in doc.items() if k != "steps"}
    names = list(trees)
    print(f"{'least CPU of ' + str(runs) + ' runs, ms':58s}" + "".join(f"{n:>10}" for n in names))
    for step in best[names[0]]:
        print(f"  {step:56s}" + "".join(f"{best[n].get(step, float('nan')):10.1f}" for n in names))
    for key in ("pydantic_modules", "modules"):
        print(f"  {key:56s}" + "".join(f"{extra[n][key]!s:>10}" for n in names))


def point(trees: dict[str, Path], scratch: Path, tries: int = 5) -> None:
    rg = shutil.which("rg")
    if rg is None:
        print("rg not installed: no bench point")
        return
    root = scratch / "bundle-8-50"
    nbytes, nlines = write_bundle(root, 8, 50.0)
    env0 = _env(trees[next(iter(trees))], scratch / next(iter(trees)))
    toks = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hypocenter.engine import default_engine; "
            "print('\\n'.join(default_engine().extractor.tokens))",
        ],
        capture_output=True,
        text=True,
        env=env0,
        cwd=tempfile.gettempdir(),
        check=True,
    ).stdout
    tokens = scratch / "tokens.txt"
    tokens.write_text(toks, encoding="utf-8")
    rg_cmd = [rg, "-c", "-F", "-f", str(tokens), str(root / "logs")]
    fastest: dict[str, float] = {}
    outputs: dict[str, bytes] = {}
    for _ in range(tries):
        for name, tree in trees.items():
            env = _env(tree, scratch / name)
            # -P: no working directory on sys.path (run_measured runs in this repository), as the
            # installed `hypocenter` script runs: the tree on PYTHONPATH is the one measured.
            run = run_measured(
                [sys.executable, "-P", "-m", "hypocenter.cli", "analyze", str(root), "--format", "json"], env
            )
            assert run.returncode == 0, run
            fastest[name] = min(fastest.get(name, run.seconds), run.seconds)
            outputs[name] = run.stdout
            ref = run_measured(rg_cmd)
            fastest["rg"] = min(fastest.get("rg", ref.seconds), ref.seconds)
    print(f"analyze 8 nodes, {nbytes / 1e6:.0f} MB, {nlines / 1e6:.2f} M lines; fastest of {tries} wall, s:")
    print(f"  rg -c -F -f <{len(toks.split())} rule tokens>  {fastest['rg']:.3f}")
    for name in trees:
        print(
            f"  analyze ({name:6s})                {fastest[name]:.3f}   {fastest[name] / fastest['rg']:.1f}x rg"
        )
    print("  same diagnosis from both trees:", len(set(outputs.values())) == 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--before", type=Path, required=True, help="the tree to compare against (e.g. a main checkout)"
    )
    ap.add_argument("--after", type=Path, default=REPO, help="the tree measured (default: this one)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--point", action="store_true", help="also the 8-node, 50 MB analyze point against rg")
    args = ap.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory(prefix="hypocenter-startup-") as name:
        scratch = Path(name)
        step_table(trees, scratch, args.runs)
        if args.point:
            point(trees, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
