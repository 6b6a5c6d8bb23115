"""Extraction on arrival: a record-numbered text stream is stored as its evidence, not line by line.

For each batch the ingest queue commits, the records of each record-numbered text stream (the
filelog receiver's `log.file.record_number`) are reduced before they reach the store: the rule
tokens' prefilter runs over the stream's live lines and the batch's lines joined (one automaton
pass), and `Extractor.evidence_lines` says which lines extraction can ever read — candidates, the
context lines rules read around them, the stamps unstamped lines inherit, boot anchors, srun
labels, the stream's head and its last 200 lines (the context of candidates still to come). Those
lines are stored; every run of other lines becomes one `gap` row that remembers how many lines it
stands for, ending at its last record number. A stream rebuilt from the store therefore has the
same line numbers, coverage counts and events as the whole stream: the compaction pass
(server/compaction.py) with a horizon of zero, run on every batch, before anything is written.

Retries stay idempotent without a row per line: the store keeps each stream's record-number
ranges, and records inside them are dropped. A batch that brings line 1 again with another time or
text starts a new generation (a rotated file), as the assembly reads it (`stream`, `stream.1`, …).

A scope group of text records of one stream without record numbers (the filelog receiver's
default, SDK handlers, journald, most agents; a `RecordBlock` with a `digest`) takes its stream's
next numbers, in the order the groups arrive, and is then reduced like a numbered one (`_number`):
evidence lines and gap rows, line numbers in the UI's context. Its retries are dropped by the
group's digest (of the records as sent, or of their retry keys when they were tagged one by one),
kept by the store for an hour (`stream_batches`); the versioned stream state makes replicas agree
on the numbers. Without numbers the order is the order of arrival, as it was when such records
were stored row by row.

(A group of several streams is a block per stream.) Records with a `log.record.uid`, structured
documents and the terminal-state records take the row-per-record path (`Store.ingest`'s `logs`),
with their dedup keys, as before.

Records that arrive as columns (`RecordBlock`, from collector/otlp_columns.py) stay columns when
they are the stream's next lines, in order, none stored yet — the usual case: one prefilter pass
and the evidence regexes run over the bodies joined, and only the lines kept and the last line of
each gap become `Entry`s (dedup keys included). That prefilter pass (`Scans`), over the stream's
live lines and the block's, is the block's only one: the events on arrival (the hang trigger, the
metric) read its candidates too. A collector's retry — records whose numbers are stored already —
is dropped as columns, as the per-record path drops it (line 1 must be the stored line 1), and
what is new of it, after every stored line, goes on as above. A block that restarts the stream,
comes before stored lines or leaves holes between them is expanded to `Entry`s and takes the path
above.

This module decides; the store writes (in the same transaction as the rest of the batch).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import accumulate, chain, pairwise

from hypocenter.engine.extract import BACKSCAN_LINES, Extractor
from hypocenter.engine.prefilter import joined
from hypocenter.lineformat import TimeContext
from hypocenter.store.base import ArrivalState, ArrivalWrite, Entry, IngestStore, RecordBlock, StreamLine

StreamId = tuple[str | None, int, str | None, str]
REREAD_LINES = BACKSCAN_LINES + 1000  # the farthest a stamp is inherited from, and rules' context beyond it


@dataclass(slots=True)
class _Item:
    """One line of a stream in record-number order: a stored row, or a record of this batch — or,
    from a `RecordBlock`, a stretch of `lines` records no rule reads (`entry`: the last of them;
    `size`: their bytes), which can only become part of a gap."""

    line: int
    row: StreamLine | None = None
    entry: Entry | None = None
    lines: int = 1
    size: int = -1

    @property
    def gap(self) -> int:
        """Lines a stored gap row (or tombstone) stands for; 0 for a line with its text."""
        if self.row is None or self.row.compacted < 2:
            return 0
        return int(self.row.body) if self.row.compacted == 3 and self.row.body.isdigit() else 1

    @property
    def body(self) -> str:
        if self.entry is not None:
            return self.entry.body
        assert self.row is not None
        return self.row.body


def _covered(ranges: list[tuple[int, int]], line: int) -> bool:
    lo, hi = 0, len(ranges)
    while lo < hi:
        mid = (lo + hi) // 2
        if ranges[mid][1] < line:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(ranges) and ranges[lo][0] <= line


def _merge(ranges: list[tuple[int, int]], lines: Sequence[int]) -> list[tuple[int, int]]:
    """`ranges` with the ascending record numbers `lines` added, merged."""
    runs: list[tuple[int, int]] = []
    for n in lines:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return _merge_spans(ranges, runs)


def _merge_spans(ranges: list[tuple[int, int]], runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    spans = sorted([*ranges, *runs])
    out: list[tuple[int, int]] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _holes(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Record numbers not stored yet that a batch still to come may bring before stored ones: between
    stored ranges, and before the first when it starts near line 1 (a stream first seen far into its
    file — a collector that started reading mid-file — waits for nothing)."""
    out = [(b + 1, c - 1) for (_, b), (c, _) in pairwise(ranges)]
    if ranges and 1 < ranges[0][0] <= REREAD_LINES:
        out.insert(0, (1, ranges[0][0] - 1))
    return out


