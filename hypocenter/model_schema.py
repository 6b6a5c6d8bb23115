"""The pydantic twins of model.py's plain classes: validation of documents, and the JSON Schema.

model.py's classes are the one source of every field, type, default and order (no pydantic on
`hypocenter analyze`'s path); this module builds a pydantic model of the same name from each of them
when it is imported (modelbase.twin) and adds only what pydantic gives: the checks and coercions of an
attempt document (attempt.yaml, an API body, a stored scope) with pydantic's messages, and the
published JSON Schema of the diagnosis (`hypocenter schema`). A new field is one edit in model.py,
plus an entry in `_CHECKS` or `_VALIDATORS` if it needs a check.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hypocenter import limits, model
from hypocenter.modelbase import ATTEMPT_MAX, check_state, count_ranks, twin, utc


class _Strict(BaseModel):
    """An input document (contract 1): unknown keys refused, the result frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


# Each twin's base (its pydantic config); BaseModel for the others (the parts of a diagnosis).
_BASES: dict[str, type[BaseModel]] = {
    "Workload": _Strict,
    "Window": _Strict,
    "AttemptContext": _Strict,
    "Event": _Closed,
    "Diagnosis": _Aliased,
}
# The parts of a diagnosis whose docstring the published schema has never carried as a description:
# taking it now would change `hypocenter schema`'s bytes (tests/test_model_schema.py pins them).
_UNDESCRIBED = frozenset(
    {
        "AttemptRef",
        "Component",
        "RootCause",
        "Symptom",
        "Evidence",
        "Quality",
        "Coverage",
        "EngineInfo",
        "Cost",
    }
)


def _id_as_text(cls: type, v: object) -> object:
    return str(v) if isinstance(v, int) else v


def _aware(cls: type, v: datetime) -> datetime:
    return utc(v)


def _ordered(self: Any) -> Any:
    if self.end < self.start:
        raise ValueError("window.end is before window.start")
    return self


def _upper_state(cls: type, v: str | None) -> str | None:
    if isinstance(v, str):
        v = v.strip().upper()
        check_state(v)
    return v


def _once_each(cls: type, v: list[str]) -> list[str]:
    # An allocation names a node once; a repeat (a hand-written list, a merged hostlist) is the same node.
    nodes = list(dict.fromkeys(v))
    limits.check_count("nodes of the attempt", len(nodes), "max_nodes_per_attempt")
    return nodes


def _ranks_on_known_nodes(self: Any) -> Any:
    total = 0
    for node, spec in self.ranks.items():
        if self.nodes and node not in self.nodes:
            raise ValueError(f"ranks: node {node!r} is not in nodes")
        total += count_ranks(spec)
    limits.check_count("ranks of the attempt's rank map", total, "max_ranks_per_attempt")
    return self


# What validation adds to a plain class's field: pydantic metadata on its value (when not None).
# model.py's __post_init__ checks are these, for scopes built directly.
_CHECKS: dict[str, dict[str, tuple[Any, ...]]] = {
    "Workload": {"attempt": (Field(ge=0, le=ATTEMPT_MAX),)},
    "AttemptContext": {"gpus_per_node": (Field(ge=1),)},  # what the scheduler allocated (GPU cost)
}
# Checks on a field before its type (mode="before"), on its value, or on a validated model (mode="after").
_VALIDATORS: dict[str, dict[str, Any]] = {
    "Workload": {"_id_as_text": field_validator("id", mode="before")(_id_as_text)},
    "Window": {
        "_aware": field_validator("start", "end")(_aware),
        "_ordered": model_validator(mode="after")(_ordered),
    },
    "AttemptContext": {
        "_upper_state": field_validator("state")(_upper_state),
        "_once_each": field_validator("nodes")(_once_each),
        "_ranks_on_known_nodes": model_validator(mode="after")(_ranks_on_known_nodes),
    },
}


def _derive() -> dict[str, type[BaseModel]]:
    twins: dict[type, type[BaseModel]] = {}
    for name, plain in model.CLASSES.items():  # in dependency order: a class after those it holds
        twins[plain] = twin(
            plain,
            twins,
            _CHECKS.get(name),
            _VALIDATORS.get(name),
            base=_BASES.get(name, BaseModel),
            module=__name__,
            doc=name not in _UNDESCRIBED,
        )
    return {cls.__name__: cls for cls in twins.values()}


_TWINS = _derive()
Workload = _TWINS["Workload"]
Window = _TWINS["Window"]
AttemptContext = _TWINS["AttemptContext"]
Event = _TWINS["Event"]
AttemptRef = _TWINS["AttemptRef"]
Component = _TWINS["Component"]
RootCause = _TWINS["RootCause"]
Symptom = _TWINS["Symptom"]
Evidence = _TWINS["Evidence"]
Quality = _TWINS["Quality"]
Coverage = _TWINS["Coverage"]
EngineInfo = _TWINS["EngineInfo"]
FirstFailure = _TWINS["FirstFailure"]
NextStep = _TWINS["NextStep"]
CostFigure = _TWINS["CostFigure"]
Cost = _TWINS["Cost"]
Diagnosis = _TWINS["Diagnosis"]
