"""`hypocenter rules list | check | test [--rule ID]`: the rule catalog, its linter and its cases (cli/cases.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hypocenter.cli.console import EXIT_INPUT, EXIT_OK, EXIT_PROBLEMS, rule_options


def _cmd_rules(args: argparse.Namespace) -> int:
    from hypocenter.cli.cases import lint, precedence_ties, run_cases
    from hypocenter.engine import default_engine

    engine = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules)
    rs = engine.ruleset
    if args.rules_cmd == "list":
        for r in rs.rules:
            role = ""
            if r.attribute:
                role = r.attribute.role + (
                    f" {r.attribute.domain}/{r.attribute.subdomain}" if r.attribute.domain else ""
                )
            kind = (
                "analyzer"
                if r.analyzer
                else ("extract" if r.extract else "metric" if r.metric else "attribute")
            )
            print(f"{r.id:<34} {r.status:<12} {kind:<9} {role:<34} {r.where}")
        print(f"{len(rs)} rules · {rs.fingerprint}")
        return EXIT_OK
    if args.rules_cmd == "check":
        problems = lint(rs)
        for p in problems:
            print(f"{p.where}: {p.rule}: {p.message}")
        ties = precedence_ties(engine)  # a warning: the catalog works, but one rule never gets those events
        for p in ties:
            print(f"{p.where}: {p.rule}: warning: {p.message}")
        cases = sum(len(r.cases) for r in rs.rules)
        warned = f", {len(ties)} warning(s)" if ties else ""
        print(f"{len(rs)} rules, {cases} cases, {len(problems)} problem(s){warned}")
        return EXIT_PROBLEMS if problems else EXIT_OK
    results = run_cases(engine, only=args.rule)
    if args.rule and not results:
        print(f"hypocenter: no cases for rule {args.rule!r}", file=sys.stderr)
        return EXIT_INPUT
    failed = [r for r in results if not r.ok]
    for res in results:
        if not res.ok or args.verbose:
            mark = "ok  " if res.ok else "FAIL"
            print(f"{mark} {res.rule} · {res.case} [{res.expect}] · {res.detail} ({res.where})")
    misses = sum(1 for r in results if r.expect == "known_miss")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed ({misses} known misses)")
    return EXIT_PROBLEMS if failed else EXIT_OK


def add_parser(sub: Any) -> None:
    r = sub.add_parser("rules", help="list, lint or test the rule catalog")
    rsub = r.add_subparsers(dest="rules_cmd", required=True)
    for name, text in (
        ("list", "list the rules"),
        ("check", "lint the catalog"),
        ("test", "run every rule's cases"),
    ):
        sp = rsub.add_parser(name, help=text)
        rule_options(sp)
        if name == "test":
            sp.add_argument("--rule", help="run only this rule's cases")
            sp.add_argument("-v", "--verbose", action="store_true", help="show passing cases too")
        sp.set_defaults(func=_cmd_rules)
    from hypocenter.cli.backtest import add_backtest

    add_backtest(rsub)
