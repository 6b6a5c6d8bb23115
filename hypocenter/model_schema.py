"""The pydantic twins of model.py's plain classes: validation of documents, and the JSON Schema.

model.py's classes are what the pipeline passes around (no pydantic on `hypocenter analyze`'s path);
each class here has the same name, fields, defaults and order (tests/test_model_schema.py proves it),
and adds what only pydantic gives: validation and coercion of an attempt document (attempt.yaml, an
API body, a stored scope) with pydantic's messages, and the published JSON Schema of the diagnosis.
`model.AttemptContext.model_validate(doc)` validates here and hands back the plain class.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hypocenter import limits
from hypocenter.modelbase import (
    ATTEMPT_MAX,
    SCHEMA_ID,
    Action,
    CoverageStatus,
    FieldValue,
    Outcome,
    QualityLevel,
    Role,
    SourceKind,
    check_state,
    count_ranks,
    utc,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------------
# Contract 1: the attempt scope


class Workload(_Strict):
    id: str
    attempt: int = Field(0, ge=0, le=ATTEMPT_MAX)
    name: str | None = None
    scheduler: str | None = None
    cluster: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v


class Window(_Strict):
    start: datetime
    end: datetime

    @field_validator("start", "end")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return utc(v)

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end < self.start:
            raise ValueError("window.end is before window.start")
        return self


class AttemptContext(_Strict):
    """The scope of one workload attempt (attempt.yaml, or a scheduler connector)."""

    workload: Workload
    window: Window
    state: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    nodes: list[str] = Field(default_factory=list)
    ranks: dict[str, str | int | list[int]] = Field(default_factory=dict)
    timezone: str = "UTC"
    gpus_per_node: int | None = Field(default=None, ge=1)  # what the scheduler allocated (GPU cost)

    @field_validator("state")
    @classmethod
    def _upper_state(cls, v: str | None) -> str | None:
        if isinstance(v, str):
            v = v.strip().upper()
            check_state(v)
        return v

    @field_validator("nodes")
    @classmethod
    def _once_each(cls, v: list[str]) -> list[str]:
        # An allocation names a node once; a repeat (a hand-written list, a merged hostlist) is the same node.
        nodes = list(dict.fromkeys(v))
        limits.check_count("nodes of the attempt", len(nodes), "max_nodes_per_attempt")
        return nodes

    @model_validator(mode="after")
    def _ranks_on_known_nodes(self) -> AttemptContext:
        total = 0
        for node, spec in self.ranks.items():
            if self.nodes and node not in self.nodes:
                raise ValueError(f"ranks: node {node!r} is not in nodes")
            total += count_ranks(spec)
        limits.check_count("ranks of the attempt's rank map", total, "max_ranks_per_attempt")
        return self


# ---------------------------------------------------------------------------------------------
# Observations and events


class Event(BaseModel):
    """A typed fact extracted from an observation (a line, sample or record): an Xid, an NCCL error, a watchdog timeout, …"""

    model_config = ConfigDict(extra="forbid")

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
    fields: dict[str, FieldValue] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Contract 3: the diagnosis


class AttemptRef(BaseModel):
    workload_id: str
    attempt: int
    scheduler: str | None
    cluster: str | None
    window: dict[str, str | None]
    nodes: list[str]


class Component(BaseModel):
    node: str
    kind: str
    id: str


class RootCause(BaseModel):
    domain: str
    subdomain: str
    rule: str
    summary: str
    nodes: list[str]
    components: list[Component] = Field(default_factory=list)
    first_seen: str | None
    action: Action


class Symptom(BaseModel):
    kind: str
    rule: str
    count: int
    nodes: list[str]
    first_seen: str | None
    last_seen: str | None
    example: str


class Evidence(BaseModel):
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
    inherited: bool = Field(default=False, exclude_if=lambda v: not v)
    time_max: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Quality(BaseModel):
    level: QualityLevel
    reasons: list[str]


class Coverage(BaseModel):
    connector: str
    source: str
    status: CoverageStatus
    observations: int
    reason: str | None = None


class EngineInfo(BaseModel):
    version: str
    ruleset: str


class FirstFailure(BaseModel):
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


class NextStep(BaseModel):
    """What to do next: the action, and for an unattributed diagnosis what to look at (engine/next_step.py)."""

    action: Action
    look_at: list[str] = Field(default_factory=list)


class CostFigure(BaseModel):
    """One figure of an attempt's cost: its value (null when unknown, never guessed as 0), how it was
    obtained, its uncertainty (±, same unit) and the line it rests on."""

    value: float | None
    uncertainty: float | None
    method: str
    ref: str | None = None


class Cost(BaseModel):
    gpus: CostFigure
    lost_work_s: CostFigure
    time_to_detect_s: CostFigure
    restart_overhead_s: CostFigure
    startup_s: CostFigure
    gpu_hours_lost: float | None
    gpu_hours_uncertainty: float | None
    unknown: list[str] = Field(default_factory=list)


class Diagnosis(BaseModel):
    """The verdict on one attempt. Field order is the order of contract 3 and of the JSON output."""

    schema_: str = Field(default=SCHEMA_ID, alias="schema")
    id: str
    attempt: AttemptRef
    terminal_state: str | None
    outcome: Outcome
    root_cause: RootCause | None
    candidates: list[RootCause] = Field(default_factory=list)
    affected_nodes: list[str]
    symptoms: list[Symptom]
    evidence: list[Evidence]
    quality: Quality
    next_step: NextStep | None = None  # added in v1 (compatible): absent from diagnoses stored before it
    coverage: list[Coverage]
    engine: EngineInfo
    # Unattributed only: localises the failure without a cause. Absent (not null) otherwise.
    first_failure: FirstFailure | None = Field(default=None, exclude_if=lambda v: v is None)
    # Added in v1 (compatible): what the attempt's failure cost (nothing, for a completed one: its
    # startup is still the restart overhead of a failed attempt before it). Absent from diagnoses
    # stored before it.
    cost: Cost | None = Field(default=None, exclude_if=lambda v: v is None)

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
