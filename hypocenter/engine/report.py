"""Report, the verdict's last step: from the causes still standing to a `Diagnosis`.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypocenter import __version__
from hypocenter.engine.abstain import FirstFailureFinder
from hypocenter.engine.candidates import SKEW, Candidate, Causes
from hypocenter.engine.classify import Classification, Role
from hypocenter.engine.cost import CostSettings, attempt_cost
from hypocenter.engine.leads import leads
from hypocenter.engine.next_step import next_step
from hypocenter.engine.suspects import Suspect, as_evidence, configuration_suspects
from hypocenter.model import (
    AttemptContext,
    AttemptRef,
    Cost,
    Coverage,
    Diagnosis,
    EngineInfo,
    Event,
    Evidence,
    FirstFailure,
    Quality,
    RootCause,
    Symptom,
    isoformat,
)

AMBIGUITY_WINDOW = timedelta(seconds=60)  # different causes starting within this: ambiguous
CONTEXT_BEFORE = timedelta(minutes=15)  # precursors shown with a root cause
MAX_EVIDENCE_PER_CAUSE = 8
MAX_SYMPTOM_EXAMPLES = 2
STRONG = 50  # precedence at or above which one signal is enough
COMPLETED_STATES = ("COMPLETED", "SUCCEEDED", "SUCCESS", "FINISHED")


@dataclass
class Decision:
    """The outcome of an attempt and the causes it names (module docstring)."""

    state: str | None
    outcome: str
    chosen: list[Candidate]  # the root cause, or the causes an ambiguous outcome lists
    others: list[Candidate]  # later independent causes
    root: RootCause | None
    candidates: list[RootCause]
    first_failure: FirstFailure | None
    reasons: list[str]  # the first quality reasons; `Report` adds the rest
    suspects: list[Suspect]  # causes an unattributed outcome offers from lines that are no error

    @classmethod
    def of(cls, classified: Classification, causes: Causes) -> Decision:
        ctx, events, primary = classified.context, classified.events, causes.primary
        state = ctx.state or _scheduler_state(events)
        completed = state in COMPLETED_STATES or (state is None and ctx.exit_code == 0)
        reasons: list[str] = []
        chosen: list[Candidate] = []
        others: list[Candidate] = []
        if completed:
            outcome = "not_failed"
            if primary:
                reasons.append(
                    f"the attempt completed; {len(primary)} potential fault signal(s) recorded as evidence"
                )
        elif not primary:
            outcome = "unattributed"
        else:
            first = primary[0]
            chosen = [c for c in primary if _starts_together(first, c)]
            others = [c for c in primary if c not in chosen]
            outcome = "attributed" if len(chosen) == 1 else "ambiguous"
        root = None
        cands: list[RootCause] = []
        if outcome == "attributed":
            root = _root(chosen[0])
            cands = [_root(c) for c in others]
        elif outcome == "ambiguous":
            cands = [_root(c) for c in chosen]
            root = _ambiguous_root(chosen, cands)
            cands += [_root(c) for c in others]
        first_failure = None
        suspects: list[Suspect] = []
        if outcome == "unattributed":
            # Abstain, but localise: the first process to fail, and the causes weighed with why each fell short.
            finder = FirstFailureFinder(events, ctx.rank_nodes())
            first_failure, hinted = finder.find()
            suspects = finder.suspects + configuration_suspects(events, ctx.nodes)
            cands = (
                hinted
                + [s.cause for s in suspects[len(finder.suspects) :]]
                + [_weighed(c, events) for c in causes.survived]
            )
            # Nothing suggested a cause: point at the cause-like lines there are.
            pointed = [] if cands else leads(events)
            if pointed:
                cands = [s.cause for s in pointed]
                reasons.append(
                    f"{len(pointed)} lead(s) from lines no rule attributes alone: offered as candidates, "
                    "each with why it falls short"
                )
            if first_failure is not None:
                reasons.append(f"first failure: {first_failure.next_step}")
            if suspects:
                reasons.append(
                    f"{len(suspects)} candidate(s) rest on configuration lines alone (no error line names "
                    "them): offered, not attributed"
                )
            suspects += pointed
        return cls(
            state=state,
            outcome=outcome,
            chosen=chosen,
            others=others,
            root=root,
            candidates=cands,
            first_failure=first_failure,
            reasons=reasons,
            suspects=suspects,
        )


class Report:
    """Writes a Decision out as the Diagnosis of contract 3."""

    def __init__(self, ruleset_fingerprint: str, cost: CostSettings | None = None) -> None:
        self.ruleset_fingerprint = ruleset_fingerprint
        self.cost = cost or CostSettings()

    def diagnosis(
        self,
        classified: Classification,
        causes: Causes,
        decision: Decision,
        coverage: list[Coverage],
        gpus: dict[str, int] | None = None,
    ) -> Diagnosis:
        ctx, roles = classified.context, classified.roles
        chosen, outcome = decision.chosen, decision.outcome
        quality = _quality(outcome, chosen, decision.others, coverage, ctx, decision.reasons)
        first_ref = decision.first_failure.ref if decision.first_failure else None
        rule_of = {id(e): a.rule.id for e, a in roles}
        cause_events = {id(e) for c in chosen for e in c.events if rule_of.get(id(e)) == c.rule.id}
        symptoms = _symptoms(roles, cause_events, first_ref)
        evidence = as_evidence(
            decision.suspects, EvidenceTrail().of(chosen if chosen else causes.primary, roles, first_ref)
        )
        affected = sorted(
            {e.node for e, a in roles if e.node and a.spec.role in ("root_cause", "symptom")}
            | {n for c in chosen for n in c.nodes}
        )
        return Diagnosis(
            id=diagnosis_id(
                ctx.workload.cluster, ctx.workload.id, ctx.workload.attempt, self.ruleset_fingerprint
            ),
            attempt=AttemptRef(
                workload_id=ctx.workload.id,
                attempt=ctx.workload.attempt,
                scheduler=ctx.workload.scheduler,
                cluster=ctx.workload.cluster,
                window={"start": isoformat(ctx.window.start), "end": isoformat(ctx.window.end)},
                nodes=list(ctx.nodes),
            ),
            terminal_state=decision.state,
            outcome=outcome,  # type: ignore[arg-type]
            root_cause=decision.root,
            candidates=decision.candidates,
            affected_nodes=affected,
            symptoms=symptoms,
            evidence=evidence,
            quality=quality,
            next_step=next_step(outcome, decision.root, decision.candidates, symptoms, coverage),
            coverage=coverage,
            engine=EngineInfo(version=__version__, ruleset=self.ruleset_fingerprint),
            first_failure=decision.first_failure,
            cost=self._cost(classified, decision, gpus or {}),
        )

    def _cost(self, classified: Classification, decision: Decision, gpus: dict[str, int]) -> Cost:
        """What the failure cost (engine/cost.py), from the first cause line or the first failure."""
        if decision.outcome == "not_failed":
            return attempt_cost(
                classified.context,
                classified.events,
                None,
                None,
                settings=self.cost,
                inventory=gpus,
                completed=True,
            )
        when: datetime | None = None
        ref: str | None = None
        starts = [c.first_seen for c in decision.chosen if c.first_seen is not None and not c.approx]
        if starts:  # the root cause's first_seen, and the line it comes from
            when = min(starts)
            at = [e for c in decision.chosen for e in c.events if e.time == when]
            ref = min(at, key=Event.stream_order).ref if at else None
        elif decision.first_failure is not None and decision.first_failure.time:
            when = datetime.fromisoformat(decision.first_failure.time.replace("Z", "+00:00"))
            ref = decision.first_failure.ref
        return attempt_cost(
            classified.context, classified.events, when, ref, settings=self.cost, inventory=gpus
        )


def diagnosis_id(cluster: str | None, workload: str, attempt: int, ruleset: str) -> str:
    """The deterministic id of an attempt's diagnosis under a ruleset."""
    ident = hashlib.sha256(f"{cluster or ''}\0{workload}\0{attempt}\0{ruleset}".encode()).hexdigest()[:24]
    return f"dx-{ident}"


