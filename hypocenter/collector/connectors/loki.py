"""The Loki pull connector: an attempt's candidate log lines, found by Loki itself.

What it asks (LogQL `GET /loki/api/v1/query_range`, direction=forward):

    {<selector>, host=~"(?i)(?:node01|node02)(?:[.:].*)?"} |~ "Xid \\(|NCCL WARN|…"

* Stream selector: the attempt's nodes on the node label, case-insensitive, short names matching
  FQDNs, plus any fixed matchers (`selector`, e.g. `job="varlogs"`). There is no standard node
  label: promtail and Alloy pass the host on only where a config relabels `__journal__hostname` or
  adds an external label, and `host` is the name most such configs pick, so it is the default
  (`node_label`); `hostname`, `nodename` or the promtail Helm chart's `node_name` are one argument
  away. With OTLP-native
  ingestion Loki keeps `host.name` as structured metadata `host_name`, not an index label:
  `node_label_kind="metadata"` then filters `| host_name=~"…"` after a `selector` that must name
  the streams. Job-level logs (not tied to one node) come from `workload_selector`, a template
  such as `slurm_job_id="{workload}"` (`{workload}`, `{attempt}` are filled in). When no stream
  carries those labels (`/series` is empty) they are taken as structured metadata — what Loki's
  OTLP endpoint makes of `hypocenter.workload.id` unless otlp_config promotes it — and the same
  matchers become label filters after `selector` (else `service_name=~".+"`, which Loki 3 gives
  every stream): `{service_name=~".+"} |~ "…" | hypocenter_workload_id="81234"`.
* Line filter: one regex alternation of the rules' literal tokens (the engine's prefilter), so
  Loki returns only lines that could produce an event. Loki rewrites a regex made only of literal
  alternatives into plain substring matches (pkg/logql/log/filter.go `simplify`), but Go's regexp
  parser first factors common prefixes of *adjacent* alternatives, which can defeat that; tokens are
  therefore interleaved so that neighbours never start with the same character. A query longer than
  `max_query_chars` (URL-encoded) is split into several token groups and node chunks; a line matched
  by several groups is kept once.
* Window: [start - lookback, end + slack] for node streams (the server's node_lookback_s /
  node_slack_s), [start, end + slack] for job-level streams; cut into pieces no longer than
  Loki's `max_query_length` (721 h by default; Loki measures end - start in whole milliseconds),
  nor `split_s`. Context fetches and `/series` stay within the same bound.
* Pagination: Loki returns at most `limit` entries (≤ max_entries_limit_per_query, 5000 by default),
  start inclusive, end exclusive. A full page moves `start` to its last timestamp T; the next page
  repeats every entry at T, so the entries at T already taken are skipped by count per (stream,
  line) — identical entries at one nanosecond stay as many as Loki holds. A page filled by one
  nanosecond cannot be paged past: the piece is reported partial.
* Context: rules that read lines around a match (`lines_before/after`) get them with Grafana's
  "show context" pair of queries on the exact stream (backward before, forward after).

Memory: only the lines Loki matched are held (candidates and their context, never a stream's other
lines), each page at most `max_entries` of them (Loki's max_entries_limit_per_query bounds one
answer), and a stream's text is made as its entries are let go; so a pull grows with the evidence
Loki finds (up to `max_pages` pages per piece), not with the bytes of the logs.

What it returns: one TextSource per stream (`loki/<node>/<file name or job>`, `_job` for job-level
streams), lines in time order. A line without a wall-clock stamp of its own is prefixed with its
Loki entry time, `[2026-11-02T10:15:03.123456789Z] `; the bracket keeps lineformat from reading
the next two words as a journalctl short-iso host and tag. Coverage per node (`logs/<node>`):
ok, partial (an error, the page cap or the context cap cut something short), failed (every query
failed), or missing (Loki holds no stream for the node in the window, per `/series`).

Never raises from `collect`; every HTTP call has the policy's timeout and retries (http_api.py).

Known limits. Evidence refs (`loki/node02/kern.log:3`) count lines of the returned stream, not of
the file on the node. The extractor's whole-stream heuristics see candidate lines only, and dated
lines no longer begin with an srun `--label` id: such ids are read as ranks, which is right when
srun starts one task per rank and wrong with one launcher per node (the whole file would show
that). Retry-After is not read; the policy's backoff applies.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import httpx

from hypocenter.collector.connectors.base import Collected, ConnectorError, RetryPolicy
from hypocenter.collector.connectors.http_api import DEFAULT_POLICY, HttpApi, auth_headers
from hypocenter.collector.connectors.scope import (
    NODE_LOOKBACK_S,
    NODE_SLACK_S,
    epoch_ns,
    node_regex,
    re2_escape,
)
from hypocenter.lineformat import TimeContext, parse_line, time_context
from hypocenter.model import AttemptContext, Coverage
from hypocenter.names import NodeNames
from hypocenter.sources import RuleQueries, Source, TextSource

JOB = "_job"
QUERY_RANGE = "/loki/api/v1/query_range"
# Ask for index labels apart from structured metadata: otherwise Loki splits one file into a
# stream per metadata value (detected_level …). Loki before 3.0 ignores the header.
CATEGORIZE = {"X-Loki-Response-Encoding-Flags": "categorize-labels"}
_FILE_LABELS = ("filename", "log_file_path", "log_file_name", "file", "path")
_NAME_LABELS = ("unit", "job", "service_name", "container", "app", "source")
# Structured metadata naming a stream's file: what Loki's OTLP endpoint makes of log.file.path / .name
_FILE_METADATA = ("log_file_path", "log_file_name")

StreamKey = tuple[tuple[str, str], ...]
Entry = tuple[StreamKey, int, str]


@dataclass(frozen=True, slots=True)
class LokiLimits:
    """The server-side limits the queries stay within (Loki's defaults) and our own caps."""

    max_entries: int = 5000  # limit per request; Loki's max_entries_limit_per_query
    # Loki's max_query_length: a range is end - start in whole milliseconds (queryrange/limits.go),
    # and one of exactly this length is taken
    max_query_length_s: float = 721 * 3600.0
    split_s: float = 24 * 3600.0  # a failed piece costs at most this much of the window
    max_query_chars: int = 6000  # URL-encoded LogQL per GET: under common 8 KiB proxy request-line limits
    max_pages: int = 2000  # per piece; beyond, the piece is partial
    max_context_fetches: int = 200  # candidate lines whose surrounding lines are fetched
    context_reach_s: float = 3600.0  # how far from a candidate its context lines are looked for


@dataclass
class _Run:
    """How the queries of one scope (a node chunk, or the job-level selector) went."""

    tried: int = 0
    failed: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)


