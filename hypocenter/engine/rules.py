"""The rule language: loader, ruleset and its fingerprint.

A rule file holds `rules:`, each of which may extract events from log lines or metric series,
attribute them (root cause, symptom, context), or name a Python analyzer, and ships its own cases.
Fields are declared in engine/rule_model.py; an error names `file:line` and the closest known field.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypocenter import strict_yaml
from hypocenter.engine.rule_model import (
    CLASSES,
    AttributeSpec,
    CaseSpec,
    ExtractSpec,
    MetricSpec,
    RecoverySpec,
    Rule,
    Status,
    When,
)
from hypocenter.errors import InputError, RuleError
from hypocenter.modelbase import FieldValue, Plain, plain_from
from hypocenter.sources import RuleQueries

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "AttributeSpec",
    "CaseSpec",
    "ExtractSpec",
    "MetricSpec",
    "RecoverySpec",
    "Rule",
    "Ruleset",
    "Status",
    "Table",
    "When",
    "builtin_catalog",
    "load_rule_file",
    "load_ruleset",
    "load_table",
    "rule_files",
]
_CLASSES = CLASSES

Table = dict[str, dict[str, FieldValue]]


class Ruleset:
    """Loaded, validated rules and data tables, with a content fingerprint (part of every diagnosis id)."""

    def __init__(self, rules: list[Rule], fingerprint: str, tables: dict[str, Table] | None = None) -> None:
        self.rules = rules
        self.fingerprint = fingerprint
        self.tables = tables or {}
        self.by_id = {r.id: r for r in rules}

    def __len__(self) -> int:
        return len(self.rules)

    def queries(self) -> RuleQueries:
        """The tokens and metric names these rules read, for the pull connectors (they never see rules)."""
        tokens: set[str] = set()
        context: dict[str, tuple[int, int]] = {}
        metrics: set[str] = set()
        labels: list[str] = []
        for rule in self.rules:
            spec = rule.extract
            if spec is not None:
                tokens.update(spec.tokens)
                if spec.lines_before or spec.lines_after:
                    for tok in spec.tokens:
                        b, a = context.get(tok, (0, 0))
                        context[tok] = (max(b, spec.lines_before), max(a, spec.lines_after))
            if rule.metric is not None:
                metrics.update(rule.metric.metrics)
                labels.extend(rule.metric.node_labels)
        return RuleQueries(
            tokens=tuple(sorted(tokens)),
            context_tokens=context,
            metrics=tuple(sorted(metrics)),
            node_labels=tuple(dict.fromkeys(labels)),
        )


def _suggest(name: str, model: type[Plain]) -> str:
    known = [f.name for f in fields(model) if f.name not in ("path", "line")]  # type: ignore[arg-type]
    from difflib import get_close_matches  # only for a rule file with a mistake

    hint = get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else f" (known fields: {', '.join(known)})"


_MODEL_AT: dict[tuple[str, ...], type[Plain]] = {
    (): Rule,
    ("extract",): ExtractSpec,
    ("metric",): MetricSpec,
    ("attribute",): AttributeSpec,
    ("attribute", "when"): When,
}


def _child(cur: Any, part: int | str) -> Any:
    if isinstance(cur, dict):
        return cur.get(part)
    if isinstance(cur, list) and isinstance(part, int) and part < len(cur):
        return cur[part]
    return None


def _rule_error(exc: ValidationError, doc: strict_yaml.LineDict, path: str) -> RuleError:
    errors = exc.errors()
    # A misspelt key also makes its correct name "missing": report the misspelling, it is the cause.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = err["loc"]
    line = doc.line
    cur: Any = doc
    for part in loc:
        key_line = getattr(cur, "key_lines", {}).get(part)
        cur = _child(cur, part)
        if key_line:
            line = key_line
        elif cur is None:
            break
        else:
            line = getattr(cur, "line", line)
    rid = doc.get("id", "?")
    dotted = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        parent = tuple(p for p in loc[:-1] if isinstance(p, str))
        model = _MODEL_AT.get(parent)
        if isinstance(loc[0], str) and loc[0] == "cases":
            model = CaseSpec
        hint = _suggest(str(loc[-1]), model) if model else ""
        return RuleError(f"rule {rid}: unknown field {dotted!r}{hint}", path=path, line=line)
    msg = err["msg"].removeprefix("Value error, ")
    return RuleError(f"rule {rid}: {dotted or 'rule'}: {msg}", path=path, line=line)


def load_rule_file(path: Path, display: str | None = None, *, builtin: bool = False) -> list[Rule]:
    """The rules of one file; `builtin` for the shipped catalog, whose reviewed patterns may use
    the bounded fallback matcher (engine/matching.py); a user's file must be RE2 throughout."""
    name = display or str(path)
    try:
        doc = strict_yaml.load_file(path, display=name)
    except InputError as exc:
        raise RuleError(str(exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise RuleError("a rule file is a mapping with a 'rules:' list", path=name, line=1)
    extra = [k for k in doc if k != "rules"]
    if extra:
        raise RuleError(
            f"unknown top-level key {extra[0]!r} (a rule file has only 'rules:')",
            path=name,
            line=getattr(doc, "line", 1),
        )
    from pydantic import ValidationError

    from hypocenter.engine import rule_schema

    out: list[Rule] = []
    for item in doc["rules"]:
        if not isinstance(item, dict):
            raise RuleError(
                "each entry of 'rules:' must be a mapping", path=name, line=getattr(doc, "line", 1)
            )
        line = getattr(item, "line", 0)
        try:
            rule: Rule = plain_from(
                rule_schema.Rule.model_validate(
                    {**item, "path": name, "line": line}, context={"builtin": builtin}
                ),
                _CLASSES,
            )
        except ValidationError as exc:
            raise _rule_error(exc, item, name) from None  # type: ignore[arg-type]
        out.append(rule)
    return out


def builtin_catalog() -> Path:
    """The catalog shipped with the package (wheel), or the repository's `rules/` (editable install)."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "catalog"
    if packaged.is_dir():
        return packaged
    repo = here.parent / "rules"
    if repo.is_dir():
        return repo
    raise RuleError(f"built-in rule catalog not found (looked in {packaged} and {repo})")


DATA_DIR = "data"


def load_table(path: Path, display: str) -> Table:
    """A data table (rules/data/*.yaml): one top-level mapping of key → fields."""
    try:
        doc = strict_yaml.load_file(path, display=display)
    except InputError as exc:
        raise RuleError(str(exc)) from None
    if not isinstance(doc, dict) or len(doc) != 1 or not isinstance(next(iter(doc.values())), dict):
        raise RuleError("a data table has one top-level key mapping keys to fields", path=display, line=1)
    rows = next(iter(doc.values()))
    return {str(k): dict(v) for k, v in rows.items() if isinstance(v, dict)}


def rule_files(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    files: list[tuple[Path, str]] = []
    for top in paths:
        if top.is_file():
            files.append((top, top.name))
            continue
        if not top.is_dir():
            raise RuleError(f"{top}: no such rule file or directory")
        for p in sorted(top.rglob("*.yaml")):
            if any(part.startswith(".") for part in p.relative_to(top).parts):
                continue
            files.append((p, p.relative_to(top).as_posix()))
    return files


def load_ruleset(extra: Iterable[Path] = (), *, builtin: bool = True) -> Ruleset:
    """The built-in catalog plus any extra rule files or directories; ids must be unique."""
    catalog = builtin_catalog() if builtin else None
    tops = ([catalog] if catalog else []) + [Path(p) for p in extra]
    digest = hashlib.sha256()
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    tables: dict[str, Table] = {}
    for path, display in rule_files(tops):
        data = path.read_bytes()
        digest.update(display.encode() + b"\0" + data + b"\0")
        if display.split("/", 1)[0] == DATA_DIR:
            tables[path.stem] = load_table(path, display)
            continue
        shipped = catalog is not None and path.resolve().is_relative_to(catalog.resolve())
        for rule in load_rule_file(path, display=display, builtin=shipped):
            if rule.id in seen:
                raise RuleError(
                    f"rule id {rule.id!r} is already defined at {seen[rule.id].where}",
                    path=display,
                    line=rule.line,
                )
            seen[rule.id] = rule
            rules.append(rule)
    from hypocenter.engine.analyzers import ANALYZER_VERSION
    from hypocenter.engine.registry import ANALYZERS

    digest.update(f"analyzers:{ANALYZER_VERSION}".encode())
    for rule in rules:
        if rule.analyzer and rule.analyzer not in ANALYZERS:
            from difflib import get_close_matches

            hint = get_close_matches(rule.analyzer, list(ANALYZERS), n=1)
            tip = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(sorted(ANALYZERS))})"
            raise RuleError(
                f"rule {rule.id}: unknown analyzer {rule.analyzer!r}{tip}", path=rule.path, line=rule.line
            )
        for spec_name, spec in (("extract", rule.extract), ("metric", rule.metric)):
            lookup = getattr(spec, "lookup", None)
            if lookup and lookup not in tables:
                raise RuleError(
                    f"rule {rule.id}: {spec_name}.lookup names no data table {lookup!r} "
                    f"(known: {', '.join(sorted(tables)) or 'none'})",
                    path=rule.path,
                    line=rule.line,
                )
    return Ruleset(rules, "sha256:" + digest.hexdigest(), tables)