def _scheduler_state(events: list[Event]) -> str | None:
    for e in events:
        if e.kind == "job_state" and isinstance(e.fields.get("state"), str):
            return str(e.fields["state"]).split("+")[0].upper()
    return None


def _starts_together(a: Candidate, b: Candidate) -> bool:
    if a is b:
        return True
    if a.first_seen is None or b.first_seen is None or a.approx or b.approx:
        return True  # without wall-clock times their order is unknown
    return b.first_seen - a.first_seen <= AMBIGUITY_WINDOW


class _Fmt(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return ""


_SPACES = re.compile(r"\s+")
_EMPTY_BITS = re.compile(r"\(\s*\)| link (?=\))| GPU $")


def _render(template: str, fmt: _Fmt) -> str:
    text = _SPACES.sub(" ", template.format_map(fmt))
    return _SPACES.sub(" ", _EMPTY_BITS.sub("", text)).replace("( ", "(").replace(" )", ")").strip()


def _root(c: Candidate) -> RootCause:
    fmt = _Fmt()
    for e in c.events:  # the first value each field takes among the cause's events
        for k, v in e.fields.items():
            if v not in (None, "") and k not in fmt:
                fmt[k] = v
    nodes = sorted(c.nodes)
    comps = [c.components[k] for k in sorted(c.components)]
    fmt.update(
        title=c.rule.title,
        nodes=", ".join(nodes) or "the job",
        node=nodes[0] if nodes else "the job",
        detail=c.detail,
        components=", ".join(f"{x.node} {x.kind} {x.id}" for x in comps) or "-",
    )
    return RootCause(
        domain=str(c.spec.domain),
        subdomain=str(c.spec.subdomain),
        rule=c.rule.id,
        summary=_render(c.spec.summary, fmt),
        nodes=nodes,
        components=comps,
        first_seen=isoformat(earliest_line(c)),
        action=c.spec.action,
    )


def earliest_line(c: Candidate) -> datetime | None:
    """`first_seen` as a reader checks it: the time of the cause's earliest evidence line. A line with
    no stamp of its own was written between the stamp before it and the one after it; its lower bound
    counts when that span is short (`AMBIGUITY_WINDOW`), its upper bound otherwise (a traceback after
    an hour of silence did not happen an hour early). The causes' own ordering keeps
    `Candidate.first_seen`."""
    times: list[datetime] = []
    for e in c.events:
        if e.time is None:
            continue
        if e.inherited and e.time_max is not None and e.time_max - e.time > AMBIGUITY_WINDOW:
            times.append(e.time_max)
        else:
            times.append(e.time)
    return min(times, default=None) or c.first_seen


def _ambiguous_root(chosen: list[Candidate], cands: list[RootCause]) -> RootCause:
    domains = sorted({c.domain for c in cands})
    nodes = sorted({n for c in chosen for n in c.nodes})
    comps = sorted({(x.node, x.kind, x.id): x for c in cands for x in c.components}.items())
    first = min((t for c in chosen if (t := earliest_line(c))), default=None)
    listing = "; ".join(f"{c.domain}/{c.subdomain} on {', '.join(c.nodes) or 'the job'}" for c in cands)
    return RootCause(
        domain=domains[0] if len(domains) == 1 else "ambiguous",
        subdomain="ambiguous",
        rule="ambiguous",
        summary=f"{len(cands)} independent causes fit and none explains the others: {listing}",
        nodes=nodes,
        components=[c for _, c in comps],
        first_seen=isoformat(first),
        action="INVESTIGATE",
    )


def _quality(
    outcome: str,
    chosen: list[Candidate],
    others: list[Candidate],
    coverage: list[Coverage],
    ctx: AttemptContext,
    reasons: list[str],
) -> Quality:
    hard = False
    missing = sorted(c.source for c in coverage if c.status == "missing")
    broken = sorted(c.source for c in coverage if c.status in ("failed", "partial", "skipped"))
    if outcome == "unattributed":
        hard = True
        reasons.append("no root-cause evidence found: the failure is not attributed rather than guessed")
    if outcome == "ambiguous":
        hard = True
        reasons.append(
            f"{len(chosen)} independent candidate causes started within {int(AMBIGUITY_WINDOW.total_seconds())} s"
        )
    if others:
        reasons.append(f"{len(others)} later independent candidate(s) also found (listed in candidates)")
    for c in chosen:
        if c.spec.precedence < STRONG:
            reasons.append(f"{c.cls} rests on weaker evidence ({c.rule.id}): confirm before acting")
        if any(e.approx for e in c.events):
            reasons.append("root-cause time is approximate (no wall-clock stamp to anchor it)")
        culprit_missing = [f"logs/{n}" for n in sorted(c.nodes) if f"logs/{n}" in missing]
        if culprit_missing:
            hard = True
            reasons.append(f"no logs for culprit node(s): {', '.join(culprit_missing)}")
        kernels = {e.node for e in c.events if e.source == "kernel"}
        if (
            c.spec.domain in ("software", "network")
            and not kernels
            and c.nodes
            and c.spec.precedence < STRONG
        ):
            reasons.append(
                "no kernel evidence on the culprit node(s): a hardware fault there is not excluded"
            )
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        reasons.append(f"missing sources: {shown}")
    if broken:
        shown = ", ".join(broken[:5]) + (f" and {len(broken) - 5} more" if len(broken) > 5 else "")
        reasons.append(f"unreadable or partly read sources: {shown}")
    if outcome == "not_failed":
        level = "high" if not missing and not broken else "medium"
    elif hard:
        level = "low"
    elif reasons:
        level = "medium"
    else:
        level = "high"
    return Quality(level=level, reasons=reasons)  # type: ignore[arg-type]


def _weighed(c: Candidate, events: list[Event]) -> RootCause:
    """A cause the job outlived, listed with why it fell short."""
    r = _root(c)
    last = max((e.time for e in events if e.kind == "progress" and e.time is not None), default=None)
    r.summary += (
        f" (fell short: training progress continued until {isoformat(last)})" if last else " (fell short)"
    )
    return r


def _symptoms(roles: list[Role], cause_events: set[int], first_ref: str | None = None) -> list[Symptom]:
    """Symptom-role events, and root-cause-role events that are not the chosen cause's own evidence
    (a KeyError explained by a GPU fault, a CUDA ECC error next to the Xid 48 behind it). The example
    of a kind is the first failure's own line when it is one of them."""
    groups: dict[str, list[Role]] = defaultdict(list)
    for e, a in roles:
        if a.spec.role == "symptom":
            groups[a.spec.symptom or e.kind].append((e, a))
        elif a.spec.role == "root_cause" and id(e) not in cause_events and a.spec.symptom:
            groups[a.spec.symptom].append((e, a))
    out: list[Symptom] = []
    for kind in sorted(groups):
        items = sorted(groups[kind], key=lambda ea: ea[0].ref != first_ref)  # stable: else arrival order
        times = [e.time for e, _ in items if e.time]
        out.append(
            Symptom(
                kind=kind,
                rule=min(a.rule.id for _, a in items),
                count=len(items),
                nodes=sorted({e.node for e, _ in items if e.node}),
                first_seen=isoformat(min(times)) if times else None,
                last_seen=isoformat(max(times)) if times else None,
                example=items[0][0].text,
            )
        )
    return out


class EvidenceTrail:
    """The evidence of a diagnosis: the causes' own lines, the first failure, context on the culprit
    nodes just before the cause, and a few examples of each symptom; a line shown as the cause is not
    repeated as its own symptom, and each (line, role) appears once."""

    def __init__(self) -> None:
        self.picked: dict[tuple[str, str], Evidence] = {}
        self.cause_refs: set[str] = set()

    def add(self, e: Event, role: str, rule: str) -> None:
        if role == "root_cause":
            self.cause_refs.add(e.ref)
        elif e.ref in self.cause_refs:
            return  # a line already shown as the cause is not repeated as its own symptom
        key = (e.ref, role)
        if key not in self.picked:
            self.picked[key] = Evidence(
                time=isoformat(e.time),
                node=e.node,
                source=e.source,
                ref=e.ref,
                text=e.text,
                role=role,  # type: ignore[arg-type]
                rule=rule,
                inherited=e.inherited,
                time_max=isoformat(e.time_max) if e.inherited else None,
            )

    def of(self, causes: list[Candidate], roles: list[Role], first_ref: str | None = None) -> list[Evidence]:
        culprit_nodes: set[str] = set()
        starts: list[datetime] = []
        for c in causes:
            for e in c.events[:MAX_EVIDENCE_PER_CAUSE]:
                self.add(e, "root_cause" if c.spec.role == "root_cause" else "context", c.rule.id)
            culprit_nodes |= c.nodes
            if c.first_seen:
                starts.append(c.first_seen)
        first = min(starts) if starts else None
        ctx_count = 0
        per_kind: dict[str, int] = defaultdict(int)
        for e, a in roles:
            if first_ref is not None and e.ref == first_ref and a.spec.role == "symptom":
                per_kind[a.spec.symptom or e.kind] += 1  # the first failure is its kind's first example
                self.add(e, "symptom", a.rule.id)
        for e, a in roles:
            if a.spec.role == "context" and e.node in culprit_nodes and ctx_count < MAX_EVIDENCE_PER_CAUSE:
                if first is None or e.time is None or first - CONTEXT_BEFORE <= e.time <= first + SKEW:
                    self.add(e, "context", a.rule.id)
                    ctx_count += 1
            elif a.spec.role == "symptom":
                kind = a.spec.symptom or e.kind
                if per_kind[kind] < MAX_SYMPTOM_EXAMPLES:
                    per_kind[kind] += 1
                    self.add(e, "symptom", a.rule.id)
        return sorted(self.picked.values(), key=lambda v: (v.time or "~", v.node or "", v.ref, v.rule))
