"""util-linux dmesg's relative and delta stamps (`dmesg -H` / `-e`, `-d`, `--time-format delta`): the
stamp is peeled so the kernel line underneath is read, and the line is placed at the nearest absolute
stamp before it in its stream (dmesg -H's `[Nov 2 10:15]` minute lines), or marked approximate."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from engine_support import analyze_bundle, write_attempt

from hypocenter.lineformat import TimeContext, parse_line, zone

CTX = TimeContext(
    tz=zone("UTC"),
    start=datetime(2026, 11, 2, 10, tzinfo=timezone.utc),
    end=datetime(2026, 11, 2, 11, tzinfo=timezone.utc),
)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "stamp",
    [
        "[  +0.000844] ",  # -H / -e, a delta under 10 s: "[  %+8.06f] "
        "[ +12.000844] ",  # from 10 s: "[ %+9.06f] "
        "[<    0.000844>] ",  # --time-format delta: "[<%12.06f>] "
    ],
)
def test_a_delta_stamp_is_peeled_and_gives_no_time(stamp: str) -> None:
    h = parse_line(stamp + XID, CTX)
    assert h.message == XID
    assert h.source_hint == "kernel"
    assert h.time is None and h.uptime is None


@pytest.mark.parametrize(
    ("stamp", "minute"),
    [("[Nov 2 10:15] ", 15), ("[Nov12 10:47] ", 47)],  # "%b%e %H:%M": %e pads the day with a space
)
def test_a_reltime_minute_line_is_an_absolute_stamp(stamp: str, minute: int) -> None:
    h = parse_line(stamp + XID, CTX)
    assert h.message == XID and h.time is not None
    assert (h.time.hour, h.time.minute, h.time.second) == (10, minute, 0)


def test_show_delta_keeps_the_uptime_and_the_wall_time() -> None:
    h = parse_line("[294950.412118 <    0.000844>] " + XID, CTX)  # -d: "[%5ld.%06ld <%12.06f>] "
    assert h.message == XID and h.uptime == pytest.approx(294950.412118)
    t = parse_line("[Mon Nov  2 10:15:03 2026 <    0.000844>] " + XID, CTX)  # -T -d
    assert t.message == XID and t.time == datetime(2026, 11, 2, 10, 15, 3, tzinfo=timezone.utc)


def _evidence_of(tmp_path: Path, dmesg: str) -> tuple[str | None, bool, str]:
    logs = tmp_path / "logs" / "gpu-a01"
    logs.mkdir(parents=True)
    (logs / "dmesg.txt").write_text(dmesg, encoding="utf-8")
    write_attempt(tmp_path, "dmesg-h", ["gpu-a01"])
    d = analyze_bundle(tmp_path)
    assert d.root_cause is not None, d.outcome
    cause = next(e for e in d.evidence if e.role == "root_cause")
    return cause.time, cause.inherited, d.root_cause.rule


def test_a_delta_line_is_placed_at_the_minute_line_before_it(tmp_path: Path) -> None:
    time, inherited, _ = _evidence_of(
        tmp_path, f"[Nov 2 10:15] pcieport 0000:00:03.0: AER: Corrected error received\n[  +0.000844] {XID}\n"
    )
    assert time == "2026-11-02T10:15:00Z" and inherited


def test_the_returnn_aer_report_names_the_gpu(tmp_path: Path) -> None:
    """rwth-i6/returnn#1500 as posted: delta stamps only, nothing to anchor them."""
    _, _, rule = _evidence_of(
        tmp_path,
        "[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n"
        "[  +0.000001] snd_hda_intel 0000:03:00.1: AER: can't recover (no error_detected callback)\n"
        "[  +0.000008] pcieport 0000:00:03.0: AER: device recovery failed\n"
        "[  +0.000001] pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0\n",
    )
    assert rule == "pcie-aer-gpu-unrecovered"
