"""Scan, then parse: turn sources into events.

One Aho-Corasick automaton of every rule's literal `tokens` runs over a whole stream's raw bytes
(in Rust, `ahocorasick_rs`); only lines containing a token become candidates and are decoded, and
only candidates get their prefix parsed and their rules' patterns applied. Lines without a stamp
inherit the last stamp of their stream, found by a bounded backward look from the candidate.
Kernel lines that only carry `[uptime]` seconds are anchored to wall time per node when any
stream of that node pairs a wall stamp with an uptime stamp; otherwise they are placed
relative to the window end and marked approximate.

This is the hot path: every line of every log passes the prefilter. Keep per-line Python work
out of it.
"""

from __future__ import annotations

import bisect
import re
import sys
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from itertools import accumulate
from typing import Any, NamedTuple

from hypocenter.engine.forked import spread
from hypocenter.engine.matching import LazyPattern, Match, Pattern, per_line, suffix_pattern
from hypocenter.engine.prefilter import PatternScanner, TokenScanner, joined
from hypocenter.engine.rules import ExtractSpec, MetricSpec, Rule, Ruleset
from hypocenter.lineformat import MAX_LINE, LineHeader, TimeContext, parse_iso, parse_line
from hypocenter.model import AttemptContext, Event, FieldValue, SourceKind, isoformat
from hypocenter.names import NodeNames
from hypocenter.sources import (
    FileTextSource,
    MetricSource,
    NotText,
    Record,
    RecordSource,
    Series,
    Source,
    TextSource,
)

MAX_TEXT = 600  # evidence text kept per event


