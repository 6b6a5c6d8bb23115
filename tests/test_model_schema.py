"""The plain model classes (model.py, engine/rules.py) and their pydantic twins (model_schema.py,
engine/rule_schema.py) say the same thing: same fields, order, defaults and types; a diagnosis renders
to the bytes pydantic rendered; a well-formed attempt.yaml read without pydantic is what pydantic makes of it."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import types
import typing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from hypocenter import model, model_schema, strict_yaml
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine, rule_schema, rules
from hypocenter.model import AttemptContext, Diagnosis, Event, plain_context

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "attempt.yaml").is_file())
PAIRS = [(getattr(model, n), getattr(model_schema, n)) for n in model.CLASSES] + [
    (getattr(rules, n), getattr(rule_schema, n)) for n in rules._CLASSES
]
REQUIRED = object()


def _type_name(annotation: Any) -> str:
    """An annotation as text: classes by name (a plain class and its twin's), validators (Annotated) left out."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal{list(args)}"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if annotation is type(None) else str(annotation.__name__)


def _plain_fields(cls: type) -> list[tuple[str, object, str, str | None, bool, bool]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else REQUIRED
        )
        out.append(
            (
                f.name,
                default,
                _type_name(hints[f.name]),
                f.metadata.get("alias"),
                bool(f.metadata.get("exclude")),
                f.metadata.get("exclude_if") is not None,
            )
        )
    return out


def _twin_fields(cls: type[BaseModel]) -> list[tuple[str, object, str, str | None, bool, bool]]:
    out = []
    for name, info in cls.model_fields.items():
        default = (
            info.default
            if info.default is not PydanticUndefined
            else info.default_factory()
            if info.default_factory is not None
            else REQUIRED
        )  # type: ignore[call-arg]
        out.append(
            (
                name,
                default,
                _type_name(info.annotation),
                info.alias,
                bool(info.exclude),
                info.exclude_if is not None,
            )
        )
    return out


@pytest.mark.parametrize(("plain", "twin"), PAIRS, ids=lambda c: c.__name__)
def test_plain_class_and_its_twin_have_the_same_fields(plain: type, twin: type[BaseModel]) -> None:
    assert _plain_fields(plain) == _twin_fields(twin)
    # A twin carries its plain class's docstring (the schema's description), except the diagnosis parts
    # whose published schema never had one.
    undescribed = twin.__module__ == model_schema.__name__ and twin.__name__ in model_schema._UNDESCRIBED
    assert twin.__doc__ == (None if undescribed else plain.__doc__)
    # A frozen plain class (an input scope, a rule) has a frozen twin, and only then.
    assert bool(twin.model_config.get("frozen")) == plain.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_every_model_twin_is_derived_from_its_plain_class() -> None:
    """model_schema.py declares no field: each twin is built from model.py's class, nested classes
    replaced by their twins, and its tables of checks name only real classes and fields."""
    assert {n: m.__name__ for n, m in model_schema._TWINS.items()} == {n: n for n in model.CLASSES}
    for name, twin in model_schema._TWINS.items():
        assert getattr(model_schema, name) is twin
    tables = (model_schema._CHECKS, model_schema._VALIDATORS, model_schema._BASES)
    assert set().union(*tables, model_schema._UNDESCRIBED) <= set(model.CLASSES)
    for name, checks in model_schema._CHECKS.items():
        assert set(checks) <= {f.name for f in dataclasses.fields(model.CLASSES[name])}  # type: ignore[arg-type]
    fields = model_schema.Diagnosis.model_fields
    assert fields["attempt"].annotation is model_schema.AttemptRef
    assert fields["candidates"].annotation == list[model_schema.RootCause]
    assert fields["cost"].annotation == model_schema.Cost | None
    assert model_schema.AttemptContext.model_fields["workload"].annotation is model_schema.Workload


def test_the_published_schema_describes_what_the_plain_classes_say() -> None:
    """`hypocenter schema` (the diagnosis' JSON Schema) takes its descriptions, field names, defaults and
    exclusions from model.py; the bounds of an attempt document come from model_schema's checks."""
    schema = model_schema.Diagnosis.model_json_schema(by_alias=True, mode="serialization")
    assert schema["description"] == inspect.cleandoc(Diagnosis.__doc__ or "")
    defs = schema["$defs"]
    for name in ("FirstFailure", "NextStep", "CostFigure"):
        assert defs[name]["description"] == inspect.cleandoc(model.CLASSES[name].__doc__ or "")
    for name in model_schema._UNDESCRIBED:
        assert "description" not in defs[name]
    assert list(schema["properties"]) == [
        f.metadata.get("alias", f.name)
        for f in dataclasses.fields(Diagnosis)  # type: ignore[arg-type]
    ]
    scope = model_schema.AttemptContext.model_json_schema()
    assert scope["additionalProperties"] is False
    assert scope["$defs"]["Workload"]["properties"]["attempt"]["maximum"] == 2**31 - 1
    assert {"type": "integer", "minimum": 1} in scope["properties"]["gpus_per_node"]["anyOf"]


def test_every_twin_has_a_plain_class() -> None:
    for module, plain in ((model_schema, model), (rule_schema, rules)):
        twins = {
            n
            for n, v in vars(module).items()
            if isinstance(v, type)
            and issubclass(v, BaseModel)
            and v.__module__ == module.__name__
            and not n.startswith("_")
        }
        assert twins == set(getattr(plain, "CLASSES", getattr(plain, "_CLASSES", ())))


def _twin_json(diagnosis: Diagnosis) -> str:
    return (
        model_schema.Diagnosis.model_validate(diagnosis.model_dump()).model_dump_json(by_alias=True, indent=2)
        + "\n"
    )


@pytest.fixture(scope="module")
def diagnoses() -> list[Diagnosis]:
    engine = default_engine()
    return [engine.analyze(load_bundle(b)) for b in BUNDLES]


def test_every_example_renders_as_pydantic_rendered_it(diagnoses: list[Diagnosis]) -> None:
    for diagnosis in diagnoses:
        assert diagnosis.to_json() == _twin_json(diagnosis)
        assert diagnosis.model_dump(mode="json") == model_schema.Diagnosis.model_validate(
            diagnosis.model_dump()
        ).model_dump(mode="json")


HOSTILE = (
    'ctl \x00\x01\x08\x0c\x1b\x1f del \x7f quote " back \\ nl \n tab \t cr \r é ü 中 \u2028\u2029 😀 \ufeff'
)


def test_hostile_text_renders_as_pydantic_rendered_it(diagnoses: list[Diagnosis]) -> None:
    with_evidence = next(d for d in diagnoses if d.evidence and d.root_cause)
    evidence = [
        e.model_copy(update={"text": HOSTILE + e.text, "inherited": True, "time_max": "2026-01-01T00:00:00Z"})
        for e in with_evidence.evidence
    ]
    unattributed = next(d for d in diagnoses if d.first_failure is not None)
    for diagnosis in (
        with_evidence.model_copy(update={"evidence": evidence, "id": HOSTILE}),
        with_evidence.model_copy(update={"next_step": None, "root_cause": None, "candidates": []}),
        unattributed.model_copy(
            update={
                "first_failure": unattributed.first_failure.model_copy(  # type: ignore[union-attr]
                    update={"text": HOSTILE, "rank": None}
                )
            }
        ),
    ):
        assert diagnosis.to_json() == _twin_json(diagnosis)
        assert Diagnosis.model_validate(diagnosis.model_dump()) == diagnosis


TIMES = [
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc),
    datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=timezone(timedelta(hours=5, minutes=30))),
]


