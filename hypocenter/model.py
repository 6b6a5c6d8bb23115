"""The data that flows through hypocenter: sources → Event → Diagnosis, scoped by AttemptContext.

Connectors produce sources (sources.py: text streams, metric series, scheduler records; an
observation is one line, sample or record of them), the extractor turns candidate observations
into `Event`s, the verdict turns events into a `Diagnosis`. These models are the contracts of docs/design.md (contract 1
for `AttemptContext`, contract 3 for `Diagnosis`); they must only ever be extended compatibly.
Nothing in this module reads files or knows about a connector.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hypocenter import limits

SCHEMA_ID = "hypocenter.diagnosis/v1"

SourceKind = Literal["kernel", "app", "scheduler", "metric"]
Outcome = Literal["attributed", "ambiguous", "unattributed", "not_failed"]
Role = Literal["root_cause", "symptom", "context"]
QualityLevel = Literal["high", "medium", "low"]
Action = Literal[
    "RESTART",
    "RESET_GPU",
    "REBOOT_NODE",
    "DRAIN_NODE",
    "CHECK_LINK",
    "FIX_CODE",
    "FIX_CONFIG",
    "ADD_RESOURCES",
    "INVESTIGATE",
    "NONE",
]

# The taxonomy of docs/design.md. More subdomains may be added; these must exist.
TAXONOMY: dict[str, tuple[str, ...]] = {
    "hardware": ("gpu", "gpu_memory", "gpu_firmware", "nvlink", "host"),
    "network": ("fabric", "nic"),
    "storage": ("filesystem",),
    "software": ("user_code", "configuration", "hang"),
    "resource": ("gpu_oom", "host_oom", "time_limit"),
    "external": ("preemption", "cancellation", "maintenance"),
}

TERMINAL_OK = frozenset({"COMPLETED", "SUCCEEDED", "SUCCESS", "FINISHED"})


def utc(dt: datetime) -> datetime:
    """Return `dt` as an aware UTC datetime (naive values are taken to be UTC)."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


def isoformat(dt: datetime | None) -> str | None:
    """Render a time the one way diagnoses render times: UTC, microseconds only when present, `Z`."""
    if dt is None:
        return None
    text = utc(dt).isoformat()
    return text.replace("+00:00", "Z")


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def count_ranks(spec: str | int | list[int]) -> int:
    """How many ranks a rank spec names (at most; overlaps counted twice), without expanding it.
    ValueError names a malformed spec."""
    if isinstance(spec, int):
        return 1
    if isinstance(spec, list):
        return len(spec)
    total = 0
    for part in str(spec).split(","):
        if not part.strip():
            continue
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"invalid rank range {part.strip()[:80]!r} (expected e.g. '0-7' or '0-3,8-11')")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"invalid rank range {part.strip()[:80]!r}: end is before start")
        total += hi - lo + 1
    return total


def parse_rank_ranges(spec: str | int | list[int]) -> list[int]:
    """Expand a rank spec such as ``"0-7"``, ``"0-3,8-11"``, ``5`` or ``[0, 1]`` into a sorted list.
    A spec naming more than max_ranks_per_attempt ranks raises LimitExceeded before anything is expanded."""
    limits.check_count(f"rank map entry {str(spec)[:80]!r} names ranks", count_ranks(spec), "max_ranks_per_attempt")
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, list):
        return sorted(int(r) for r in spec)
    ranks: set[int] = set()
    for part in str(spec).split(","):
        if not part.strip():
            continue
        m = _RANGE.match(part)
        assert m is not None  # count_ranks checked every part
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        ranks.update(range(lo, hi + 1))
    return sorted(ranks)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------------
# Contract 1: the attempt scope


class Workload(_Strict):
    id: str
    attempt: int = 0
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

    @field_validator("state")
    @classmethod
    def _upper_state(cls, v: str | None) -> str | None:
        return v.strip().upper() if isinstance(v, str) else v

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


# ---------------------------------------------------------------------------------------------
# Observations and events


FieldValue = str | int | float | None


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


class AttemptRef(BaseModel):
    workload_id: str
    attempt: int
    scheduler: str | None
    cluster: str | None
    window: dict[str, str | None]
    nodes: list[str]


# One vocabulary of component kinds, for the engine's diagnoses and the benchmark's truth alike:
# a GPU (id: its PCI address, or gpuN), an HCA port (mlx5_N/P, or the netdev of a one-port NIC), a NIC
# as a device (mlx5_N, or its PCI address), a filesystem (NFS server, Lustre target, or mount path).
COMPONENT_KINDS = ("gpu", "port", "nic", "filesystem")


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
    status: Literal["ok", "partial", "failed", "skipped", "missing"]
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

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    def to_json(self) -> str:
        """The canonical, byte-stable JSON rendering."""
        return self.model_dump_json(by_alias=True, indent=2) + "\n"
