"""Turn what the server stored for one attempt into the engine's input: scope, sources, coverage.

How an attempt's scope (`AttemptContext`) is decided, most specific first:
1. an uploaded attempt.yaml (`PUT /v1/attempts/{workload}/{attempt}`), used as it is;
2. `hypocenter.*` attributes seen on the attempt's records (resource or record), the latest value
   of each winning: `hypocenter.workload.{name,scheduler,cluster}` (or `k8s.cluster.name`),
   `hypocenter.attempt.window.{start,end}` (RFC 3339 or Unix nanoseconds), `hypocenter.attempt.state`,
   `.exit_code`, `.reason`, `.nodes` (a list or a Slurm hostlist such as `node[01-04]`), `.ranks`
   (`node01=0-7;node02=8-15` or JSON), `.timezone`;
3. what the data shows: window = the earliest line stamp of the workload's own streams (the
   line's text, not its record's time: senders stamp records when they send them), at most
   `node_lookback_s` before the first record, or that first record's time when no line carries a
   stamp … last record time (the terminal-state record's time ends it); nodes = every `host.name`
   of the workload's records.

Node-scoped streams (no workload) join an attempt when their node is one of its nodes (short
names and FQDNs match) and one of their records lies within [window.start - lookback, window.end +
slack]; such a stream joins whole, as far as retention kept it (its boot lines anchor uptime stamps).
Streams are rebuilt line by line in `log.file.record_number` order, so line references and
timestamp inheritance work as they do on the files.

This module reads the store and builds `Source`s; it never extracts or decides anything.
"""

from __future__ import annotations

import gc
import json
import operator
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from itertools import groupby
from typing import Any, Final, NamedTuple, cast

from hypocenter.collector.hostlist import expand_hostlist  # moved there; re-exported for callers
from hypocenter.collector.scheduler_records import render
from hypocenter.engine.fleet import marks_of
from hypocenter.errors import InputError
from hypocenter.lineformat import TimeContext, parse_iso, parse_line, zone
from hypocenter.model import AttemptContext, Coverage, Window, Workload, parse_rank_ranges
from hypocenter.modelbase import check_state
from hypocenter.names import NODE_LABELS, NODE_RANKS_SCOPE, NodeNames
from hypocenter.sources import AttemptInput, MetricSource, Record, RecordSource, Series, Source, TextSource
from hypocenter.store.base import AttemptRow, LogLine, PointRow, Store

MAX_LINE_PADDING = 1 << 20  # blank lines kept to preserve line numbers across a gap, at most


def _ns(dt: datetime) -> int:
    return int(dt.timestamp() * 1_000_000) * 1000


def _from_ns(ns: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)


# Times the store can keep as signed 64-bit Unix nanoseconds, with room for the lookback and slack
# added around a window: a client's time outside them is no time at all.
TIME_MIN: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)
TIME_MAX: Final = datetime(2262, 1, 1, tzinfo=timezone.utc)


def parse_time(text: str | None) -> datetime | None:
    """RFC 3339 text or Unix nanoseconds (an integer string) → aware UTC time; None for text that is
    neither, or for a time outside TIME_MIN … TIME_MAX."""
    if text is None:
        return None
    t = text.strip()
    if re.fullmatch(r"\d{10,20}", t):
        n = int(t)
        n = n if n > 10**14 else n * 10**9
        return _from_ns(n) if n < _ns(TIME_MAX) else None
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None
    dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    try:
        return dt if TIME_MIN <= dt <= TIME_MAX else None
    except OverflowError:  # an offset that takes it past year 1 or 9999
        return None


def parse_ranks(text: str) -> dict[str, str]:
    t = text.strip()
    if t.startswith("{"):
        doc = json.loads(t)
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
    out: dict[str, str] = {}
    for part in re.split(r"[;\s]+", t):
        if "=" in part:
            node, spec = part.split("=", 1)
            parse_rank_ranges(spec)
            out[node.strip()] = spec.strip()
    return out


