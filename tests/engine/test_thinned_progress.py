"""A training loop prints a step line on every step: a stream keeps the first and the last
THINNED_KEEP of them (what the cost estimate reads), in stream order among its other events, so a long
run's output is not millions of events held at once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypocenter.engine import default_engine
from hypocenter.engine.extract import THINNED_KEEP
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Event, Window, Workload
from hypocenter.sources import TextSource

START = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)


def _events(lines: list[str]) -> list[Event]:
    ctx = AttemptContext(
        workload=Workload(id="long-run", attempt=0),
        window=Window(start=START, end=START + timedelta(hours=6)),
        nodes=["gpu0007"],
    )
    result = default_engine().extractor.extract(
        [TextSource(name="rank0.log", text="\n".join(lines) + "\n", node="gpu0007")], ctx, time_context(ctx)
    )
    return result.events


def _step(i: int) -> str:
    t = START + timedelta(seconds=i)
    return f"[{t:%Y-%m-%d %H:%M:%S}] step {i} lr 3.0e-04 loss 2.31"


def test_a_long_run_keeps_its_first_and_last_steps_in_order() -> None:
    n = 10 * THINNED_KEEP
    lines = [_step(i) for i in range(n)]
    lines.insert(n // 2, "RuntimeError: CUDA error: an illegal memory access was encountered")
    events = _events(lines)
    steps = [e.fields.get("n") for e in events if e.kind == "train_step"]
    assert steps == [*range(THINNED_KEEP), *range(n - THINNED_KEEP, n)]
    kinds = [e.kind for e in events if e.kind in ("train_step", "cuda_error")]
    assert kinds.index("cuda_error") == THINNED_KEEP  # other events keep their place among the kept steps
    assert [e.stream_position() for e in events] == sorted(e.stream_position() for e in events)


def test_a_short_run_keeps_every_step() -> None:
    events = _events([_step(i) for i in range(THINNED_KEEP)])
    assert [e.fields.get("n") for e in events if e.kind == "train_step"] == list(range(THINNED_KEEP))
