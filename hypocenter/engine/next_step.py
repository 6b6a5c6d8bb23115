"""What a person should do next with a diagnosis: the action, and for an unattributed one, where to look.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from hypocenter.model import Coverage, NextStep, RootCause, Symptom


def next_step(
    outcome: str,
    root: RootCause | None,
    candidates: list[RootCause],
    symptoms: list[Symptom],
    coverage: list[Coverage],
) -> NextStep:
    if outcome == "not_failed":
        return NextStep(action="NONE", look_at=[])
    if root is not None:
        told = [
            f"{c.domain}/{c.subdomain} on {', '.join(c.nodes) or 'the job'} ({c.rule})" for c in candidates
        ]
        return NextStep(action=root.action, look_at=told if outcome == "ambiguous" else [])
    look: list[str] = []
    dated = sorted((s for s in symptoms if s.first_seen), key=lambda s: (s.first_seen or "", s.kind))
    first = dated[0] if dated else None
    if first is not None:
        where = ", ".join(first.nodes) or "the job's own output"
        look.append(
            f"the first failure signal: {first.kind} on {where} at {first.first_seen}: {first.example.strip()[:120]}"
        )
    gaps = [c for c in coverage if c.status in ("missing", "failed", "partial")]
    for c in gaps[:5]:
        look.append(
            f"{c.source} ({c.status}{': ' + c.reason if c.reason else ''}): collect it and analyse again"
        )
    if len(gaps) > 5:
        look.append(f"{len(gaps) - 5} more sources missing or unreadable (see coverage)")
    nodes = ", ".join(first.nodes) if first is not None and first.nodes else "the attempt's nodes"
    when = f" around {first.first_seen}" if first is not None else ""
    look.append(f"host kernel logs (dmesg, journalctl -k), DCGM and fabric counters of {nodes}{when}")
    return NextStep(action="INVESTIGATE", look_at=look)