def _node_ranks(scope: dict[str, str], nodes: list[str], notes: list[str]) -> dict[str, str]:
    """The rank map the nodes' processes told one node at a time (`hypocenter.node.ranks`)."""
    names = NodeNames(nodes)
    ranks: dict[str, str] = {}
    for key, spec in sorted(scope.items()):
        if not key.startswith(NODE_RANKS_SCOPE):
            continue
        node = names.resolve(key[len(NODE_RANKS_SCOPE) :])
        if node is None:
            continue
        try:
            parse_rank_ranges(spec)
        except (ValueError, InputError) as exc:
            notes.append(f"hypocenter.node.ranks of {node} ignored: {exc}")
            continue
        ranks[node] = spec
    return ranks


def _state(text: str | None, notes: list[str]) -> str | None:
    if text is None:
        return None
    try:
        check_state(text.strip().upper())
    except ValueError as exc:
        notes.append(f"hypocenter.attempt.state ignored: {exc}")
        return None
    return text


def context_for(row: AttemptRow, now: datetime) -> tuple[AttemptContext, list[str]]:
    """The attempt's scope (see the module docstring); notes say what was inferred or ignored."""
    notes: list[str] = []
    if row.context is not None:
        return AttemptContext.model_validate(row.context), notes
    sc = row.scope
    start = parse_time(sc.get("window_start"))
    end = parse_time(sc.get("window_end"))
    if start is None:
        start = _from_ns(row.first_ns) if row.first_ns else now
        notes.append("window start inferred from the first record (no hypocenter.attempt.window.start)")
    if end is None:
        end_ns = row.terminal_ns or row.last_ns
        end = _from_ns(end_ns) if end_ns else max(start, now)
    end = max(start, end)
    nodes = expand_hostlist(sc["nodes"]) if sc.get("nodes") else list(row.nodes)
    ranks: dict[str, str] = {}
    if sc.get("ranks"):
        try:
            ranks = {n: s for n, s in parse_ranks(sc["ranks"]).items() if not nodes or n in nodes}
        except (ValueError, json.JSONDecodeError) as exc:
            notes.append(f"hypocenter.attempt.ranks ignored: {exc}")
    else:
        ranks = _node_ranks(sc, nodes, notes)
    tz = sc.get("timezone") or "UTC"
    try:
        zone(tz)
    except ValueError:
        notes.append(f"hypocenter.attempt.timezone {tz!r} ignored: unknown zone")
        tz = "UTC"
    exit_code: int | None = None
    if sc.get("exit_code") not in (None, ""):
        try:
            exit_code = int(float(sc["exit_code"]))
        except ValueError:
            notes.append(f"hypocenter.attempt.exit_code {sc['exit_code']!r} ignored: not a number")
    fields: dict[str, Any] = {
        "workload": Workload(
            id=row.workload,
            attempt=row.attempt,
            name=sc.get("name"),
            scheduler=sc.get("scheduler"),
            cluster=sc.get("cluster"),
        ),
        "window": Window(start=start, end=end),
        "state": _state(sc.get("state") or sc.get("banner_state"), notes),
        "exit_code": exit_code,
        "reason": sc.get("reason"),
        "nodes": nodes,
        "ranks": ranks,  # nodes as given
        "timezone": tz,
    }
    try:
        return AttemptContext(**fields), notes
    except ValueError as exc:  # the scope's own check (model.AttemptContext): a rank map on other nodes
        notes.append(f"hypocenter.attempt.ranks ignored: {exc}")
        fields["ranks"] = {}
        return AttemptContext(**fields), notes


class NodeMatcher:
    """Match stored node names (FQDNs, upper case) to the attempt's node names."""

    def __init__(self, nodes: list[str]) -> None:
        self._alias: dict[str, str] = {}
        for n in nodes:
            for a in (n, n.lower(), n.split(".", 1)[0].lower()):
                self._alias.setdefault(a, n)

    def resolve(self, name: str | None) -> str | None:
        if not name:
            return None
        key = name.strip().lower()
        if ":" in key:  # host:port
            key = key.rsplit(":", 1)[0]
        return self._alias.get(key) or self._alias.get(key.split(".", 1)[0])


