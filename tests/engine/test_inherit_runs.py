"""A storm of stamp-less candidate lines (a flapping port's NCCL WARNs, thousands in a row) costs
each line one look back, not a look back over the whole storm: the time every candidate inherits —
and so every event — is what it was, and the stamp parses stay proportional to the lines."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hypocenter import lineformat
from hypocenter.engine import default_engine
from hypocenter.engine import extract as extract_module
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Window, Workload
from hypocenter.sources import TextSource

WARN = "gpu0007:1234:5678 [{k}] misc/ibvwrap.cc:266 NCCL WARN NET/IB : Got async event : port error"
STAMPED = "Nov  2 10:{m:02d}:00 gpu0007 kernel: [29177.3{m:02d}] mlx5_core 0000:3b:00.0: port 1 link down"


def _events(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[str, datetime | None, bool]], int]:
    calls = 0
    real = lineformat.parse_line

    def counting(line: str, tctx: lineformat.TimeContext) -> lineformat.LineHeader:
        nonlocal calls
        calls += 1
        return real(line, tctx)

    monkeypatch.setattr(extract_module, "parse_line", counting)
    start = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)
    ctx = AttemptContext(
        workload=Workload(id="storm", attempt=0),
        window=Window(start=start, end=start + timedelta(hours=3)),
        nodes=["gpu0007"],
    )
    result = default_engine().extractor.extract(
        [TextSource(name="nccl.log", text=text, node="gpu0007")], ctx, time_context(ctx)
    )
    events = [(ev.kind, ev.time, ev.inherited) for ev in result.events]
    return events, calls


def test_a_storm_of_stampless_candidates_looks_back_once_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    storm = [WARN.format(k=i % 8) for i in range(1500)]
    events, calls = _events("\n".join(storm) + "\n", monkeypatch)
    assert len(events) == 1500
    assert all(when is None for _, when, _ in events)  # nothing to inherit from: no time
    assert calls < 5 * len(storm), f"{calls} stamp parses for {len(storm)} lines"


def test_stamps_before_and_inside_a_storm_are_still_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [STAMPED.format(m=1)] + [WARN.format(k=i % 8) for i in range(300)]
    lines += [STAMPED.format(m=2)] + [WARN.format(k=i % 8) for i in range(300)]
    events, calls = _events("\n".join(lines) + "\n", monkeypatch)
    inherited = [when for _, when, took in events if took]
    assert len(inherited) == 600 and all(when is not None for when in inherited)
    # each WARN took the stamp before it: the first 300 minute 1, the next 300 minute 2
    assert [when.minute for when in inherited if when is not None] == [1] * 300 + [2] * 300
    assert calls < 5 * len(lines)
