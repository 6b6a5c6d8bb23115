"""The data that flows through hypocenter: sources → Event → Diagnosis, scoped by AttemptContext.

Connectors produce sources (sources.py: text streams, metric series, scheduler records; an
observation is one line, sample or record of them), the extractor turns candidate observations
into `Event`s, the verdict turns events into a `Diagnosis`. These models are the contracts of docs/design.md (contract 1
for `AttemptContext`, contract 3 for `Diagnosis`); they must only ever be extended compatibly.
Nothing in this module reads files or knows about a connector.

They are plain slotted dataclasses (modelbase.Plain: `model_dump`, `model_copy`), so that
`hypocenter analyze` never imports pydantic; documents are validated by their pydantic twins in
model_schema.py (`AttemptContext.model_validate(doc)` does that, and hands back the plain class),
which also give the published JSON Schema. model_schema.py derives each twin from the class here, so a
field is declared once; tests/test_model_schema.py checks that they agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

from hypocenter import limits
from hypocenter.modelbase import (
    ATTEMPT_MAX,
    COMPONENT_KINDS,
    SCHEMA_ID,
    TAXONOMY,
    TERMINAL_OK,
    Action,
    CoverageStatus,
    FieldValue,
    Outcome,
    Plain,
    QualityLevel,
    Role,
    SourceKind,
    check_state,
    count_ranks,
    isoformat,
    json_time,
    omit_false,
    omit_none,
    parse_rank_ranges,
    plain_from,
    utc,
)


class _Model(Plain):
    __slots__ = ()

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """Validate a document with this class's pydantic twin (model_schema.py): pydantic's coercions,
        checks and ValidationError; the result comes back as this plain class."""
        from hypocenter import model_schema

        twin = getattr(model_schema, cls.__name__)
        result: Self = plain_from(twin.model_validate(obj), CLASSES)
        return result


# ---------------------------------------------------------------------------------------------
# Contract 1: the attempt scope


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class Workload(_Model):
    """Which workload and attempt: its scheduler's id, name, scheduler and cluster."""

    id: str
    attempt: int = 0
    name: str | None = None
    scheduler: str | None = None
    cluster: str | None = None

    # The __post_init__ checks of these three classes are their pydantic twins' validators (model_schema.py),
    # without the type coercions: a connector or the server that builds a scope directly gets the same
    # normalised, checked scope that a validated document gives.
    def __post_init__(self) -> None:
        if isinstance(self.id, int):
            object.__setattr__(self, "id", str(self.id))
        if not 0 <= self.attempt <= ATTEMPT_MAX:
            raise ValueError(f"workload.attempt {self.attempt} is not a whole number from 0 to 2^31-1")


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class Window(_Model):
    """The attempt's time window (UTC)."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", utc(self.start))
        object.__setattr__(self, "end", utc(self.end))
        if self.end < self.start:
            raise ValueError("window.end is before window.start")


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class AttemptContext(_Model):
    """The scope of one workload attempt (attempt.yaml, or a scheduler connector)."""

    workload: Workload
    window: Window
    state: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: dict[str, str | int | list[int]] = field(default_factory=dict)
    timezone: str = "UTC"
    gpus_per_node: int | None = None  # optional: what the scheduler allocated (GPU cost, engine/cost.py)

    def __post_init__(self) -> None:
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError("gpus_per_node must be at least 1")
        if isinstance(self.state, str):
            object.__setattr__(self, "state", self.state.strip().upper())
            check_state(self.state)
        # An allocation names a node once; a repeat (a hand-written list, a merged hostlist) is the same node.
        nodes = list(dict.fromkeys(self.nodes))
        limits.check_count("nodes of the attempt", len(nodes), "max_nodes_per_attempt")
        object.__setattr__(self, "nodes", nodes)
        total = 0
        for node, spec in self.ranks.items():
            if nodes and node not in nodes:
                raise ValueError(f"ranks: node {node!r} is not in nodes")
            total += count_ranks(spec)
        limits.check_count("ranks of the attempt's rank map", total, "max_ranks_per_attempt")

    def rank_nodes(self) -> dict[int, str]:
        """Global rank → node, from the optional rank map."""
        out: dict[int, str] = {}
        for node, spec in self.ranks.items():
            for rank in parse_rank_ranges(spec):
                out[rank] = node
        return out

    @property
    def completed(self) -> bool:
        return self.state in TERMINAL_OK


# A well-formed attempt document, taken without pydantic (`hypocenter analyze` reads one per run).
# Only what is plainly of its field's type is taken here, where pydantic would keep the value as it
# is; anything else (a wrong type, a value pydantic coerces, an unknown key, a failed check) is left
# to AttemptContext.model_validate, so messages and coercions stay pydantic's alone.
_STAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:\d\d)?")
_WORKLOAD_KEYS = frozenset({"id", "attempt", "name", "scheduler", "cluster"})
_CONTEXT_KEYS = frozenset(
    {"workload", "window", "state", "exit_code", "reason", "nodes", "ranks", "timezone", "gpus_per_node"}
)


def _text(v: object) -> bool:
    return type(v) is str or v is None


def _stamp(v: object) -> datetime | None:
    if type(v) is datetime:
        return v
    if type(v) is str and _STAMP.fullmatch(v):
        return datetime.fromisoformat(v)
    return None


def plain_context(doc: Mapping[str, Any]) -> AttemptContext | None:
    """The AttemptContext a well-formed attempt document (attempt.yaml as loaded) validates to, or None
    when the document needs pydantic's judgement: `AttemptContext.model_validate(doc)` then."""
    try:
        return _plain_context(doc)
    except Exception:  # a failed check, a limit: pydantic's validation says it its own way
        return None


