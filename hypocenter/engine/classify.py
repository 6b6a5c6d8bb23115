"""Classification, the verdict's first step: which events of an attempt count, and the role each plays.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from hypocenter.engine.matching import Pattern, compile_pattern
from hypocenter.engine.rules import AttributeSpec, RecoverySpec, Rule, Ruleset, When
from hypocenter.model import AttemptContext, Event

SCOPE_BEFORE = timedelta(minutes=2)  # node events this long before the window still count
SCOPE_AFTER = timedelta(minutes=5)  # … and after it (teardown, scheduler bookkeeping)
# Without timed progress, a job that ended this long after a recovery outlived it: a collective that
# did not recover is stopped by its watchdog sooner (PyTorch's NCCL timeout: 10 min, 30 in older releases).
RECOVERY_OUTLIVED = timedelta(minutes=30)


@dataclass
class Attribution:
    """An attribution rule as the classifier applies it (its `when.text` compiled)."""

    rule: Rule
    spec: AttributeSpec
    text: Pattern | None


Role = tuple[Event, Attribution]


def _values_match(actual: object, wanted: object) -> bool:
    options = wanted if isinstance(wanted, list) else [wanted]
    return str(actual) in {str(o) for o in options} if actual is not None else None in options


def when_matches(w: When, text: Pattern | None, e: Event) -> bool:
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


class Recoveries:
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
        self.progress = sorted(
            e.time
            for e in events
            if e.kind == "progress" and e.time is not None and not e.inherited and not e.approx
        )
        self.end = end
        self._patterns: dict[str, Pattern] = {}

    def after(self, e: Event, spec: RecoverySpec) -> bool:
        if not e.node:
            return False
        pattern = self._patterns.get(spec.text)
        if pattern is None:
            pattern = self._patterns[spec.text] = compile_pattern(spec.text)
        if e.time is None:
            # A line with no time at all cannot be shown before or after any progress: the recovery
            # later in its own stream is all there is (peers' errors naming its node still make the
            # node a cause, through the ib-peer analyzer).
            path, line = e.stream_position()
            return any(
                r.kind in spec.kind
                and (rp := r.stream_position())[0] == path
                and rp[1] > line
                and pattern.search(r.text)
                and all(r.fields.get(k) == e.fields.get(k) for k in spec.same)
                for r in self.untimed.get(e.node, ())
            )
        limit = e.time + timedelta(seconds=spec.within_s)
        return any(
            r.kind in spec.kind
            and e.time <= r.time <= limit  # type: ignore[operator]
            and pattern.search(r.text)
            and all(r.fields.get(k) == e.fields.get(k) for k in spec.same)
            and self.progressed_after(r.time)  # type: ignore[arg-type]
            for r in self.by_node.get(e.node, ())
        )

    def progressed_after(self, t: datetime) -> bool:
        if self.progress:
            return len(self.progress) - bisect_right(self.progress, t) >= 2
        # No timed progress (tqdm, plain prints, rank 0's log missing): the job went on if it ended long after.
        return self.end is not None and self.end - t > RECOVERY_OUTLIVED


@dataclass
class Classification:
    """One attempt's in-scope events (sorted, ranks resolved to nodes) and the roles they took."""

    context: AttemptContext
    events: list[Event]
    roles: list[Role]
    rank_nodes: dict[int, str]


class Classifier:
    def __init__(self, ruleset: Ruleset) -> None:
        self.by_kind: dict[str, list[Attribution]] = defaultdict(list)
        self.analyzer_rules: list[Rule] = []
        for rule in ruleset.rules:
            if rule.attribute is None:
                continue
            if rule.analyzer:
                self.analyzer_rules.append(rule)
                continue
            a = Attribution(
                rule,
                rule.attribute,
                compile_pattern(rule.attribute.when.text) if rule.attribute.when.text else None,
            )
            for kind in rule.attribute.when.kind:
                self.by_kind[kind].append(a)
        for attrs in self.by_kind.values():
            attrs.sort(key=lambda a: (-a.spec.precedence, a.rule.id))

    def classify(self, e: Event, recovered: Recoveries | None = None) -> Attribution | None:
        for a in self.by_kind.get(e.kind, ()):
            if not when_matches(a.spec.when, a.text, e):
                continue
            if (
                a.spec.unless_recovered is not None
                and recovered is not None
                and recovered.after(e, a.spec.unless_recovered)
            ):
                continue  # e.g. a Lustre disconnect that reconnected within minutes: fall through to context
            return a
        return None

    def roles(self, events: list[Event], end: datetime | None = None) -> list[Role]:
        """Each event with the attribution rule that gives it its role (unclassified ones dropped);
        `end` is when the attempt ended, if known (a recovery counts only if the job went on after it)."""
        recovered = Recoveries(events, end)
        roles: list[Role] = []
        for e in events:
            a = self.classify(e, recovered)
            if a is not None:
                roles.append((e, a))
        return roles

    def attempt(self, ctx: AttemptContext, events: list[Event]) -> Classification:
        """The attempt's events in scope and in order, each rank-only event given its rank's node, classified."""
        events = sorted((e for e in events if in_scope(e, ctx)), key=Event.sort_key)
        rank_nodes = ctx.rank_nodes()
        for e in events:
            if e.node is None and e.rank is not None:
                e.node = rank_nodes.get(e.rank)
        return Classification(
            context=ctx, events=events, roles=self.roles(events, ctx.window.end), rank_nodes=rank_nodes
        )
