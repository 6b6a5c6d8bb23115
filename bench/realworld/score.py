"""Score the engine on real logs posted in public issue threads: `python -m bench.realworld.score`.

Each case of bench/realworld/cases.yaml becomes a bundle (its posted lines, an attempt as the thread
describes it) and is analysed. A case is right when the diagnosis has the expected class (or, for a
case whose lines do not carry the cause, abstains and offers the expected candidate). False confidence
is an attributed or ambiguous verdict with a class the thread does not support. Figures are printed for
all cases and for the held-out ones (in no rule's cases) apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine

CASES = Path(__file__).resolve().parent / "cases.yaml"


@dataclass
class Scored:
    id: str
    held_out: bool
    expect: str
    got: str
    right: bool
    false_confident: bool
    abstained: bool
    points: bool = True  # an abstention names a candidate or the failing node


def _bundle(case: dict[str, Any], root: Path) -> Path:
    b = root / case["id"]
    for rel, text in case["logs"].items():
        path = b / "logs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    attempt = {
        "workload": {"id": case["id"], "attempt": 0, "scheduler": "none"},
        "window": {"start": "2000-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z"},
        "state": "FAILED",
        "exit_code": 1,
        "timezone": "UTC",
        **case.get("attempt", {}),
    }
    (b / "attempt.yaml").write_text(yaml.safe_dump(attempt), encoding="utf-8")
    return b


def score_case(case: dict[str, Any], root: Path) -> Scored:
    bundle = load_bundle(_bundle(case, root))
    d = default_engine().analyze(bundle)
    want = case["expect"]
    rc = d.root_cause
    got = f"{d.outcome}" + (f" {rc.domain}/{rc.subdomain}" if rc else "")
    cands = {f"{c.domain}/{c.subdomain}" for c in d.candidates}
    if want["outcome"] == "unattributed":
        right = d.outcome == "unattributed" and (not want.get("candidate") or want["candidate"] in cands)
        expect = "unattributed" + (f" + candidate {want['candidate']}" if want.get("candidate") else "")
        if cands:
            got += " candidates " + ",".join(sorted(cands))
    else:
        cls = f"{want['domain']}/{want['subdomain']}"
        right = d.outcome == "attributed" and rc is not None and f"{rc.domain}/{rc.subdomain}" == cls
        expect = f"attributed {cls}"
    confident = d.outcome in ("attributed", "ambiguous")
    return Scored(
        case["id"],
        bool(case.get("held_out")),
        expect,
        got,
        right,
        confident and not right and want["outcome"] != "ambiguous",
        d.outcome == "unattributed",
        d.outcome != "unattributed" or bool(d.candidates) or bool(d.first_failure and d.first_failure.node),
    )


def summary(rows: list[Scored]) -> dict[str, Any]:
    n = len(rows)
    return {
        "cases": n,
        "right": sum(r.right for r in rows),
        "accuracy": round(sum(r.right for r in rows) / n, 3) if n else None,
        "false_confident": round(sum(r.false_confident for r in rows) / n, 3) if n else None,
        "abstention": round(sum(r.abstained for r in rows) / n, 3) if n else None,
        "abstentions_pointing": f"{sum(r.abstained and r.points for r in rows)}/{sum(r.abstained for r in rows)}",
    }


def run(path: Path = CASES) -> list[Scored]:
    cases = yaml.safe_load(path.read_text(encoding="utf-8"))["cases"]
    with tempfile.TemporaryDirectory(prefix="hypocenter-realworld-") as tmp:
        return [score_case(c, Path(tmp)) for c in cases]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=CASES)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    rows = run(args.cases)
    figures = {"all": summary(rows), "held_out": summary([r for r in rows if r.held_out])}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for r in rows:
        mark = "ok  " if r.right else ("FALSE" if r.false_confident else "miss")
        print(
            f"{mark} {r.id:<40} expect {r.expect:<45} got {r.got}"
            + ("" if r.held_out else "  (in rule cases)")
        )
    for name, f in figures.items():
        print(
            f"{name:<9} {f['cases']} cases  accuracy {f['accuracy']}  false-confident {f['false_confident']}  "
            f"abstention {f['abstention']} (pointing at a candidate or node: {f['abstentions_pointing']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
