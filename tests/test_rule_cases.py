"""The catalog's own cases, one test each, and the catalog lint (hypocenter rules check)."""

from __future__ import annotations

import pytest

from hypocenter.cli.cases import lint, run_case
from hypocenter.engine import default_engine

ENGINE = default_engine()
CASES = [(r, c) for r in ENGINE.ruleset.rules for c in r.cases]


@pytest.mark.parametrize(("rule", "case"), CASES, ids=[f"{r.id}::{c.name}" for r, c in CASES])
def test_rule_case(rule, case) -> None:  # type: ignore[no-untyped-def]
    result = run_case(ENGINE, rule, case)
    assert result.ok, f"{result.where} {result.rule} · {result.case}: {result.detail}"


def test_catalog_lints_clean() -> None:
    assert [f"{p.where}: {p.message}" for p in lint(ENGINE.ruleset)] == []


def test_catalog_covers_the_taxonomy() -> None:
    from hypocenter.model import TAXONOMY

    seen = {(r.attribute.domain, r.attribute.subdomain) for r in ENGINE.ruleset.rules
            if r.attribute and r.attribute.role == "root_cause"}
    missing = [f"{d}/{s}" for d, subs in TAXONOMY.items() for s in subs if (d, s) not in seen]
    assert missing == []
