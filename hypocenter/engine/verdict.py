"""Correlate events and decide: which event began the failure, which are its symptoms.

1. Scope: node-scoped events (kernel, metrics) count only for the attempt's nodes and window
   (with a clock-skew allowance); workload-scoped events (app, scheduler) always count.
2. Classify: each event takes the role of the highest-precedence attribution rule that matches it:
   root cause, symptom or context. Python analyzers add findings of their own.
3. Group root-cause evidence into candidates, merge the same cause seen on several nodes at about
   the same time, and drop every candidate that another one explains (by class, locality, time).
4. One candidate left → attributed; several starting within the ambiguity window → ambiguous
   (all listed); none → unattributed. A completed attempt is not_failed.

Deterministic by construction: inputs are sorted by a total order before any decision, and ties
break on rule id and node name, never on arrival order.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from itertools import pairwise
from typing import Any

from hypocenter import __version__
from hypocenter.engine.abstain import FirstFailureFinder
from hypocenter.engine.analyzers import AttemptView, first_seen
from hypocenter.engine.matching import Pattern, compile_pattern
from hypocenter.engine.next_step import next_step
from hypocenter.engine.registry import ANALYZERS
from hypocenter.engine.rules import AttributeSpec, RecoverySpec, Rule, Ruleset, When
from hypocenter.model import (
    AttemptContext,
    AttemptRef,
    Component,
    Coverage,
    Diagnosis,
    EngineInfo,
    Event,
    Evidence,
    Quality,
    RootCause,
    Symptom,
    isoformat,
)

SKEW = timedelta(seconds=120)             # node clocks and detection lag
SCOPE_BEFORE = timedelta(minutes=2)       # node events this long before the window still count
SCOPE_AFTER = timedelta(minutes=5)        # … and after it (teardown, scheduler bookkeeping)
MERGE_WINDOW = timedelta(seconds=90)      # same cause on several nodes within this: one cause
AMBIGUITY_WINDOW = timedelta(seconds=60)  # different causes starting within this: ambiguous
CONTEXT_BEFORE = timedelta(minutes=15)    # precursors shown with a root cause
MAX_EVIDENCE_PER_CAUSE = 8
MAX_SYMPTOM_EXAMPLES = 2
PROGRESS_GRACE = timedelta(minutes=5)    # progress this long after a signal: the job survived it
STRONG = 50                               # precedence at or above which one signal is enough
# Without timed progress, a job that ended this long after a recovery outlived it: a collective that
# did not recover is stopped by its watchdog sooner (PyTorch's NCCL timeout: 10 min, 30 in older releases).
RECOVERY_OUTLIVED = timedelta(minutes=30)


@dataclass
class _Attr:
    rule: Rule
    spec: AttributeSpec
    text: Pattern | None


@dataclass
class Candidate:
    rule: Rule
    spec: AttributeSpec
    nodes: set[str]
    events: list[Event]
    first_seen: datetime | None
    detail: str = ""
    components: dict[tuple[str, str, str], Component] = field(default_factory=dict)

    @property
    def cls(self) -> str:
        return f"{self.spec.domain}/{self.spec.subdomain}"

    @property
    def approx(self) -> bool:
        """No event of this cause has a wall-clock time (raw dmesg with nothing to anchor it)."""
        return bool(self.events) and all(e.approx for e in self.events)

    def sort_key(self) -> tuple[str, int, str, str]:
        return (isoformat(self.first_seen) or "~", -self.spec.precedence, self.rule.id, ",".join(sorted(self.nodes)))


def _values_match(actual: object, wanted: object) -> bool:
    options = wanted if isinstance(wanted, list) else [wanted]
    return str(actual) in {str(o) for o in options} if actual is not None else None in options


class Classifier:
    def __init__(self, ruleset: Ruleset) -> None:
        self.by_kind: dict[str, list[_Attr]] = defaultdict(list)
        self.analyzer_rules: list[Rule] = []
        for rule in ruleset.rules:
            if rule.attribute is None:
                continue
            if rule.analyzer:
                self.analyzer_rules.append(rule)
                continue
            a = _Attr(rule, rule.attribute, compile_pattern(rule.attribute.when.text) if rule.attribute.when.text else None)
            for kind in rule.attribute.when.kind:
                self.by_kind[kind].append(a)
        for attrs in self.by_kind.values():
            attrs.sort(key=lambda a: (-a.spec.precedence, a.rule.id))

    def classify(self, e: Event, recovered: _Recoveries | None = None) -> _Attr | None:
        for a in self.by_kind.get(e.kind, ()):
            if not _when_matches(a.spec.when, a.text, e):
                continue
            if a.spec.unless_recovered is not None and recovered is not None and recovered.after(e, a.spec.unless_recovered):
                continue  # e.g. a Lustre disconnect that reconnected within minutes: fall through to context
            return a
        return None


class _Recoveries:
    """Per node, the events that can show a condition cleared (reconnects, server OK, a port ACTIVE
    again). A recovery counts only if the job is seen going on after it: a link that comes back
    seconds before the job dies anyway did not recover the job (NCCL's queue pairs had already
    retried out). Going on means two stamped progress lines after the recovery (one whole interval);
    when no progress line carries a time, that the attempt ended longer after it than a stuck
    collective can last (RECOVERY_OUTLIVED)."""

    def __init__(self, events: list[Event], end: datetime | None = None) -> None:
        self.by_node: dict[str, list[Event]] = defaultdict(list)
        self.untimed: dict[str, list[Event]] = defaultdict(list)
        for e in events:
            if e.node:
                (self.by_node if e.time is not None else self.untimed)[e.node].append(e)
        self.progress = sorted(e.time for e in events
                               if e.kind == "progress" and e.time is not None and not e.inherited and not e.approx)
        self.end = end

    def after(self, e: Event, spec: RecoverySpec) -> bool:
        if not e.node:
            return False
        pattern = compile_pattern(spec.text)
        if e.time is None:
            # A line with no time at all cannot be shown before or after any progress: the recovery
            # later in its own stream is all there is (peers' errors naming its node still make the
            # node a cause, through the ib-peer analyzer).
            path = e.ref.rpartition(":")[0]
            return any(r.kind in spec.kind and r.ref.rpartition(":")[0] == path and _line_no(r.ref) > _line_no(e.ref)
                       and pattern.search(r.text) and all(r.fields.get(k) == e.fields.get(k) for k in spec.same)
                       for r in self.untimed.get(e.node, ()))
        limit = e.time + timedelta(seconds=spec.within_s)
        return any(r.kind in spec.kind and e.time <= r.time <= limit and pattern.search(r.text)  # type: ignore[operator]
                   and all(r.fields.get(k) == e.fields.get(k) for k in spec.same)
                   and self.progressed_after(r.time)  # type: ignore[arg-type]
                   for r in self.by_node.get(e.node, ()))

    def progressed_after(self, t: datetime) -> bool:
        if self.progress:
            return len(self.progress) - bisect_right(self.progress, t) >= 2
        # No timed progress (tqdm, plain prints, rank 0's log missing): the job went on if it ended long after.
        return self.end is not None and self.end - t > RECOVERY_OUTLIVED


def _line_no(ref: str) -> int:
    line = ref.rpartition(":")[2]
    return int(line) if line.isdigit() else 0


def _when_matches(w: When, text: Pattern | None, e: Event) -> bool:
    if w.source is not None and e.source not in w.source:
        return False
    for k, v in w.fields.items():
        if not _values_match(e.fields.get(k), v):
            return False
    for k in w.has:
        if e.fields.get(k) in (None, ""):
            return False
    for k, v in w.unless.items():
        if k in e.fields and _values_match(e.fields.get(k), v):
            return False
    return not (text is not None and not text.search(e.text))


def in_scope(e: Event, ctx: AttemptContext) -> bool:
    """Workload-scoped events always count; node-scoped ones (kernel, metrics, scheduler records
    about a node) only for the attempt's nodes and window."""
    if e.source == "app" or (e.source == "scheduler" and e.node is None):
        return True
    if ctx.nodes and e.node is not None and e.node not in ctx.nodes:
        return False
    if e.time is None:
        return True
    return ctx.window.start - SCOPE_BEFORE <= e.time <= ctx.window.end + SCOPE_AFTER


