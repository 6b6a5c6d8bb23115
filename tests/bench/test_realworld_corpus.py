"""The engine on real logs posted in public issue threads (bench/realworld/cases.yaml)."""

from __future__ import annotations

from bench.realworld.score import run, summary


def test_real_posted_logs_no_false_confidence_and_right_answers() -> None:
    rows = run()
    assert len(rows) >= 10 and any(r.held_out for r in rows) and any(not r.held_out for r in rows)
    wrong = [f"{r.id}: expected {r.expect}, got {r.got}" for r in rows if r.false_confident]
    assert not wrong, wrong  # never a confident wrong cause
    held = summary([r for r in rows if r.held_out])
    assert held["accuracy"] is not None and held["accuracy"] >= 0.85, [
        f"{r.id}: {r.got}" for r in rows if not r.right
    ]
