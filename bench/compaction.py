"""Compaction on a long node stream: how long a pass takes and what it leaves in the store.

    python -m bench.compaction [--lines 1000000] [--more 20000]

Stores a healthy node log (bench.throughput's synthetic NCCL INFO / audit / progress lines, a
candidate in ~20,000) as one node-scoped stream in a SQLite store, the way the OTLP receiver does
(batches of 5,000 records), then times, in the same run:

- the ingest itself (the reference: what the server spends anyway to accept those lines);
- the first compaction pass over the whole stream;
- the merge pass (`collapse_after_s`, here 0): runs of blanked lines become one gap row each;
- a later pass after `--more` new lines arrived (it reads the live lines only, not the tombstones);

and prints the store's size before and after (VACUUM), and how many lines kept their text.
Figures are for this machine and run only; compare rows of one run.
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.throughput import write_log
from hypocenter.engine import default_engine
from hypocenter.server.compaction import compact
from hypocenter.store.base import Entry
from hypocenter.store.sqlite import SQLiteStore

BATCH = 5000
T0 = 1_793_000_000_000_000_000


def _entries(lines: list[str], first: int) -> list[Entry]:
    return [
        Entry(
            workload=None,
            attempt=0,
            node="n1",
            stream="n1/var/log/nccl.log",
            kind="text",
            body=line,
            time_ns=T0 + (first + i) * 1_000_000,
            line=first + i + 1,
            dedup=hashlib.blake2b(f"{first + i}\x1f{line}".encode(), digest_size=16).hexdigest(),
        )
        for i, line in enumerate(lines)
    ]


def _ingest(store: SQLiteStore, lines: list[str], first: int, now: float) -> float:
    t = time.perf_counter()
    for i in range(0, len(lines), BATCH):
        store.ingest(_entries(lines[i : i + BATCH], first + i), [], now)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines in the stream before the first pass")
    ap.add_argument("--more", type=int, default=20_000, help="lines arriving before the second pass")
    args = ap.parse_args()
    engine = default_engine()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "node.log"
        write_log(log, max(1, (args.lines + args.more) * 110 // 1_000_000 + 1), seed=5)
        lines = log.read_text().split("\n")[: args.lines + args.more]
        first, more = lines[: args.lines], lines[args.lines :]
        raw = sum(len(x) + 1 for x in first)
        store = SQLiteStore(Path(tmp) / "store.db", synchronous="NORMAL")
        t_ingest = _ingest(store, first, 0, now=1000.0)
        size_before = sum(p.stat().st_size for p in Path(tmp).glob("store.db*"))
        t = time.perf_counter()
        report = compact(store, engine.extractor, now=2000.0, compact_after_s=0)
        t_first = time.perf_counter() - t
        t = time.perf_counter()
        merge = compact(store, engine.extractor, now=2500.0, compact_after_s=0, collapse_after_s=0)
        t_merge = time.perf_counter() - t
        t_more_ingest = _ingest(store, more, len(first), now=3000.0)
        t = time.perf_counter()
        second = compact(store, engine.extractor, now=4000.0, compact_after_s=0, collapse_after_s=0)
        t_second = time.perf_counter() - t
        store.close()
        db = sqlite3.connect(Path(tmp) / "store.db", isolation_level=None)
        rows = db.execute("SELECT COUNT(*) FROM log_entries").fetchone()[0]
        kept = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM log_entries WHERE compacted = 1"
        ).fetchone()
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # WAL mode: the file shrinks at the checkpoint
        db.close()
        size_after = sum(p.stat().st_size for p in Path(tmp).glob("store.db*"))
        print(f"stream: {len(first):,} lines, {raw / 1e6:.1f} MB of text, then {len(more):,} more")
        print(f"ingest (reference)        {t_ingest:7.2f} s  {len(first) / t_ingest:10,.0f} lines/s")
        print(
            f"first compaction pass     {t_first:7.2f} s  {len(first) / t_first:10,.0f} lines/s  "
            f"{report.blanked:,} blanked, {report.bytes_freed / 1e6:.1f} MB of text"
        )
        print(
            f"merge pass                {t_merge:7.2f} s  {merge.merged:,} blanked rows merged into gap rows"
        )
        print(f"ingest of {len(more):,} more       {t_more_ingest:7.2f} s")
        print(
            f"second pass (both steps)  {t_second:7.2f} s  {second.blanked:,} blanked, {second.merged:,} merged"
        )
        print(f"rows left: {rows:,} for {len(first) + len(more):,} lines")
        print(f"kept with text: {kept[0]:,} lines, {kept[1] / 1e3:.1f} KB")
        print(
            f"store file: {size_before / 1e6:.1f} MB before, {size_after / 1e6:.2f} MB after compaction + VACUUM"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
