"""The static + local-files connector: read an attempt bundle directory (DESIGN.md contract 1).

    bundle/attempt.yaml          the scope → AttemptContext
    bundle/logs/<node>/<file>    node logs (node = directory name); logs/_job/<file> job-level logs
    bundle/metrics/<file>        Prometheus API JSON or OpenMetrics/Prometheus text
    bundle/events/<file>         scheduler / Kubernetes documents (JSON or YAML)

A bundle that cannot be analysed at all (no directory, no or bad attempt.yaml) raises
`BundleError`. A bad file inside a usable bundle never does: it is listed in coverage with the
reason and the rest is read. Gzip-compressed logs (`kern.log.1.gz`) are read transparently.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from hypocenter import strict_yaml
from hypocenter.collector.lineformat import TimeContext, zone
from hypocenter.collector.metrics import MetricFormatError, parse_metrics
from hypocenter.collector.scheduler_records import render
from hypocenter.collector.sources import MetricSource, RecordSource, Source, TextSource
from hypocenter.errors import BundleError, InputError
from hypocenter.model import AttemptContext, Coverage

JOB_DIR = "_job"
_BINARY_PROBE = 8192


@dataclass
class Bundle:
    root: Path
    context: AttemptContext
    sources: list[Source] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)


def load_context(root: Path) -> AttemptContext:
    """Read and validate attempt.yaml; every problem is a BundleError naming file:line."""
    if not root.exists():
        raise BundleError(f"{root}: no such bundle directory")
    if not root.is_dir():
        raise BundleError(f"{root}: not a directory (expected an attempt bundle: attempt.yaml, logs/, …)")
    path = root / "attempt.yaml"
    if not path.is_file():
        raise BundleError(f"{root}: no attempt.yaml (every bundle needs one; see examples/nvlink-xid149/attempt.yaml)")
    try:
        doc = strict_yaml.load_file(path, display=str(path))
    except InputError as exc:
        raise BundleError(str(exc)) from None
    if not isinstance(doc, dict):
        raise BundleError(f"{path}: expected a mapping with workload, window, nodes, …")
    try:
        return AttemptContext.model_validate(doc)
    except ValidationError as exc:
        raise BundleError(_validation_message(exc, path, doc)) from None


def _validation_message(exc: ValidationError, path: Path, doc: strict_yaml.LineDict) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    line = _line_of(doc, err["loc"])
    where = f"{path}:{line}" if line else str(path)
    field_name = ".".join(loc) or "(document)"
    if err["type"] == "extra_forbidden":
        from difflib import get_close_matches

        known = _known_fields(err["loc"][:-1])
        hint = get_close_matches(str(err["loc"][-1]), known, n=1)
        tip = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(sorted(known))})"
        return f"{where}: unknown field {field_name!r}{tip}"
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return f"{where}: {field_name}: {err['msg']}{more}"


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    from hypocenter.model import Window, Workload

    if loc and loc[0] == "workload":
        return list(Workload.model_fields)
    if loc and loc[0] == "window":
        return list(Window.model_fields)
    return list(AttemptContext.model_fields)


def _line_of(doc: object, loc: tuple[int | str, ...]) -> int | None:
    line = getattr(doc, "line", None)
    cur = doc
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
            line = getattr(cur, "line", line)
        else:
            break
    return line if isinstance(line, int) and line > 0 else None


def time_context(ctx: AttemptContext) -> TimeContext:
    try:
        tz = zone(ctx.timezone)
    except ValueError as exc:
        raise BundleError(f"attempt.yaml: timezone: {exc}") from None
    return TimeContext(tz=tz, start=ctx.window.start, end=ctx.window.end)


def read_text(path: Path) -> tuple[str | None, str, str | None]:
    """(text, status, reason) for one log file; text None when it cannot be used at all."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, "failed", f"cannot read: {exc.strerror or exc}"
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            return None, "failed", f"bad gzip data: {exc}"
    if b"\x00" in raw[:_BINARY_PROBE]:
        return None, "skipped", "binary file (NUL bytes), not a text log"
    try:
        return raw.decode("utf-8"), "ok", ("empty file" if not raw else None)
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        return text, "partial", f"not valid UTF-8: {bad} undecodable byte sequences replaced"