@pytest.mark.parametrize("when", TIMES)
def test_times_dump_as_pydantic_dumps_them(when: datetime) -> None:
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": 7},
            "window": {"start": when, "end": when + timedelta(1)},
            "nodes": ["b", "a", "b"],
            "ranks": {"a": [1, 0], "b": "2-3"},
        }
    )
    twin = model_schema.AttemptContext.model_validate(ctx.model_dump())
    assert (
        ctx.model_dump(mode="json") == twin.model_dump(mode="json") and ctx.model_dump() == twin.model_dump()
    )
    event = Event(
        kind="k",
        rule="r",
        time=when,
        node=None,
        source="app",
        ref="a:1",
        text=HOSTILE,
        time_max=when,
        fields={"x": float("nan"), "y": float("inf"), "z": 1.5, "n": None},
    )
    twin_event = model_schema.Event.model_validate(event.model_dump())
    assert event.model_dump(mode="json") == twin_event.model_dump(mode="json")
    assert pickle.loads(pickle.dumps(ctx)) == ctx


# ---------------------------------------------------------------------------------------------
# attempt.yaml without pydantic


def _example_doc() -> dict[str, Any]:
    doc = strict_yaml.load_file(ROOT / "examples" / "nvlink-xid149" / "attempt.yaml", display="attempt.yaml")
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_every_example_attempt_is_read_without_pydantic(bundle: Path) -> None:
    doc = strict_yaml.load_file(bundle / "attempt.yaml", display="attempt.yaml")
    fast = plain_context(doc)
    assert fast is not None and fast == AttemptContext.model_validate(doc)


