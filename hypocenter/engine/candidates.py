"""Candidates, the verdict's second step: from classified events to the causes still standing.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from itertools import pairwise

from hypocenter.engine.analyzers import AttemptView, first_seen
from hypocenter.engine.classify import Classification, Role
from hypocenter.engine.registry import ANALYZERS
from hypocenter.engine.rules import AttributeSpec, Rule
from hypocenter.model import Component, Event, isoformat

SKEW = timedelta(seconds=120)  # node clocks and detection lag
MERGE_WINDOW = timedelta(seconds=90)  # same cause on several nodes within this: one cause
PROGRESS_GRACE = timedelta(minutes=5)  # progress this long after a signal: the job survived it


@dataclass
class Candidate:
    """A cause under consideration: one rule's root-cause events on one node, or an analyzer's finding."""

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
        return (
            isoformat(self.first_seen) or "~",
            -self.spec.precedence,
            self.rule.id,
            ",".join(sorted(self.nodes)),
        )


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


def _matches(patterns: list[str], cls: str) -> bool:
    return any(fnmatchcase(cls, p) for p in patterns)


@dataclass
class Causes:
    """What the search leaves for the report."""

    primary: list[Candidate]  # causes no other cause explains, earliest first
    survived: list[Candidate]  # causes the job outlived: training progress continued well after them


class CandidateSearch:
    """From an attempt's classification to its causes (module docstring)."""

    def __init__(self, analyzer_rules: list[Rule]) -> None:
        self.analyzer_rules = sorted(analyzer_rules, key=lambda r: r.id)

    def find(self, classified: Classification) -> Causes:
        ctx = classified.context
        candidates = self.from_roles(classified.roles) + self.from_analyzers(classified)
        # What the job outlived is judged per rule and node, before the same class is merged across
        # nodes: an old benign signal must not carry a later fatal one away with it, nor the reverse.
        outlived = _survived(candidates, classified.events)
        survived = _merge(outlived)
        # Nothing that began after the attempt ended caused it (clock skew allowed).
        candidates = [
            c
            for c in _merge([c for c in candidates if c not in outlived])
            if c.first_seen is None or c.approx or c.first_seen <= ctx.window.end + SKEW
        ]
        primary, _ = _explain(candidates)
        _locate_by_exits(primary, classified.events, len(classified.rank_nodes), ctx.nodes)
        return Causes(primary=primary, survived=survived)

    @staticmethod
    def from_roles(roles: list[Role]) -> list[Candidate]:
        """One candidate per root-cause rule and node, with its events and components."""
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

    def from_analyzers(self, classified: Classification) -> list[Candidate]:
        """The Python analyzers' findings, in rule id order."""
        view = AttemptView(
            context=classified.context, events=classified.events, rank_nodes=classified.rank_nodes
        )
        out: list[Candidate] = []
        for rule in self.analyzer_rules:
            assert rule.analyzer is not None and rule.attribute is not None
            for f in ANALYZERS[rule.analyzer](view):
                out.append(
                    Candidate(
                        rule=rule,
                        spec=rule.attribute,
                        nodes=set(f.nodes),
                        events=list(f.events),
                        first_seen=f.first_seen,
                        detail=f.detail,
                        components={(c.node, c.kind, c.id): c for c in f.components},
                    )
                )
        return out


def _locate_by_exits(
    primary: list[Candidate], events: list[Event], ranks: int, everywhere: list[str]
) -> None:
    """A cause whose lines name no rank or host (a bare traceback in a merged job log) is located by
    what the processes did: the same exception from (nearly) every rank is everywhere; otherwise it
    is where a process first exited with an error code (`srun: error: <node>: task N: Exited with exit
    code 1`, a torchrun failure entry with a positive exit code). Signal exits (Terminated, Aborted,
    -6, -15) are the collateral of that first exit."""
    unlocated = [c for c in primary if not c.nodes and c.spec.locus != "job"]
    if not unlocated:
        return
    exits = [e for e in events if e.node and _error_exit(e)]
    first_exit = min(exits, key=Event.stream_order).node if exits else None
    # An OOM kill is a SIGKILL: a step's `Detected N oom_kill event in StepId=…` or an OUT_OF_MEMORY
    # state names no node, srun's `<node>: task N: Killed | Out Of Memory` does.
    killed = [
        e
        for e in events
        if e.node and e.kind == "task_exit" and e.fields.get("what") in ("Killed", "Out Of Memory")
    ]
    first_killed = min(killed, key=Event.stream_order).node if killed else None
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
        if (
            latest is not None
            and latest + grace < last
            and c.spec.domain != "external"
            and c.spec.effect == "stop"
        ):
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
            near = (
                o.first_seen is None
                or c.first_seen is None
                or abs(c.first_seen - o.first_seen) <= MERGE_WINDOW
            )
            if near or not c.nodes or not o.nodes or (c.nodes & o.nodes):
                target = o
                break
        if target is None:
            out.append(
                Candidate(
                    rule=c.rule,
                    spec=c.spec,
                    nodes=set(c.nodes),
                    events=list(c.events),
                    first_seen=c.first_seen,
                    detail=c.detail,
                    components=dict(c.components),
                )
            )
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
    if (
        a.first_seen is not None
        and b_latest is not None
        and a.first_seen - timedelta(seconds=a.spec.lag_s) > b_latest + SKEW
    ):
        return False
    if _matches(a.spec.explains, b.cls):
        return _linked(a, b)
    # A cause whose node is unknown (an exception line with no rank or host) may be on b's node.
    return _matches(a.spec.explains_on_node, b.cls) and bool(a.nodes & b.nodes or not b.nodes or not a.nodes)


# What a fault on one node can do to the processes on another: hang them, fail them in their own code,
# run them into the time limit, get them cancelled. A fault on another node (a link down, a lost
# filesystem server, an OOM kill, another GPU's error) is evidence of its own, not a consequence.
CONSEQUENCES = ("software/*", "resource/time_limit", "external/cancellation")


def _linked(a: Candidate, b: Candidate) -> bool:
    """Whether cause `a`, whose rule names `b`'s class, can have produced `b` where `b` was seen. On a
    node of `a`'s (or where either is unlocated) it can. On other nodes only through the job's own
    processes, which cross between nodes: `b` must be a consequence class, never another fault."""
    if not a.nodes or not b.nodes or a.nodes & b.nodes:
        return True
    return _matches(list(CONSEQUENCES), b.cls)


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
        located = sorted(
            {
                n
                for b in explained
                if b.nodes and _explains(a, b) and _matches(a.spec.explains_on_node, b.cls)
                for n in b.nodes
            }
        )
        if len(located) == 1:
            a.nodes = set(located)
    return primary, explained
