"""A user's rule patterns must be RE2 patterns: matching time linear in the line, whatever the pattern.

The syntactic check for nested quantifiers missed overlapping alternation behind a lookahead:
`(?=a)(a|aa)+$` passed `rules check` and backtracked exponentially (`analyze --rules` on a
45-character line was killed at 90 s). No syntactic check catches every such pattern, so a user's
pattern that RE2 cannot run is refused at load, naming file:line, with a hint.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hypocenter.engine.rules import load_ruleset
from hypocenter.errors import RuleError

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "(?=a)(a|aa)+$"


def _rule_file(tmp_path: Path, pattern: str) -> Path:
    rules = tmp_path / "mine.yaml"
    rules.write_text(
        "rules:\n"
        "  - id: my-rule\n"
        "    title: mine\n"
        "    status: experimental\n"
        "    extract:\n"
        '      tokens: ["aaaa"]\n'
        f"      pattern: '{pattern}'\n"
        "      event: my_event\n"
    )
    return rules


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_rules_check_refuses_a_lookahead_before_overlapping_alternation(tmp_path: Path) -> None:
    proc = _cli("rules", "check", "--rules", str(_rule_file(tmp_path, HOSTILE)))
    assert proc.returncode == 2, proc
    assert "mine.yaml:7" in proc.stderr and HOSTILE in proc.stderr and "RE2" in proc.stderr, proc.stderr
    assert "Hint:" in proc.stderr


def test_analyze_with_it_is_refused_at_load_not_run(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(REPO / "examples" / "nvlink-xid149", bundle)
    node = sorted(p for p in (bundle / "logs").iterdir() if p.name != "_job")[0]
    (node / "app.log").write_text("2026-11-02T10:30:00Z " + "a" * 45 + "b\n")
    proc = _cli("analyze", str(bundle), "--rules", str(_rule_file(tmp_path, HOSTILE)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "mine.yaml:7" in proc.stderr and "RE2" in proc.stderr


@pytest.mark.parametrize("pattern", [r"(?<=boom )\w+", r"(\w)\1", r"x(?!y)"])
def test_every_lookaround_and_backreference_is_refused_in_user_rules(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(RuleError, match="not one RE2 can run"):
        load_ruleset([_rule_file(tmp_path, pattern)])


def test_the_same_patterns_in_re2_form_load(tmp_path: Path) -> None:
    ruleset = load_ruleset([_rule_file(tmp_path, r"(a|aa)+$")])
    assert any(r.id == "my-rule" for r in ruleset.rules)