class SourceKey(NamedTuple):
    """Which `Source` an attempt's rows become: one per node, stream (or rotated generation) and kind."""

    node: str | None  # the attempt's name for the node; None for the workload's own streams
    stream: str  # `stream.1`, `stream.2`, … for older (rotated) generations
    kind: str  # "text" or "doc"


_RUN = operator.attrgetter("node", "stream", "doc")  # a stored stream's rows of one kind
_in_range = operator.attrgetter("in_range")
_line_of = operator.attrgetter("line")
# Rows of one of the attempt's streams in arrival order; a node stream stored under several spellings
# of one node (an FQDN and its short name) is one spelling's rows after the other's.
_ARRIVAL = {False: operator.attrgetter("id"), True: operator.attrgetter("node", "id")}


def _text(rows: list[LogLine]) -> tuple[str, int]:
    """A stream's lines in order; gaps in record numbers become blank lines so refs keep their line.
    A `gap` row stands for a run of lines compaction blanked and merged (its body: how many), ending
    at its record number."""
    parts: list[str] = []  # each row's blank lines before it and its text, joined by newlines once
    add = parts.append
    expected = 1
    count = len(rows)
    for r in rows:
        line = r.line
        if r.gap:
            body = r.body
            merged = int(body) if body.isdigit() else 0
            add(
                "\n" * min(line - expected, max(MAX_LINE_PADDING, merged))
                if line is not None and line > expected
                else ""
            )
            count += (merged or 1) - 1
        elif line is not None and line > expected:
            add("\n" * min(line - expected, MAX_LINE_PADDING) + r.body)
        else:
            add(r.body)
        expected = (line if line is not None else expected) + 1
    return ("\n".join(parts) + "\n" if parts else ""), count


def _increasing(lines: list[int | None]) -> bool:
    """Record numbers all known, positive and strictly ascending: one generation, already in order."""
    if not lines or None in lines:
        return False
    known = cast("list[int]", lines)
    return known[0] > 0 and all(map(operator.lt, known, known[1:]))


def _one_generation(rows: list[LogLine]) -> list[LogLine] | None:
    """The rows in record-number order when no two of them stand for the same record number (a gap
    row for the run of lines ending at its own), else None. Batches of one file stored out of order
    (parallel exporters, several replicas) arrive with their record numbers out of order, but never
    with one twice: only a rotated or truncated file repeats them."""
    if None in map(_line_of, rows):
        return None
    ordered = sorted(rows, key=_line_of)
    high = 0
    for r in ordered:
        line = cast("int", r.line)
        first = line - (int(r.body) if r.gap and r.body.isdigit() else 1) + 1
        if first <= high:
            return None
        high = line
    return ordered


def _generations(streams: dict[SourceKey, list[LogLine]]) -> dict[SourceKey, list[LogLine]]:
    """Split each stream (rows in arrival order) where its record numbers start again — a rotated or
    truncated file — into `stream` (the newest file) and `stream.1`, `stream.2`, … (older ones, as
    logrotate names them); each part in record-number order."""
    out: dict[SourceKey, list[LogLine]] = {}
    for key, rows in streams.items():
        node, stream, kind = key
        lines = list(map(_line_of, rows))
        if (kind == "text" and _increasing(lines)) or all(n is None for n in lines):
            out[key] = rows  # the usual case, rows read in order: nothing to split or sort
            continue
        if kind == "text" and (ordered := _one_generation(rows)) is not None:
            out[key] = ordered  # one file's rows, stored out of order
            continue
        parts: list[list[LogLine]] = [[]]
        high = 0
        for r in rows:
            line = r.line
            if line is not None and line <= high and parts[-1] and kind == "text":
                parts.append([])
                high = 0
            parts[-1].append(r)
            high = max(high, line or 0)
        for age, part in enumerate(reversed(parts)):
            part.sort(key=lambda r: r.line if r.line is not None else 1 << 62)
            out[SourceKey(node, stream if age == 0 else f"{stream}.{age}", kind)] = part
    return out


STAMPED_LINES_READ = 8  # lines read from the head of each of an attempt's streams for its earliest stamp


