"""Rule patterns match in linear time (engine/matching.py): an adversarial 1 MiB line costs about what
a benign one does, and a user rule that would backtrack is refused by name."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypocenter.engine import default_engine
from hypocenter.engine.matching import compile_pattern, pattern_problem

MIB = 1 << 20
ENGINE = default_engine()
# The five built-in rules whose patterns took quadratic time on Python's `re` (issue #12), each with a
# line that made it backtrack: the rule's token, then a 1 MiB run its leading repeat can swallow.
QUADRATIC = {
    "oom-killer": "out of memory: Killed" + "/" * MIB,
    "k8s-record": "1" * MIB + " k8s pod ",  # anchored: the run of word characters must come first
    "lustre-connection-lost": "Request sent has timed out" + "1" * MIB,
    "watchdog-progress": "last enqueued" + "a b" * (MIB // 3),
    "progress-line": "iteration" + "1" * MIB,
}


def _cost(pattern: str, text: str) -> float:
    rx = compile_pattern(pattern)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        rx.search(text)
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("rule_id", sorted(QUADRATIC))
def test_an_adversarial_megabyte_line_costs_about_a_benign_one(rule_id: str) -> None:
    rule = next(r for r in ENGINE.ruleset.rules if r.id == rule_id)
    assert rule.extract is not None
    benign = _cost(rule.extract.pattern, "the quick brown fox jumps over the lazy dog " * (MIB // 44))
    hostile = _cost(rule.extract.pattern, QUADRATIC[rule_id])
    # Python's `re` took 2-10 s on 8 KiB of these lines (quadratic: hours at 1 MiB); RE2 is linear.
    assert hostile <= 50 * max(benign, 1e-3), (rule_id, hostile, benign)


def test_ingest_extraction_of_an_adversarial_line_is_linear() -> None:
    """The whole extractor on one 1 MiB hostile line per quadratic rule, against a benign 1 MiB line."""
    from hypocenter.lineformat import TimeContext
    from hypocenter.model import AttemptContext
    from hypocenter.sources import TextSource

    ctx = AttemptContext.model_validate(
        {"workload": {"id": "w"}, "window": {"start": "2026-11-02T10:00:00Z", "end": "2026-11-02T11:00:00Z"}}
    )
    tctx = TimeContext(tz=__import__("datetime").timezone.utc, start=ctx.window.start, end=ctx.window.end)

    def run(text: str) -> float:
        t = time.perf_counter()
        ENGINE.extractor.extract([TextSource(name="n1/app.log", text=text, node="n1")], ctx, tctx)
        return time.perf_counter() - t

    benign = run(("2026-11-02T10:00:00Z " + "x" * (MIB - 40) + " iteration\n") * len(QUADRATIC))
    hostile = run("".join(f"2026-11-02T10:00:00Z {line}\n" for line in QUADRATIC.values()))
    assert hostile <= 50 * max(benign, 1e-3), (hostile, benign)


def test_nested_repeats_are_refused_only_where_backtracking_runs() -> None:
    assert pattern_problem(r"(a+)+b") is None  # RE2 runs it in linear time
    problem = pattern_problem(r"(?=x)(a+)+b", builtin=True)
    assert problem is not None and "nested quantifier" in problem
    # lookaround without nesting: bounded, in the built-in catalog only (tests/test_user_rules_re2.py)
    assert pattern_problem(r"(?i)maint|set_by=(?!slurm)\S+", builtin=True) is None
    assert pattern_problem(r"(") is not None


def test_rules_check_names_the_offending_pattern_of_a_user_rule(tmp_path: Path) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text(
        "rules:\n"
        "  - id: my-rule\n"
        "    title: mine\n"
        "    status: experimental\n"
        "    extract:\n"
        '      tokens: ["boom"]\n'
        "      pattern: '(?<=boom )(\\w+\\s?)*$'\n"
        "      event: my_event\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "rules", "check", "--rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert "mine.yaml:7" in proc.stderr and "not one RE2 can run" in proc.stderr, proc.stderr
    assert "(\\w+\\s?)*" in proc.stderr, proc.stderr