def _plain_context(doc: Mapping[str, Any]) -> AttemptContext | None:
    w, win = doc.get("workload"), doc.get("window")
    if not (
        doc.keys() <= _CONTEXT_KEYS
        and isinstance(w, dict)
        and isinstance(win, dict)
        and w.keys() <= _WORKLOAD_KEYS
        and win.keys() == {"start", "end"}
    ):
        return None
    ident, attempt = w.get("id"), w.get("attempt", 0)
    if not (type(ident) is str or type(ident) is int) or type(attempt) is not int:
        return None
    if not all(_text(w.get(k)) for k in ("name", "scheduler", "cluster")):
        return None
    start, end = _stamp(win["start"]), _stamp(win["end"])
    if start is None or end is None:
        return None
    state, exit_code, zone = doc.get("state"), doc.get("exit_code"), doc.get("timezone", "UTC")
    if not (
        _text(state)
        and _text(doc.get("reason"))
        and type(zone) is str
        and (exit_code is None or type(exit_code) is int)
    ):
        return None
    gpus = doc.get("gpus_per_node")
    if not (gpus is None or type(gpus) is int):
        return None
    nodes, ranks = doc.get("nodes", []), doc.get("ranks", {})
    if not (type(nodes) is list and all(type(n) is str for n in nodes) and isinstance(ranks, dict)):
        return None
    plain_ranks: dict[str, str | int | list[int]] = {}
    for node, spec in ranks.items():
        if type(spec) is list and all(type(r) is int for r in spec):
            spec = list(spec)
        elif not (type(spec) is str or type(spec) is int):
            return None
        if type(node) is not str:
            return None
        plain_ranks[node] = spec
    # The classes' own checks (window order, state, nodes once each, ranks on them, the limits) raise
    # here, and `plain_context` leaves the document to pydantic.
    return AttemptContext(
        workload=Workload(
            id=str(ident),
            attempt=attempt,
            name=w.get("name"),
            scheduler=w.get("scheduler"),
            cluster=w.get("cluster"),
        ),
        window=Window(start=start, end=end),
        state=state,
        exit_code=exit_code,
        reason=doc.get("reason"),
        nodes=nodes,
        ranks=plain_ranks,
        timezone=zone,
        gpus_per_node=gpus,
    )


# ---------------------------------------------------------------------------------------------
# Observations and events


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Event(_Model):
    """A typed fact extracted from an observation (a line, sample or record): an Xid, an NCCL error, a watchdog timeout, …"""

    kind: str
    rule: str
    time: datetime | None
    approx: bool = False
    inherited: bool = False  # time taken from an earlier line of the stream: a lower bound
    time_max: datetime | None = None  # for inherited times: the next stamp in the stream, an upper bound
    node: str | None
    rank: int | None = None
    source: SourceKind
    ref: str
    text: str
    fields: dict[str, FieldValue] = field(default_factory=dict)

    def sort_key(self) -> tuple[str, str, str, str, str]:
        """A total order that does not depend on arrival order."""
        t = isoformat(self.time) or "~"
        return (t, self.node or "", self.ref, self.kind, self.rule)

    def stream_position(self) -> tuple[str, int]:
        """The file and line number its `ref` (`path:line`) names; line 0 when it names none."""
        path, _, line = self.ref.rpartition(":")
        return path, int(line) if line.isdigit() else 0

    def stream_order(self) -> tuple[str, str, int]:
        """Stream order: the stamp, then the file and line (unstamped lines of one file keep their order)."""
        return (isoformat(self.time) or "~", *self.stream_position())