def _start_inferred(row: AttemptRow) -> bool:
    """No uploaded scope, scheduler scope or `hypocenter.attempt.window.start` gave the window's start."""
    return row.context is None and parse_time(row.scope.get("window_start")) is None


def _start_from_lines(
    ctx: AttemptContext, streams: dict[SourceKey, list[LogLine]], lookback: timedelta, notes: list[str]
) -> AttemptContext:
    """The window starts at the earliest stamp the attempt's own lines carry, not at the first
    record's time: a sender stamps records when it sends them (the OpenTelemetry SDK when the program
    emits, a collector when it reads), which may be long after the line was written. Only each
    stream's first stamped line among its first few is read (lines arrive mostly in order), and the
    start moves back by at most `lookback`
    (`node_lookback_s`), so one stray old line cannot stretch the window over days."""
    tctx = TimeContext(tz=zone(ctx.timezone), start=ctx.window.start, end=ctx.window.end)
    floor = ctx.window.start - lookback
    earliest: datetime | None = None
    for key, rows in streams.items():
        if key.kind != "text":
            continue
        for r in rows[:STAMPED_LINES_READ]:
            t = parse_line(r.body, tctx).time
            if t is None or t < floor:
                continue
            if earliest is None or t < earliest:
                earliest = t
            break  # a stream's first stamped line is its earliest, near enough: one parse per stream
    if earliest is None or earliest >= ctx.window.start:
        return ctx
    for i, note in enumerate(notes):
        if note.startswith("window start inferred"):
            notes[i] = (
                "window start inferred from the earliest line stamp (no hypocenter.attempt.window.start)"
            )
    return ctx.model_copy(update={"window": Window(start=earliest, end=ctx.window.end)})


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a while: an attempt's assembly makes tens of thousands of rows,
    tuples and strings (no cycles among them), and each few hundred allocations would otherwise start
    a collection that walks the process' objects — a quarter of the assembly's time at 1,024 nodes."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def assemble(
    store: Store, row: AttemptRow, *, lookback_s: float, slack_s: float, now: datetime | None = None
) -> AttemptInput:
    with _collector_paused():
        return _assemble(store, row, lookback_s=lookback_s, slack_s=slack_s, now=now)


