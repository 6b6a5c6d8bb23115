"""Compaction: the server keeps only the raw lines extraction can read, not whole logs.

Lines are stored as they arrive; once `compact_after_s` old, every line the engine could never read
is blanked to a tombstone (number, time, dedup key), so line references, coverage and retries are
unchanged and a stream rebuilt from the store gives the same diagnosis.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from hypocenter.engine.extract import Extractor
from hypocenter.lineformat import TimeContext
from hypocenter.store.base import Store, StreamKey, StreamLine

log = logging.getLogger("hypocenter.server")


@dataclass(slots=True)
class CompactionReport:
    streams: int = 0
    blanked: int = 0
    bytes_freed: int = 0
    merged: int = 0  # blanked rows merged into gap rows (and so deleted)


def generations(rows: list[StreamLine]) -> list[list[StreamLine]]:
    """A stream's rows (arrival order) split where record numbers start again (rotation), each part
    in record-number order — the parts `collector.attempts` rebuilds as `stream`, `stream.1`, …"""
    parts: list[list[StreamLine]] = [[]]
    high = 0
    for r in rows:
        if r.line is not None and r.line <= high and parts[-1]:
            parts.append([])
            high = 0
        parts[-1].append(r)
        high = max(high, r.line or 0)
    for part in parts:
        part.sort(key=lambda r: r.line if r.line is not None else 1 << 62)
    return [p for p in parts if p]


def placed(part: list[StreamLine]) -> list[int]:
    """The line each row is in the rebuilt text: its record number, else the next one after the
    previous row's (as attempts._text lays rows out, gaps kept as blank lines)."""
    out: list[int] = []
    expected = 1
    for r in part:
        out.append(r.line if r.line is not None else expected)
        expected = out[-1] + 1
    return out


def compact(
    store: Store,
    extractor: Extractor,
    now: float,
    compact_after_s: float,
    *,
    collapse_after_s: float = -1,
    max_streams: int = 200,
) -> CompactionReport:
    """One pass over the streams with lines older than the horizon; returns what it blanked. With
    `collapse_after_s` ≥ 0, runs of lines blanked at least that long ago become one gap row each."""
    cutoff = now - compact_after_s
    report = CompactionReport()
    # Year-less stamps only need *a* year to tell stamped from unstamped lines.
    when = datetime.fromtimestamp(now, timezone.utc)
    tctx = TimeContext(tz=timezone.utc, start=when - timedelta(days=1), end=when)
    for key in store.compaction_due(cutoff, max_streams):
        blank, keep, freed = _stream(store, extractor, key, cutoff, tctx)
        store.compact(blank, keep)
        report.streams += 1
        report.blanked += len(blank)
        report.bytes_freed += freed
    if collapse_after_s >= 0:
        for key in store.collapse_due(now - collapse_after_s, max_streams):
            runs = _runs(store, key, now - collapse_after_s)
            store.collapse(runs)
            report.merged += sum(len(drop) for _, _, drop in runs)
    if report.blanked or report.merged:
        log.info(
            "compaction blanked %d line(s) (%d bytes) in %d stream(s), merged %d blank row(s)",
            report.blanked,
            report.bytes_freed,
            report.streams,
            report.merged,
        )
    return report


def _runs(store: Store, key: StreamKey, cutoff: float) -> list[tuple[int, int, list[int]]]:
    """Runs of blanked rows (record-numbered, blanked before `cutoff`) with no live line between them,
    each merged into its last row: (row kept, lines it stands for, rows dropped). A run next to an
    earlier gap row joins it."""
    rows = sorted(
        [*store.stream_lines(key, live_only=True), *store.stream_tombstones(key)], key=lambda r: r.id
    )
    out: list[tuple[int, int, list[int]]] = []
    for part in generations(rows):
        run: list[StreamLine] = []
        for r in [*part, None]:
            mergeable = (
                r is not None
                and r.line is not None
                and r.compacted >= 2
                and (r.compacted == 3 or r.received < cutoff)
            )
            if mergeable and r is not None:
                run.append(r)
                continue
            if len(run) > 1 or (len(run) == 1 and run[0].compacted == 2):
                last = run[-1]
                lines = sum(int(x.body) if x.compacted == 3 and x.body.isdigit() else 1 for x in run)
                out.append((last.id, lines, [x.id for x in run[:-1]]))
            run = []
    return out


def _stream(
    store: Store, extractor: Extractor, key: StreamKey, cutoff: float, tctx: TimeContext
) -> tuple[list[int], list[int], int]:
    blank: list[int] = []
    keep: list[int] = []
    freed = 0
    # Lines with record numbers are placed by their numbers, so the tombstones need not be read
    # (a generation's restart shows in the head lines it keeps); lines without are placed by
    # arrival order, tombstones included.
    rows = store.stream_lines(key, live_only=True)
    if any(r.line is None for r in rows):
        rows = store.stream_lines(key)
    for part in generations(rows):
        numbers = placed(part)
        live = [(i, r) for i, r in enumerate(part) if r.compacted != 2]
        needed = extractor.evidence_lines([(numbers[i], r.body) for i, r in live], tctx)
        for j, (_, r) in enumerate(live):
            if r.received >= cutoff:
                continue
            if j in needed:
                if r.compacted == 0:
                    keep.append(r.id)
            else:
                blank.append(r.id)
                freed += len(r.body.encode("utf-8", "surrogateescape"))
    return blank, keep, freed
