"""Figures README states about the rule catalog match the catalog as it is."""

from __future__ import annotations

import re
from pathlib import Path

from hypocenter.engine import default_engine

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_rule_token_count_is_current() -> None:
    stated = re.findall(r"literal tokens \((\d+) today\)", README.read_text())
    assert stated, "README no longer states the token count: drop this test with it"
    assert {int(n) for n in stated} == {len(default_engine().ruleset.queries().tokens)}
