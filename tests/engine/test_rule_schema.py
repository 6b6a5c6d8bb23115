"""The rule file schema is derived from the plain rule classes: a field declared once in
engine/rules.py is validated, defaulted and bounded without a second declaration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import ValidationError

from hypocenter.engine import rule_schema, rules
from hypocenter.engine.rules import load_rule_file
from hypocenter.errors import RuleError
from hypocenter.modelbase import Plain


@dataclass(slots=True, kw_only=True, frozen=True, eq=False, repr=False)
class _Probe(Plain):
    """A plain class with one field of each shape the rule classes use."""

    name: str
    when: rules.When | None = None
    kinds: list[str] = field(default_factory=lambda: ["xid"])
    limit: int = 5
    pattern: str | None = None
    where: str = field(default="", metadata={"exclude": True})


def _probe_twin() -> type:
    return rule_schema.twin(
        _Probe,
        {rules.When: rule_schema.When},
        {"limit": (rule_schema.Field(ge=0, le=9),), "pattern": (rule_schema.Regex,)},
    )


def test_a_field_declared_once_is_in_the_derived_model_with_its_default_and_doc() -> None:
    twin = _probe_twin()
    assert twin.__name__ == "_Probe" and twin.__doc__ == _Probe.__doc__
    assert list(twin.model_fields) == [f.name for f in dataclasses.fields(_Probe)]
    probe = twin.model_validate({"name": "n", "when": {"kind": "xid"}})
    assert (probe.limit, probe.kinds, probe.pattern) == (5, ["xid"], None)
    assert type(probe.when) is rule_schema.When and probe.when.kind == ["xid"]
    assert "where" not in probe.model_dump()
    with pytest.raises(ValidationError, match="extra"):
        twin.model_validate({"name": "n", "nmae": "typo"})


def test_checks_apply_to_the_value_and_let_an_optional_field_be_none() -> None:
    twin = _probe_twin()
    with pytest.raises(ValidationError, match="less than or equal to 9"):
        twin.model_validate({"name": "n", "limit": 10})
    with pytest.raises(ValidationError, match="pattern"):
        twin.model_validate({"name": "n", "pattern": "(unclosed"})
    assert twin.model_validate({"name": "n", "pattern": None}).pattern is None


def test_a_check_for_a_field_the_plain_class_lacks_is_an_error_at_import() -> None:
    with pytest.raises(TypeError, match="limt"):
        rule_schema.twin(_Probe, {rules.When: rule_schema.When}, {"limt": (rule_schema.Field(ge=0),)})


def test_every_rule_class_has_its_derived_twin_and_checks_name_real_fields() -> None:
    assert {n: m.__name__ for n, m in rule_schema._TWINS.items()} == {n: n for n in rules._CLASSES}
    assert set(rule_schema._CHECKS) | set(rule_schema._VALIDATORS) <= set(rules._CLASSES)
    for name, checks in rule_schema._CHECKS.items():
        assert set(checks) <= {f.name for f in dataclasses.fields(rules._CLASSES[name])}  # type: ignore[arg-type]


RULE = """rules:
  - id: probe-rule
    title: probe
    status: experimental
    extract:
      source: any
      tokens: ["frobnicator"]
      pattern: 'frobnicator (?P<state>down)'
      event: frob
      lines_after: {after}
    attribute:
      when: {{kind: frob{text}}}
      role: root_cause
      domain: hardware
      subdomain: gpu
"""


def test_a_rule_file_loads_with_the_derived_defaults_and_conveniences(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RULE.format(after=2, text=""))
    (rule,) = load_rule_file(path)
    assert isinstance(rule, rules.Rule) and isinstance(rule.attribute, rules.AttributeSpec)
    assert rule.extract is not None and rule.extract.source == ["kernel", "app", "scheduler"]
    assert rule.attribute.when.kind == ["frob"] and rule.attribute.when.text is None
    assert (rule.attribute.precedence, rule.attribute.action, rule.extract.lines_after) == (
        50,
        "INVESTIGATE",
        2,
    )


@pytest.mark.parametrize(
    ("after", "text", "message"),
    [
        (21, "", "r.yaml:10: rule probe-rule: extract.lines_after: Input should be less than or equal to 20"),
        (0, ", text: '(oops'", "r.yaml:12: rule probe-rule: attribute.when.text: regex does not compile"),
    ],
)
def test_a_derived_check_names_the_file_line_and_field(
    tmp_path: Path, after: int, text: str, message: str
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RULE.format(after=after, text=text))
    with pytest.raises(RuleError) as err:
        load_rule_file(path, display="r.yaml")
    assert str(err.value).startswith(message)