# ---------------------------------------------------------------------------------------------
# Contract 3: the diagnosis


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class AttemptRef(_Model):
    """The attempt a diagnosis is about."""

    workload_id: str
    attempt: int
    scheduler: str | None
    cluster: str | None
    window: dict[str, str | None]
    nodes: list[str]


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Component(_Model):
    """A part of a node named as a cause: a GPU, an HCA port, a NIC, a filesystem."""

    node: str
    kind: str
    id: str


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class RootCause(_Model):
    """A cause: where in the taxonomy, which rule, on which nodes and components, and what to do."""

    domain: str
    subdomain: str
    rule: str
    summary: str
    nodes: list[str]
    components: list[Component] = field(default_factory=list)
    first_seen: str | None
    action: Action


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Symptom(_Model):
    """Events of one kind that a cause explains."""

    kind: str
    rule: str
    count: int
    nodes: list[str]
    first_seen: str | None
    last_seen: str | None
    example: str


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Evidence(_Model):
    """One line a diagnosis rests on, and its role."""

    time: str | None
    node: str | None
    source: str
    ref: str
    text: str
    role: Role
    rule: str
    # A line without its own stamp: `time` is the stamp before it in its stream (a lower bound) and
    # `time_max` the stamp after it, when there is one; the line happened in between.
    # Both absent from the JSON for a stamped line: contract 3's evidence keys are unchanged there.
    inherited: bool = field(default=False, metadata={"exclude_if": omit_false})
    time_max: str | None = field(default=None, metadata={"exclude_if": omit_none})


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Quality(_Model):
    """How far the diagnosis can be trusted, and why."""

    level: QualityLevel
    reasons: list[str]


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Coverage(_Model):
    """What one source gave the analysis: its status and how many observations."""

    connector: str
    source: str
    status: CoverageStatus
    observations: int
    reason: str | None = None


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class EngineInfo(_Model):
    """The engine and ruleset that made the diagnosis."""

    version: str
    ruleset: str


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class FirstFailure(_Model):
    """When no cause is attributed: the first process seen to fail, where, how, and what to check next."""

    rank: int | None
    node: str | None
    exit_code: int | None
    signal: str | None
    time: str | None
    ref: str
    text: str
    next_step: str
    action: Action


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class NextStep(_Model):
    """What to do next: the action, and for an unattributed diagnosis what to look at (engine/next_step.py)."""

    action: Action
    look_at: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class CostFigure(_Model):
    """One figure of an attempt's cost: its value (null when unknown, never guessed as 0), how it was
    obtained, its uncertainty (±, same unit) and the line it rests on."""

    value: float | None
    uncertainty: float | None
    method: str
    ref: str | None = None


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Cost(_Model):
    """What this attempt's failure cost (engine/cost.py): GPUs in scope and the time they lost.

    gpu_hours_lost = gpus x (lost_work_s + time_to_detect_s + restart_overhead_s) / 3600 over the parts
    that are known; `unknown` names the parts left out (the figure is then a lower bound), and it is
    null when the GPUs are unknown. `startup_s` is this attempt's own start → first progress: the
    restart overhead of the attempt before it, which fleet roll-ups join to that attempt."""

    gpus: CostFigure
    lost_work_s: CostFigure
    time_to_detect_s: CostFigure
    restart_overhead_s: CostFigure
    startup_s: CostFigure
    gpu_hours_lost: float | None
    gpu_hours_uncertainty: float | None
    unknown: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class Diagnosis(_Model):
    """The verdict on one attempt. Field order is the order of contract 3 and of the JSON output."""

    _by_alias: ClassVar[bool] = True

    schema_: str = field(default=SCHEMA_ID, metadata={"alias": "schema"})
    id: str
    attempt: AttemptRef
    terminal_state: str | None
    outcome: Outcome
    root_cause: RootCause | None
    candidates: list[RootCause] = field(default_factory=list)
    affected_nodes: list[str]
    symptoms: list[Symptom]
    evidence: list[Evidence]
    quality: Quality
    next_step: NextStep | None = None  # added in v1 (compatible): absent from diagnoses stored before it
    coverage: list[Coverage]
    engine: EngineInfo
    # Unattributed only: localises the failure without a cause. Absent (not null) otherwise.
    first_failure: FirstFailure | None = field(default=None, metadata={"exclude_if": omit_none})
    # Added in v1 (compatible): what the attempt's failure cost (nothing, for a completed one: its
    # startup is still the restart overhead of a failed attempt before it). Absent from diagnoses
    # stored before it.
    cost: Cost | None = field(default=None, metadata={"exclude_if": omit_none})

    def to_json(self) -> str:
        """The canonical, byte-stable JSON rendering (what pydantic's model_dump_json(indent=2) wrote:
        UTF-8 as is, control characters escaped)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2, ensure_ascii=False) + "\n"


# Every class, in dependency order (a class after those it holds): model_schema.py derives a twin of each.
CLASSES: dict[str, type[Plain]] = {
    cls.__name__: cls
    for cls in (
        Workload,
        Window,
        AttemptContext,
        Event,
        AttemptRef,
        Component,
        RootCause,
        Symptom,
        Evidence,
        Quality,
        Coverage,
        EngineInfo,
        FirstFailure,
        NextStep,
        CostFigure,
        Cost,
        Diagnosis,
    )
}

__all__ = [
    "COMPONENT_KINDS",
    "SCHEMA_ID",
    "TAXONOMY",
    "TERMINAL_OK",
    "Action",
    "AttemptContext",
    "AttemptRef",
    "Component",
    "Cost",
    "CostFigure",
    "Coverage",
    "CoverageStatus",
    "Diagnosis",
    "EngineInfo",
    "Event",
    "Evidence",
    "FieldValue",
    "FirstFailure",
    "NextStep",
    "Outcome",
    "Quality",
    "QualityLevel",
    "Role",
    "RootCause",
    "SourceKind",
    "Symptom",
    "Window",
    "Workload",
    "count_ranks",
    "isoformat",
    "json_time",
    "parse_rank_ranges",
    "plain_context",
    "utc",
]