class _Streams:
    """Entries per stream. Answers overlap (token groups, node and job scopes, context fetches); an
    entry (timestamp, line) seen k times in one answer and j in another is kept max(k, j) times,
    in the order it first arrived."""

    def __init__(self) -> None:
        self.entries: dict[StreamKey, list[tuple[int, str]]] = defaultdict(list)
        self._counts: dict[StreamKey, Counter[tuple[int, str]]] = defaultdict(Counter)

    def merge(self, answer: Iterable[Entry]) -> None:
        seen: dict[StreamKey, Counter[tuple[int, str]]] = defaultdict(Counter)
        for key, ts, line in answer:
            item = (ts, line)
            seen[key][item] += 1
            if seen[key][item] > self._counts[key][item]:
                self._counts[key][item] += 1
                self.entries[key].append(item)

    def count(self, key: StreamKey, ts: int) -> int:
        return sum(n for (t, _), n in self._counts[key].items() if t == ts)

    def take(self, key: StreamKey) -> list[tuple[int, str]]:
        """A stream's entries, forgotten here (its text is made from them, one stream at a time)."""
        self._counts.pop(key, None)
        return self.entries.pop(key)


def logql_string(text: str) -> str:
    """A LogQL double-quoted string (Go strconv.Unquote rules: `\\` and `"` escaped, no raw newline)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + out.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def interleave(tokens: Sequence[str]) -> list[str]:
    """The tokens reordered so that neighbours start with different characters where possible
    (greedy: the largest remaining group whose first character differs from the last one taken)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for t in sorted(set(tokens)):
        groups[t[:1]].append(t)
    out: list[str] = []
    last = None
    while groups:
        order = sorted(groups, key=lambda k: (-len(groups[k]), k))
        pick = next((k for k in order if k != last), order[0])
        out.append(groups[pick].pop(0))
        if not groups[pick]:
            del groups[pick]
        last = pick
    return out


