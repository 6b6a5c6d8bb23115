"""Figures README and docs/ state about the rule catalog match the catalog as it is."""

from __future__ import annotations

import re
from pathlib import Path

from hypocenter.engine import default_engine

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_rule_token_count_is_current() -> None:
    stated = [n for doc in DOCS for n in re.findall(r"literal tokens \((\d+) today\)", doc.read_text())]
    assert stated, "the docs no longer state the token count: drop this test with it"
    assert {int(n) for n in stated} == {len(default_engine().ruleset.queries().tokens)}
