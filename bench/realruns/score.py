"""Score the engine on the recorded real torchrun failures: `python -m bench.realruns.score [DIR]`.

Each mode recorded by bench/realruns/record.py (tests/fixtures/torchrun/<mode>/) is analysed as a
bundle of one node (`localhost`, ranks 0-3) or, for the two-agent wrong-port mode, of two nodes
(node0 ranks 0-1, node1 ranks 2-3). A mode is right when the diagnosis has the expected outcome and
class and names the node the failure began on (first_failure or the culprit); a confident verdict with
another class is false confidence. The expectations below are what each mode's program did.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.model import Diagnosis

FIXTURES = Path(__file__).resolve().parent.parent.parent / "tests" / "fixtures" / "torchrun"

# mode → (outcome, class or None, candidate class a right abstention offers or None)
EXPECT: dict[str, tuple[str, str | None, str | None]] = {
    "sigkill": ("unattributed", None, "resource/host_oom"),
    "sigkill-tee": ("unattributed", None, "resource/host_oom"),
    "sigsegv": ("unattributed", None, None),
    "sigabrt": ("unattributed", None, None),
    "exception": ("attributed", "software/user_code", None),
    "collective-timeout": ("unattributed", None, "software/hang"),
    "dataloader-killed": ("unattributed", None, "resource/host_oom"),
    "rank0-checkpoint": ("unattributed", None, "software/configuration"),
    "rank0-checkpoint-tee": ("unattributed", None, "software/configuration"),
    "cpu-alloc": ("attributed", "resource/host_oom", None),
    "memory-error": ("attributed", "resource/host_oom", None),
    "desync": ("attributed", "software/user_code", None),
    "early-exit": ("attributed", "software/user_code", None),
    "wrong-port": ("attributed", "software/configuration", None),
}


@dataclass
class Scored:
    mode: str
    right: bool
    false_confident: bool
    points_at_node: bool
    got: str


def bundle(mode_dir: Path, root: Path) -> Path:
    """The recording as an attempt bundle under `root`."""
    logs = sorted(mode_dir.glob("*.log"))
    two_nodes = [p for p in logs if p.stem.startswith("node")]
    if two_nodes:
        nodes = [p.stem for p in two_nodes]
        ranks = {n: f"{2 * i}-{2 * i + 1}" for i, n in enumerate(nodes)}
        for p in two_nodes:
            (root / "logs" / p.stem).mkdir(parents=True)
            shutil.copy(p, root / "logs" / p.stem / "out.log")
    else:
        nodes, ranks = ["localhost"], {"localhost": "0-3"}
        (root / "logs" / "_job").mkdir(parents=True)
        shutil.copy(mode_dir / "out.log", root / "logs" / "_job" / "out.log")
    attempt = {
        "workload": {"id": mode_dir.name, "attempt": 0, "scheduler": "none"},
        "window": {"start": "2026-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
        "state": "FAILED",
        "exit_code": 1,
        "nodes": nodes,
        "ranks": ranks,
        "timezone": "UTC",
    }
    (root / "attempt.yaml").write_text(yaml.safe_dump(attempt), encoding="utf-8")
    return root


def judge(mode: str, d: Diagnosis) -> Scored:
    outcome, cls, candidate = EXPECT[mode]
    rc = d.root_cause
    got_cls = f"{rc.domain}/{rc.subdomain}" if rc else None
    cands = [f"{c.domain}/{c.subdomain}" for c in d.candidates]
    right = d.outcome == outcome and got_cls == cls and (candidate is None or candidate in cands)
    confident = d.outcome in ("attributed", "ambiguous")
    node = (rc.nodes if rc and rc.nodes else []) or ([d.first_failure.node] if d.first_failure else [])
    got = d.outcome + (f" {got_cls}" if got_cls else "") + (f" candidates {','.join(cands)}" if cands else "")
    return Scored(mode, right, confident and not right, bool([n for n in node if n]), got)


def run(fixtures: Path = FIXTURES) -> list[Scored]:
    engine = default_engine()
    out = []
    for mode_dir in sorted(p for p in fixtures.iterdir() if (p / "run.yaml").is_file()):
        if mode_dir.name not in EXPECT:
            continue
        with tempfile.TemporaryDirectory(prefix="hypocenter-realruns-") as tmp:
            d = engine.analyze(load_bundle(bundle(mode_dir, Path(tmp))))
        out.append(judge(mode_dir.name, d))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", nargs="?", type=Path, default=FIXTURES)
    args = ap.parse_args(argv)
    rows = run(args.fixtures)
    for r in rows:
        mark = "ok  " if r.right else ("FALSE" if r.false_confident else "miss")
        print(f"{mark} {r.mode:<22} got {r.got}" + ("" if r.points_at_node else "  (names no node)"))
    n = len(rows)
    print(
        f"{n} runs  exact {sum(r.right for r in rows)}/{n}  false-confident {sum(r.false_confident for r in rows)}  "
        f"naming the failing node {sum(r.points_at_node for r in rows)}/{n}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