def _beside_holes(holes: list[tuple[int, int]], numbers: Sequence[int]) -> set[int]:
    """Indices of the `numbers` (ascending) that a line in one of the `holes` may read: no rule's context
    or inherited stamp reaches farther than BACKSCAN_LINES. They keep their text until the hole is
    filled, when the batch that fills it decides again (its reduction re-reads them); so a stream's
    batches stored in any order keep the lines that storing them in order keeps."""
    keep: set[int] = set()
    for lo, hi in holes:
        keep.update(
            range(
                bisect.bisect_left(numbers, lo - BACKSCAN_LINES),
                bisect.bisect_right(numbers, hi + BACKSCAN_LINES),
            )
        )
    return keep


@dataclass(slots=True)
class Scanned:
    """Lines joined as bytes (engine/prefilter.py's `joined`), where each starts in them, and where
    the rule tokens occur (`Extractor.scan`): one prefilter pass over them."""

    data: bytes
    starts: list[int]
    hits: list[tuple[int, int, int]]

    def candidates(self) -> list[int]:
        """Indices of the lines with a rule token."""
        found: list[int] = []
        for _, start, _ in self.hits:
            i = bisect.bisect_right(self.starts, start) - 1
            if not found or found[-1] != i:
                found.append(i)
        return found

    def size(self, a: int, b: int) -> int:
        """The bytes of lines a..b-1, their newlines left out."""
        end = self.starts[b] if b < len(self.starts) else len(self.data) + 1
        return end - self.starts[a] - (b - a)


class Scans:
    """The rule tokens' candidates in each `RecordBlock` of one batch, found once: by the reduction
    (in the same pass as its stream's stored lines) or else on first asking. The events on arrival
    and the reduction read the same pass."""

    def __init__(self, extractor: Extractor) -> None:
        self._extractor = extractor
        self._found: dict[int, tuple[RecordBlock, list[int]]] = {}  # by identity; the block is held
        self.inert: dict[str, bool] = {}  # candidate lines told inert or not (`Extractor.inert_lines`)

    def candidates(self, block: RecordBlock) -> list[int]:
        """Indices of the block's records that have a rule token."""
        found = self._found.get(id(block))
        if found is None:
            found = self._found[id(block)] = (block, self.of(block.bodies).candidates())
        return found[1]

    def found(self, parts: Sequence[RecordBlock], scanned: Scanned, first: int) -> None:
        """`parts`' candidates from `scanned`, which holds their records one part after another from
        its line `first` on (no rule token holds a newline: a line's hits are its own)."""
        ends = list(accumulate(map(len, parts)))
        per: list[list[int]] = [[] for _ in parts]
        for i in scanned.candidates():
            if i >= first:
                k = bisect.bisect_right(ends, i - first)
                per[k].append(i - first - (ends[k - 1] if k else 0))
        for part, indices in zip(parts, per, strict=True):
            self._found[id(part)] = (part, indices)

    def of(self, lines: Sequence[str]) -> Scanned:
        data, starts = joined(lines)
        return Scanned(data, starts, self._extractor.scan(data))


@dataclass(slots=True)
class Reduced:
    """One batch, split: records stored row by row, reduced streams, and the lines (bytes) whose text
    the reduction left out — counted as compaction's are, once the batch is committed."""

    rest: list[Entry]
    writes: list[ArrivalWrite]
    blanked: int = 0
    freed: int = 0


