"""Every line format the issue lists is recognised by content and turned into the right instant."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hypocenter.lineformat import TimeContext, parse_line, zone

CTX = TimeContext(
    tz=timezone.utc,
    start=datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc),
    end=datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc),
)


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("line", "time", "message", "extra"),
    [
        # RFC 3164 kern.log, with and without the kernel's [uptime]
        (
            "Nov  2 10:15:03 node02 kernel: [240314.528856] NVRM: Xid (PCI:0000:3b:00): 149, x",
            utc(2026, 11, 2, 10, 15, 3),
            "NVRM: Xid (PCI:0000:3b:00): 149, x",
            {"host": "node02", "tag": "kernel", "uptime": 240314.528856},
        ),
        (
            "Nov  2 10:15:03 node02 kernel: NVRM: Xid 79",
            utc(2026, 11, 2, 10, 15, 3),
            "NVRM: Xid 79",
            {"tag": "kernel"},
        ),
        # RFC 5424
        (
            "<4>1 2026-11-02T10:15:03.120Z node02 kernel - - - mlx5_core 0000:5c:00.0 mlx5_3: Port: 1 Link DOWN",
            utc(2026, 11, 2, 10, 15, 3, 120000),
            "mlx5_core 0000:5c:00.0 mlx5_3: Port: 1 Link DOWN",
            {"host": "node02"},
        ),
        # dmesg -T and raw dmesg
        (
            "[Mon Nov  2 10:15:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            utc(2026, 11, 2, 10, 15, 3),
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            {"tag": "kernel"},
        ),
        (
            "[ 1234.567890] nfs: server fs01 not responding, still trying",
            None,
            "nfs: server fs01 not responding, still trying",
            {"uptime": 1234.56789},
        ),
        # journalctl short-iso and short-precise
        (
            "2026-11-02T10:15:03+0000 node02 kernel: Out of memory: Killed process 1 (python)",
            utc(2026, 11, 2, 10, 15, 3),
            "Out of memory: Killed process 1 (python)",
            {"host": "node02", "tag": "kernel"},
        ),
        (
            "Nov 02 10:15:03.654321 node02 kernel: Lustre: x",
            utc(2026, 11, 2, 10, 15, 3, 654321),
            "Lustre: x",
            {"tag": "kernel"},
        ),
        # journalctl -o json
        (
            '{"__REALTIME_TIMESTAMP": "1793614503000000", "_HOSTNAME": "node02", "SYSLOG_IDENTIFIER": "kernel", "MESSAGE": "NVRM: Xid 48"}',
            utc(2026, 11, 2, 10, 15, 3),
            "NVRM: Xid 48",
            {"host": "node02", "tag": "kernel"},
        ),
        # PyTorch c10 with rank prefix (unpadded month), torchelastic
        (
            "[rank3]:[E1102 10:15:03.123456789 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught",
            utc(2026, 11, 2, 10, 15, 3, 123456),
            "[Rank 3] Watchdog caught",
            {"rank": 3},
        ),
        (
            "E1102 10:25:10.000000 32974 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1)",
            utc(2026, 11, 2, 10, 25, 10),
            "32974 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1)",
            {},
        ),
        # Python logging
        (
            "2026-11-02 10:15:03,250 - INFO - iteration 10",
            utc(2026, 11, 2, 10, 15, 3, 250000),
            "INFO - iteration 10",
            {},
        ),
        # Hugging Face Trainer / transformers logging (%m/%d/%Y %H:%M:%S)
        (
            "11/02/2026 10:15:03 - INFO - __main__ - step 16200: {'loss': 6.81}",
            utc(2026, 11, 2, 10, 15, 3),
            "INFO - __main__ - step 16200: {'loss': 6.81}",
            {},
        ),
        # torchtitan's "[titan]" logger tag before a Python logging stamp
        (
            "[titan] 2026-11-02 10:15:03,250 - root - INFO - step:    20  loss: 10.8873",
            utc(2026, 11, 2, 10, 15, 3, 250000),
            "root - INFO - step:    20  loss: 10.8873",
            {},
        ),
        # NCCL prefix: no stamp, host and device
        (
            "gpu-a02:40211:40980 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion",
            None,
            "transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion",
            {"host": "gpu-a02", "device": 3},
        ),
        # kubectl logs with the CRI prefix, and srun --label
        (
            "2026-11-02T10:15:03.123456789Z stderr F [rank5]: KeyError: 'x'",
            utc(2026, 11, 2, 10, 15, 3, 123456),
            "KeyError: 'x'",
            {"rank": 5},
        ),
        ("37: KeyError: 'input_ids'", None, "KeyError: 'input_ids'", {"rank": 37}),
    ],
)
def test_line_prefixes(line: str, time: datetime | None, message: str, extra: dict[str, object]) -> None:
    h = parse_line(line, CTX)
    assert h.time == time
    assert h.message == message
    for k, v in extra.items():
        assert getattr(h, k) == v, k


def test_yearless_stamp_takes_the_year_nearest_the_window() -> None:
    ctx = TimeContext(
        tz=timezone.utc,
        start=datetime(2027, 1, 1, 0, 10, tzinfo=timezone.utc),
        end=datetime(2027, 1, 1, 2, 0, tzinfo=timezone.utc),
    )
    assert parse_line("Dec 31 23:59:58 n1 kernel: x", ctx).time == utc(2026, 12, 31, 23, 59, 58)
    assert parse_line("Jan  1 00:20:00 n1 kernel: x", ctx).time == utc(2027, 1, 1, 0, 20)


def test_local_zone_stamps_are_converted_to_utc() -> None:
    ctx = TimeContext(tz=zone("Europe/Paris"), start=CTX.start, end=CTX.end)
    assert parse_line("Nov  2 11:15:03 n1 kernel: x", ctx).time == utc(2026, 11, 2, 10, 15, 3)


def test_unknown_timezone_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown timezone 'Mars/Olympus'"):
        zone("Mars/Olympus")


def test_garbage_never_raises() -> None:
    for junk in (
        "",
        "[",
        "{",
        "{not json",
        "<999>1 x",
        "[rank]:",
        "Nov 99 99:99:99 x y: z",
        "\x00\x01",
        "E9999 99:99:99.9 x",
    ):
        parse_line(junk, CTX)
