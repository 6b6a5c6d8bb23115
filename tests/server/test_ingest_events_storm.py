"""The events on arrival (server/service.py `IngestEvents`) of an evidence storm.

What a user relies on: the extracted-events metric and the hang trigger say what extracting a
batch's candidate lines says, whatever the batch holds — thousands of one repeated WARN, progress
lines that only carry a rule's token, real progress lines past the per-stream keep of training
steps, a record of several lines, a watchdog timeout (a stall, with its time).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypocenter.engine import default_engine
from hypocenter.exporter.activity import Activity
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext
from hypocenter.server.service import IngestEvents
from hypocenter.sources import TextSource
from hypocenter.store.base import RecordBlock

T0 = 1_793_613_600  # 2026-11-02T10:00:00Z
PORT_ERROR = "n1:4242:4243 [{d}] misc/ibvwrap.cc:266 NCCL WARN NET/IB : Got async event : port error"
WATCHDOG = (
    "[rank3]:[E1102 10:{m:02d}:00.000000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600020 milliseconds before timing out."
)


def _info(i: int) -> str:
    return f"n1:4242:4243 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : 1[0] -> 2[0] [send] via NET/IB/0"


def _block(bodies: list[str], stream: str = "rank.log") -> RecordBlock:
    n = len(bodies)
    times = [(T0 + i) * 10**9 for i in range(n)]
    return RecordBlock("w1", 0, "n1", stream, {}, list(range(1, n + 1)), bodies, times, times)


def _storm(n: int) -> list[str]:
    out = []
    for i in range(n):
        m, s = i // 60 % 60, i % 60
        if i % 10 == 5:
            out.append(PORT_ERROR.format(d=i // 10 % 8))
        elif i % 10 in (1, 7):
            out.append(f"[2026-11-02 10:{m:02d}:{s:02d}] step {i} ppl {i % 9}.5 lr 3.0e-4")  # no step event
        elif i % 10 == 3 and i < 8000:
            out.append(f"[2026-11-02 10:{m:02d}:{s:02d}] step {i} loss {i % 9}.5")  # a training step
        else:
            out.append(_info(i))
    return out


def _counted(blocks: list[RecordBlock]) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    activity = Activity()
    stalls, committed = IngestEvents(default_engine().extractor, activity)([], blocks)
    committed()
    return activity.snapshot().extracted_events, stalls


def _extracted_together(bodies: list[str]) -> dict[str, int]:
    """The events of a stream's candidate lines extracted as one text, by kind."""
    ex = default_engine().extractor
    lines = [b for b in bodies if ex.is_candidate(b)]
    now = datetime.fromtimestamp(T0, timezone.utc)
    window = {"start": now - timedelta(hours=1), "end": now + timedelta(hours=4)}
    ctx = AttemptContext.model_validate({"workload": {"id": "w1"}, "window": window, "nodes": ["n1"]})
    kinds: dict[str, int] = {}
    for ev in ex.extract(
        [TextSource("rank.log", "\n".join(lines), node="n1")], ctx, time_context(ctx)
    ).events:
        kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    return kinds


def test_a_storm_counts_every_repeated_warning_and_keeps_the_step_cap() -> None:
    bodies = _storm(20_000)
    kinds, stalls = _counted([_block(bodies[:12_000]), _block(bodies[12_000:], "other.log")])
    one, two = _extracted_together(bodies[:12_000]), _extracted_together(bodies[12_000:])
    assert kinds == {k: one.get(k, 0) + two.get(k, 0) for k in one.keys() | two.keys()}
    assert kinds["nccl_ib_async"] == 2000
    assert kinds["train_step"] == 512  # 800 steps in the first stream: its first and last 256
    assert stalls == []


def test_a_record_of_several_lines_counts_each_line() -> None:
    two = PORT_ERROR.format(d=1) + "\n" + PORT_ERROR.format(d=2)
    kinds, _ = _counted([_block([two, _info(0), two, PORT_ERROR.format(d=1)])])
    assert kinds == {"nccl_ib_async": 5}


def test_a_watchdog_in_a_storm_is_a_stall_at_its_time() -> None:
    bodies = _storm(3000)
    bodies[2000] = WATCHDOG.format(m=33)
    bodies[2500] = WATCHDOG.format(m=41)
    kinds, stalls = _counted([_block(bodies)])
    assert kinds == _extracted_together(bodies)
    assert kinds["watchdog_timeout"] == 2 and kinds["nccl_ib_async"] == 300
    at = datetime(2026, 11, 2, 10, 33, tzinfo=timezone.utc).timestamp()
    assert stalls[0] == ("w1", 0, int(at * 1e9))
    assert len(stalls) == 2