class Arrival:
    """Reduces each batch's record-numbered text streams to `ArrivalWrite`s for `Store.ingest`.
    `on_blanked(lines, bytes)` is told what committed batches left out (the compaction metric)."""

    def __init__(self, extractor: Extractor, on_blanked: Callable[[int, int], None] | None = None) -> None:
        self._extractor = extractor
        self._on_blanked = on_blanked

    def committed(self, reduced: Reduced) -> None:
        if self._on_blanked is not None and reduced.blanked:
            self._on_blanked(reduced.blanked, reduced.freed)

    def scans(self) -> Scans:
        """A batch's scans, to share with the events on arrival (`split` first; it makes its own without)."""
        return Scans(self._extractor)

    def split(
        self,
        store: IngestStore,
        logs: Sequence[Entry],
        now: float,
        blocks: Sequence[RecordBlock] = (),
        scans: Scans | None = None,
    ) -> Reduced:
        """The batch's records stored row by row and its reduced streams."""
        scans = scans or self.scans()
        rest: list[Entry] = []
        streams: dict[StreamId, list[Entry]] = defaultdict(list)
        for e in logs:
            if e.kind == "text" and e.line is not None and e.line > 0:
                streams[(e.workload, e.attempt, e.node, e.stream)].append(e)
            else:
                rest.append(e)
        when = datetime.fromtimestamp(now, timezone.utc)
        # Year-less stamps only need *a* year to tell stamped from unstamped lines (as compaction).
        tctx = TimeContext(tz=timezone.utc, start=when - timedelta(days=1), end=when)
        out = Reduced(rest, [])
        by_stream: dict[StreamId, list[RecordBlock]] = defaultdict(list)
        for block in blocks:
            by_stream[block.key].append(block)
        digests: dict[StreamId, list[str]] = {}
        for key, parts in by_stream.items():
            if parts[0].digest:
                # records without numbers (a stream's groups come all with or all without them):
                # the stream's next numbers, then as numbered ones
                w = self._number(store, key, parts, scans, tctx, out, streams)
                if w is not None:
                    out.writes.append(w)
                else:  # its records joined the stream's records given one by one
                    digests[key] = [b.digest for b in parts if b.lines]
                continue
            # The usual case — the stream's next records, in order, or a retry of stored ones —
            # without an object per record; anything else (a rotation, records out of order) per record.
            ordered = None if key in streams else _in_order(parts)
            w = None
            if ordered is not None:
                state = store.arrival_state(*key, ordered[0].lines[0] - REREAD_LINES)
                w = self._reduce_block(ordered, scans, state, tctx, out)
            if w is None:
                streams[key].extend(e for block in parts for e in block.entries())
            else:
                out.writes.append(w)
        for (workload, attempt, node, stream), entries in streams.items():
            # Requests of one stream may come in any order (parallel exporters), a retry with its original.
            arrived = entries
            entries = sorted(arrived, key=lambda e: e.line or 0)
            unique = [entries[0]]
            for e in entries[1:]:
                if e.line != unique[-1].line:
                    unique.append(e)
                elif e.dedup != unique[-1].dedup:  # the same number, another record: a rotation in this batch
                    break
            else:
                entries = unique
            if entries is not unique:
                rest.extend(arrived)  # row by row, as before: the assembly tells the generations apart
                continue
            # Rows further back than any rule or inherited stamp reaches are final: not read again, so a
            # batch costs the same however long its stream already is.
            state = store.arrival_state(
                workload, attempt, node, stream, (entries[0].line or 0) - REREAD_LINES
            )
            w = ArrivalWrite(workload, attempt, node, stream, entries, state)
            w.digests = digests.get((workload, attempt, node, stream), [])
            blanked, freed = self._reduce(w, tctx)
            out.writes.append(w)
            out.blanked += blanked
            out.freed += freed
        return out

    def _number(
        self,
        store: IngestStore,
        key: StreamId,
        parts: list[RecordBlock],
        scans: Scans,
        tctx: TimeContext,
        out: Reduced,
        streams: dict[StreamId, list[Entry]],
    ) -> ArrivalWrite | None:
        """Give a stream's groups without record numbers, in arrival order, the stream's next numbers
        and reduce them as `_reduce_block` does; a group whose digest is stored (an exporter's retry,
        to this replica or another) or came earlier in this batch is dropped, as the per-record path
        drops the records its dedup keys match. None when the stream also has records given one by
        one in this batch, or its groups were tagged differently: their records go that way,
        numbered (their digests are then the stream's write's)."""
        state = store.arrival_state(*key, tail=REREAD_LINES, digests=sorted({b.digest for b in parts}))
        seen = set(state.batches)
        fresh: list[RecordBlock] = []
        for b in parts:
            b.lines = []
            if b.digest not in seen:
                seen.add(b.digest)
                fresh.append(b)
        if not fresh:
            return ArrivalWrite(*key, [], state)
        at = state.ranges[-1][1] if state.ranges else 0
        for b in fresh:
            b.lines = list(range(at + 1, at + 1 + len(b)))
            at += len(b)
        if key in streams or any(b.scope != fresh[0].scope for b in fresh):
            # with records given one by one, or groups tagged differently (the attempt's bookkeeping
            # reads each record's scope): as records, numbered
            streams[key].extend(e for b in fresh for e in b.entries())
            return None
        w = self._reduce_block(fresh, scans, state, tctx, out)
        if w is None:  # cannot be: the numbers come after every stored one
            raise AssertionError(f"stream {key[3]!r}: numbered records did not follow the stored ones")
        w.digests = [b.digest for b in fresh]
        w.banners = [(b.times[i], state) for b in fresh for i, state in sorted(b.banners.items())]
        return w

    def _reduce(self, w: ArrivalWrite, tctx: TimeContext) -> tuple[int, int]:
        """Fill `w`'s row changes and state; returns the lines (bytes) whose text it leaves out."""
        state = w.state
        entries = w.entries
        first = entries[0]
        if first.line == 1 and state.head is not None and state.head != first.dedup:
            # line 1 again, another record: the file was rotated or truncated — a new generation
            w.rotate = True
            state = w.state = ArrivalState(
                generation=state.generation + 1, lines=state.lines, bytes=state.bytes
            )
        elif entries and state.ranges:
            entries = [e for e in entries if e.line is not None and not _covered(state.ranges, e.line)]
        w.entries = entries
        if not entries:
            return 0, 0
        if first.line == 1 and state.head is None:
            state.head = first.dedup
        state.ranges = _merge(state.ranges, [e.line for e in entries if e.line is not None])
        state.lines += len(entries)
        state.bytes += sum(len(e.body) + 1 for e in entries)
        times = [e.time_ns for e in entries if e.time_ns]
        w.first_ns, w.last_ns = (min(times), max(times)) if times else (None, None)
        items = [_Item(r.line or 0, row=r) for r in state.rows]
        ordered = not items or items[-1].line < (
            entries[0].line or 0
        )  # the usual case: the batch comes after
        items.extend(_Item(e.line or 0, entry=e) for e in entries)
        if not ordered:
            items.sort(key=lambda it: (it.line, it.entry is not None))
        live = [i for i, it in enumerate(items) if it.gap == 0]
        numbers = [items[i].line for i in live]
        needed = {
            live[j] for j in self._extractor.evidence_columns(numbers, [items[i].body for i in live], tctx)
        }
        needed.update(live[j] for j in _beside_holes(_holes(state.ranges), numbers))
        state.rows = []
        return self._write(w, items, needed)

    def _reduce_block(
        self, parts: list[RecordBlock], scans: Scans, state: ArrivalState, tctx: TimeContext, out: Reduced
    ) -> ArrivalWrite | None:
        """`_reduce` for a stream's blocks (in order, see `_in_order`) whose records are stored already
        (a retry) up to those that follow every stored one; None when they are not."""
        run = _joined(parts)
        lo, hi = run.lines[0], run.lines[-1]
        head = run.entry(0).dedup if lo == 1 else None
        if head is not None and state.head not in (None, head):
            return None  # line 1 again, another record: a rotation
        # A retry: the records in the stored ranges are dropped, as the per-record path drops them
        # (their text is not looked at again); what is new must come after them all.
        stored = next((min(b, hi) - lo + 1 for a, b in state.ranges if a <= lo <= b), 0)
        if stored == len(run):
            return ArrivalWrite(run.workload, run.attempt, run.node, run.stream, [], state)
        if stored:
            run, lo = run.after(stored), lo + stored
        if any(a <= hi and b >= lo for a, b in state.ranges) or (
            state.rows and (state.rows[-1].line or 0) >= lo
        ):
            return None
        n = len(run)
        w = ArrivalWrite(
            run.workload, run.attempt, run.node, run.stream, [], state, block=n, block_scope=run.scope
        )
        if head is not None:
            state.head = head
        state.ranges = _merge_spans(state.ranges, [(lo, hi)])
        state.lines += n
        state.bytes += sum(map(len, run.bodies)) + n
        times = list(filter(None, run.times))
        w.first_ns, w.last_ns = (min(times), max(times)) if times else (None, None)
        items = [_Item(r.line or 0, row=r) for r in state.rows]
        live = [i for i, it in enumerate(items) if it.gap == 0]
        # The stored lines rules may still read and the new records: one text, one prefilter pass,
        # whose candidates among the new records the events on arrival read too.
        bodies = [items[i].body for i in live] + run.bodies
        whole = scans.of(bodies)
        if not stored:
            scans.found(parts, whole, len(live))
        numbers = [items[i].line for i in live] + run.lines
        kept = self._extractor.evidence_columns(
            numbers, bodies, tctx, scanned=(whole.data, whole.starts, whole.hits), inert=scans.inert
        )
        kept |= _beside_holes(_holes(state.ranges), numbers)
        state.rows = []
        needed = {live[j] for j in kept if j < len(live)}
        fresh = sorted(j - len(live) for j in kept if j >= len(live))
        start = 0
        for k in [*fresh, n]:
            if k > start:  # records start..k-1: no rule reads them
                items.append(
                    _Item(
                        run.lines[k - 1],
                        entry=run.entry(k - 1),
                        lines=k - start,
                        size=whole.size(len(live) + start, len(live) + k),
                    )
                )
            if k < n:
                needed.add(len(items))
                items.append(_Item(run.lines[k], entry=run.entry(k)))
            start = k + 1
        blanked, freed = self._write(w, items, needed)
        out.blanked += blanked
        out.freed += freed
        return w

    @staticmethod
    def _write(w: ArrivalWrite, items: list[_Item], needed: set[int]) -> tuple[int, int]:
        """Kept lines stay or go in as text; each run of the others becomes one gap row at its end."""
        run: list[_Item] = []
        blanked = freed = 0

        def close() -> None:
            if not run:
                return
            count = sum(it.gap or it.lines for it in run)
            last = run[-1]
            olds = [it.row.id for it in run if it.row is not None]
            if last.row is not None:
                if not (len(run) == 1 and last.row.compacted == 3 and last.gap == count):
                    w.updates.append((last.row.id, "gap", str(count), 3))
                w.deletes.extend(olds[:-1])
            else:
                assert last.entry is not None
                w.inserts.append((last.entry, "gap", str(count), 3))
                w.deletes.extend(olds)
            run.clear()

        for i, it in enumerate(items):
            if i in needed:
                close()
                if it.entry is not None:
                    w.inserts.append((it.entry, "text", it.entry.body, 1))
                elif it.row is not None and it.row.compacted == 0:
                    w.updates.append((it.row.id, "text", it.row.body, 1))
            else:
                run.append(it)
                if it.gap == 0:
                    blanked += it.lines
                    freed += it.size if it.size >= 0 else len(it.body.encode("utf-8", "surrogateescape"))
        close()
        return blanked, freed


def _in_order(blocks: list[RecordBlock]) -> list[RecordBlock] | None:
    """One stream's blocks of a batch in record order, when their record numbers run on without a
    repeat or a hole (each block consecutive, each starting where the one before ended) and they
    share their scope; else None. (`_reduce_block` reads the run as the numbers lo..hi.)"""
    blocks = sorted(blocks, key=lambda b: b.lines[0])
    for i, b in enumerate(blocks):
        if (
            b.lines != list(range(b.lines[0], b.lines[0] + len(b)))
            or b.scope != blocks[0].scope
            or (i and blocks[i - 1].lines[-1] + 1 != b.lines[0])
        ):
            return None
    return blocks


def _joined(blocks: list[RecordBlock]) -> RecordBlock:
    """Blocks `_in_order` as one."""
    if len(blocks) == 1:
        return blocks[0]
    first = blocks[0]
    lines, bodies, times, stamps = (
        list(chain.from_iterable(getattr(b, name) for b in blocks))
        for name in ("lines", "bodies", "times", "stamps")
    )
    return RecordBlock(
        first.workload, first.attempt, first.node, first.stream, first.scope, lines, bodies, times, stamps
    )