def _set(path: str, value: object) -> Any:
    def change(doc: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        cur = doc
        for p in parents:
            cur = cur[p]
        if value is _DROP:
            cur.pop(key, None)
        else:
            cur[key] = value

    return change


_DROP = object()
_NOW = datetime(2026, 11, 2, 10, 0, 0)
# (change, taken without pydantic?) — the ones marked True are the forms real bundles use.
VARIANTS = [
    (_set("workload.id", 81234), True),
    (_set("workload.id", True), False),
    (_set("workload.id", 1.5), False),
    (_set("workload.id", None), False),
    (_set("workload.id", _DROP), False),
    (_set("workload.attempt", "1"), False),
    (_set("workload.attempt", True), False),
    (_set("workload.attempt", 1.0), False),
    (_set("workload.attempt", 3), True),
    (_set("workload.name", 5), False),
    (_set("workload.name", None), True),
    (_set("workload.extra", 1), False),
    (_set("state", " failed "), True),
    (_set("state", 3), False),
    (_set("state", None), True),
    (_set("exit_code", "1"), False),
    (_set("exit_code", True), False),
    (_set("exit_code", None), True),
    (_set("exit_code", 1.0), False),
    (_set("reason", 9), False),
    (_set("nodes", ["node01", "node01", "node02", "node03", "node04"]), True),
    (_set("nodes", ["node01", 2]), False),
    (_set("nodes", "node01"), False),
    (_set("nodes", None), False),
    (_set("nodes", _DROP), True),
    (_set("ranks", {"node01": 0, "node02": [1, 2], "node03": "3-4,6"}), True),
    (_set("ranks", {"node01": [1, "2"]}), False),
    (_set("ranks", {"node01": 1.0}), False),
    (_set("ranks", {"elsewhere": "0"}), False),
    (_set("ranks", {"node01": "3-1"}), False),
    (_set("ranks", {"node01": "x"}), False),
    (_set("ranks", None), False),
    (_set("ranks", _DROP), True),
    (_set("timezone", None), False),
    (_set("timezone", 5), False),
    (_set("timezone", "+02:00"), True),
    (_set("timezone", _DROP), True),
    (_set("gpus_per_node", 8), True),
    (_set("gpus_per_node", None), True),
    (_set("gpus_per_node", "8"), False),
    (_set("gpus_per_node", 0), False),
    (_set("gpus_per_node", True), False),
    (_set("extra", 1), False),
    (_set("window", None), False),
    (_set("window.start", "2026-11-02 10:00:00"), True),
    (_set("window.start", "2026-11-02T10:00:00.5+05:30"), True),
    (_set("window.start", "2026-11-02T10:00:00"), True),
    (_set("window.start", "2026-11-02T10:00:00-01:00"), True),
    (_set("window.start", "2026-11-02"), False),
    (_set("window.start", "2026-11-02T10:00:00z"), False),
    (_set("window.start", "2026-11-02T10:00:00.1234567Z"), False),
    (_set("window.start", "2026-11-02T25:00:00Z"), False),
    (_set("window.start", "2026-11-02T10:00:00+0200"), False),
    (_set("window.start", 1700000000), False),
    (_set("window.start", _NOW), True),
    (_set("window.start", _NOW.replace(tzinfo=timezone(timedelta(hours=3)))), True),
    (_set("window.start", "2026-11-02T12:00:00Z"), False),
    (_set("window.end", _DROP), False),
    (_set("window.extra", 1), False),
]


@pytest.mark.parametrize(("change", "fast"), VARIANTS)
def test_an_attempt_document_is_read_as_pydantic_reads_it(change: Any, fast: bool) -> None:
    doc = _example_doc()
    change(doc)
    try:
        expected: AttemptContext | None = AttemptContext.model_validate(doc)
    except ValidationError:
        expected = None
    got = plain_context(doc)
    if fast:
        assert got is not None and got == expected
        assert got.window.start.tzinfo is timezone.utc and got.window.end.tzinfo is timezone.utc
        assert got.model_dump(mode="json") == expected.model_dump(mode="json")  # type: ignore[union-attr]
    else:
        assert got is None  # pydantic's judgement: its coercion or its message


def test_the_cached_catalog_holds_no_pydantic_object() -> None:
    ruleset = rules.load_ruleset()
    data = pickle.dumps(ruleset)
    assert b"pydantic" not in data
    assert [r.model_dump() for r in pickle.loads(data).rules] == [r.model_dump() for r in ruleset.rules]


def test_a_scope_built_directly_is_normalised_and_checked_as_a_validated_document_is() -> None:
    """Connectors (Slurm, Kubernetes) and the server build the scope without a document: the same
    normalisation (state upper case, nodes once each, times in UTC, a numeric id as text) and the same
    checks (window order, ranks on the attempt's nodes) as pydantic's validators gave them."""
    naive = datetime(2026, 11, 2, 10, 0)
    direct = AttemptContext(
        workload=model.Workload(id=81234, attempt=1),  # type: ignore[arg-type]  # what a YAML number gives
        window=model.Window(start=naive, end=naive + timedelta(hours=1)),
        state=" failed\n",
        nodes=["gpu01", "gpu02", "gpu01"],
        ranks={"gpu02": "0-7"},
    )
    validated = AttemptContext.model_validate(
        {
            "workload": {"id": 81234, "attempt": 1},
            "window": {"start": naive, "end": naive + timedelta(hours=1)},
            "state": " failed\n",
            "nodes": ["gpu01", "gpu02", "gpu01"],
            "ranks": {"gpu02": "0-7"},
        }
    )
    assert direct == validated
    assert (direct.state, direct.nodes, direct.workload.id) == ("FAILED", ["gpu01", "gpu02"], "81234")
    assert direct.window.start.tzinfo is not None and direct.completed is False
    with pytest.raises(ValueError, match=r"window\.end is before window\.start"):
        model.Window(start=naive, end=naive - timedelta(seconds=1))
    with pytest.raises(ValueError, match="ranks: node 'gpu09' is not in nodes"):
        AttemptContext(
            workload=model.Workload(id="1"), window=direct.window, nodes=["gpu01"], ranks={"gpu09": 0}
        )
