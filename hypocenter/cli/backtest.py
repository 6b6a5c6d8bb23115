"""`hypocenter rules backtest`: what a rule change would flip, over stored attempts or a folder of bundles.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypocenter.engine import Engine, default_engine
from hypocenter.errors import InputError
from hypocenter.model import AttemptContext, Coverage, Diagnosis
from hypocenter.sources import AttemptInput, Source

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """`30d`, `12h`, `2w`, `90m`, `45s` -> seconds."""
    m = _SINCE.match(text.strip())
    if m is None:
        raise InputError(f"--since {text!r}: expected a number and a unit, e.g. 30d, 12h, 2w")
    return float(m[1]) * _UNIT[m[2]]


def verdict(d: Diagnosis) -> str:
    """The part of a diagnosis a rule change can flip, as one line."""
    rc = d.root_cause
    if rc is None:
        return d.outcome
    return f"{d.outcome} {rc.domain}/{rc.subdomain} ({rc.rule}) on {','.join(rc.nodes) or '-'}"


@dataclass(slots=True)
class Attempt:
    label: str  # workload/attempt, or the bundle's directory
    context: AttemptContext
    sources: list[Source]
    coverage: list[Coverage]


def stored_attempts(url: str, since_s: float, lookback_s: float, slack_s: float) -> Iterator[Attempt]:
    """The attempts of a store with a final diagnosis whose window ends after `since_s`, input rebuilt."""
    from hypocenter.cli.fleet import open_existing_store
    from hypocenter.server.attempts import assemble
    from hypocenter.store.base import DiagnosisFilter

    store = open_existing_store(url)
    try:
        rows = store.list_diagnoses(DiagnosisFilter(since_ns=int(since_s * 1e9), limit=1000))
        for d in sorted(rows, key=lambda r: (r.workload, r.attempt)):
            if d.provisional:
                continue
            row = store.attempt(d.workload, d.attempt)
            if row is None:
                continue
            at = datetime.fromtimestamp(row.analyzed_at or d.created, timezone.utc)
            inp = assemble(store, row, lookback_s=lookback_s, slack_s=slack_s, now=at)
            yield Attempt(f"{d.workload}/{d.attempt}", inp.context, list(inp.sources), list(inp.coverage))
    finally:
        store.close()


def bundle_attempts(root: Path) -> Iterator[Attempt]:
    from hypocenter.collector.bundle import load_bundle

    if not root.is_dir():
        raise InputError(f"--bundles {root}: not a directory")
    for yaml_path in sorted(root.rglob("attempt.yaml")):
        try:
            b = load_bundle(yaml_path.parent)
        except InputError as exc:  # one bad bundle is reported and skipped, the rest still count
            print(f"hypocenter: skipping {yaml_path.parent}: {exc}")
            continue
        yield Attempt(
            str(yaml_path.parent.relative_to(root)) or ".", b.context, list(b.sources), list(b.coverage)
        )


def backtest(
    attempts: Iterator[Attempt], baseline: Engine, candidate: Engine, examples: int = 3
) -> dict[str, Any]:
    total = 0
    flips: dict[tuple[str, str], list[str]] = {}
    by_domain: Counter[str] = Counter()
    for a in attempts:
        total += 1
        before = baseline.analyze(AttemptInput(a.context, a.sources, a.coverage))
        after = candidate.analyze(AttemptInput(a.context, a.sources, a.coverage))
        b, c = verdict(before), verdict(after)
        if b != c:
            flips.setdefault((b, c), []).append(a.label)
            domain = before.root_cause.domain if before.root_cause else before.outcome
            by_domain[domain] += 1
    changes = [
        {"from": b, "to": c, "count": len(labels), "examples": sorted(labels)[:examples]}
        for (b, c), labels in sorted(flips.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    return {
        "schema": "hypocenter.backtest/v1",
        "attempts": total,
        "flipped": sum(len(v) for v in flips.values()),
        "baseline_ruleset": baseline.ruleset.fingerprint,
        "candidate_ruleset": candidate.ruleset.fingerprint,
        "by_domain": dict(sorted(by_domain.items())),
        "changes": changes,
    }


def render(report: dict[str, Any]) -> str:
    out = [
        f"backtest · {report['attempts']} attempt(s) · {report['flipped']} verdict(s) flip · "
        f"{report['baseline_ruleset'][:19]} -> {report['candidate_ruleset'][:19]}"
    ]
    if report["by_domain"]:
        out.append("  by baseline domain: " + ", ".join(f"{k} {v}" for k, v in report["by_domain"].items()))
    for ch in report["changes"]:
        out.append(f"  {ch['count']:>4} x  {ch['from']}")
        out.append(f"         -> {ch['to']}")
        out.append(f"         e.g. {', '.join(ch['examples'])}")
    if not report["changes"]:
        out.append("  no verdict changes")
    return "\n".join(out) + "\n"


def _cmd_backtest(args: argparse.Namespace) -> int:
    if bool(args.store) == bool(args.bundles):
        args.parser.error("give exactly one of --store or --bundles")
    if not args.rules and not args.no_builtin_rules:
        args.parser.error(
            "--rules: give the changed rules to backtest (the baseline is the built-in catalog)"
        )
    baseline = default_engine()
    candidate = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules)
    if args.store:
        attempts = stored_attempts(
            args.store, time.time() - parse_since(args.since), args.node_lookback_s, args.node_slack_s
        )
    else:
        attempts = bundle_attempts(Path(args.bundles))
    report = backtest(attempts, baseline, candidate, args.examples)
    print(
        json.dumps(report, indent=2, sort_keys=True) if args.format == "json" else render(report),
        end="" if args.format != "json" else "\n",
    )
    return 0


def add_backtest(rsub: Any) -> None:
    b = rsub.add_parser(
        "backtest",
        help="re-run a changed catalog over stored attempts or bundles: what flips",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    b.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="the changed rule file or directory (repeatable), added to the built-in catalog",
    )
    b.add_argument("--no-builtin-rules", action="store_true", help="the candidate is only the --rules given")
    b.add_argument("--store", metavar="URL", help="a store file (SQLite) or postgresql:// URL")
    b.add_argument("--bundles", metavar="DIR", help="a folder of attempt bundles")
    b.add_argument(
        "--since", default="30d", help="stored attempts whose window ended within this (default 30d)"
    )
    b.add_argument("--node-lookback-s", type=float, default=3600.0, help="as the server's node_lookback_s")
    b.add_argument("--node-slack-s", type=float, default=600.0, help="as the server's node_slack_s")
    b.add_argument("--examples", type=int, default=3, help="example attempts per change (default 3)")
    b.add_argument("--format", choices=("text", "json"), default="text")
    b.set_defaults(func=_cmd_backtest, parser=b)


__all__ = ["add_backtest", "backtest", "parse_since", "render", "verdict"]
