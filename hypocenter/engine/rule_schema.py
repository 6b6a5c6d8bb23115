"""What a rule file is checked against: pydantic models derived from engine/rule_model.py.

The plain classes are the one source of a rule's fields, types, defaults and order; this module adds
only what validation needs (bounds, pattern checks, YAML conveniences, cross-field checks) and builds
a pydantic model of the same name for each plain class when it is imported. Only the loader
(engine/rules.py) imports it, so `analyze` with a cached catalog (engine/rulecache.py) never imports
pydantic. A new field is one edit in rule_model.py, plus an entry in `_CHECKS` if it needs a check.
"""

from __future__ import annotations

import functools
import re
from typing import Any

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

from hypocenter.engine import rule_model
from hypocenter.engine.matching import pattern_problem
from hypocenter.modelbase import TAXONOMY
from hypocenter.modelbase import twin as modelbase_twin

_LINE_SOURCES = rule_model.LINE_SOURCES


def _as_list(v: Any) -> Any:
    """YAML convenience: `kind: xid` means `kind: [xid]`."""
    return [v] if isinstance(v, str) else v


def _regex(v: str, info: ValidationInfo) -> str:
    # linear-time matching (engine/matching.py); the loader says whether the file is the built-in catalog
    problem = pattern_problem(v, builtin=bool(info.context and info.context.get("builtin")))
    if problem is not None:
        raise ValueError(problem)
    return v


Regex = AfterValidator(_regex)
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*[a-z0-9]$")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first validation


def _any_source(cls: type, v: Any) -> Any:
    return list(_LINE_SOURCES) if v == "any" else _as_list(v)


def _nonblank(cls: type, v: list[str]) -> list[str]:
    for t in v:
        if len(t.strip()) < 2:
            raise ValueError(f"token {t!r} is too short to be a useful prefilter literal")
    return v


def _classified(self: Any) -> Any:
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


def _slug(cls: type, v: str) -> str:
    if not _ID.match(v):
        raise ValueError(f"rule id {v!r} must be lowercase letters, digits and dashes")
    return v


def _does_something(self: Any) -> Any:
    if not (self.extract or self.metric or self.attribute or self.analyzer):
        raise ValueError("a rule needs at least one of extract, metric, attribute, analyzer")
    if self.analyzer and not self.attribute:
        raise ValueError("an analyzer rule needs an attribute block (its domain, subdomain, action …)")
    return self


_AS_LIST = BeforeValidator(_as_list)

# What validation adds to a plain class's field: pydantic metadata (Field constraints, validators) on
# its value; on an optional field, on the value when it is not None.
_CHECKS: dict[str, dict[str, tuple[Any, ...]]] = {
    "ExtractSpec": {
        "tokens": (Field(min_length=1),),
        "pattern": (Regex,),
        "lines_before": (Field(ge=0, le=20),),
        "lines_after": (Field(ge=0, le=20),),
    },
    "MetricSpec": {"metrics": (Field(min_length=1),)},
    "When": {"kind": (_AS_LIST,), "text": (Regex,), "source": (_AS_LIST,)},
    "RecoverySpec": {"kind": (_AS_LIST,), "text": (Regex,), "within_s": (Field(ge=1),)},
    "AttributeSpec": {"precedence": (Field(ge=0, le=100),), "lag_s": (Field(ge=0, le=3600),)},
}
# Checks on a whole field before its type (mode="before") or on a validated model (mode="after").
_VALIDATORS: dict[str, dict[str, Any]] = {
    "ExtractSpec": {
        "_any_source": field_validator("source", mode="before")(_any_source),
        "_nonblank": field_validator("tokens")(_nonblank),
    },
    "AttributeSpec": {"_classified": model_validator(mode="after")(_classified)},
    "Rule": {
        "_slug": field_validator("id")(_slug),
        "_does_something": model_validator(mode="after")(_does_something),
    },
}


# The shared derivation (modelbase.twin), making subclasses of _Spec in this module.
twin = functools.partial(modelbase_twin, base=_Spec, module=__name__)


def _derive() -> dict[str, type[BaseModel]]:
    twins: dict[type, type[BaseModel]] = {}
    for name, plain in rule_model.CLASSES.items():  # in dependency order: a class after those it holds
        twins[plain] = twin(plain, twins, _CHECKS.get(name, {}), _VALIDATORS.get(name, {}))
    return {cls.__name__: cls for cls in twins.values()}


_TWINS = _derive()
ExtractSpec = _TWINS["ExtractSpec"]
MetricSpec = _TWINS["MetricSpec"]
When = _TWINS["When"]
RecoverySpec = _TWINS["RecoverySpec"]
AttributeSpec = _TWINS["AttributeSpec"]
CaseSpec = _TWINS["CaseSpec"]
Rule = _TWINS["Rule"]