def _assemble(
    store: Store, row: AttemptRow, *, lookback_s: float, slack_s: float, now: datetime | None
) -> AttemptInput:
    ctx, notes = context_for(row, now or datetime.now(timezone.utc))
    matcher = NodeMatcher(ctx.nodes)
    stored = {n: m for n in store.known_nodes() if (m := matcher.resolve(n)) is not None}
    names: dict[str | None, str | None] = {}  # stored node name → the attempt's (one resolve per name)

    def read(part: Iterable[LogLine], node_scoped: bool) -> dict[SourceKey, list[LogLine]]:
        grouped: dict[SourceKey, list[LogLine]] = defaultdict(list)
        # runs of rows of one stored stream (and kind), in the order read: rows are tuples, and no
        # Python step is taken per row here (an attempt at 1,024 nodes reads tens of thousands)
        for (name, stream, doc), run in groupby(part, key=_RUN):
            try:
                node = names[name]
            except KeyError:
                node = names[name] = matcher.resolve(name) or name
            grouped[SourceKey(node, stream, "doc" if doc else "text")].extend(run)
        for rows in grouped.values():
            rows.sort(key=_ARRIVAL[node_scoped])  # the store does not sort: already in order, mostly
        return _generations(grouped)

    lo = _ns(ctx.window.start) - int(lookback_s * 1e9)
    hi = _ns(ctx.window.end) + int(slack_s * 1e9)
    streams = read(store.attempt_lines(row.id, lo, hi), False)
    if _start_inferred(row):
        ctx = _start_from_lines(ctx, streams, timedelta(seconds=lookback_s), notes)
        lo = _ns(ctx.window.start) - int(lookback_s * 1e9)
    tctx = TimeContext(tz=zone(ctx.timezone), start=ctx.window.start, end=ctx.window.end)
    for key, rows in read(store.node_lines(sorted(stored), lo, hi), True).items():
        # a node's older (rotated) files join only when they reach into the attempt's time
        if any(map(_in_range, rows)):
            streams.setdefault(key, rows)
    drops = store.drops(row.id, sorted(stored))
    sources: list[Source] = []
    coverage: list[Coverage] = []
    lines_by_node: dict[str, int] = defaultdict(int)
    for (node, stream, kind), rows in sorted(
        streams.items(), key=lambda kv: (kv[0].stream, kv[0].node or "", kv[0].kind)
    ):
        dropped = sum(n for (dn, ds), n in drops.items() if ds == stream and (dn or None) in (node, None))
        reason = f"{dropped} older line(s) removed by retention" if dropped else None
        if kind == "doc":
            records: list[Record] = []
            bad = 0
            for i, r in enumerate(rows):
                name = stream if len(rows) == 1 else f"{stream}[{i}]"
                try:
                    records.extend(render(json.loads(r.body), name, tctx))
                except (ValueError, RecursionError):
                    bad += 1
            if records:
                sources.append(RecordSource(name=stream, records=records))
            coverage.append(
                Coverage(
                    connector="otlp",
                    source=stream,
                    status="ok" if records and not bad else "partial" if records else "failed",
                    observations=len(records),
                    reason=None if records else "no scheduler or Kubernetes records recognised",
                )
            )
            continue
        text, count = _text(rows)
        sources.append(TextSource(name=stream, text=text, node=node))
        if node is not None:
            lines_by_node[node] += count
        coverage.append(
            Coverage(
                connector="otlp",
                source=stream,
                status="partial" if dropped else "ok",
                observations=count,
                reason=reason,
            )
        )
    for node in ctx.nodes:
        n = lines_by_node.get(node, 0)
        coverage.append(
            Coverage(
                connector="otlp",
                source=f"logs/{node}",
                status="ok" if n else "missing",
                observations=n,
                reason=None if n else f"no log records from node {node} (host.name)",
            )
        )

    points = store.attempt_points(row.id) + store.node_points(sorted(stored), lo, hi)
    series: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[PointRow]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for p in points:
        labels = dict(p.labels)
        if p.node is not None and not any(k in labels for k in NODE_LABELS):
            labels["hostname"] = matcher.resolve(p.node) or p.node  # a node-scoped series names its node
        series[p.source][(p.name, tuple(sorted(labels.items())))].append(p)
    for source in sorted(series):
        out: list[Series] = []
        n = 0
        for (name, label_items), pts in sorted(series[source].items()):
            pts.sort(key=lambda p: p.time_ns)
            out.append(
                Series(
                    name=name, labels=dict(label_items), samples=[(_from_ns(p.time_ns), p.value) for p in pts]
                )
            )
            n += len(pts)
        sources.append(MetricSource(name=source, series=out))
        coverage.append(Coverage(connector="otlp-metrics", source=source, status="ok", observations=n))
    coverage.sort(key=lambda c: (c.source, c.connector))
    return AttemptInput(context=ctx, sources=sources, coverage=coverage, notes=notes)


def summary(diagnosis_json: dict[str, Any], ctx: AttemptContext) -> dict[str, Any]:
    """The columns the store indexes a diagnosis by."""
    rc = diagnosis_json.get("root_cause") or {}
    culprits = set(rc.get("nodes") or [])
    for c in diagnosis_json.get("candidates") or []:
        culprits.update(c.get("nodes") or [])
    return {
        "id": diagnosis_json["id"],
        "workload": ctx.workload.id,
        "attempt": ctx.workload.attempt,
        "cluster": ctx.workload.cluster,
        "outcome": diagnosis_json["outcome"],
        "domain": rc.get("domain"),
        "subdomain": rc.get("subdomain"),
        "terminal_state": diagnosis_json.get("terminal_state"),
        "window_start_ns": _ns(ctx.window.start),
        "window_end_ns": _ns(ctx.window.end),
        "culprits": sorted(culprits),
        "affected": sorted(diagnosis_json.get("affected_nodes") or []),
        "marks": marks_of(diagnosis_json),
    }


__all__ = ["AttemptInput", "assemble", "context_for", "expand_hostlist", "parse_iso", "parse_time", "summary"]