def normalize_pci(raw: str) -> str:
    """`PCI:0000:3b:00`, `00000000:3B:00.0`, `0000:3b:00.0` → `0000:3b:00` (domain:bus:device)."""
    s = raw.strip().lower().removeprefix("pci:")
    parts = s.split(":")
    if len(parts) >= 3:
        dom = parts[-3][-4:].rjust(4, "0")
        return f"{dom}:{parts[-2]}:{parts[-1].split('.')[0]}"
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1].split('.')[0]}"
    return s


def _components(spec: AttributeSpec, e: Event) -> list[Component]:
    if not e.node:
        return []
    if spec.locus == "gpu":
        pci = e.fields.get("pci")
        if isinstance(pci, str) and pci:
            return [Component(node=e.node, kind="gpu", id=normalize_pci(pci))]
        gpu = e.fields.get("gpu")
        if gpu is not None:
            return [Component(node=e.node, kind="gpu", id=f"gpu{gpu}")]
    if spec.locus == "port":
        dev, port = e.fields.get("device"), e.fields.get("port")
        if isinstance(dev, str) and dev:
            return [Component(node=e.node, kind="port", id=f"{dev}/{port}" if port is not None else dev)]
    if spec.locus == "nic":
        dev, pci, ifname = e.fields.get("device"), e.fields.get("pci"), e.fields.get("ifname")
        if isinstance(dev, str) and dev.startswith("mlx"):
            return [Component(node=e.node, kind="nic", id=dev)]
        if isinstance(pci, str) and pci:
            return [Component(node=e.node, kind="nic", id=normalize_pci(pci))]
        name = dev if isinstance(dev, str) and dev else ifname
        if isinstance(name, str) and name:
            return [Component(node=e.node, kind="nic", id=name)]
    if spec.locus == "filesystem":
        for key in ("server", "target", "rtarget"):
            v = e.fields.get(key)
            if isinstance(v, str) and v:
                return [Component(node=e.node, kind="filesystem", id=v)]
        path = e.fields.get("path")
        if isinstance(path, str) and path.startswith("/") and path.rstrip("/").count("/") >= 1:
            # The mount point is not in the line: the file's directory names the filesystem holding it.
            return [Component(node=e.node, kind="filesystem", id=path.rstrip("/").rsplit("/", 1)[0] or "/")]
    return []