def _files(top: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        out.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    return out


def load_bundle(root: Path) -> Bundle:
    root = Path(root)
    context = load_context(root)
    tctx = time_context(context)
    bundle = Bundle(root=root, context=context)
    logs = root / "logs"
    seen_nodes: set[str] = set()
    if logs.is_dir():
        for node_dir in sorted(p for p in logs.iterdir() if p.is_dir()):
            node = None if node_dir.name == JOB_DIR else node_dir.name
            if node is not None:
                seen_nodes.add(node)
            lines = 0
            problems: list[str] = []
            status = "ok"
            for path in _files(node_dir):
                rel = path.relative_to(root).as_posix()
                text, fstatus, reason = read_text(path)
                if fstatus != "ok":
                    problems.append(f"{rel}: {reason}")
                    bundle.coverage.append(Coverage(connector="files", source=rel, status=fstatus,  # type: ignore[arg-type]
                                                    observations=0 if text is None else text.count("\n"),
                                                    reason=reason))
                    status = "partial"
                if text is None:
                    continue
                lines += text.count("\n") + (0 if text.endswith("\n") or not text else 1)
                bundle.sources.append(TextSource(name=rel, text=text, node=node))
            src = node_dir.relative_to(root).as_posix()
            bundle.coverage.append(Coverage(
                connector="files", source=src, status=status if lines else ("failed" if problems else "ok"),  # type: ignore[arg-type]
                observations=lines, reason="; ".join(problems) if problems else (None if lines else "no log lines")))
    for node in context.nodes:
        if node not in seen_nodes:
            bundle.coverage.append(Coverage(connector="files", source=f"logs/{node}", status="missing",
                                            observations=0, reason=f"no logs for node {node}"))
    _load_metrics(root, tctx, bundle)
    _load_events(root, tctx, bundle)
    bundle.coverage.sort(key=lambda c: (c.source, c.connector))
    return bundle


def _load_metrics(root: Path, tctx: TimeContext, bundle: Bundle) -> None:
    top = root / "metrics"
    if not top.is_dir():
        return
    for path in _files(top):
        rel = path.relative_to(root).as_posix()
        text, status, reason = read_text(path)
        if text is None:
            bundle.coverage.append(Coverage(connector="metrics", source=rel, status=status,  # type: ignore[arg-type]
                                            observations=0, reason=reason))
            continue
        try:
            series = parse_metrics(text, default_time=tctx.end)
        except MetricFormatError as exc:
            bundle.coverage.append(Coverage(connector="metrics", source=rel, status="failed",
                                            observations=0, reason=str(exc)))
            continue
        n = sum(len(s.samples) for s in series)
        bundle.sources.append(MetricSource(name=rel, series=series))
        bundle.coverage.append(Coverage(connector="metrics", source=rel, status="ok", observations=n))


def _load_events(root: Path, tctx: TimeContext, bundle: Bundle) -> None:
    top = root / "events"
    if not top.is_dir():
        return
    for path in _files(top):
        rel = path.relative_to(root).as_posix()
        text, status, reason = read_text(path)
        if text is None:
            bundle.coverage.append(Coverage(connector="scheduler", source=rel, status=status,  # type: ignore[arg-type]
                                            observations=0, reason=reason))
            continue
        try:
            docs = _documents(text, path)
        except ValueError as exc:
            bundle.coverage.append(Coverage(connector="scheduler", source=rel, status="failed",
                                            observations=0, reason=str(exc)))
            continue
        records = [r for i, doc in enumerate(docs) for r in render(doc, rel if len(docs) == 1 else f"{rel}[{i}]", tctx)]
        if not records:
            bundle.coverage.append(Coverage(connector="scheduler", source=rel, status="failed", observations=0,
                                            reason="no scheduler or Kubernetes records recognised in this document"))
            continue
        bundle.sources.append(RecordSource(name=rel, records=records))
        bundle.coverage.append(Coverage(connector="scheduler", source=rel, status="ok", observations=len(records)))


def _documents(text: str, path: Path) -> list[object]:
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as first:
            docs: list[object] = []
            for n, line in enumerate(text.splitlines(), start=1):  # JSON lines
                if line.strip():
                    try:
                        docs.append(json.loads(line))
                    except json.JSONDecodeError:
                        raise ValueError(f"invalid JSON at line {first.lineno}: {first.msg}") from None
            return docs
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
