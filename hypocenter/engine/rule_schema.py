"""The pydantic twins of engine/rules.py's plain rule classes: what a rule file is checked against.

A rule file is validated here (field by field, with `extra="forbid"` and the pattern checks of
engine/matching.py) and the validated rules are handed to the engine as rules.py's plain classes, so
the cached catalog (engine/rulecache.py) unpickles without pydantic. Each class here has the same name,
fields, defaults and order as its plain class (tests/test_model_schema.py proves it).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hypocenter.engine.matching import pattern_problem
from hypocenter.modelbase import TAXONOMY, Action, FieldValue, Role, SourceKind
from hypocenter.names import NODE_LABELS

Status = Literal["experimental", "test", "stable"]
_LINE_SOURCES: tuple[SourceKind, ...] = ("kernel", "app", "scheduler")


def _as_list(v: Any) -> Any:
    """YAML convenience: `kind: xid` means `kind: [xid]`."""
    return [v] if isinstance(v, str) else v


def _regex(v: str, info: ValidationInfo) -> str:
    # linear-time matching (engine/matching.py); the loader says whether the file is the built-in catalog
    problem = pattern_problem(v, builtin=bool(info.context and info.context.get("builtin")))
    if problem is not None:
        raise ValueError(problem)
    return v


Regex = Annotated[str, AfterValidator(_regex)]
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*[a-z0-9]$")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first validation


class ExtractSpec(_Spec):
    """Turn log lines into events. `tokens` are literals at least one of which must occur in
    every line the pattern can match: they build the prefilter."""

    source: list[SourceKind] = Field(default_factory=lambda: list(_LINE_SOURCES))
    tokens: list[str] = Field(min_length=1)
    pattern: Regex
    event: str
    lines_before: int = Field(default=0, ge=0, le=20)
    lines_after: int = Field(default=0, ge=0, le=20)
    ints: list[str] = Field(default_factory=list)
    set: dict[str, FieldValue] = Field(default_factory=dict)
    lookup: str | None = None
    lookup_key: str = "code"

    @field_validator("source", mode="before")
    @classmethod
    def _any_source(cls, v: Any) -> Any:
        return list(_LINE_SOURCES) if v == "any" else _as_list(v)

    @field_validator("tokens")
    @classmethod
    def _nonblank(cls, v: list[str]) -> list[str]:
        for t in v:
            if len(t.strip()) < 2:
                raise ValueError(f"token {t!r} is too short to be a useful prefilter literal")
        return v


class MetricSpec(_Spec):
    """Turn metric series into events: one event per series, at the first sample that meets the condition."""

    metrics: list[str] = Field(min_length=1)
    condition: Literal["increase", "above", "below", "bits_any", "equals_any", "changed_to_nonzero"]
    threshold: float = 0.0
    bits: int = 0
    values: list[float] = Field(default_factory=list)
    node_labels: list[str] = Field(default_factory=lambda: list(NODE_LABELS))
    fields_from_labels: dict[str, str] = Field(default_factory=dict)
    value_field: str = "value"
    event: str
    set: dict[str, FieldValue] = Field(default_factory=dict)
    lookup: str | None = None


class When(_Spec):
    """Which events an attribution applies to: kind(s), exact field values, a regex on the text."""

    kind: Annotated[list[str], BeforeValidator(_as_list)]
    fields: dict[str, FieldValue | list[FieldValue]] = Field(default_factory=dict)
    unless: dict[str, FieldValue | list[FieldValue]] = Field(default_factory=dict)
    has: list[str] = Field(default_factory=list)
    text: Regex | None = None
    source: Annotated[list[SourceKind] | None, BeforeValidator(_as_list)] = None


class RecoverySpec(_Spec):
    """A later event on the same node that shows the condition cleared (a reconnect, a port ACTIVE
    again). It counts only when the job is seen progressing after it (verdict.py)."""

    kind: Annotated[list[str], BeforeValidator(_as_list)]
    text: Regex
    within_s: int = Field(default=300, ge=1)
    # Fields that must be equal in the event and its recovery (a port coming back clears that port only).
    same: list[str] = Field(default_factory=list)


class AttributeSpec(_Spec):
    when: When
    role: Role
    symptom: str | None = None
    domain: str | None = None
    subdomain: str | None = None
    locus: Literal["node", "gpu", "port", "nic", "filesystem", "job"] = "node"
    precedence: int = Field(default=50, ge=0, le=100)
    explains: list[str] = Field(default_factory=list)
    explains_on_node: list[str] = Field(default_factory=list)
    action: Action = "INVESTIGATE"
    summary: str = "{title} on {nodes}"
    # stop: the job cannot outlive this cause (progress after it clears it); slow: a straggler the
    # job keeps running under until a time limit, so progress after it says nothing.
    effect: Literal["stop", "slow"] = "stop"
    # How long the cause may precede its first evidence: a scheduler notices a lost node only after
    # its heartbeat timeout (Slurm SlurmdTimeout, Kubernetes node-monitor grace).
    lag_s: int = Field(default=0, ge=0, le=3600)
    # Not a cause if the same node logs a matching recovery this soon after (a Lustre reconnect, a link
    # ACTIVE again) and the job then went on progressing.
    unless_recovered: RecoverySpec | None = None

    @model_validator(mode="after")
    def _classified(self) -> AttributeSpec:
        if self.role == "root_cause":
            if self.domain not in TAXONOMY:
                raise ValueError(f"domain {self.domain!r} is not one of {', '.join(TAXONOMY)}")
            if self.subdomain not in TAXONOMY[self.domain]:
                raise ValueError(
                    f"subdomain {self.subdomain!r} is not in domain {self.domain} "
                    f"({', '.join(TAXONOMY[self.domain])})"
                )
        for pat in [*self.explains, *self.explains_on_node]:
            dom = pat.split("/", 1)[0]
            if dom != "*" and dom not in TAXONOMY:
                raise ValueError(f"explains: {pat!r} does not name a domain ({', '.join(TAXONOMY)})")
        return self


class CaseSpec(_Spec):
    """A rule's own test: a tiny timeline and what the rule must (not) do with it."""

    name: str
    expect: Literal["fire", "no_fire", "known_miss"]
    logs: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, str] = Field(default_factory=dict)
    events: dict[str, str] = Field(default_factory=dict)
    attempt: dict[str, Any] = Field(default_factory=dict)
    fields: dict[str, FieldValue] = Field(default_factory=dict)
    verdict: dict[str, Any] = Field(default_factory=dict)
    note: str | None = None


class Rule(_Spec):
    id: str
    title: str
    status: Status
    description: str | None = None
    runbook: str | None = None
    references: list[str] = Field(default_factory=list)
    emitter: str | None = None  # the program(s) and versions whose source the patterns were checked against
    extract: ExtractSpec | None = None
    metric: MetricSpec | None = None
    attribute: AttributeSpec | None = None
    analyzer: str | None = None
    cases: list[CaseSpec] = Field(default_factory=list)

    path: str = Field(default="", exclude=True)
    line: int = Field(default=0, exclude=True)

    @field_validator("id")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"rule id {v!r} must be lowercase letters, digits and dashes")
        return v

    @model_validator(mode="after")
    def _does_something(self) -> Rule:
        if not (self.extract or self.metric or self.attribute or self.analyzer):
            raise ValueError("a rule needs at least one of extract, metric, attribute, analyzer")
        if self.analyzer and not self.attribute:
            raise ValueError("an analyzer rule needs an attribute block (its domain, subdomain, action …)")
        return self


class RuleFile(_Spec):
    rules: list[dict[str, Any]]