def extraction_line(body: str) -> str:
    """A line's text as extraction reads it: its first MAX_LINE bytes, decoded with replacement."""
    if body.isascii():
        return body[:MAX_LINE]
    return body.encode("utf-8", "surrogateescape")[:MAX_LINE].decode("utf-8", "replace")


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """`text` up to `limit` characters; a cut text ends with an ellipsis, so no one reads it as whole."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


BACKSCAN_LINES = 4096  # how far back a stamp-less line looks for a stamp to inherit
_SCHED_PREFIXES = ("srun:", "slurmstepd:", "slurmstepd-", "slurmd:", "sbatch:", "salloc:")
_BEYOND = sys.maxsize  # "no stamped line ahead" holds for the rest of the stream
HEAD_BYTES = 65536  # the start of a stream probed for boot anchors (wall + uptime stamps, RTC)
HEAD_LINES = 20

_UPTIME = re.compile(r"\[\s*(\d+\.\d+)\]")
_RANK_FILE = re.compile(r"(?:^|[/_.-])rank[-_]?(\d{1,6})(?:\.[a-z]+)*$")

# Messages only the kernel writes, for dmesg exports whose stamps carry no "kernel:" tag
# (`dmesg --time-format=iso`, journalctl -k -o cat).
_KERNEL_MESSAGE = re.compile(
    r"(?:NVRM: |nvidia(?:-\w+)?: |mlx5_core |mlx5_ib|pcieport |nfs: server |Lustre(?:Error)?: |INFO: task |"
    r"(?:Memory cgroup )?[Oo]ut of memory: |oom-kill:|\S+ invoked oom-killer|Kernel panic|mce: |EDAC |"
    r"clocksource: |BUG: |NETDEV WATCHDOG|rtc_cmos |pci \d{4}:|ib\w*: |nvme\d|XFS |EXT4-fs )"
)
# Every stamp `parse_line` reads a time from holds an hour and minutes ("10:15", two digits each, not
# after a digit) — all but a JSON document's, which is a field: a line without either has no time.
STAMP_HINT = re.compile(r"(?<!\d)\d\d:\d\d|\{")
_RTC = re.compile(r"\[\s*(\d+\.\d+)\] rtc_cmos \S+ setting system clock to \S+ UTC \((\d+)\)")
_LABEL_AND_RANK = re.compile(rb"(?m)^(\d{1,6}): \[rank(\d+)\]:")
_LABEL = re.compile(rb"(?m)^(\d{1,6}): ")
_LABEL_AFTER_NEWLINE = re.compile(rb"\n\d{1,6}: ")  # a literal first: Python's `re` then skips ahead fast
_ANCHOR_TOKENS = (b"rtc_cmos", b"srun: error:")  # boot anchors and srun's task errors: kept as evidence
_LABEL_AND_LOCAL = re.compile(
    rb"(?m)^ *\d{1,6}: \[[A-Za-z_][\w-]*?\d+\]:"
)  # srun -l torchrun --tee: one task per node
_SRUN_TASK_NODE = re.compile(rb"srun: error: ([\w.-]+): task (\d+):")


@dataclass(slots=True)
class _Compiled:
    rule: Rule
    spec: ExtractSpec
    regex: Pattern
    sources: frozenset[str]
    ints: frozenset[str]
    table: dict[str, dict[str, FieldValue]] | None


@dataclass
class _Pending:
    event: Event
    uptime: float
    stream: str


@dataclass
class ExtractionResult:
    events: list[Event] = field(default_factory=list)
    candidates: int = 0
    lines_scanned: int = 0


class Extractor:
    """Compiled extraction rules of a ruleset; reusable across attempts (holds no attempt state)."""

    def __init__(self, ruleset: Ruleset) -> None:
        self._by_token: dict[str, list[_Compiled]] = defaultdict(list)
        self.metric_rules: list[tuple[Rule, MetricSpec]] = []
        self.tables = ruleset.tables
        for rule in ruleset.rules:
            if rule.extract is not None:
                spec = rule.extract
                table = ruleset.tables.get(spec.lookup) if spec.lookup else None
                comp = _Compiled(
                    rule, spec, LazyPattern(spec.pattern), frozenset(spec.source), frozenset(spec.ints), table
                )
                for tok in spec.tokens:
                    self._by_token[tok].append(comp)
            if rule.metric is not None:
                self.metric_rules.append((rule, rule.metric))
        self.tokens = sorted(self._by_token, key=lambda t: (-len(t), t))
        # Per token (automaton index): the most lines before / after a line with it that its rules read.
        self._reach = [
            (
                max(c.spec.lines_before for c in self._by_token[t]),
                max(c.spec.lines_after for c in self._by_token[t]),
            )
            for t in self.tokens
        ]
        # One multi-literal matcher over every rule's literal tokens, run on raw bytes outside Python
        # (engine/prefilter.py): ~40x the throughput of a Python `re` alternation of the same literals.
        self._scanner = TokenScanner(self.tokens)
        self._reach_back = max((before for before, _ in self._reach), default=0)
        # Evidence's anchor tokens (every occurrence, as `bytes.find` finds them) and srun labels
        # after a newline, in one Hyperscan pass; without Hyperscan, `bytes.find` and `re`.
        self._marks = PatternScanner.of([*map(re.escape, _ANCHOR_TOKENS), _LABEL_AFTER_NEWLINE.pattern])
        # Hyperscan reports every occurrence of every token: the tokens of a line are those of its hits
        # (the automaton may leave out overlapping ones, so without it no line is told inert).
        self.tokens_exact = self._scanner.engine == "hyperscan"
        # token → its rules' relaxed patterns (`inert`), alone and for lines joined
        self._suffix_checks: dict[int, tuple[list[Pattern], list[Any] | None] | None] = {}

    def scan(self, data: bytes) -> list[tuple[int, int, int]]:
        """(token index, start, end) of token occurrences, ordered by start (see engine/prefilter.py)."""
        return self._scanner.scan(data)

    def is_candidate(self, text: str) -> bool:
        return bool(self.scan(text.encode("utf-8", "surrogateescape")))

    def inert(self, tokens: Iterable[int], line: str) -> bool:
        """No rule of `tokens` (the token indices found on `line`, every one) can make an event of the
        line: each reads the line alone (no lines around it) and its pattern, run where it runs — on
        the message, which is what is left of the line once prefixes are peeled, a suffix of it — finds
        nothing, because even the pattern relaxed to match wherever a suffix matches (`suffix_pattern`)
        finds nothing in the whole line. A JSON line's message is a field, not a suffix: never inert.
        `line`: as extraction reads it (`extraction_line`)."""
        if not self.tokens_exact or "{" in line or "\n" in line:
            return False
        for t in tokens:
            checks = self._checks(t)
            if checks is None or any(p.search(line) is not None for p in checks[0]):
                return False
        return True

    def inert_lines(
        self, lines: Sequence[str], tokens: Sequence[Iterable[int]], known: dict[str, bool] | None = None
    ) -> list[bool]:
        """`inert` of each of `lines` (texts as stored) with its `tokens`: each token's patterns run
        once over its lines joined, matching within a line only (RE2's `never_nl`). `known`: texts
        told already (a line's tokens are its text's), read and filled."""
        if not self.tokens_exact:
            return [False] * len(lines)
        if known is not None:
            todo = [i for i, line in enumerate(lines) if line not in known]
            told = self.inert_lines([lines[i] for i in todo], [tokens[i] for i in todo])
            known.update(zip((lines[i] for i in todo), told, strict=True))
            return [known[line] for line in lines]
        out = [True] * len(lines)
        by_token: dict[int, list[int]] = defaultdict(list)
        for i, (line, found) in enumerate(zip(lines, tokens, strict=True)):
            if len(line) > MAX_LINE or not line.isascii():  # not the text extraction reads
                out[i] = self.inert(found, extraction_line(line))
            elif "{" in line or "\n" in line:
                out[i] = False
            else:
                for t in found:
                    by_token[t].append(i)
        for t, indices in by_token.items():
            checks = self._checks(t)
            if checks is None or checks[1] is None:
                for i in indices:
                    out[i] = out[i] and self.inert((t,), lines[i])
                continue
            text = "\n".join(lines[i] for i in indices)
            starts = [0, *accumulate(len(lines[i]) + 1 for i in indices)]
            for p in checks[1]:
                for m in p.finditer(text):
                    out[indices[bisect.bisect_right(starts, m.start()) - 1]] = False
        return out

    def _checks(self, token: int) -> tuple[list[Pattern], list[Any] | None] | None:
        """The relaxed patterns of a token's rules, each alone and for lines joined (None when one
        rule's cannot be told, or reads lines around its own)."""
        if token in self._suffix_checks:
            return self._suffix_checks[token]
        alone: list[Pattern] = []
        joined_: list[Any] | None = []
        for comp in self._by_token[self.tokens[token]]:
            relaxed = suffix_pattern(comp.spec.pattern)
            if relaxed is None or comp.spec.lines_before or comp.spec.lines_after:
                self._suffix_checks[token] = None
                return None
            alone.append(relaxed)
            lines = per_line(relaxed.pattern)
            joined_ = None if joined_ is None or lines is None else [*joined_, lines]
        self._suffix_checks[token] = (alone, joined_)
        return alone, joined_

    def alone(self, tokens: Iterable[int], kinds: frozenset[str]) -> bool:
        """Every rule of `tokens` reads its line alone (no lines around it) and makes no event of `kinds`."""
        for t in tokens:
            for comp in self._by_token[self.tokens[t]]:
                if comp.spec.lines_before or comp.spec.lines_after or comp.spec.event in kinds:
                    return False
        return True

    def evidence_lines(
        self, lines: Sequence[tuple[int, str]], tctx: TimeContext, *, tail: int = 200
    ) -> set[int]:
        """Which of a stream's lines (line number, text; ascending) extraction can ever read.

        A stream rebuilt from these lines alone, with blank lines in place of the others, extracts
        exactly the events the whole stream does: candidate lines (but the inert ones `_quiet` tells
        apart) and the context lines rules read around them; the nearest stamped line before and
        after each candidate (the stamps an unstamped candidate inherits and is bounded by; the lines
        between are unstamped, blank or not); the lines with an uptime stamp among the first 20 (wall/uptime stamp pairs; all 20
        when they are long) and RTC lines (boot anchors); the first line of each srun label and the
        first label+rank pair (tasks vs ranks); `srun: error: <node>: task N` lines; the highest
        uptime among the last `tail` lines (the uptime a stream ends at); and as many last lines as
        rules read before a candidate (the context of candidates still to come). Returns indices
        into `lines`."""
        if not lines:
            return set()
        numbers, bodies = (list(c) for c in zip(*lines, strict=True))
        return self.evidence_columns(numbers, bodies, tctx, tail=tail)

    def evidence_columns(
        self,
        numbers: Sequence[int],
        bodies: Sequence[str],
        tctx: TimeContext,
        *,
        tail: int = 200,
        scanned: tuple[bytes, list[int], list[tuple[int, int, int]]] | None = None,
        inert: dict[str, bool] | None = None,
    ) -> set[int]:
        """`evidence_lines` of the lines `numbers` (ascending) with texts `bodies`: the same, with no
        Python step per line but for the last `tail` (one prefilter pass, regexes over the lines joined).
        `scanned`: the lines joined, where each starts and `scan`'s hits in them, when the caller
        has them already (`joined` and `scan` of the same lines). `inert`: lines told inert or not
        already (`inert_lines`' `known`), read and filled."""
        if not numbers:
            return set()
        if scanned is None:
            data, starts = joined(bodies)
            hits = self.scan(data)
        else:
            data, starts, hits = scanned
        # The lines a candidate still to come reads back into: its rules' lines before it (the lines
        # after it come with it or later).
        # The last lines by number, not by position: `numbers` may skip the lines left out already
        # (the rebuilt stream has blank lines there), and which lines a stream keeps must not depend
        # on which it had left out before (a stream's batches may arrive in any order).
        last = numbers[-1]
        keep: set[int] = set(range(bisect.bisect_right(numbers, last - self._reach_back), len(numbers)))
        head = bisect.bisect_right(numbers, HEAD_LINES)
        # Of the first lines, only one with an uptime stamp can pair it with a wall stamp (a boot
        # anchor, `_boot_anchors`): the others are blank lines there — unless the head is long
        # enough that blanking its lines would bring other bytes into the HEAD_BYTES anchors are read from.
        long_head = sum(map(len, bodies[:head])) + head >= HEAD_BYTES // 4
        keep.update(i for i in range(head) if long_head or _UPTIME.search(bodies[i]) is not None)
        reach: dict[int, tuple[int, int]] = {}  # candidate line → lines its rules read before / after it
        found: dict[int, list[int]] = {}  # candidate line → its tokens
        for tok, start, _ in hits:
            i = bisect.bisect_right(starts, start) - 1
            before, after = reach.get(i, (0, 0))
            tok_before, tok_after = self._reach[tok]
            reach[i] = (max(before, tok_before), max(after, tok_after))
            found.setdefault(i, []).append(tok)
        stamped: dict[int, bool] = {}

        def has_stamp(i: int) -> bool:
            if i not in stamped:
                head = bodies[i][:512]
                stamped[i] = STAMP_HINT.search(head) is not None and parse_line(head, tctx).time is not None
            return stamped[i]

        quiet = self._quiet(found, numbers, bodies, tctx, has_stamp, inert)
        unsure = sorted(quiet)
        # Candidates from the last one back: a line whose look back for a stamp ends without one takes
        # the time of the last candidate before it whose time is known, which can be a quiet one in
        # the lines it looked at (one further back has a stamped candidate after it, before this line).
        for i in sorted(reach, reverse=True):
            if i in quiet:
                continue
            before, after = reach[i]
            n = numbers[i]
            lo = bisect.bisect_left(numbers, n - before)
            hi = bisect.bisect_right(numbers, n + after)
            keep.update(range(lo, hi))
            for step, limit in ((-1, n - BACKSCAN_LINES), (1, n + BACKSCAN_LINES)):
                j = i + step
                while 0 <= j < len(numbers) and (numbers[j] >= limit if step < 0 else numbers[j] <= limit):
                    if has_stamp(j):
                        keep.add(j)
                        break
                    j += step
                else:
                    if step < 0:  # the quiet lines it looked at are kept (and come after it here)
                        at = bisect.bisect_left(unsure, bisect.bisect_left(numbers, limit))
                        quiet.difference_update(unsure[at:])
                        del unsure[at:]
        # The stream's end: the last stamp (inherited by candidates still to come) and the highest
        # uptime among its last `tail` lines (where uptime-only lines are placed without an anchor).
        for j in range(len(numbers) - 1, -1, -1):
            if has_stamp(j):
                keep.add(j)
                break
        uptimes = [
            (float(m.group(1)), j)
            for j in range(bisect.bisect_right(numbers, last - tail), len(numbers))
            if (m := _UPTIME.search(bodies[j])) is not None
        ]
        if uptimes:
            keep.add(max(uptimes)[1])
        if self._marks is not None:
            marks = self._marks.scan(data)
            anchors = [at for kind, at in marks if kind < len(_ANCHOR_TOKENS)]
            after_newline = [at for kind, at in marks if kind == len(_ANCHOR_TOKENS)]
        else:
            anchors = [at for token in _ANCHOR_TOKENS for at in _occurrences(data, token)]
            after_newline = [m.start() for m in _LABEL_AFTER_NEWLINE.finditer(data)]
        keep.update(bisect.bisect_right(starts, at) - 1 for at in anchors)
        labels: set[bytes] = set()
        pair_seen = False
        # Lines that start with an srun label ("12: "): a newline and digits, then the line's own check.
        labelled = [0] if _LABEL.match(data) else []
        labelled.extend(
            i for at in after_newline if starts[(i := bisect.bisect_right(starts, at + 1) - 1)] == at + 1
        )
        for i in labelled:  # a line that starts with an srun label (few, if any)
            raw = bodies[i][:24].encode("utf-8", "surrogateescape")
            label = _LABEL.match(raw)
            if label is not None:
                if label.group(1) not in labels:
                    labels.add(label.group(1))
                    keep.add(i)
                if not pair_seen and (_LABEL_AND_RANK.match(raw) or _LABEL_AND_LOCAL.match(raw)):
                    pair_seen = True
                    keep.add(i)
        return keep

    def _quiet(
        self,
        found: dict[int, list[int]],
        numbers: Sequence[int],
        bodies: Sequence[str],
        tctx: TimeContext,
        has_stamp: Callable[[int], bool],
        known: dict[str, bool] | None = None,
    ) -> set[int]:
        """The candidate lines (of `found`: line → tokens) that evidence needs not keep for their own
        sake. A stream rebuilt without them extracts the same events: they are `inert` (no events);
        they hold no uptime stamp (a wall and an uptime stamp on one line are a boot anchor); and a
        stamped candidate comes within BACKSCAN_LINES after each. That one is what a later look ahead
        for a stamp finds (one that ends without a stamp is taken to hold for the rest of the stream),
        and the last known time for every line after it; a line before it whose look back ends
        without a stamp keeps the quiet lines it looked at (`evidence_columns`). Their times are
        inherited from, or are, stamped lines, which the evidence keeps wherever a line reads one.
        Every condition is on the lines within BACKSCAN_LINES: batches stored in any order keep the
        same lines."""
        if not self.tokens_exact or not found:
            return set()
        first: dict[str, int] = {}  # a storm repeats its lines: each text is looked at once
        for i in found:
            first.setdefault(bodies[i], i)
        texts = list(first)
        inert = self.inert_lines(texts, [found[first[t]] for t in texts], known)
        quiet = {
            text
            for text, q in zip(texts, inert, strict=True)
            if q and _UPTIME.search(extraction_line(text)) is None
        }
        ordered = sorted(found)
        at = [numbers[i] for i in ordered]

        def stamped(i: int) -> bool:  # a candidate of extraction's, with a stamp as it reads it
            body = bodies[i]
            if body.isascii():  # (`has_stamp` reads the first 512 characters)
                return len(body) <= MAX_LINE and has_stamp(i)
            whole = len(body.encode("utf-8", "surrogateescape")) <= MAX_LINE  # its tokens all read
            return whole and parse_line(extraction_line(body), tctx).time is not None

        out: set[int] = set()
        ahead = -1  # a stamped candidate, as far ahead as the last look found one
        clean = (0, -1)  # candidates (positions in `ordered`) known to hold no stamp
        for k, i in enumerate(ordered):
            if bodies[i] not in quiet:
                continue
            limit = numbers[i] + BACKSCAN_LINES
            if not (ahead > i and numbers[ahead] <= limit):
                m = bisect.bisect_right(at, limit) - 1
                while m > k:
                    if clean[0] <= m <= clean[1]:
                        m = clean[0] - 1
                    elif stamped(ordered[m]):
                        ahead = ordered[m]
                        break
                    else:
                        m -= 1
                else:
                    clean = (k + 1, bisect.bisect_right(at, limit) - 1)
                    continue
            out.add(i)
        return out

    # ----------------------------------------------------------------------------------------- text

    def extract(
        self, sources: Iterable[Source], context: AttemptContext, tctx: TimeContext, *, workers: int = 1
    ) -> ExtractionResult:
        """Events of every source. With `workers` > 1 (and fork available), text streams are extracted
        by that many processes (this one and forked ones, engine/forked.py), each stream whole in one
        of them; results are merged in source order, so the events are the ones one process finds, in
        the same order."""
        names = NodeNames(context.nodes)
        if context.nodes and not tctx.hosts:  # pdsh-style "host: " prefixes are peeled for these names only
            tctx = replace(tctx, hosts=frozenset(names.aliases()))
        job = _Job(tctx, names, context.rank_nodes(), list(context.nodes))
        result = ExtractionResult()
        pending: list[_Pending] = []
        anchors: dict[str, list[timedelta]] = defaultdict(list)  # node → wall − uptime (boot time offsets)
        max_uptime: dict[str, float] = {}
        listed = list(sources)
        for src, stream in zip(listed, self._streams(listed, job, workers), strict=True):
            if stream is not None and isinstance(src, TextSource):
                if isinstance(src, FileTextSource):  # what reading it told (in a worker process, maybe)
                    src.facts = stream.facts
                    src.newlines = stream.lines
                result.events.extend(stream.events)
                result.candidates += stream.candidates
                result.lines_scanned += stream.lines
                if src.node:
                    anchors[src.node].extend(stream.anchors)
                pending.extend(stream.pending)
                if stream.last_uptime is not None:
                    max_uptime[src.name] = stream.last_uptime
            elif isinstance(src, RecordSource):
                for rec in src.records:
                    self._record(rec, tctx, names, result)
            elif isinstance(src, MetricSource):
                self._metrics(src, tctx, names, result)
        # The boot-anchor probe of the streams' first lines, for the nodes with uptime-only events only
        # (most attempts have none: their streams' heads are never looked at).
        needed = {p.event.node for p in pending if p.event.node}
        for src in listed:
            if isinstance(src, TextSource) and src.node in needed:
                anchors[src.node].extend(_boot_anchors(_head(src), tctx))
        for p in pending:
            node = p.event.node or ""
            offs = anchors.get(node)
            if offs:
                boot = sorted(offs)[len(offs) // 2]
                p.event.time = (
                    datetime(1970, 1, 1, tzinfo=tctx.start.tzinfo) + boot + timedelta(seconds=p.uptime)
                )
            else:
                last = max_uptime.get(p.stream, p.uptime)
                p.event.time = tctx.end - timedelta(seconds=max(0.0, last - p.uptime))
                p.event.approx = True
        return result

    def _streams(self, sources: list[Source], job: _Job, workers: int) -> Iterator[_StreamResult | None]:
        """Per source, in order: its text stream's extraction (None for records and metrics)."""
        texts = [src for src in sources if isinstance(src, TextSource)]
        if workers > 1 and len(texts) > 1:
            # In batches of about equal bytes, over this process and forked ones (engine/forked.py).
            done = spread(
                lambda i: _TextStream(self, job, texts[i]).run(), [_size(src) for src in texts], workers
            )
            if done is not None:
                streams = iter(done)
                yield from (next(streams) if isinstance(src, TextSource) else None for src in sources)
                return
        for src in sources:
            yield _TextStream(self, job, src).run() if isinstance(src, TextSource) else None

    # ----------------------------------------------------------------------------------------- records

    def _record(self, rec: Record, tctx: TimeContext, names: NodeNames, result: ExtractionResult) -> None:
        if not self.is_candidate(rec.text):
            return
        result.candidates += 1
        seen: set[str] = set()
        for tok, comps in self._by_token.items():
            if tok not in rec.text:
                continue
            for comp in comps:
                if comp.rule.id in seen or "scheduler" not in comp.sources:
                    continue
                seen.add(comp.rule.id)
                fm = comp.regex.search(rec.text)
                if fm is None:
                    continue
                fields = _fields(fm, comp)
                named = rec.node or _str(fields.get("host"))
                # A record about a node outside the attempt keeps that node's name, so scope drops it.
                node = names.resolve(named) or (named if named and names.nodes else None)
                result.events.append(
                    Event(
                        kind=comp.spec.event,
                        rule=comp.rule.id,
                        time=rec.time or tctx.end,
                        approx=rec.time is None,
                        node=node,
                        source="scheduler",
                        ref=rec.ref,
                        text=cut(rec.text),
                        fields=fields,
                    )
                )

    # ----------------------------------------------------------------------------------------- metrics

    def _metrics(
        self, src: MetricSource, tctx: TimeContext, names: NodeNames, result: ExtractionResult
    ) -> None:
        lo = tctx.start - timedelta(minutes=5)
        hi = tctx.end + timedelta(minutes=5)
        for rule, spec in self.metric_rules:
            for s in src.series:
                if s.name not in spec.metrics:
                    continue
                hit = _first_hit(s, spec, lo, hi)
                if hit is None:
                    continue
                when, value, before = hit
                host = next((s.labels[k] for k in spec.node_labels if k in s.labels), None)
                node = names.resolve(host)
                fields: dict[str, FieldValue] = {
                    k: s.labels.get(lbl) for k, lbl in spec.fields_from_labels.items()
                }
                fields.update(spec.set)
                fields[spec.value_field] = int(value) if value.is_integer() else value
                if before is not None:
                    fields["delta"] = value - before
                if spec.lookup:
                    row = self.tables.get(spec.lookup, {}).get(str(fields[spec.value_field]))
                    for k, v in (row or {}).items():
                        fields.setdefault(k, v)
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                result.events.append(
                    Event(
                        kind=spec.event,
                        rule=rule.id,
                        time=when,
                        node=node,
                        source="metric",
                        ref=f"{src.name}#{s.name}{{{labels}}}@{isoformat(when)}",
                        text=f"{s.name}{{{labels}}} {value:g}"
                        + (f" (was {before:g})" if before is not None else ""),
                        fields=fields,
                    )
                )


def _first_hit(
    s: Series, spec: MetricSpec, lo: datetime, hi: datetime
) -> tuple[datetime, float, float | None] | None:
    prev: float | None = None
    for when, v in s.samples:
        inside = lo <= when <= hi
        if spec.condition == "increase":
            if prev is not None and inside:
                delta = v - prev if v >= prev else v
                if delta > spec.threshold:
                    return when, v, prev
        elif spec.condition == "changed_to_nonzero":
            if inside and v != 0 and (prev is None or v != prev) and prev is not None:
                return when, v, prev
        elif inside:
            if spec.condition == "above" and v > spec.threshold:
                return when, v, None
            if spec.condition == "below" and v < spec.threshold:
                return when, v, None
            if spec.condition == "bits_any" and int(v) & spec.bits:
                return when, v, None
            if spec.condition == "equals_any" and v in spec.values:
                return when, v, None
        prev = v
    return None


def _str(v: FieldValue) -> str | None:
    return v if isinstance(v, str) else None


def _fields(m: Match, comp: _Compiled) -> dict[str, FieldValue]:
    out: dict[str, FieldValue] = {}
    for k, v in m.groupdict().items():
        if v is None:
            continue
        if k in comp.ints:
            try:
                out[k] = int(v, 0) if v.lower().startswith(("0x", "-0x")) else int(v)
            except ValueError:
                out[k] = v
        else:
            out[k] = v.strip()
    out.update(comp.spec.set)
    if comp.table is not None:
        row = comp.table.get(str(out.get(comp.spec.lookup_key)))
        if row:
            for k, v in row.items():
                out.setdefault(k, v)
    return out


def _source_kind(h: LineHeader) -> SourceKind:
    hint = h.source_hint
    if hint == "kernel":
        return "kernel"
    if hint == "scheduler":
        return "scheduler"
    msg = h.message
    if msg.startswith(_SCHED_PREFIXES):
        return "scheduler"
    if h.uptime is not None or _KERNEL_MESSAGE.match(msg):
        return "kernel"
    return "app"


def _inherit(
    data: bytes, ls: int, stop: int, tctx: TimeContext, open_start: bool = False, known: int = -1
) -> tuple[datetime | None, bool]:
    """The stamp of the nearest earlier line that has one, looking back at most BACKSCAN_LINES
    lines and never past `stop` (a line whose time is already known). `open_start`: `data` is a
    window whose first byte is not the stream's (_Edge when the look goes past it). `known` (>= 0):
    no line ending at or before it, back to `stop` or the stream's start, has a stamp (an earlier
    look found none): the look ends there. Also says whether a None is final — the look reached
    `stop`, the stream's start or `known` — rather than BACKSCAN_LINES' bound."""
    end = ls - 1
    for _ in range(BACKSCAN_LINES):
        if end <= stop:
            return None, True
        if known >= 0 and end <= known:
            return None, True
        if end <= 0:
            if open_start:
                raise _Edge
            return None, True
        start = data.rfind(b"\n", 0, end) + 1
        h = parse_line(data[start : min(end, start + 512)].decode("utf-8", "replace"), tctx)
        if h.time is not None:
            return h.time, True
        end = start - 1
    return None, False


def _occurrences(data: bytes, token: bytes) -> Iterator[int]:
    """Where `token` starts in `data`, every occurrence (as `bytes.find` finds them)."""
    at = data.find(token)
    while at >= 0:
        yield at
        at = data.find(token, at + 1)


def _srun_labels(pieces: Iterable[bytes], nodes: list[str], n_ranks: int) -> dict[int, str] | None:
    """srun --label prefixes are task ids. They are the ranks when srun starts one task per rank;
    with one launcher (torchrun) per node they are node indices. Decide once per stream: a label
    paired with a different [rankN], or labels that never reach the node count while the job has
    more ranks than nodes, mean tasks-per-node; then map each task to its node (from `srun: error:
    <node>: task N` lines, else the allocation order). None: labels are ranks. The stream comes in
    line-aligned pieces (every pattern here matches within one line)."""
    pair: tuple[bytes, bytes] | None = None
    local = False
    top = -1
    tasks: list[tuple[bytes, int]] = []
    for data in pieces:
        if pair is None and (m := _LABEL_AND_RANK.search(data)) is not None:
            pair = (m.group(1), m.group(2))
        local = local or _LABEL_AND_LOCAL.search(data) is not None
        top = max(top, max((int(m.group(1)) for m in _LABEL.finditer(data)), default=-1))
        tasks.extend((m.group(1), int(m.group(2))) for m in _SRUN_TASK_NODE.finditer(data))
    per_node = (pair is not None and pair[0] != pair[1]) or local
    if not per_node:
        per_node = bool(nodes) and n_ranks > len(nodes) and 0 <= top < len(nodes)
    if not per_node:
        return None
    mapping = dict(enumerate(nodes))
    names = {n.lower(): n for n in nodes}
    for raw_host, task in tasks:
        host = raw_host.decode(errors="replace").lower()
        if host in names:
            mapping[task] = names[host]
    return mapping


def _global_rank(ranks: dict[int, str], node: str, local_rank: int) -> int | None:
    """The global rank of `local_rank` on `node`: the node's ranks in order (torchrun numbers a node's
    workers from its first global rank). None without a rank map or when the node has fewer ranks."""
    mine = sorted(r for r, n in ranks.items() if n == node)
    return mine[local_rank] if 0 <= local_rank < len(mine) else None


def _rank_from_name(name: str) -> int | None:
    """Per-rank log files (`rank-13.log`, `rank13.out`, `train_rank_13.txt`) name their rank."""
    m = _RANK_FILE.search(name.rsplit("/", 1)[-1].lower())
    return int(m.group(1)) if m else None


def _next_stamp(
    data: bytes, le: int, tctx: TimeContext, open_end: bool = False
) -> tuple[int, datetime | None]:
    """The start offset and stamp of the first stamped line after offset `le` (bounded look-ahead);
    (len(data), None) when there is none. `open_end`: `data` is a window that ends before the stream
    does, with a whole line (_Edge when the look goes past it)."""
    start = le + 1
    n = len(data)
    for _ in range(BACKSCAN_LINES):
        if start >= n:
            if open_end:
                raise _Edge
            break
        end = data.find(b"\n", start)
        end = n if end == -1 else end
        h = parse_line(data[start : min(end, start + 512)].decode("utf-8", "replace"), tctx)
        if h.time is not None:
            return start, h.time
        start = end + 1
    return n, None


def _block(
    data: bytes,
    ls: int,
    le: int,
    before: int,
    after: int,
    tctx: TimeContext,
    open_start: bool = False,
    open_end: bool = False,
) -> str:
    start = ls
    for _ in range(before):
        if start <= 0:
            if open_start:
                raise _Edge
            break
        start = data.rfind(b"\n", 0, start - 1) + 1
    end = le
    for _ in range(after):
        if end >= len(data) or (open_end and end + 1 >= len(data)):
            if open_end:
                raise _Edge
            break
        nxt = data.find(b"\n", end + 1)
        end = len(data) if nxt == -1 else nxt
    lines = data[start:end].decode("utf-8", "replace").split("\n")
    return "\n".join(parse_line(x[:MAX_LINE], tctx).message for x in lines)


def _last_uptime(data: bytes) -> float:
    best = 0.0
    for line in data[-65536:].decode("utf-8", "replace").splitlines()[-200:]:
        m = _UPTIME.search(line)
        if m:
            best = max(best, float(m.group(1)))
    return best


def _head(src: TextSource) -> bytes:
    """The first HEAD_BYTES of a stream's text (read again for a file)."""
    if isinstance(src, FileTextSource):
        head = b""
        for piece in src.chunks():
            head += piece[: HEAD_BYTES - len(head)]
            if len(head) >= HEAD_BYTES:
                break
        return head
    text = src.text
    return (text if isinstance(text, bytes) else text[:HEAD_BYTES].encode("utf-8", "surrogateescape"))[
        :HEAD_BYTES
    ]


def _boot_anchors(head: bytes, tctx: TimeContext) -> list[timedelta]:
    """Boot-time offsets (wall - uptime) a stream's head states: its first lines pairing a wall stamp
    with an uptime stamp (kern.log carries both), and raw dmesg's RTC line, which pairs an uptime
    with the wall clock it set."""
    if b"] " not in head:
        return []
    epoch = datetime(1970, 1, 1, tzinfo=tctx.start.tzinfo)
    text = head.decode("utf-8", "replace")
    first = text.splitlines()[:HEAD_LINES]
    out: list[timedelta] = []
    # only a line with an uptime stamp can pair: the whole parse is skipped when none has one
    for line in first if _UPTIME.search("\n".join(first)) else ():
        h = parse_line(line, tctx)
        if h.time is not None and h.uptime is not None:
            out.append(h.time - epoch - timedelta(seconds=h.uptime))
    m = _RTC.search(text)
    if m:
        out.append(timedelta(seconds=int(m.group(2)) - float(m.group(1))))
    return out


class _Edge(Exception):
    """A look at a candidate's context (`_inherit`, `_next_stamp`, `_block`) ran past the window of
    bytes it was given. An exception because the look is three helpers deep and the candidate must be
    abandoned whole: `_TextStream._candidate` changes nothing until every look is done, so the caller
    simply reads the candidate again in a wider window."""


@dataclass(slots=True)
class _Job:
    """What every stream of one attempt is extracted against."""

    tctx: TimeContext
    names: NodeNames
    ranks: dict[int, str]
    nodes: list[str]


@dataclass(slots=True)
class _StreamResult:
    """One text stream's share of an extraction, merged by `Extractor.extract` in source order."""

    events: list[Event]
    candidates: int
    lines: int
    anchors: list[timedelta]  # boot offsets found in the stream (of its node)
    pending: list[_Pending]  # uptime-only events, placed once every stream is read
    last_uptime: float | None  # the highest uptime near its end, when it has uptime-only events
    facts: object = None  # what a file's reader learned reading it (FileTextSource.facts)


class _Pieces:
    """A stream's pieces, with a look at the next ones (empty pieces skipped)."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._it = iter(pieces)
        self._ahead: list[bytes] = []

    def peek(self, k: int) -> bytes | None:
        while len(self._ahead) <= k:
            piece = next(self._it, None)
            if piece is None:
                return None
            if piece:
                self._ahead.append(piece)
        return self._ahead[k]

    def pop(self) -> bytes | None:
        piece = self.peek(0)
        if piece is not None:
            del self._ahead[0]
        return piece


class _Clock(NamedTuple):
    """Where a stream's time is known, as stream offsets; each candidate moves it forward."""

    resolved_at: int = -1  # the last line whose time is known
    resolved_time: datetime | None = None
    stampless_to: int = -1  # no line ending at or before it, back to resolved_at, has a stamp (-1: unknown)
    next_at: int = -1  # the next stamped line after the last inherited candidate
    next_time: datetime | None = None


class _When(NamedTuple):
    """A candidate line's time: its own stamp, else inherited from the nearest earlier one."""

    time: datetime | None
    approx: bool  # no stamp found at all
    inherited: bool
    upper: datetime | None  # an inherited time's bound: the next stamped line's time


_START = _Clock()  # nothing known yet
# Built per candidate line from a tuple in one C call (a NamedTuple's own __new__ is a Python frame).
_new_clock = partial(tuple.__new__, _Clock)
_new_when = partial(tuple.__new__, _When)


# Events a training loop prints on every step (engine/cost.py reads them): a stream keeps its first and
# its last THINNED_KEEP of each kind, so a long run's output is not a list of millions of events.
THINNED_KINDS = frozenset({"train_step"})
THINNED_KEEP = 256


@dataclass(slots=True)
class _Scan:
    """What one read of a stream has gathered. A read that must start again (the whole text after
    pieces proved too narrow, or nothing after a file proved not to be text) starts from a new one."""

    events: list[Event] = field(default_factory=list)
    thinned: dict[str, int] = field(default_factory=dict)  # kind → events of it seen (THINNED_KINDS)
    # the latest events of a thinned kind past its first THINNED_KEEP, each with where it goes in `events`
    latest: deque[tuple[int, Event]] = field(default_factory=lambda: deque(maxlen=THINNED_KEEP))
    candidates: int = 0
    anchors: list[timedelta] = field(default_factory=list)  # boot offsets (wall - uptime)
    pending: list[_Pending] = field(default_factory=list)  # uptime-only events
    last_uptime: float | None = None
    clock: _Clock = _START
    line_no: int = 1  # line number at the scan's position in the current piece
    whole: bytes = b""  # the stream's bytes when they are one piece (srun labels read it)
    tail: bytes = b""  # the stream's last bytes so far (its uptime at the end)
    # srun --label ids are ranks only when srun starts one task per rank; with one torchrun per node
    # they are node indices, which the stream shows by pairing a label with another [rankN].
    labels_checked: bool = False
    label_nodes: dict[int, str] | None = None  # srun task label → node, when labels are not ranks

    def add(self, events: list[Event]) -> None:
        for e in events:
            if e.kind in THINNED_KINDS:
                seen = self.thinned.get(e.kind, 0) + 1
                self.thinned[e.kind] = seen
                if seen > THINNED_KEEP:
                    self.latest.append((len(self.events), e))
                    continue
            self.events.append(e)

    def kept(self) -> list[Event]:
        """The events in stream order: the thinned kinds' latest put back where they were found."""
        if not self.latest:
            return self.events
        out: list[Event] = []
        start = 0
        for at, e in self.latest:
            out.extend(self.events[start:at])
            out.append(e)
            start = at
        out.extend(self.events[start:])
        return out


class _TextStream:
    """The extraction of one text stream: scan its bytes, parse the candidate lines, keep what the
    attempt-wide pass needs (boot anchors, uptime-only events).

    A file comes in line-aligned pieces (FileTextSource.chunks) and is never held whole: each piece
    is scanned on its own (tokens never span lines, so none spans two pieces); a candidate whose
    context (the stamp it inherits, the next stamp, lines around it) reaches past its piece is read
    again in the previous, its own and the next piece together, and in the rare case even that is
    too narrow, the stream is read again, from a new `_Scan`, as one piece. The events are those of
    the whole text in every case."""

    def __init__(self, extractor: Extractor, job: _Job, src: TextSource) -> None:
        self.ex = extractor
        self.job = job
        self.src = src
        self.file_rank = _rank_from_name(src.name)
        self.scan = _Scan()

    def run(self) -> _StreamResult:
        src = self.src
        if isinstance(src, FileTextSource):
            try:
                if not self._read(_Pieces(src.chunks())):
                    self.scan = _Scan()  # pieces too narrow: the whole text, one piece (never too narrow)
                    self._read(_Pieces([b"".join(src.chunks())]))
            except NotText:  # found at the end of its read not to be text after all: none of it counts
                self.scan = _Scan()
        else:
            text = src.text
            self._read(
                _Pieces([text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")])
            )
        scan = self.scan
        known = src.newlines if isinstance(src, FileTextSource) else None  # counted at load, or by its reader
        return _StreamResult(
            scan.kept(),
            scan.candidates,
            known if known is not None else scan.line_no - 1,  # the scan counted every line
            scan.anchors,
            scan.pending,
            scan.last_uptime,
            src.facts if isinstance(src, FileTextSource) else None,
        )

    def _read(self, pieces: _Pieces) -> bool:
        """Scan every piece; False as soon as a candidate's context reaches past even a wide window."""
        scan = self.scan
        prev = b""
        base = 0
        cur = pieces.pop()
        while cur is not None:
            last = pieces.peek(0) is None
            if base == 0 and last:
                scan.whole = cur
            if not self._piece(cur, base, prev, pieces, last):
                return False
            scan.tail = cur[-HEAD_BYTES:] if len(cur) >= HEAD_BYTES else (scan.tail + cur)[-HEAD_BYTES:]
            base += len(cur)
            prev = cur
            cur = pieces.pop()
        if scan.pending:
            scan.last_uptime = _last_uptime(scan.tail)
        return True

    def _piece(self, cur: bytes, base: int, prev: bytes, pieces: _Pieces, last: bool) -> bool:
        """Every candidate line of one piece (at stream offset `base`); False when one needs the whole text."""
        scan = self.scan
        n = len(cur)
        counted = 0
        line_end = -1
        by_token = self.ex._by_token
        for _, start, _ in self.ex.scan(cur):
            if start <= line_end:
                continue  # another token on a line already handled
            ls = cur.rfind(b"\n", 0, start) + 1
            le = cur.find(b"\n", start)
            if le == -1:
                le = n
            line_end = le
            scan.line_no += cur.count(b"\n", counted, ls)
            counted = ls
            line = cur[ls : min(le, ls + MAX_LINE)].decode("utf-8", "replace")
            matched = [c for tok, comps in by_token.items() if tok in line for c in comps]
            if not matched:
                continue
            try:
                self._candidate(cur, base, ls, le, line, matched, base > 0, not last)
            except _Edge:
                if not self._widened(cur, base, prev, pieces, ls, le, line, matched):
                    return False
        scan.line_no += cur.count(b"\n", counted)
        return True

    def _widened(
        self,
        cur: bytes,
        base: int,
        prev: bytes,
        pieces: _Pieces,
        ls: int,
        le: int,
        line: str,
        matched: list[_Compiled],
    ) -> bool:
        """Read a candidate its own piece was too narrow for in the previous, its own and the next
        piece together; False when even that is too narrow."""
        wide = prev + cur + (pieces.peek(0) or b"")
        wide_base = base - len(prev)
        try:
            self._candidate(
                wide,
                wide_base,
                ls + len(prev),
                le + len(prev),
                line,
                matched,
                wide_base > 0,
                pieces.peek(1) is not None,
            )
        except _Edge:
            return False
        return True

    def _candidate(
        self,
        data: bytes,
        base: int,
        ls: int,
        le: int,
        line: str,
        matched: list[_Compiled],
        open_start: bool,
        open_end: bool,
    ) -> None:
        """One candidate line, at [ls, le) of `data`, which starts at stream offset `base`: its time,
        then its events, then the scan records them. Everything before the last step only reads, so an
        `_Edge` from any look into `data` leaves no trace."""
        header = parse_line(line, self.job.tctx)
        when, clock = self._when(data, base, ls, le, header, open_start, open_end)
        events, pending = self._events(data, ls, le, line, header, matched, when, open_start, open_end)
        scan = self.scan
        scan.candidates += 1
        if header.time is not None and header.uptime is not None and self.src.node:
            scan.anchors.append(
                header.time
                - datetime(1970, 1, 1, tzinfo=self.job.tctx.start.tzinfo)
                - timedelta(seconds=header.uptime)
            )
        scan.clock = clock
        scan.add(events)
        scan.pending.extend(pending)

    def _when(
        self, data: bytes, base: int, ls: int, le: int, header: LineHeader, open_start: bool, open_end: bool
    ) -> tuple[_When, _Clock]:
        """The candidate's time and the clock after it. A line with no stamp of its own inherits the
        nearest earlier one (a run of stamp-less candidates: each looks back only as far as the one
        before it), bounded by the next stamped line."""
        tctx = self.job.tctx
        resolved_at, resolved_time, stampless_to, next_at, next_time = self.scan.clock
        when = header.time
        approx = inherited = False
        if when is None and header.uptime is None:
            inherited = True
            if resolved_at >= 0 and base + ls <= resolved_at:
                when = resolved_time
            else:
                known = stampless_to - base if stampless_to >= 0 else -1
                when, final = _inherit(data, ls, resolved_at - base, tctx, open_start, known)
                if when is None and final:
                    stampless_to = base + ls - 1
                if when is None and resolved_at >= 0:
                    when = resolved_time
                approx = when is None
        if when is not None:
            resolved_at, resolved_time = base + ls, when
        upper: datetime | None = None
        if inherited and when is not None:
            if next_at <= base + le:
                at, next_time = _next_stamp(data, le, tctx, open_end)
                next_at = base + at if next_time is not None else _BEYOND
            upper = next_time
        clock = _new_clock((resolved_at, resolved_time, stampless_to, next_at, next_time))
        return _new_when((when, approx, inherited, upper)), clock

    def _events(
        self,
        data: bytes,
        ls: int,
        le: int,
        line: str,
        header: LineHeader,
        matched: list[_Compiled],
        stamp: _When,
        open_start: bool,
        open_end: bool,
    ) -> tuple[list[Event], list[_Pending]]:
        """The events of the rules whose pattern matches the line (or its block of lines around it);
        uptime-only ones also pending, to be placed once the node's boot time is known."""
        src, tctx = self.src, self.job.tctx
        kind = src.source or _source_kind(header)
        when, approx, inherited, upper = stamp
        host_node = self.job.names.resolve(header.host) if header.host else None
        events: list[Event] = []
        pending: list[_Pending] = []
        seen_rules: set[str] = set()
        for comp in matched:
            if comp.rule.id in seen_rules or kind not in comp.sources:
                continue
            seen_rules.add(comp.rule.id)
            block = header.message
            if comp.spec.lines_before or comp.spec.lines_after:
                block = _block(
                    data, ls, le, comp.spec.lines_before, comp.spec.lines_after, tctx, open_start, open_end
                )
            fm = comp.regex.search(block)
            if fm is None:
                continue
            fields = _fields(fm, comp)
            if header.time is None and isinstance(fields.get("at"), str):
                stated = parse_iso(str(fields["at"]), tctx)  # a time the line states (banners)
                if stated is not None:
                    when, approx, inherited = stated, False, False  # for this rule and the ones after it
            node, rank = self._place(header, fields, host_node)
            ev = Event(
                kind=comp.spec.event,
                rule=comp.rule.id,
                time=when,
                approx=approx,
                inherited=inherited and when is not None,
                time_max=upper
                if inherited and upper is not None and when is not None and upper >= when
                else None,
                node=node,
                rank=rank,
                source=kind,
                ref=f"{src.name}:{self.scan.line_no}",
                text=cut(line.rstrip()),
                fields=fields,
            )
            if when is None and header.uptime is not None:
                pending.append(_Pending(ev, header.uptime, src.name))
            events.append(ev)
        return events, pending

    def _place(
        self, header: LineHeader, fields: dict[str, FieldValue], host_node: str | None
    ) -> tuple[str | None, int | None]:
        """The node and rank an event is on: from the stream's node, the line's header, the file's
        name, the rule's fields, srun's labels and the attempt's rank map, in that order."""
        job = self.job
        rank = header.rank
        label_node: str | None = None
        if rank is not None and header.task is not None and rank == header.task:
            label_nodes = self._labels()
            if label_nodes is not None:
                rank = None  # the label is a task (one per node), not a rank
                label_node = label_nodes.get(header.task)
        if rank is None:
            rank = self.file_rank
        if rank is None and isinstance(fields.get("rank"), int):
            rank = int(fields["rank"])  # type: ignore[arg-type]
        node = self.src.node or job.names.resolve(_str(fields.get("host"))) or host_node or label_node
        if node is None and rank is not None:
            # Without a rank map, rank 0 is on the first node of the allocation (Slurm's batch host).
            node = job.ranks.get(rank) or (
                job.nodes[0] if job.nodes and rank == 0 and not job.ranks else None
            )
        if rank is None and header.local_rank is not None:
            # torchrun's [defaultN]: on a known node, or on the attempt's only node
            on = node if node is not None else (job.nodes[0] if len(job.nodes) == 1 else None)
            if on is not None:
                rank = _global_rank(job.ranks, on, header.local_rank)
        return node, rank

    def _labels(self) -> dict[int, str] | None:
        scan = self.scan
        if not scan.labels_checked:
            src = self.src
            pieces = [scan.whole] if scan.whole or not isinstance(src, FileTextSource) else src.chunks()
            scan.label_nodes = _srun_labels(pieces, self.job.nodes, len(self.job.ranks))
            scan.labels_checked = True
        return scan.label_nodes


def _size(src: TextSource) -> int:
    """About how many bytes a text stream holds (how streams are spread over processes)."""
    if isinstance(src, FileTextSource):
        return src.nbytes or 0
    return len(src.text)
