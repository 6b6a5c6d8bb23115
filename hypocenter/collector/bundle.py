"""The static + local-files connector: read an attempt bundle directory (docs/design.md, contract 1).

A bundle that cannot be analysed at all raises `BundleError`; a bad file inside a usable bundle
never does: it is listed in coverage with the reason and the rest is read.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from hypocenter import strict_yaml
from hypocenter.collector import flight_recorder
from hypocenter.collector.bundle_logs import (
    EngineRead,
    NodeCoverage,
    dir_entries,
    entry_is_dir,
    node_files,
    read_whole_size,
    streamed_size,
)
from hypocenter.collector.logstream import (
    _display,
    _kind,
    log_pieces,
    read_log,
    scan_log,
)
from hypocenter.collector.metrics import MetricFormatError, parse_metrics
from hypocenter.collector.scheduler_records import parse_scontrol, render
from hypocenter.errors import BundleError, InputError
from hypocenter.lineformat import TimeContext, time_context, zone
from hypocenter.model import AttemptContext, Coverage, plain_context
from hypocenter.sources import (
    AttemptInput,
    FileTextSource,
    MetricSource,
    Record,
    RecordSource,
    TextSource,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

JOB_DIR = "_job"


@dataclass
class Bundle(AttemptInput):
    """An attempt read from a bundle directory (contract 1).

    Loaded with `read_once`, the log files of a bundle on disk (plain or gzip) are not read at load
    but once, when the engine reads them; what the load would have said of them (status, line counts)
    is learned then.
    Their node directories' coverage is complete from the moment `coverage` is looked at: a file
    read by then is not read again, one not yet read is scanned there and then."""

    root: Path = field(kw_only=True)
    _unread: list[NodeCoverage] = field(default_factory=list, init=False, repr=False, compare=False)

    @property  # type: ignore[misc]  # a field of AttemptInput, complete whenever it is read
    def coverage(self) -> list[Coverage]:
        if self._unread:
            for tally in self._unread:
                self._coverage.extend(tally.entries())
            self._unread.clear()
            self._coverage.sort(key=lambda c: (c.source, c.connector))
        return self._coverage

    @coverage.setter
    def coverage(self, value: list[Coverage]) -> None:
        self._coverage = value


def load_context(root: Path) -> AttemptContext:
    """Read and validate attempt.yaml; every problem is a BundleError naming file:line."""
    if not root.exists():
        raise BundleError(f"{root}: no such bundle directory")
    if not root.is_dir():
        raise BundleError(f"{root}: not a directory (expected an attempt bundle: attempt.yaml, logs/, …)")
    path = root / "attempt.yaml"
    if not path.is_file():
        if path.is_symlink() or path.exists():
            raise BundleError(f"{path}: {_kind(path)}, not a readable file")
        raise BundleError(
            f"{root}: no attempt.yaml (every bundle needs one; see examples/nvlink-xid149/attempt.yaml)"
        )
    try:
        doc = strict_yaml.load_file(path, display=str(path))
    except InputError as exc:
        raise BundleError(str(exc)) from None
    if doc is None:
        raise BundleError(f"{path}: empty file (expected a mapping with workload, window, nodes, …)")
    if not isinstance(doc, dict):
        raise BundleError(
            f"{path}: expected a mapping with workload, window, nodes, …, not a {type(doc).__name__}"
        )
    ctx = plain_context(doc)  # the common, well-formed document: no pydantic on analyze's path
    if ctx is None:
        from pydantic import ValidationError

        try:
            ctx = AttemptContext.model_validate(doc)
        except ValidationError as exc:
            raise BundleError(_validation_message(exc, path, doc)) from None
    try:
        zone(ctx.timezone)
    except ValueError as exc:
        line = _line_of(doc, ("timezone",))
        where = f"{path}:{line}" if line else str(path)
        raise BundleError(f"{where}: timezone: {_zone_message(ctx.timezone, exc)}") from None
    return ctx


def _zone_message(name: str, exc: ValueError) -> str:
    text = str(exc)
    if text.startswith("unknown timezone"):
        return text
    return f"invalid timezone {name!r}: a UTC offset must lie between -23:59 and +23:59"


def _validation_message(exc: ValidationError, path: Path, doc: object) -> str:
    errors = exc.errors()
    # A misspelt field also makes the real one "missing": name the misspelling, it is the cause.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err["loc"]]
    line = _line_of(doc, err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not loc and "rank" in msg:  # the rank map is checked against the whole document
        line = _line_of(doc, ("ranks",)) or line
    where = f"{path}:{line}" if line else str(path)
    field_name = ".".join(loc)
    if err["type"] == "extra_forbidden":
        from difflib import get_close_matches

        known = _known_fields(err["loc"][:-1])
        hint = get_close_matches(str(err["loc"][-1]), known, n=1)
        tip = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(sorted(known))})"
        return f"{where}: unknown field {field_name!r}{tip}"
    if err["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{where}: {field_name + ': ' if field_name else ''}{msg}{more}"


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    from hypocenter.model_schema import AttemptContext, Window, Workload

    if loc and loc[0] == "workload":
        return list(Workload.model_fields)
    if loc and loc[0] == "window":
        return list(Window.model_fields)
    return list(AttemptContext.model_fields)


def _line_of(doc: object, loc: tuple[int | str, ...]) -> int | None:
    """The line of the deepest part of `loc` that the YAML document has (a key's own line when known)."""
    line = getattr(doc, "line", None)
    cur = doc
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            key_line = getattr(cur, "key_lines", {}).get(part)
            cur = cur[part]
            line = key_line or getattr(cur, "line", line)
        else:
            break
    return line if isinstance(line, int) and line > 0 else None


def read_text(path: Path) -> tuple[str | None, str, str | None]:
    """(text, status, reason) for one log file; text None when it cannot be used at all.

    Never raises: a file that cannot be read, is not a regular file, is corrupt gzip, empty or
    binary comes back with text None; a file with undecodable bytes, NUL bytes or very long lines
    comes back usable, status "partial" and the reason."""
    data, status, reason = read_log(path)
    return (None if data is None else data.decode("utf-8", "surrogateescape")), status, reason


def _text_of(path: Path, clean: bool) -> bytes:
    """A log file's bytes for the engine, read again whole (gzip undone; repaired unless `clean`).
    A file gone since reads as empty."""
    return b"".join(log_pieces(path, clean))


def _files(top: Path) -> list[Path]:
    walk = getattr(
        top, "walk_files", None
    )  # an uploaded archive's directory, in memory (collector/archive.py)
    if walk is not None:
        return list(walk())
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        out.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    return out


def _not_a_directory(root: Path, name: str, connector: str, bundle: Bundle) -> bool:
    """True (and a coverage entry) when bundle/<name> exists but is not a directory."""
    top = root / name
    if top.is_dir() or not (top.exists() or top.is_symlink()):
        return False
    bundle.coverage.append(
        Coverage(
            connector=connector,
            source=name,
            status="failed",
            observations=0,
            reason=f"{name} is {_kind(top)}, expected a directory",
        )
    )
    return True


def load_bundle(root: Path, *, read_once: bool = False) -> Bundle:
    """A bundle directory read (its log files scanned at load, in pieces).
    `read_once`: its log files are read once, by the engine, not also at load (`Bundle`)."""
    root = root if isinstance(root, Path) else Path(root)  # an ArchivePath stays one
    bundle = Bundle(root=root, context=load_context(root))
    read_data(bundle, read_once=read_once)
    return bundle


def read_data(bundle: Bundle, *, read_once: bool = False) -> None:
    """Read logs/, metrics/ and events/ under `bundle.root` for `bundle.context` into its sources and
    coverage (the local-files connector, connectors/files.py, reads a directory the same way).
    `read_once`: log files (but an uploaded archive's) are left to the engine's read (`Bundle`)."""
    root, context = bundle.root, bundle.context
    tctx = time_context(context)
    logs = root / "logs"
    seen_nodes: set[str] = set()
    unread: list[NodeCoverage] = []
    _not_a_directory(root, "logs", "files", bundle)
    if logs.is_dir():
        on_disk = read_once and getattr(logs, "walk_files", None) is None  # a bundle on disk, not an upload
        if on_disk:
            listed = dir_entries(str(logs))
            strays = [logs / e.name for e in listed if not entry_is_dir(e)]
            names = [e.name for e in listed if entry_is_dir(e)]
        else:
            entries = sorted(p for p in logs.iterdir() if not p.name.startswith("."))
            strays = [p for p in entries if not p.is_dir()]
            node_dirs = [p for p in entries if p.is_dir()]
            names = [d.name for d in node_dirs]
        for stray in strays:
            bundle.coverage.append(
                Coverage(
                    connector="files",
                    source=_display(stray.relative_to(root).as_posix()),
                    status="skipped",
                    observations=0,
                    reason=(
                        f"not read: {_kind(stray)}"
                        if stray.exists() and not stray.is_file()
                        else "not read: logs go in logs/<node>/ (or logs/_job/ for job-level logs)"
                    ),
                )
            )
        if on_disk:
            _read_logs_once(logs, names, bundle, unread)
        else:
            _scan_logs(root, node_dirs, bundle)
        seen_nodes.update(_display(name) for name in names if name != JOB_DIR)
    for node in context.nodes:
        if node not in seen_nodes:
            bundle.coverage.append(
                Coverage(
                    connector="files",
                    source=f"logs/{node}",
                    status="missing",
                    observations=0,
                    reason=f"no logs for node {node}",
                )
            )
    _load_metrics(root, tctx, bundle)
    _load_events(root, tctx, bundle)
    _load_traces(root, bundle)
    bundle.coverage.sort(key=lambda c: (c.source, c.connector))
    bundle._unread.extend(unread)  # their entries join `coverage` when it is next looked at


def _scan_logs(root: Path, node_dirs: list[Path], bundle: Bundle) -> None:
    """logs/<node>/ files scanned at load and read again, in pieces, when the engine gets to them
    (an uploaded archive's, or any bundle's without `read_once`)."""
    for node_dir in node_dirs:
        node = None if node_dir.name == JOB_DIR else _display(node_dir.name)
        tally = NodeCoverage(_display(node_dir.relative_to(root).as_posix()))
        for path in _files(node_dir):
            rel = _display(path.relative_to(root).as_posix())
            if _dump(bundle, tally, flight_recorder.read_source(path, rel, node)):
                continue
            facts = scan_log(path)  # in pieces: never a whole file in memory
            tally.files.append((rel, path, facts))
            if not facts.usable:
                continue
            clean = facts.status == "ok"
            bundle.sources.append(
                FileTextSource(
                    rel,
                    partial(_text_of, path, clean),
                    node,
                    newlines=facts.newlines,
                    nbytes=facts.nbytes,
                    chunks=partial(log_pieces, path, clean) if facts.streamed else None,
                )
            )
        bundle.coverage.extend(tally.entries())


def _read_logs_once(logs: Path, names: list[str], bundle: Bundle, unread: list[NodeCoverage]) -> None:
    """logs/<node>/ files (the directories `names`) of a bundle on disk left to the engine's one read
    (collector/bundle_logs.py): a small plain file costs a directory entry and a `stat` here. Other
    files (big, gzip'd, not regular, empty) are looked at here as `read_data` looks at every file
    without `read_once`."""
    for name in names:
        node = None if name == JOB_DIR else _display(name)
        top = _display(f"logs/{name}")
        tally = NodeCoverage(top)
        for sub, entry in node_files(os.path.join(logs, name)):
            rel = top + "/" + _display(sub)
            size = read_whole_size(entry)
            if size is not None:  # its first bytes say, when the engine reads it, whether it is a dump
                source = EngineRead(rel, entry.path, node, size, True, sniff=not entry.is_symlink())
                bundle.sources.append(source)
                tally.files.append((rel, entry.path, source))
                continue
            path = logs / name / sub
            if _dump(bundle, tally, flight_recorder.read_source(path, rel, node)):
                continue
            size = streamed_size(path)
            if size is not None:
                source = EngineRead(rel, path, node, size, False)
                bundle.sources.append(source)
                tally.files.append((rel, path, source))
                continue
            facts = scan_log(path)  # empty, not a regular file, gone: nothing to read
            tally.files.append((rel, path, facts))
        if tally.unread():
            unread.append(tally)
        else:
            bundle.coverage.extend(tally.entries())


def _dump(bundle: Bundle, tally: NodeCoverage, dump: tuple[TextSource | None, Coverage] | None) -> bool:
    """A Flight Recorder dump among a node's logs (`flight_recorder.read_source`) added to the
    bundle; False when the file is not one."""
    if dump is None:
        return False
    bundle.sources.extend([dump[0]] if dump[0] else [])
    bundle.coverage.append(dump[1])
    tally.dump_lines += dump[1].observations
    return True


def _load_metrics(root: Path, tctx: TimeContext, bundle: Bundle) -> None:
    top = root / "metrics"
    if _not_a_directory(root, "metrics", "metrics", bundle) or not top.is_dir():
        return
    for path in _files(top):
        rel = _display(path.relative_to(root).as_posix())
        text, status, reason = read_text(path)
        if text is None:
            bundle.coverage.append(
                Coverage(
                    connector="metrics",
                    source=rel,
                    status=status,  # type: ignore[arg-type]
                    observations=0,
                    reason=reason,
                )
            )
            continue
        try:
            series = parse_metrics(text, default_time=tctx.end)
        except MetricFormatError as exc:
            bundle.coverage.append(
                Coverage(
                    connector="metrics",
                    source=rel,
                    status="failed",
                    observations=0,
                    reason=f"not a Prometheus API response or metrics text: {exc}",
                )
            )
            continue
        except Exception as exc:  # one bad file never stops the analysis of the others
            bundle.coverage.append(
                Coverage(
                    connector="metrics",
                    source=rel,
                    status="failed",
                    observations=0,
                    reason=f"could not be parsed: {_describe(exc)}",
                )
            )
            continue
        n = sum(len(s.samples) for s in series)
        bundle.sources.append(MetricSource(name=rel, series=series))
        bundle.coverage.append(
            Coverage(
                connector="metrics",
                source=rel,
                status=status,  # type: ignore[arg-type]
                observations=n,
                reason=reason,
            )
        )


def _load_events(root: Path, tctx: TimeContext, bundle: Bundle) -> None:
    top = root / "events"
    if _not_a_directory(root, "events", "scheduler", bundle) or not top.is_dir():
        return
    for path in _files(top):
        rel = _display(path.relative_to(root).as_posix())
        text, status, reason = read_text(path)
        if text is None:
            bundle.coverage.append(
                Coverage(
                    connector="scheduler",
                    source=rel,
                    status=status,  # type: ignore[arg-type]
                    observations=0,
                    reason=reason,
                )
            )
            continue
        try:
            records = event_records(text, rel, tctx)
        except ValueError as exc:
            bundle.coverage.append(
                Coverage(connector="scheduler", source=rel, status="failed", observations=0, reason=str(exc))
            )
            continue
        except Exception as exc:  # one bad file never stops the analysis of the others
            bundle.coverage.append(
                Coverage(
                    connector="scheduler",
                    source=rel,
                    status="failed",
                    observations=0,
                    reason=f"could not be parsed: {_describe(exc)}",
                )
            )
            continue
        if not records:
            bundle.coverage.append(
                Coverage(
                    connector="scheduler",
                    source=rel,
                    status="failed",
                    observations=0,
                    reason="no scheduler or Kubernetes records recognised in this document",
                )
            )
            continue
        bundle.sources.append(RecordSource(name=rel, records=records))
        bundle.coverage.append(
            Coverage(
                connector="scheduler",
                source=rel,
                status=status,  # type: ignore[arg-type]
                observations=len(records),
                reason=reason,
            )
        )


def _load_traces(root: Path, bundle: Bundle) -> None:
    """traces/[<node>/]<file>: hang forensics (Flight Recorder dumps, `ncclras` output, py-spy and
    faulthandler stack dumps). A file directly under traces/ belongs to no node: the rank map places it."""
    top = root / "traces"
    if _not_a_directory(root, "traces", "files", bundle) or not top.is_dir():
        return
    for path in _files(top):
        rel = _display(path.relative_to(root).as_posix())
        parts = path.relative_to(top).parts
        node = _display(parts[0]) if len(parts) > 1 else None
        dump = flight_recorder.read_source(path, rel, node)
        if dump is not None:
            bundle.sources.extend([dump[0]] if dump[0] else [])
            bundle.coverage.append(dump[1])
            continue
        text, status, reason = read_text(path)
        bundle.coverage.append(
            Coverage(
                connector="files",
                source=rel,
                status=status,  # type: ignore[arg-type]
                observations=0 if text is None else text.count("\n"),
                reason=reason,
            )
        )
        if text is not None:
            bundle.sources.append(TextSource(name=rel, text=text, node=node))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return f"{type(exc).__name__}: {exc}"


def event_records(text: str, name: str, tctx: TimeContext) -> list[Record]:
    """The records of one events/ file: each of its `documents` rendered, named `name` (or
    `name[i]` when the file holds several). ValueError names what is wrong."""
    docs = documents(text)
    return [
        r for i, doc in enumerate(docs) for r in render(doc, name if len(docs) == 1 else f"{name}[{i}]", tctx)
    ]


def documents(text: str) -> list[object]:
    """The scheduler / Kubernetes documents in one file: `scontrol show` text, one JSON document, or
    JSON lines. ValueError names what is wrong."""
    scontrol = parse_scontrol(text)
    if scontrol is not None:
        return [scontrol]
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        try:
            return [json.loads(text)]
        except RecursionError:
            raise ValueError("invalid JSON: nested too deeply") from None
        except json.JSONDecodeError as first:
            docs: list[object] = []
            for line in text.splitlines():  # JSON lines
                if line.strip():
                    try:
                        docs.append(json.loads(line))
                    except (json.JSONDecodeError, RecursionError):
                        raise ValueError(f"invalid JSON at line {first.lineno}: {first.msg}") from None
            return docs
    try:
        return [d for d in yaml.load_all(text, Loader=strict_yaml.DataLoader) if d is not None]
    except RecursionError:
        raise ValueError("invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