def _encoded(text: str) -> int:
    return len(urllib.parse.quote(text, safe=""))


def line_filters(tokens: Sequence[str], budget: int) -> list[str]:
    """`|~ "a|b|…"` filters that together match a line iff it contains a token, each at most `budget`
    URL-encoded characters (a token too long for any filter gets one of its own)."""
    out: list[str] = []
    group: list[str] = []
    for tok in interleave(tokens):
        trial = [*group, re2_escape(tok)]
        if group and _encoded("|~ " + logql_string("|".join(trial))) > budget:
            out.append("|~ " + logql_string("|".join(group)))
            trial = [re2_escape(tok)]
        group = trial
    if group:
        out.append("|~ " + logql_string("|".join(group)))
    return out


def rfc3339_ns(ts: int) -> str:
    secs, frac = divmod(ts, 1_000_000_000)
    base = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=secs)
    return base.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def dated(line: str, ts: int, tctx: TimeContext) -> str:
    """The line, prefixed with its Loki time when it has no wall-clock stamp of its own."""
    if parse_line(line.split("\n", 1)[0][:512], tctx).time is not None:
        return line
    return f"[{rfc3339_ns(ts)}] {line}"


def pieces(lo: int, hi: int, longest_ns: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into consecutive half-open pieces of at most `longest_ns`."""
    out: list[tuple[int, int]] = []
    a = lo
    while a < hi:
        b = min(hi, a + longest_ns)
        out.append((a, b))
        a = b
    return out


class LokiConnector:
    """Pull an attempt's candidate log lines from Loki (module docstring)."""

    name = "loki"

    def __init__(
        self,
        url: str,
        *,
        policy: RetryPolicy = DEFAULT_POLICY,
        headers: Mapping[str, str] | None = None,
        tenant: str | None = None,
        token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        selector: str | None = None,
        node_label: str = "host",
        node_label_kind: Literal["index", "metadata"] = "index",
        workload_selector: str | None = None,
        lookback_s: float = NODE_LOOKBACK_S,
        slack_s: float = NODE_SLACK_S,
        limits: LokiLimits | None = None,
        queries: RuleQueries,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base = _inner(selector)
        if node_label_kind == "metadata" and not self.base:
            raise ValueError(
                "node_label_kind='metadata' needs a selector naming the streams (Loki requires "
                "a stream matcher; structured metadata can only be filtered after one)"
            )
        self.node_label = node_label
        self.node_label_kind = node_label_kind
        self.workload_selector = _inner(workload_selector) if workload_selector else None
        if self.workload_selector:
            _matchers(self.workload_selector)  # refused now rather than at the first attempt
        self._job_filter = ""  # label filters selecting the job's lines by structured metadata, when used
        self.lookback_s = lookback_s
        self.slack_s = slack_s
        self.limits = limits or LokiLimits()
        all_headers = {**auth_headers(token=token, basic_auth=basic_auth, tenant=tenant), **(headers or {})}
        self.api = HttpApi(url, policy=policy, headers=all_headers, transport=transport, sleep=sleep)
        self.tokens, self.context_tokens = list(queries.tokens), dict(queries.context_tokens)

    # ------------------------------------------------------------------------------------- collect

    def collect(self, context: AttemptContext) -> Collected:
        try:
            with self.api:
                return self._collect(context)
        except Exception as exc:  # a bug or an answer unlike any Loki's must not stop the analysis
            reason = f"internal error: {type(exc).__name__}: {exc}"
            sources = [f"logs/{n}" for n in context.nodes] or [f"logs/{JOB}"]
            return Collected(
                coverage=[
                    Coverage(connector=self.name, source=s, status="failed", observations=0, reason=reason)
                    for s in sources
                ]
            )

    def _collect(self, ctx: AttemptContext) -> Collected:
        tctx = time_context(ctx)
        names = NodeNames(ctx.nodes)
        start, end = epoch_ns(ctx.window.start), epoch_ns(ctx.window.end)
        hi = end + int(self.slack_s * 1e9) + 1  # Loki's end is exclusive; ours is inclusive
        node_lo = start - int(self.lookback_s * 1e9)
        streams = _Streams()
        runs: dict[str, _Run] = {}
        chunks = self._node_chunks(ctx.nodes)
        for chunk in chunks:
            run = _Run()
            for query in self._queries(self._node_selector(chunk), self._node_filter(chunk)):
                self._run(query, node_lo, hi, streams, run)
            for node in chunk:
                runs[node] = run
        job_run: _Run | None = None
        self._job_filter = ""
        if self.workload_selector is not None:
            job_run = self._job_streams(ctx, start, hi, streams)
        self._fetch_context(streams, node_lo, hi, names, runs, job_run)

        sources, lines = self._sources(streams, names, tctx)
        coverage = self._coverage(ctx, lines, runs, job_run, node_lo, hi, names)
        return Collected(sources=list[Source](sources), coverage=coverage)

    # ------------------------------------------------------------------------------------- queries

    def _job_streams(self, ctx: AttemptContext, lo: int, hi: int, streams: _Streams) -> _Run:
        """The job-level lines: streams matching the workload selector; when no stream carries those
        labels (Loki's OTLP endpoint keeps `hypocenter.workload.id` as structured metadata unless
        otlp_config promotes it), the same matchers as label filters after a broader selector."""
        assert self.workload_selector is not None
        run = _Run()
        filled = _fill(self.workload_selector, ctx)
        found = _Streams()
        for query in self._queries("{" + filled + "}", ""):
            self._run(query, lo, hi, found, run)
        if not found.entries and run.failed < run.tried:
            try:
                indexed = bool(self._series("{" + filled + "}", lo, hi))
            except ConnectorError:
                indexed = True  # unknown: keep the selector as written (coverage tells)
            if not indexed:
                self._job_filter = "".join(f" | {m}" for m in _matchers(filled))
                run = _Run()
                broad = (
                    "{" + (self.base or 'service_name=~".+"') + "}"
                )  # Loki 3 gives every stream a service_name
                for query in self._queries(broad, self._job_filter):
                    self._run(query, lo, hi, found, run)
        streams.merge((key, ts, line) for key, items in found.entries.items() for ts, line in items)
        return run

    def _node_selector(self, nodes: Sequence[str]) -> str:
        if self.node_label_kind == "metadata":
            return "{" + self.base + "}"
        matcher = f"{self.node_label}=~{logql_string(node_regex(nodes))}"
        return "{" + ", ".join(m for m in (self.base, matcher) if m) + "}"

    def _node_filter(self, nodes: Sequence[str]) -> str:
        if self.node_label_kind != "metadata":
            return ""
        return f" | {self.node_label}=~{logql_string(node_regex(nodes))}"

    def _node_chunks(self, nodes: Sequence[str]) -> list[list[str]]:
        """Nodes in groups whose selector takes at most half the query budget."""
        out: list[list[str]] = []
        for node in nodes:
            if (
                out
                and _encoded(self._node_selector([*out[-1], node]) + self._node_filter([*out[-1], node]))
                <= self.limits.max_query_chars // 2
            ):
                out[-1].append(node)
            else:
                out.append([node])
        return out

    def _queries(self, selector: str, node_filter: str) -> list[str]:
        if not self.tokens:
            return [selector + node_filter]
        budget = max(200, self.limits.max_query_chars - _encoded(selector + node_filter) - 8)
        # line filters first: substring tests are cheaper than the label filter on metadata
        return [f"{selector} {f}{node_filter}" for f in line_filters(self.tokens, budget)]

    def _longest(self, wanted_s: float | None = None) -> int:
        """The longest range (ns) Loki takes in one query, at most `wanted_s`."""
        cap = self.limits.max_query_length_s
        # whole milliseconds: Loki measures start and end in ms, so a piece of N ms is N ms whatever
        # its start's nanoseconds
        return max(1, int(min(cap, wanted_s if wanted_s is not None else cap) * 1e3)) * 10**6

    def _run(self, query: str, lo: int, hi: int, streams: _Streams, run: _Run) -> None:
        for a, b in pieces(lo, hi, self._longest(self.limits.split_s)):
            run.tried += 1
            try:
                entries, problem = self._paginate(query, a, b)
            except ConnectorError as exc:
                run.failed += 1
                run.note(str(exc))
                continue
            streams.merge(entries)
            if problem:
                run.note(problem)

    def _paginate(self, query: str, lo: int, hi: int) -> tuple[list[Entry], str | None]:
        """Every entry of `query` in [lo, hi), each exactly once (module docstring); a problem that
        cut the piece short, if any."""
        limit = self.limits.max_entries
        out: list[Entry] = []
        cursor = lo
        taken_at_cursor: Counter[tuple[StreamKey, str]] = Counter()
        problem: str | None = None
        for _ in range(self.limits.max_pages):
            page = self._query_range(query, cursor, hi, limit, "forward")
            skip = Counter(taken_at_cursor)
            for key, ts, line in page:
                if ts == cursor and skip[(key, line)] > 0:
                    skip[(key, line)] -= 1
                    continue
                out.append((key, ts, line))
            if len(page) < limit:
                return out, problem
            last = page[-1][1]
            if last == cursor:  # a whole page at one nanosecond: no start can page past it
                problem = (
                    f"more than {limit} entries at {rfc3339_ns(last)}: only {limit} of them read "
                    f"(raise the connector's max_entries, up to Loki's max_entries_limit_per_query)"
                )
                cursor, taken_at_cursor = last + 1, Counter()
                continue
            cursor = last
            taken_at_cursor = Counter((key, line) for key, ts, line in page if ts == last)
        return out, f"stopped after {self.limits.max_pages} pages of {limit} entries before {rfc3339_ns(hi)}"

    def _query_range(self, query: str, lo: int, hi: int, limit: int, direction: str) -> list[Entry]:
        params = {
            "query": query,
            "start": str(lo),
            "end": str(hi),
            "limit": str(limit),
            "direction": direction,
        }
        doc = self.api.get(QUERY_RANGE, params, what="Loki query_range", headers=CATEGORIZE)
        return self._entries(doc)

    def _entries(self, doc: Any) -> list[Entry]:
        """A query_range answer → (stream, ns, line) in time order (ties: as Loki listed them)."""
        data = doc.get("data") if isinstance(doc, dict) else None
        if (
            not isinstance(data, dict)
            or doc.get("status") != "success"
            or data.get("resultType") != "streams"
            or not isinstance(data.get("result"), list)
        ):
            raise ConnectorError(
                f"Loki query_range: not a streams answer: {str(doc)[:200]}", kind="permanent"
            )
        out: list[Entry] = []
        for stream in data["result"]:
            labels = stream.get("stream") if isinstance(stream, dict) else None
            values = stream.get("values") if isinstance(stream, dict) else None
            if not isinstance(labels, dict) or not isinstance(values, list):
                raise ConnectorError(
                    f"Loki query_range: malformed stream {str(stream)[:200]}", kind="permanent"
                )
            base = {str(k): str(v) for k, v in labels.items()}
            for value in values:
                if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], str):
                    raise ConnectorError(
                        f"Loki query_range: malformed entry {str(value)[:200]}", kind="permanent"
                    )
                try:
                    ts = int(value[0])
                except (TypeError, ValueError):
                    raise ConnectorError(
                        f"Loki query_range: bad timestamp {value[0]!r}", kind="permanent"
                    ) from None
                key_labels = base
                if len(value) > 2 and isinstance(value[2], dict):
                    key_labels = self._with_metadata(base, value[2].get("structuredMetadata"))
                out.append((tuple(sorted(key_labels.items())), ts, value[1]))
        out.sort(key=lambda e: e[1])
        return out

    def _with_metadata(self, base: dict[str, str], meta: object) -> dict[str, str]:
        """The stream's labels and the structured metadata that names its node (with
        `node_label_kind="metadata"`) and its file: logs sent to Loki's /otlp/v1/logs keep
        `log.file.path` / `log.file.name` as metadata `log_file_path` / `log_file_name`, and a file
        is a stream of its own."""
        if not isinstance(meta, dict):
            return base
        wanted = [n for n in _FILE_METADATA if n in meta and n not in base]
        if self.node_label_kind == "metadata" and self.node_label in meta:
            wanted.append(self.node_label)
        return {**base, **{n: str(meta[n]) for n in wanted}} if wanted else base

    # ------------------------------------------------------------------------------------- context

    def _fetch_context(
        self,
        streams: _Streams,
        lo: int,
        hi: int,
        names: NodeNames,
        runs: dict[str, _Run],
        job_run: _Run | None,
    ) -> None:
        """Lines around candidates that rules read as one block (`lines_before` / `lines_after`)."""
        if not self.context_tokens:
            return
        spans: dict[tuple[StreamKey, int], tuple[int, int]] = {}
        for key in sorted(streams.entries):
            for ts, line in streams.entries[key]:
                for tok, (b, a) in self.context_tokens.items():
                    if tok in line:
                        b0, a0 = spans.get((key, ts), (0, 0))
                        spans[(key, ts)] = (max(b0, b), max(a0, a))
        wanted = sorted((key, ts, b, a) for (key, ts), (b, a) in spans.items())
        reach = self._longest(self.limits.context_reach_s)  # one query each way, within max_query_length
        for i, (key, ts, before, after) in enumerate(wanted):
            run = self._run_of(key, names, runs, job_run)
            if i >= self.limits.max_context_fetches:
                if run is not None:
                    run.note(
                        f"context lines not fetched for {len(wanted) - i} candidate line(s) "
                        f"(more than {self.limits.max_context_fetches})"
                    )
                break
            selector = self._exact_selector(key)
            try:
                if before:
                    streams.merge(self._query_range(selector, max(lo, ts - reach), ts, before, "backward"))
                if after:
                    same = streams.count(key, ts)
                    streams.merge(
                        self._query_range(selector, ts, min(hi, ts + reach), after + same, "forward")
                    )
            except ConnectorError as exc:
                if run is not None:
                    run.note(f"context lines: {exc}")

    def _exact_selector(self, key: StreamKey) -> str:
        index = [(k, v) for k, v in key if not (self.node_label_kind == "metadata" and k == self.node_label)]
        selector = "{" + ", ".join(f"{k}={logql_string(v)}" for k, v in index) + "}"
        node = dict(key).get(self.node_label)
        if self.node_label_kind == "metadata" and node is not None:
            selector += f" | {self.node_label}={logql_string(node)}"
        elif node is None:
            selector += self._job_filter  # job lines found by structured metadata: only this job's
        return selector

    def _node_of(self, key: StreamKey, names: NodeNames) -> str | None:
        value = dict(key).get(self.node_label)
        if value is None:
            return None
        return names.resolve(value) or value

    def _run_of(
        self, key: StreamKey, names: NodeNames, runs: dict[str, _Run], job_run: _Run | None
    ) -> _Run | None:
        node = self._node_of(key, names)
        return runs.get(node) if node is not None else job_run

    # ------------------------------------------------------------------------------------- output

    def _sources(
        self, streams: _Streams, names: NodeNames, tctx: TimeContext
    ) -> tuple[list[TextSource], Counter[str]]:
        named: list[tuple[str, StreamKey, str | None]] = []
        for key in sorted(streams.entries):
            node = self._node_of(key, names)
            named.append((f"loki/{node or JOB}/{_leaf(key, self.node_label)}", key, node))
        clashes = Counter(name for name, _, _ in named)
        sources: list[TextSource] = []
        lines: Counter[str] = Counter()
        for name, key, node in named:
            if clashes[name] > 1:  # same file name in two streams: keep both, told apart by their labels
                name += "~" + hashlib.sha1(repr(key).encode()).hexdigest()[:8]
            entries = sorted(streams.take(key), key=lambda e: e[0])
            text = "".join(dated(line.rstrip("\r\n"), ts, tctx) + "\n" for ts, line in entries)
            sources.append(TextSource(name=name, text=text, node=node))
            lines[node or JOB] += len(entries)
        sources.sort(key=lambda s: s.name)
        return sources, lines

    def _coverage(
        self,
        ctx: AttemptContext,
        lines: Counter[str],
        runs: dict[str, _Run],
        job_run: _Run | None,
        lo: int,
        hi: int,
        names: NodeNames,
    ) -> list[Coverage]:
        out: list[Coverage] = []
        silent = [n for n in ctx.nodes if not lines[n] and runs[n].failed < runs[n].tried]
        logged: set[str] | None = None
        check_error: str | None = None
        if silent:
            try:
                logged = self._nodes_with_logs(silent, lo, hi, names)
            except ConnectorError as exc:
                check_error = str(exc)
        for node in ctx.nodes:
            run = runs[node]
            out.append(
                self._status(
                    f"logs/{node}",
                    lines[node],
                    run,
                    logged is None or node in logged,
                    check_error,
                    f"Loki holds no log stream with {self.node_label}={node} "
                    f"between {rfc3339_ns(lo)} and {rfc3339_ns(hi)}",
                )
            )
        if job_run is not None and self.workload_selector is not None:
            selector = "{" + _fill(self.workload_selector, ctx) + "}"
            has_logs, job_error = True, None
            if not lines[JOB] and job_run.failed < job_run.tried and not self._job_filter:
                try:
                    has_logs = bool(self._series(selector, epoch_ns(ctx.window.start), hi))
                except ConnectorError as exc:
                    job_error = str(exc)
            out.append(
                self._status(
                    f"logs/{JOB}",
                    lines[JOB],
                    job_run,
                    has_logs,
                    job_error,
                    f"Loki holds no log stream matching {selector} in the attempt's window",
                )
            )
        return out

    def _series(self, selector: str, lo: int, hi: int) -> list[dict[str, Any]]:
        """The streams (index label sets) matching `selector` with entries in [lo, hi)."""
        out: list[dict[str, Any]] = []
        for a, b in pieces(lo, hi, self._longest()):
            doc = self.api.get(
                "/loki/api/v1/series",
                [("match[]", selector), ("start", str(a)), ("end", str(b))],
                what="Loki series",
            )
            items = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise ConnectorError(
                    f"Loki series: not a list of label sets: {str(doc)[:200]}", kind="permanent"
                )
            out.extend(i for i in items if isinstance(i, dict))
        return out

    def _status(
        self, source: str, n: int, run: _Run, has_logs: bool, check_error: str | None, missing: str
    ) -> Coverage:
        problems = "; ".join(run.problems) or None
        if run.tried and run.failed == run.tried:
            return Coverage(
                connector=self.name, source=source, status="failed", observations=n, reason=problems
            )
        if problems:
            return Coverage(
                connector=self.name, source=source, status="partial", observations=n, reason=problems
            )
        if n:
            return Coverage(connector=self.name, source=source, status="ok", observations=n)
        if check_error:
            return Coverage(
                connector=self.name,
                source=source,
                status="ok",
                observations=0,
                reason=f"no line matched a rule token; whether the node logged at all is unknown "
                f"({check_error})",
            )
        if not has_logs:
            return Coverage(
                connector=self.name, source=source, status="missing", observations=0, reason=missing
            )
        return Coverage(
            connector=self.name,
            source=source,
            status="ok",
            observations=0,
            reason="no line matched a rule token",
        )

    def _nodes_with_logs(self, nodes: list[str], lo: int, hi: int, names: NodeNames) -> set[str]:
        """Which of `nodes` have any log stream in [lo, hi): the index (`/series`) for an index
        label; a line count for structured metadata (which the index does not know)."""
        found: set[str] = set()
        longest = self._longest()
        for chunk in self._node_chunks(nodes):
            if self.node_label_kind == "index":
                labels = [i.get(self.node_label) for i in self._series(self._node_selector(chunk), lo, hi)]
                found.update(n for v in labels if isinstance(v, str) and (n := names.resolve(v)))
                continue
            for a, b in pieces(lo, hi, longest):
                seconds = max(1, -(-(b - a) // 1_000_000_000))
                expr = (
                    f"sum by ({self.node_label}) (count_over_time({self._node_selector(chunk)}"
                    f"{self._node_filter(chunk)} [{seconds}s]))"
                )
                doc = self.api.get(
                    "/loki/api/v1/query", {"query": expr, "time": str(b)}, what="Loki line count"
                )
                result = (doc.get("data") or {}).get("result") if isinstance(doc, dict) else None
                labels = [
                    (r.get("metric") or {}).get(self.node_label) for r in result or [] if isinstance(r, dict)
                ]
                found.update(n for v in labels if isinstance(v, str) and (n := names.resolve(v)))
        return found


def _inner(selector: str | None) -> str:
    """`{job="x"}` or `job="x"` → `job="x"`."""
    text = (selector or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    return text


_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|`[^`]*`)\s*(?:,|$)')


def _matchers(selector: str) -> list[str]:
    """`a="x", b=~"y"` → [`a="x"`, `b=~"y"`] (each usable as a LogQL label filter)."""
    out: list[str] = []
    pos = 0
    while pos < len(selector.strip()):
        m = _MATCHER.match(selector, pos)
        if not m:
            raise ValueError(
                f"cannot read the stream selector {selector!r} at character {pos}: "
                f'expected name="value" matchers separated by commas'
            )
        out.append(f"{m.group(1)}{m.group(2)}{m.group(3)}")
        pos = m.end()
    return out


def _fill(template: str, ctx: AttemptContext) -> str:
    """Put the workload id and attempt into a selector template, escaped for a LogQL string."""

    def esc(v: object) -> str:
        return logql_string(str(v))[1:-1]

    return template.replace("{workload}", esc(ctx.workload.id)).replace(
        "{attempt}", esc(ctx.workload.attempt)
    )


def _leaf(key: StreamKey, node_label: str) -> str:
    labels = dict(key)
    for name in _FILE_LABELS:
        if labels.get(name):
            return posixpath.basename(labels[name].rstrip("/")) or labels[name]
    for name in _NAME_LABELS:
        if labels.get(name):
            return labels[name].replace("/", "_")
    rest = [f"{k}={v}" for k, v in key if k != node_label]
    return ",".join(rest).replace("/", "_") or "stream"
