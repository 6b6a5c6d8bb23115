"""Run the cases every rule ships with, and lint the catalog.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from hypocenter.collector.bundle import event_records
from hypocenter.collector.metrics import parse_metrics
from hypocenter.engine import Engine, _attempt_record
from hypocenter.engine.analyzers import AttemptView
from hypocenter.engine.classify import Recoveries, in_scope, when_matches
from hypocenter.engine.registry import ANALYZERS
from hypocenter.engine.rules import CaseSpec, Rule, Ruleset
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Event
from hypocenter.sources import AttemptInput, MetricSource, RecordSource, Source, TextSource

DEFAULT_WINDOW = {"start": "2026-11-02T00:00:00Z", "end": "2026-11-02T23:59:59Z"}


@dataclass
class CaseResult:
    rule: str
    case: str
    expect: str
    ok: bool
    detail: str
    where: str


def case_context(case: CaseSpec) -> AttemptContext:
    nodes = sorted({k.split("/", 1)[0] for k in case.logs if not k.startswith("_job/")})
    doc: dict[str, Any] = {
        "workload": {"id": "case", "attempt": 0, "scheduler": "slurm", "cluster": "cases"},
        "window": DEFAULT_WINDOW,
        "state": "FAILED",
        "nodes": nodes,
    }
    doc.update(case.attempt)
    return AttemptContext.model_validate(doc)


def case_sources(case: CaseSpec, ctx: AttemptContext) -> list[Source]:
    tctx = time_context(ctx)
    out: list[Source] = []
    for key in sorted(case.logs):
        node = key.split("/", 1)[0]
        out.append(TextSource(name=f"logs/{key}", text=case.logs[key], node=None if node == "_job" else node))
    for key in sorted(case.metrics):
        out.append(MetricSource(name=f"metrics/{key}", series=parse_metrics(case.metrics[key], tctx.end)))
    for key in sorted(case.events):
        out.append(
            RecordSource(name=f"events/{key}", records=event_records(case.events[key], f"events/{key}", tctx))
        )
    return out


def _fired(engine: Engine, rule: Rule, ctx: AttemptContext, sources: list[Source]) -> list[Event]:
    tctx = time_context(ctx)
    events = engine.extractor.extract([*sources, _attempt_record(ctx)], ctx, tctx).events
    if rule.attribute is None:
        return sorted((e for e in events if e.rule == rule.id), key=Event.sort_key)
    scoped = sorted((e for e in events if in_scope(e, ctx)), key=Event.sort_key)
    if rule.analyzer:
        view = AttemptView(context=ctx, events=scoped, rank_nodes=ctx.rank_nodes())
        return [e for f in ANALYZERS[rule.analyzer](view) for e in f.events]
    return [e for e, a in engine.verdict.classify(scoped, ctx.window.end) if a.rule.id == rule.id]


def run_case(engine: Engine, rule: Rule, case: CaseSpec) -> CaseResult:
    ctx = case_context(case)
    sources = case_sources(case, ctx)
    hits = _fired(engine, rule, ctx, sources)
    problems: list[str] = []
    if case.expect == "fire":
        if not hits:
            problems.append("did not fire" + why_not(engine, rule, ctx, sources))
        elif case.fields:
            got = hits[0].fields
            for k, v in case.fields.items():
                if str(got.get(k)) != str(v):
                    problems.append(f"field {k}: expected {v!r}, got {got.get(k)!r}")
    elif hits:
        problems.append(f"fired on {hits[0].ref}: {hits[0].text[:120]}")
    if case.verdict:
        d = engine.analyze(AttemptInput(ctx, sources))
        rc = d.root_cause
        got_v = {
            "outcome": d.outcome,
            "domain": rc.domain if rc else None,
            "subdomain": rc.subdomain if rc else None,
            "nodes": rc.nodes if rc else [],
            "candidates": [f"{c.domain}/{c.subdomain}" for c in d.candidates],
        }
        for k, v in case.verdict.items():
            if got_v.get(k) != v:
                problems.append(f"verdict {k}: expected {v!r}, got {got_v.get(k)!r}")
    ok = not problems
    return CaseResult(
        rule=rule.id,
        case=case.name,
        expect=case.expect,
        ok=ok,
        detail="; ".join(problems) or "ok",
        where=rule.where,
    )


def _scoped_events(engine: Engine, ctx: AttemptContext, sources: list[Source]) -> list[Event]:
    events = engine.extractor.extract([*sources, _attempt_record(ctx)], ctx, time_context(ctx)).events
    return sorted((e for e in events if in_scope(e, ctx)), key=Event.sort_key)


def _matches(rule: Rule, e: Event) -> bool:
    assert rule.attribute is not None
    w = rule.attribute.when
    return e.kind in w.kind and when_matches(w, re.compile(w.text) if w.text else None, e)


def why_not(engine: Engine, rule: Rule, ctx: AttemptContext, sources: list[Source]) -> str:
    """Why an attribution rule classified nothing in a case: no event of its kind, none its `when`
    matches, or another rule took the event first — by higher precedence, or by a tie (then the rule
    id first in alphabetical order wins)."""
    if rule.attribute is None or rule.analyzer:
        return ""
    spec = rule.attribute
    events = _scoped_events(engine, ctx, sources)
    mine = [e for e in events if e.kind in spec.when.kind]
    if not mine:
        return f": no {' or '.join(spec.when.kind)} event was extracted from the case"
    matched = [e for e in mine if _matches(rule, e)]
    if not matched:
        return f": {len(mine)} {mine[0].kind} event(s), none matches its when ({mine[0].ref}: {mine[0].text[:80]})"
    e = matched[0]
    winner = engine.verdict.classifier.classify(e, Recoveries(events, ctx.window.end))
    if winner is None:
        return f": {e.ref} matches, but the condition cleared (unless_recovered)"
    other = winner.spec.precedence
    if other > spec.precedence:
        return (
            f": {e.ref} went to rule {winner.rule.id} ({winner.rule.where}), precedence {other} > "
            f"{spec.precedence}"
        )
    return (
        f": {e.ref} went to rule {winner.rule.id} ({winner.rule.where}): both have precedence {other}, and a "
        f"tie goes to the rule id first in alphabetical order; give {rule.id} a precedence above {other}"
    )


def precedence_ties(engine: Engine) -> list[LintProblem]:
    """Attribution rules with the same precedence that can claim the same event: the one whose id sorts
    first silently wins it. A pair counts when an event from one's `expect: fire` cases matches the
    other's `when` too, or when a rule has no such case to tell (fields or sources that cannot both hold
    never count)."""
    rules = [r for r in engine.ruleset.rules if r.attribute is not None and not r.analyzer]
    seen: dict[str, list[Event] | None] = {}

    def fire_events(r: Rule) -> list[Event] | None:
        if r.id not in seen:
            cases = [c for c in r.cases if c.expect == "fire"]
            found: list[Event] = []
            for c in cases:
                ctx = case_context(c)
                found.extend(e for e in _scoped_events(engine, ctx, case_sources(c, ctx)) if _matches(r, e))
            seen[r.id] = found if cases else None
        return seen[r.id]

    out: list[LintProblem] = []
    for a, b in combinations(rules, 2):
        assert a.attribute is not None and b.attribute is not None
        wa, wb = a.attribute.when, b.attribute.when
        if (
            a.attribute.precedence != b.attribute.precedence
            or not set(wa.kind) & set(wb.kind)
            or _disjoint(wa, wb)
        ):
            continue
        ea, eb = fire_events(a), fire_events(b)
        shared = next((e for e in (ea or []) if _matches(b, e)), None) or next(
            (e for e in (eb or []) if _matches(a, e)), None
        )
        if shared is None and ea is not None and eb is not None:
            continue
        first, last = sorted((a, b), key=lambda r: r.id)
        seen_on = f" (e.g. {shared.text[:60]!r})" if shared is not None else ""
        out.append(
            LintProblem(
                last.id,
                last.where,
                f"ties rule {first.id} ({first.where}) at precedence "
                f"{a.attribute.precedence} on the same events{seen_on}: {first.id} wins them "
                "(alphabetical order); set a different precedence",
            )
        )
    return out


def _disjoint(a: Any, b: Any) -> bool:
    if a.source is not None and b.source is not None and not set(a.source) & set(b.source):
        return True
    for k in set(a.fields) & set(b.fields):
        va = {str(x) for x in (a.fields[k] if isinstance(a.fields[k], list) else [a.fields[k]])}
        vb = {str(x) for x in (b.fields[k] if isinstance(b.fields[k], list) else [b.fields[k]])}
        if not va & vb:
            return True
    return False


def run_cases(engine: Engine, only: str | None = None) -> list[CaseResult]:
    out: list[CaseResult] = []
    for rule in engine.ruleset.rules:
        if only and rule.id != only:
            continue
        for case in rule.cases:
            out.append(run_case(engine, rule, case))
    return out


@dataclass
class LintProblem:
    rule: str
    where: str
    message: str


def lint(ruleset: Ruleset) -> list[LintProblem]:
    """Catalog policy: stable rules have a positive and a negative case; causes have a runbook; every
    rule names its emitter; every attributed event kind is produced by some extractor or metric rule or analyzer."""
    problems: list[LintProblem] = []
    produced = {r.extract.event for r in ruleset.rules if r.extract} | {
        r.metric.event for r in ruleset.rules if r.metric
    }
    for rule in ruleset.rules:

        def say(msg: str, rule: Rule = rule) -> None:
            problems.append(LintProblem(rule.id, rule.where, msg))

        expects = {c.expect for c in rule.cases}
        if rule.status == "stable":
            if "fire" not in expects:
                say("stable rule has no positive case (expect: fire)")
            if "no_fire" not in expects:
                say("stable rule has no negative case (expect: no_fire)")
        elif not rule.cases:
            say(f"{rule.status} rule has no cases at all")
        if not rule.runbook and (
            rule.status == "stable" or (rule.attribute and rule.attribute.role == "root_cause")
        ):
            say("no runbook: say where an operator reads what to do")
        if not (rule.emitter or "").strip():
            say(
                "no emitter: name the program that writes what this rule reads (and the versions its source was read in)"
            )
        if rule.attribute and not rule.analyzer:
            for kind in rule.attribute.when.kind:
                if kind not in produced:
                    say(f"attribute.when.kind {kind!r} is produced by no extract or metric rule")
        names = [c.name for c in rule.cases]
        if len(names) != len(set(names)):
            say("two cases share a name")
    return problems
