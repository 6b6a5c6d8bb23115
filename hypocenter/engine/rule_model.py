"""The rule language's plain classes: the one definition of a rule's fields, types and defaults.

A loaded rule is a tree of these slotted dataclasses (engine/rules.py loads them), so a cached catalog
(engine/rulecache.py) unpickles without pydantic. engine/rule_schema.py derives from them the pydantic
models a rule file is validated against; a new field is declared here only, and given a bound or a
check there if it needs one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hypocenter.modelbase import Action, FieldValue, Plain, Role, SourceKind
from hypocenter.names import NODE_LABELS

Status = Literal["experimental", "test", "stable"]
LINE_SOURCES: tuple[SourceKind, ...] = ("kernel", "app", "scheduler")


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class ExtractSpec(Plain):
    """Turn log lines into events. `tokens` are literals at least one of which must occur in
    every line the pattern can match: they build the prefilter."""

    source: list[SourceKind] = field(default_factory=lambda: list(LINE_SOURCES))
    tokens: list[str]
    pattern: str
    event: str
    lines_before: int = 0
    lines_after: int = 0
    ints: list[str] = field(default_factory=list)
    set: dict[str, FieldValue] = field(default_factory=dict)
    lookup: str | None = None
    lookup_key: str = "code"


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class MetricSpec(Plain):
    """Turn metric series into events: one event per series, at the first sample that meets the condition."""

    metrics: list[str]
    condition: Literal["increase", "above", "below", "bits_any", "equals_any", "changed_to_nonzero"]
    threshold: float = 0.0
    bits: int = 0
    values: list[float] = field(default_factory=list)
    node_labels: list[str] = field(default_factory=lambda: list(NODE_LABELS))
    fields_from_labels: dict[str, str] = field(default_factory=dict)
    value_field: str = "value"
    event: str
    set: dict[str, FieldValue] = field(default_factory=dict)
    lookup: str | None = None


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class When(Plain):
    """Which events an attribution applies to: kind(s), exact field values, a regex on the text."""

    kind: list[str]
    fields: dict[str, FieldValue | list[FieldValue]] = field(default_factory=dict)
    unless: dict[str, FieldValue | list[FieldValue]] = field(default_factory=dict)
    has: list[str] = field(default_factory=list)
    text: str | None = None
    source: list[SourceKind] | None = None


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class RecoverySpec(Plain):
    """A later event on the same node that shows the condition cleared (a reconnect, a port ACTIVE
    again). It counts only when the job is seen progressing after it (verdict.py)."""

    kind: list[str]
    text: str
    within_s: int = 300
    # Fields that must be equal in the event and its recovery (a port coming back clears that port only).
    same: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class AttributeSpec(Plain):
    """How a rule classifies the events it applies to: role, taxonomy, locus, precedence, action."""

    when: When
    role: Role
    symptom: str | None = None
    domain: str | None = None
    subdomain: str | None = None
    locus: Literal["node", "gpu", "port", "nic", "filesystem", "job"] = "node"
    precedence: int = 50
    explains: list[str] = field(default_factory=list)
    explains_on_node: list[str] = field(default_factory=list)
    action: Action = "INVESTIGATE"
    summary: str = "{title} on {nodes}"
    # stop: the job cannot outlive this cause (progress after it clears it); slow: a straggler the
    # job keeps running under until a time limit, so progress after it says nothing.
    effect: Literal["stop", "slow"] = "stop"
    # How long the cause may precede its first evidence: a scheduler notices a lost node only after
    # its heartbeat timeout (Slurm SlurmdTimeout, Kubernetes node-monitor grace).
    lag_s: int = 0
    # Not a cause if the same node logs a matching recovery this soon after (a Lustre reconnect, a link
    # ACTIVE again) and the job then went on progressing.
    unless_recovered: RecoverySpec | None = None


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class CaseSpec(Plain):
    """A rule's own test: a tiny timeline and what the rule must (not) do with it."""

    name: str
    expect: Literal["fire", "no_fire", "known_miss"]
    logs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    events: dict[str, str] = field(default_factory=dict)
    attempt: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, FieldValue] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class Rule(Plain):
    """One rule: what it extracts from logs or metrics, how it classifies events, and its own cases."""

    id: str
    title: str
    status: Status
    description: str | None = None
    runbook: str | None = None
    references: list[str] = field(default_factory=list)
    emitter: str | None = None  # the program(s) and versions whose source the patterns were checked against
    extract: ExtractSpec | None = None
    metric: MetricSpec | None = None
    attribute: AttributeSpec | None = None
    analyzer: str | None = None
    cases: list[CaseSpec] = field(default_factory=list)

    path: str = field(default="", metadata={"exclude": True})
    line: int = field(default=0, metadata={"exclude": True})

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


# Every class, by name, each after the classes its fields hold.
CLASSES: dict[str, type[Plain]] = {
    cls.__name__: cls for cls in (ExtractSpec, MetricSpec, When, RecoverySpec, AttributeSpec, CaseSpec, Rule)
}
