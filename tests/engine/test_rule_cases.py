"""The catalog's own cases, one test each, and the catalog lint (hypocenter rules check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypocenter.cli.cases import lint, run_case
from hypocenter.engine import default_engine
from hypocenter.engine.rules import load_ruleset

ENGINE = default_engine()
CASES = [(r, c) for r in ENGINE.ruleset.rules for c in r.cases]


@pytest.mark.parametrize(("rule", "case"), CASES, ids=[f"{r.id}::{c.name}" for r, c in CASES])
def test_rule_case(rule, case) -> None:  # type: ignore[no-untyped-def]
    result = run_case(ENGINE, rule, case)
    assert result.ok, f"{result.where} {result.rule} · {result.case}: {result.detail}"


def test_catalog_lints_clean() -> None:
    assert [f"{p.where}: {p.message}" for p in lint(ENGINE.ruleset)] == []


def test_every_catalog_rule_names_its_emitter_and_the_lint_requires_it(tmp_path: Path) -> None:
    assert [r.id for r in ENGINE.ruleset.rules if not (r.emitter or "").strip()] == []
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "rules:\n  - id: my-rule\n    title: mine\n    status: experimental\n    extract:\n"
        "      tokens: [\"frobnicator\"]\n      pattern: 'frobnicator (?P<state>down)'\n      event: frob\n"
        '    cases:\n      - {name: down, expect: fire, logs: {n1/kern.log: "frobnicator down\\n"}}\n'
    )
    problems = lint(load_ruleset([mine], builtin=False))
    assert [(p.rule, p.where) for p in problems if "no emitter" in p.message] == [("my-rule", "mine.yaml:2")]


def test_catalog_covers_the_taxonomy() -> None:
    from hypocenter.model import TAXONOMY

    seen = {
        (r.attribute.domain, r.attribute.subdomain)
        for r in ENGINE.ruleset.rules
        if r.attribute and r.attribute.role == "root_cause"
    }
    missing = [f"{d}/{s}" for d, subs in TAXONOMY.items() for s in subs if (d, s) not in seen]
    assert missing == []
