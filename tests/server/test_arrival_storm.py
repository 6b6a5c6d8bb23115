"""An evidence storm reduced on arrival (server/arrival.py, engine/extract.py `evidence_columns`).

What a user relies on: a rank log in a fault storm — a flapping port's `NCCL WARN NET/IB : Got
async event : port error` every few lines, between training progress lines that carry the
train-step rule's `step` token without being a step it reads — is stored as its warnings and the
stamps they read, not as every progress line, and the attempt rebuilt from the store diagnoses
byte for byte as its whole logs do, whatever the batches (a warning that looks back past 4,096
unstamped lines, into an earlier batch, for the time it inherits).
"""

from __future__ import annotations

import random
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench.perf import FAULT, VICTIM
from hypocenter.engine import default_engine
from hypocenter.lineformat import time_context
from hypocenter.server.arrival import Arrival
from hypocenter.server.attempts import assemble
from hypocenter.sources import AttemptInput, TextSource
from hypocenter.store.base import Entry
from hypocenter.store.sqlite import SQLiteStore

T0 = 1_793_613_600  # 2026-11-02T10:00:00Z
SCOPE = {
    "window_start": "2026-11-02T10:00:00Z",
    "window_end": "2026-11-02T11:02:00Z",
    "nodes": "n1,n2",
    "state": "FAILED",
    "scheduler": "slurm",
}
PORT_ERROR = "n1:4242:4243 [{d}] misc/ibvwrap.cc:266 NCCL WARN NET/IB : Got async event : port error"


def _info(i: int) -> str:
    return f"n1:4242:4243 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : 1[0] -> 2[0] [send] via NET/IB/0"


def _rank_log() -> list[str]:
    out = []
    for i in range(9000):
        stamp = f"[2026-11-02 10:{i // 180 % 60:02d}:{i // 3 % 60:02d}]"
        if 3000 <= i < 8200:  # a quiet stretch: NCCL chatter only, then the storm again
            out.append(_info(i))
        elif i % 10 == 5:
            out.append(PORT_ERROR.format(d=i // 10 % 8))
        elif i % 10 in (0, 4, 6):
            out.append(_info(i))
        else:
            out.append(f"{stamp} step {i} ppl {i % 9}.5 lr 3.0e-4 tokens/s 98304")
    out[2998] = "[2026-11-02 10:16:40] step 2998 ppl 3.5 lr 3.0e-4"  # the last known time before 8200
    out[2999] = "Nov  2 09:30:00 n1 systemd[1]: Started Session 7 of User root."  # a stamp, no candidate
    out[8200] = PORT_ERROR.format(d=3)  # 5,200 unstamped lines back: it takes 10:16:40
    out[8950] = VICTIM.format(rank=0, s=7)
    return out


def _send(
    store: SQLiteStore, arrival: Arrival, workload: str | None, stream: str, lines: list[str], order: int = 0
) -> None:
    now = T0 + 4000.0
    entries = [
        Entry(
            workload=workload,
            attempt=0,
            node="n1",
            stream=stream,
            kind="text",
            body=b,
            time_ns=(T0 + i) * 10**9,
            line=i + 1,
            dedup=f"n1|{stream}|{i}",
            scope=SCOPE if workload else {},
        )
        for i, b in enumerate(lines)
    ]
    starts = list(range(0, len(entries), 1000))
    if order:  # batches in another order, one sent twice (parallel exporters, a retry)
        random.Random(order).shuffle(starts)
        starts.insert(3, starts[1])
    for i in starts:
        reduced = arrival.split(store, entries[i : i + 1000], now)
        store.ingest(reduced.rest, [], now, (), reduced.writes)


@pytest.mark.parametrize("order", [0, 1, 2], ids=["in order", "shuffled", "shuffled again"])
def test_a_storm_is_stored_as_its_evidence_and_diagnoses_as_its_logs(tmp_path: Path, order: int) -> None:
    engine = default_engine()
    store = SQLiteStore(tmp_path / "store.db")
    arrival = Arrival(engine.extractor)
    rank = _rank_log()
    kern = [FAULT.format(node="n1")] + [_info(i) for i in range(200)]
    _send(store, arrival, "w1", "logs/n1/rank.log", rank, order)
    _send(store, arrival, None, "logs/n1/kern.log", kern)
    row = store.attempt("w1", 0)
    assert row is not None
    now = datetime.fromtimestamp(T0 + 4000.0, timezone.utc)
    inp = assemble(store, row, lookback_s=3600, slack_s=600, now=now)
    written = {"logs/n1/rank.log": rank, "logs/n1/kern.log": kern}
    whole = AttemptInput(
        context=inp.context,
        coverage=inp.coverage,
        notes=inp.notes,
        sources=[
            TextSource(s.name, "\n".join(written[s.name]) + "\n", node=s.node)
            if isinstance(s, TextSource)
            else s
            for s in inp.sources
        ],
    )
    got, want = engine.analyze(inp), engine.analyze(whole)
    assert got.to_json() == want.to_json()
    tctx = time_context(inp.context)
    events = engine.extractor.extract(whole.sources, inp.context, tctx).events
    rebuilt = engine.extractor.extract(inp.sources, inp.context, tctx).events
    assert [e.model_dump() for e in rebuilt] == [e.model_dump() for e in events]  # times included
    late = [e for e in rebuilt if e.ref == "logs/n1/rank.log:8201"]
    assert late and late[0].time == datetime(2026, 11, 2, 10, 16, 40, tzinfo=timezone.utc)
    store.close()

    db = sqlite3.connect(tmp_path / "store.db")
    (texts,) = db.execute(
        "SELECT COUNT(*) FROM log_entries WHERE kind = 'text' AND stream = 'logs/n1/rank.log'"
    ).fetchone()
    warnings = sum(1 for x in rank if "port error" in x)
    # each warning, the stamps before and after it, the stream's head and end: not the progress lines
    assert texts < 3 * warnings + 300, texts


def test_batches_in_any_order_store_the_same_rows(tmp_path: Path) -> None:
    """Which lines a storm keeps depends on the lines around each, never on which came first."""
    stored = []
    for order in (0, 1, 2):
        store = SQLiteStore(tmp_path / f"{order}.db")
        _send(store, Arrival(default_engine().extractor), "w1", "logs/n1/rank.log", _rank_log(), order)
        store.close()
        db = sqlite3.connect(tmp_path / f"{order}.db")
        stored.append(db.execute("SELECT line, kind, body FROM log_entries ORDER BY line, kind").fetchall())
        db.close()
    assert stored[0] and stored[1] == stored[0] and stored[2] == stored[0]