class _Fmt(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return ""


_SPACES = re.compile(r"\s+")
_EMPTY_BITS = re.compile(r"\(\s*\)| link (?=\))| GPU $")


def _render(template: str, fmt: _Fmt) -> str:
    text = _SPACES.sub(" ", template.format_map(fmt))
    return _SPACES.sub(" ", _EMPTY_BITS.sub("", text)).replace("( ", "(").replace(" )", ")").strip()


def _matches(patterns: list[str], cls: str) -> bool:
    return any(fnmatchcase(cls, p) for p in patterns)


class Verdict:
    def __init__(self, ruleset: Ruleset) -> None:
        self.ruleset = ruleset
        self.classifier = Classifier(ruleset)

    def decide(self, ctx: AttemptContext, events: list[Event], coverage: list[Coverage]) -> Diagnosis:
        events = sorted((e for e in events if in_scope(e, ctx)), key=Event.sort_key)
        rank_nodes = ctx.rank_nodes()
        for e in events:
            if e.node is None and e.rank is not None:
                e.node = rank_nodes.get(e.rank)
        roles = self.classify(events, ctx.window.end)
        candidates = self._candidates(roles)
        view = AttemptView(context=ctx, events=events, rank_nodes=rank_nodes)
        for rule in self.analyzer_rules_sorted():
            assert rule.analyzer is not None and rule.attribute is not None
            for f in ANALYZERS[rule.analyzer](view):
                candidates.append(Candidate(rule=rule, spec=rule.attribute, nodes=set(f.nodes), events=list(f.events),
                                            first_seen=f.first_seen, detail=f.detail,
                                            components={(c.node, c.kind, c.id): c for c in f.components}))
        # What the job outlived is judged per rule and node, before the same class is merged across
        # nodes: an old benign signal must not carry a later fatal one away with it, nor the reverse.
        outlived = _survived(candidates, events)
        survived = _merge(outlived)
        # Nothing that began after the attempt ended caused it (clock skew allowed).
        candidates = [c for c in _merge([c for c in candidates if c not in outlived])
                      if c.first_seen is None or c.approx or c.first_seen <= ctx.window.end + SKEW]
        primary, _ = _explain(candidates)
        _locate_by_exits(primary, events, len(rank_nodes), ctx.nodes)
        return self._diagnosis(ctx, events, roles, primary, coverage, survived)

    def classify(self, events: list[Event], end: datetime | None = None) -> list[tuple[Event, _Attr]]:
        """Each in-scope event with the attribution rule that gives it its role (unclassified ones dropped);
        `end` is when the attempt ended, if known."""
        recovered = _Recoveries(events, end)
        roles: list[tuple[Event, _Attr]] = []
        for e in events:
            a = self.classifier.classify(e, recovered)
            if a is not None:
                roles.append((e, a))
        return roles

    def analyzer_rules_sorted(self) -> list[Rule]:
        return sorted(self.classifier.analyzer_rules, key=lambda r: r.id)

    @staticmethod
    def _candidates(roles: list[tuple[Event, _Attr]]) -> list[Candidate]:
        groups: dict[tuple[str, str], Candidate] = {}
        for e, a in roles:
            if a.spec.role != "root_cause":
                continue
            key = (a.rule.id, e.node or "")
            c = groups.get(key)
            if c is None:
                c = groups[key] = Candidate(rule=a.rule, spec=a.spec, nodes=set(), events=[], first_seen=None)
            if e.node:
                c.nodes.add(e.node)
            c.events.append(e)
            for comp in _components(a.spec, e):
                c.components[(comp.node, comp.kind, comp.id)] = comp
        for c in groups.values():
            c.first_seen = first_seen(c.events)
        return [groups[k] for k in sorted(groups)]

    # ----------------------------------------------------------------------------------------- output

    def _diagnosis(self, ctx: AttemptContext, events: list[Event], roles: list[tuple[Event, _Attr]],
                   primary: list[Candidate], coverage: list[Coverage], survived: list[Candidate]) -> Diagnosis:
        state = ctx.state or _scheduler_state(events)
        completed = state in ("COMPLETED", "SUCCEEDED", "SUCCESS", "FINISHED") or (state is None and ctx.exit_code == 0)
        reasons: list[str] = []
        chosen: list[Candidate] = []
        others: list[Candidate] = []
        if completed:
            outcome = "not_failed"
            if primary:
                reasons.append(f"the attempt completed; {len(primary)} potential fault signal(s) recorded as evidence")
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
        if outcome == "unattributed":
            # Abstain, but localise: the first process to fail, and the causes weighed with why each fell short.
            first_failure, hinted = FirstFailureFinder(events, ctx.rank_nodes()).find()
            cands = hinted + [_weighed(c, events) for c in survived]
            if first_failure is not None:
                reasons.append(f"first failure: {first_failure.next_step}")
        quality = _quality(outcome, chosen, others, coverage, ctx, reasons)
        rule_of = {id(e): a.rule.id for e, a in roles}
        cause_events = {id(e) for c in chosen for e in c.events if rule_of.get(id(e)) == c.rule.id}
        symptoms = _symptoms(roles, cause_events, first_failure.ref if first_failure else None)
        evidence = _evidence(chosen if chosen else primary, roles, first_failure.ref if first_failure else None)
        affected = sorted({e.node for e, a in roles if e.node and a.spec.role in ("root_cause", "symptom")}
                          | {n for c in chosen for n in c.nodes})
        ident = hashlib.sha256(
            f"{ctx.workload.cluster or ''}\0{ctx.workload.id}\0{ctx.workload.attempt}\0{self.ruleset.fingerprint}".encode()
        ).hexdigest()[:24]
        return Diagnosis(
            id=f"dx-{ident}",
            attempt=AttemptRef(
                workload_id=ctx.workload.id, attempt=ctx.workload.attempt, scheduler=ctx.workload.scheduler,
                cluster=ctx.workload.cluster,
                window={"start": isoformat(ctx.window.start), "end": isoformat(ctx.window.end)},
                nodes=list(ctx.nodes)),
            terminal_state=state,
            outcome=outcome,  # type: ignore[arg-type]
            root_cause=root,
            candidates=cands,
            affected_nodes=affected,
            symptoms=symptoms,
            evidence=evidence,
            quality=quality,
            next_step=next_step(outcome, root, cands, symptoms, coverage),
            coverage=coverage,
            engine=EngineInfo(version=__version__, ruleset=self.ruleset.fingerprint),
            first_failure=first_failure,
        )


def _scheduler_state(events: list[Event]) -> str | None:
    for e in events:
        if e.kind == "job_state" and isinstance(e.fields.get("state"), str):
            return str(e.fields["state"]).split("+")[0].upper()
    return None


def _stream_order(e: Event) -> tuple[str, str, int]:
    path, _, line = e.ref.rpartition(":")
    return (isoformat(e.time) or "~", path, int(line) if line.isdigit() else 0)


def _locate_by_exits(primary: list[Candidate], events: list[Event], ranks: int, everywhere: list[str]) -> None:
    """A cause whose lines name no rank or host (a bare traceback in a merged job log) is located by
    what the processes did: the same exception from (nearly) every rank is everywhere; otherwise it
    is where a process first exited with an error code (`srun: error: <node>: task N: Exited with exit
    code 1`, a torchrun failure entry with a positive exit code). Signal exits (Terminated, Aborted,
    -6, -15) are the collateral of that first exit."""
    unlocated = [c for c in primary if not c.nodes and c.spec.locus != "job"]
    if not unlocated:
        return
    exits = [e for e in events if e.node and _error_exit(e)]
    first_exit = min(exits, key=_stream_order).node if exits else None
    # An OOM kill is a SIGKILL: a step's `Detected N oom_kill event in StepId=…` or an OUT_OF_MEMORY
    # state names no node, srun's `<node>: task N: Killed | Out Of Memory` does.
    killed = [e for e in events if e.node and e.kind == "task_exit" and e.fields.get("what") in ("Killed", "Out Of Memory")]
    first_killed = min(killed, key=_stream_order).node if killed else None
    for c in unlocated:
        if c.spec.subdomain == "host_oom" and first_killed:
            c.nodes = {first_killed}
        elif len(everywhere) == 1 and c.events and all(e.source == "app" for e in c.events):
            c.nodes = set(everywhere)  # a program's line in a single-node attempt: that node
        elif ranks >= 2 and len(c.events) * 2 >= ranks:
            c.nodes = set(everywhere)
        elif first_exit:
            c.nodes = {first_exit}


def _error_exit(e: Event) -> bool:
    if e.kind == "task_exit":
        return e.fields.get("code") not in (None, "0")
    code = e.fields.get("exitcode")
    return e.kind == "child_failed" and isinstance(code, int) and code > 0


def _survived(cands: list[Candidate], events: list[Event]) -> list[Candidate]:
    """Candidates the job demonstrably lived through: training progress continued well after them.
    A collective job stops progressing at the fault that kills it, so progress long after a signal
    means that signal did not (a Lustre reconnect, a recovered link, an old benign Xid)."""
    times = sorted(e.time for e in events if e.kind == "progress" and e.time is not None)
    if not times:
        return []
    gaps = sorted((b - a).total_seconds() for a, b in pairwise(times))
    typical = gaps[len(gaps) // 2] if gaps else 0.0
    grace = max(PROGRESS_GRACE, timedelta(seconds=3 * typical))
    last = times[-1]
    out = []
    for c in cands:
        # Only a bounded signal can be shown to precede progress: a stamped line, or an unstamped one
        # with a later stamp in its stream (an inherited time alone is a lower bound). The job outlived
        # the cause only if it progressed after the cause's *last* sign: a link that flapped, came back
        # and then failed the job (peers' errors naming it at the end) is one candidate whose first
        # line the job did outlive.
        latest = _last_sign(c)
        if latest is not None and latest + grace < last and c.spec.domain != "external" \
                and c.spec.effect == "stop":
            out.append(c)
    return out


def _last_sign(c: Candidate) -> datetime | None:
    """The latest time the cause's evidence can have been written: a stamped line's time, an unstamped
    line's upper bound (the next stamp in its stream); None when an unstamped line has no bound."""
    times: list[datetime] = []
    for e in c.events:
        if e.time is None or e.approx:
            continue
        if e.inherited:
            if e.time_max is None:
                return None
            times.append(e.time_max)
        else:
            times.append(e.time)
    return max(times, default=None)


def _starts_together(a: Candidate, b: Candidate) -> bool:
    if a is b:
        return True
    if a.first_seen is None or b.first_seen is None or a.approx or b.approx:
        return True  # without wall-clock times their order is unknown
    return b.first_seen - a.first_seen <= AMBIGUITY_WINDOW


def _merge(cands: list[Candidate]) -> list[Candidate]:
    """The same class of cause on several nodes at about the same time (or job-level and node-level
    records of it) is one cause."""
    cands = sorted(cands, key=Candidate.sort_key)
    out: list[Candidate] = []
    for c in cands:
        target = None
        for o in out:
            if o.cls != c.cls:
                continue
            near = (o.first_seen is None or c.first_seen is None
                    or abs(c.first_seen - o.first_seen) <= MERGE_WINDOW)
            if near or not c.nodes or not o.nodes or (c.nodes & o.nodes):
                target = o
                break
        if target is None:
            out.append(Candidate(rule=c.rule, spec=c.spec, nodes=set(c.nodes), events=list(c.events),
                                 first_seen=c.first_seen, detail=c.detail, components=dict(c.components)))
            continue
        if (c.spec.precedence, bool(c.nodes)) > (target.spec.precedence, bool(target.nodes)):
            target.rule, target.spec = c.rule, c.spec
            target.detail = c.detail or target.detail
        target.nodes |= c.nodes
        target.events = sorted(target.events + c.events, key=Event.sort_key)
        target.components.update(c.components)
        target.first_seen = first_seen(target.events) or target.first_seen or c.first_seen
    return sorted(out, key=Candidate.sort_key)


def _explains(a: Candidate, b: Candidate) -> bool:
    if a is b:
        return False
    if (a.spec.precedence, -_ts(a)) <= (b.spec.precedence, -_ts(b)):
        return False  # only a stronger (or equally strong and earlier) cause explains another
    b_latest = _latest_start(b)
    if a.first_seen is not None and b_latest is not None and \
            a.first_seen - timedelta(seconds=a.spec.lag_s) > b_latest + SKEW:
        return False
    if _matches(a.spec.explains, b.cls):
        return True
    # A cause whose node is unknown (an exception line with no rank or host) may be on b's node.
    return _matches(a.spec.explains_on_node, b.cls) and bool(a.nodes & b.nodes or not b.nodes or not a.nodes)


def _latest_start(c: Candidate) -> datetime | None:
    """The latest time the cause can have begun: its first stamped event; for a cause known only from
    unstamped lines, the stamp after them; None when nothing bounds it (it may have begun any time)."""
    exact = [e.time for e in c.events if e.time is not None and not e.inherited and not e.approx]
    if exact:
        return min(exact)
    bounds = [e.time_max for e in c.events if e.time_max is not None]
    if bounds and len(bounds) == len(c.events):
        return min(bounds)
    return None if c.events else c.first_seen


def _ts(c: Candidate) -> float:
    return c.first_seen.timestamp() if c.first_seen else float("inf")


def _explain(cands: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    primary: list[Candidate] = []
    explained: list[Candidate] = []
    for b in cands:
        if any(_explains(a, b) for a in cands):
            explained.append(b)
        else:
            primary.append(b)
    for a in primary:
        if a.nodes or a.spec.locus == "job":
            continue
        # Locate a cause that names no node by the node its consequences point at: the peer every
        # other node lost its connection to is where the failing process was.
        located = sorted({n for b in explained if b.nodes and _explains(a, b)
                          and _matches(a.spec.explains_on_node, b.cls) for n in b.nodes})
        if len(located) == 1:
            a.nodes = set(located)
    return primary, explained


def _root(c: Candidate) -> RootCause:
    fmt = _Fmt()
    for e in c.events:  # the first value each field takes among the cause's events
        for k, v in e.fields.items():
            if v not in (None, "") and k not in fmt:
                fmt[k] = v
    nodes = sorted(c.nodes)
    comps = [c.components[k] for k in sorted(c.components)]
    fmt.update(title=c.rule.title, nodes=", ".join(nodes) or "the job", node=nodes[0] if nodes else "the job",
               detail=c.detail, components=", ".join(f"{x.node} {x.kind} {x.id}" for x in comps) or "-")
    return RootCause(domain=str(c.spec.domain), subdomain=str(c.spec.subdomain), rule=c.rule.id,
                     summary=_render(c.spec.summary, fmt), nodes=nodes, components=comps,
                     first_seen=isoformat(c.first_seen), action=c.spec.action)


def _ambiguous_root(chosen: list[Candidate], cands: list[RootCause]) -> RootCause:
    domains = sorted({c.domain for c in cands})
    nodes = sorted({n for c in chosen for n in c.nodes})
    comps = sorted({(x.node, x.kind, x.id): x for c in cands for x in c.components}.items())
    first = min((c.first_seen for c in chosen if c.first_seen), default=None)
    listing = "; ".join(f"{c.domain}/{c.subdomain} on {', '.join(c.nodes) or 'the job'}" for c in cands)
    return RootCause(domain=domains[0] if len(domains) == 1 else "ambiguous", subdomain="ambiguous",
                     rule="ambiguous", summary=f"{len(cands)} independent causes fit and none explains the others: {listing}",
                     nodes=nodes, components=[c for _, c in comps], first_seen=isoformat(first), action="INVESTIGATE")


def _quality(outcome: str, chosen: list[Candidate], others: list[Candidate], coverage: list[Coverage],
             ctx: AttemptContext, reasons: list[str]) -> Quality:
    hard = False
    missing = sorted(c.source for c in coverage if c.status == "missing")
    broken = sorted(c.source for c in coverage if c.status in ("failed", "partial", "skipped"))
    if outcome == "unattributed":
        hard = True
        reasons.append("no root-cause evidence found: the failure is not attributed rather than guessed")
    if outcome == "ambiguous":
        hard = True
        reasons.append(f"{len(chosen)} independent candidate causes started within {int(AMBIGUITY_WINDOW.total_seconds())} s")
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
        if c.spec.domain in ("software", "network") and not kernels and c.nodes and c.spec.precedence < STRONG:
            reasons.append("no kernel evidence on the culprit node(s): a hardware fault there is not excluded")
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
    r.summary += f" (fell short: training progress continued until {isoformat(last)})" if last else " (fell short)"
    return r


def _symptoms(roles: list[tuple[Event, _Attr]], cause_events: set[int], first_ref: str | None = None) -> list[Symptom]:
    """Symptom-role events, and root-cause-role events that are not the chosen cause's own evidence
    (a KeyError explained by a GPU fault, a CUDA ECC error next to the Xid 48 behind it). The example
    of a kind is the first failure's own line when it is one of them."""
    groups: dict[str, list[tuple[Event, _Attr]]] = defaultdict(list)
    for e, a in roles:
        if a.spec.role == "symptom":
            groups[a.spec.symptom or e.kind].append((e, a))
        elif a.spec.role == "root_cause" and id(e) not in cause_events and a.spec.symptom:
            groups[a.spec.symptom].append((e, a))
    out: list[Symptom] = []
    for kind in sorted(groups):
        items = sorted(groups[kind], key=lambda ea: ea[0].ref != first_ref)  # stable: else arrival order
        times = [e.time for e, _ in items if e.time]
        out.append(Symptom(kind=kind, rule=min(a.rule.id for _, a in items), count=len(items),
                           nodes=sorted({e.node for e, _ in items if e.node}),
                           first_seen=isoformat(min(times)) if times else None,
                           last_seen=isoformat(max(times)) if times else None,
                           example=items[0][0].text))
    return out


def _evidence(causes: list[Candidate], roles: list[tuple[Event, _Attr]], first_ref: str | None = None) -> list[Evidence]:
    picked: dict[tuple[str, str], Evidence] = {}
    cause_refs: set[str] = set()

    def add(e: Event, role: str, rule: str) -> None:
        if role == "root_cause":
            cause_refs.add(e.ref)
        elif e.ref in cause_refs:
            return  # a line already shown as the cause is not repeated as its own symptom
        key = (e.ref, role)
        if key not in picked:
            picked[key] = Evidence(time=isoformat(e.time), node=e.node, source=e.source, ref=e.ref,
                                   text=e.text, role=role, rule=rule,  # type: ignore[arg-type]
                                   inherited=e.inherited, time_max=isoformat(e.time_max) if e.inherited else None)

    culprit_nodes: set[str] = set()
    starts: list[datetime] = []
    for c in causes:
        for e in c.events[:MAX_EVIDENCE_PER_CAUSE]:
            add(e, "root_cause" if c.spec.role == "root_cause" else "context", c.rule.id)
        culprit_nodes |= c.nodes
        if c.first_seen:
            starts.append(c.first_seen)
    first = min(starts) if starts else None
    ctx_count = 0
    per_kind: dict[str, int] = defaultdict(int)
    for e, a in roles:
        if first_ref is not None and e.ref == first_ref and a.spec.role == "symptom":
            per_kind[a.spec.symptom or e.kind] += 1  # the first failure is its kind's first example
            add(e, "symptom", a.rule.id)
    for e, a in roles:
        if a.spec.role == "context" and e.node in culprit_nodes and ctx_count < MAX_EVIDENCE_PER_CAUSE:
            if first is None or e.time is None or first - CONTEXT_BEFORE <= e.time <= first + SKEW:
                add(e, "context", a.rule.id)
                ctx_count += 1
        elif a.spec.role == "symptom":
            kind = a.spec.symptom or e.kind
            if per_kind[kind] < MAX_SYMPTOM_EXAMPLES:
                per_kind[kind] += 1
                add(e, "symptom", a.rule.id)
    return sorted(picked.values(), key=lambda v: (v.time or "~", v.node or "", v.ref, v.rule))
