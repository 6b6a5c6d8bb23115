"""What model.py's plain classes and model_schema.py's pydantic twins share, without pydantic.

`analyze` validates nothing but attempt.yaml, and importing pydantic costs more than analysing a small
bundle, so its types are plain slotted dataclasses. This module holds the vocabulary both sides use
and `Plain`: the slice of pydantic's model API (`model_dump`, `model_copy`) callers use on them.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from hypocenter import limits

if TYPE_CHECKING:
    from pydantic import BaseModel

# An attempt is a restart count (Slurm's restart_count is 16 bits, a JobSet's restarts 32): this bound
# keeps it, and anything computed from it, far inside the store's signed 64-bit integers.
ATTEMPT_MAX = (1 << 31) - 1
SCHEMA_ID = "hypocenter.diagnosis/v1"

SourceKind = Literal["kernel", "app", "scheduler", "metric"]
Outcome = Literal["attributed", "ambiguous", "unattributed", "not_failed"]
Role = Literal["root_cause", "symptom", "context"]
QualityLevel = Literal["high", "medium", "low"]
CoverageStatus = Literal["ok", "partial", "failed", "skipped", "missing"]
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
FieldValue = str | int | float | None

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
# The states an attempt's `state` may take: Slurm's job states (squeue(1), "JOB STATE CODES"), the
# Kubernetes / Kueue ones the connectors report, and TERMINAL_OK. A word outside it is a typo that
# would otherwise read as a failure (anything not TERMINAL_OK is one): it is refused with a suggestion.
STATES = TERMINAL_OK | frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "CONFIGURING",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PENDING",
        "PREEMPTED",
        "RUNNING",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "REQUEUED",
        "RESIZING",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
        "STOPPED",
        "SUSPENDED",
        "TIMEOUT",
        "EVICTED",
    }
)


def check_state(state: str) -> None:
    """Raise ValueError naming the nearest known state when `state` (upper case) is not one."""
    if state in STATES:
        return
    import difflib

    near = difflib.get_close_matches(state, sorted(STATES), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else f" (one of {', '.join(sorted(STATES))})"
    raise ValueError(f"state {state!r} is not a job state{hint}")


# One vocabulary of component kinds, for the engine's diagnoses and the benchmark's truth alike:
# a GPU (id: its PCI address, or gpuN), an HCA port (mlx5_N/P, or the netdev of a one-port NIC), a NIC
# as a device (mlx5_N, or its PCI address), a filesystem (NFS server, Lustre target, or mount path).
COMPONENT_KINDS = ("gpu", "port", "nic", "filesystem")


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
    limits.check_count(
        f"rank map entry {str(spec)[:80]!r} names ranks", count_ranks(spec), "max_ranks_per_attempt"
    )
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


# ---------------------------------------------------------------------------------------------
# Plain classes


def json_time(dt: datetime) -> str:
    """A time as pydantic writes it in JSON mode (ISO 8601, a zero UTC offset as `Z`)."""
    text = dt.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _dump_value(value: Any, json_mode: bool, by_alias: bool | None) -> Any:
    if isinstance(value, Plain):
        return value.model_dump(mode="json" if json_mode else "python", by_alias=by_alias)
    if isinstance(value, list | tuple):
        return [_dump_value(v, json_mode, by_alias) for v in value]
    if isinstance(value, dict):
        return {k: _dump_value(v, json_mode, by_alias) for k, v in value.items()}
    if json_mode and isinstance(value, datetime):
        return json_time(value)
    return value


class Plain:
    """Base of the plain (dataclass) models: the part of pydantic's BaseModel API callers use.

    Subclasses are `@dataclass(slots=True, kw_only=True, eq=False, repr=False)` (and `frozen=True`
    where the pydantic model was frozen): equality, hash and repr are these, one for all classes,
    as dataclasses would write them (generating them per class costs start-up)."""

    __slots__: ClassVar[tuple[str, ...]] = ()
    # pydantic's serialize_by_alias: whether model_dump uses aliases when not told.
    _by_alias: ClassVar[bool] = False

    def _values(self) -> tuple[Any, ...]:
        return tuple(
            [getattr(self, name) for name in self.__slots__]
        )  # a dataclass's slots: its fields, in order

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        if not self.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise TypeError(f"unhashable type: {type(self).__name__!r}")
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def model_dump(self, *, mode: str = "python", by_alias: bool | None = None) -> dict[str, Any]:
        json_mode = mode == "json"
        alias = self._by_alias if by_alias is None else by_alias
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            meta = f.metadata
            if meta.get("exclude"):
                continue
            value = getattr(self, f.name)
            skip: Callable[[Any], bool] | None = meta.get("exclude_if")
            if skip is not None and skip(value):
                continue
            out[meta.get("alias", f.name) if alias else f.name] = _dump_value(value, json_mode, by_alias)
        return out

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]


def plain_from(validated: Any, classes: Mapping[str, type[Plain]]) -> Any:
    """A validated pydantic model (and the models, lists and dicts inside it) as plain classes: each
    model becomes the plain class of the same name in `classes`, with the same field values."""
    fields = getattr(type(validated), "model_fields", None)
    if fields is not None:
        cls = classes[type(validated).__name__]
        return cls(**{name: plain_from(getattr(validated, name), classes) for name in fields})
    if isinstance(validated, list):
        return [plain_from(v, classes) for v in validated]
    if isinstance(validated, dict):
        return {k: plain_from(v, classes) for k, v in validated.items()}
    return validated


def _swap(tp: Any, twins: Mapping[type, type[BaseModel]]) -> Any:
    """An annotation of a plain class with each plain class in it replaced by its twin."""
    if isinstance(tp, type) and tp in twins:
        return twins[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or origin is Literal or not args:
        return tp
    new = tuple(_swap(a, twins) for a in args)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, new)
    return origin[new[0] if len(new) == 1 else new]


def _checked(tp: Any, checks: tuple[Any, ...]) -> Any:
    if not checks:
        return tp
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        inner = functools.reduce(operator.or_, [a for a in args if a is not type(None)])
        return Annotated[(inner, *checks)] | None
    return Annotated[(tp, *checks)]


def twin(
    plain: type[Plain],
    twins: Mapping[type, type[BaseModel]],
    checks: Mapping[str, tuple[Any, ...]] | None = None,
    validators: Mapping[str, Any] | None = None,
    *,
    base: type[BaseModel],
    module: str,
    doc: bool = True,
) -> type[BaseModel]:
    """The pydantic model of a plain dataclass, a subclass of `base` in `module`: its fields in order,
    with their types (plain classes replaced by their twins in `twins`), defaults, dump options and
    (unless `doc` is false) docstring, `checks` added to the fields and `validators` to the class.

    Only the schema modules (model_schema.py, engine/rule_schema.py) call it; pydantic is imported here,
    not when this module is, so the plain classes stay free of it."""
    from pydantic import Field

    checks = checks or {}
    hints = typing.get_type_hints(plain)
    unknown = set(checks) - {f.name for f in dataclasses.fields(plain)}  # type: ignore[arg-type]
    if unknown:
        raise TypeError(f"checks for fields {plain.__name__} does not have: {sorted(unknown)}")
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {
        "__module__": module,
        "__qualname__": plain.__name__,
        "__doc__": plain.__doc__ if doc else None,
    }
    for f in dataclasses.fields(plain):  # type: ignore[arg-type]
        annotations[f.name] = _checked(_swap(hints[f.name], twins), checks.get(f.name, ()))
        options: dict[str, Any] = {
            k: v for k in ("alias", "exclude", "exclude_if") if (v := f.metadata.get(k)) is not None
        }
        if f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        elif f.default is not dataclasses.MISSING:
            options["default"] = f.default
        if options:
            namespace[f.name] = Field(**options)
    namespace["__annotations__"] = annotations
    namespace.update(validators or {})
    return typing.cast("type[BaseModel]", type(plain.__name__, (base,), namespace))


def omit_false(v: object) -> bool:
    return not v


def omit_none(v: object) -> bool:
    return v is None


__all__ = [
    "COMPONENT_KINDS",
    "SCHEMA_ID",
    "TAXONOMY",
    "TERMINAL_OK",
    "Action",
    "CoverageStatus",
    "FieldValue",
    "Outcome",
    "Plain",
    "QualityLevel",
    "Role",
    "SourceKind",
    "count_ranks",
    "isoformat",
    "json_time",
    "omit_false",
    "omit_none",
    "parse_rank_ranges",
    "plain_from",
    "twin",
    "utc",
]
