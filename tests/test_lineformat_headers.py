"""Issue #20 behaviours a user sees in a diagnosis: bounds for unstamped lines, launcher prefixes in
parsed headers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import yaml
from engine_support import analyze_bundle

from hypocenter.lineformat import TimeContext, parse_line

CTX = TimeContext(
    tz=UTC,
    start=datetime(2026, 11, 2, 9, 0, tzinfo=UTC),
    end=datetime(2026, 11, 2, 14, 0, tzinfo=UTC),
    hosts=frozenset({"worker-1"}),
)


def test_launcher_prefixes_name_rank_or_host() -> None:
    assert parse_line("[1,6]<stderr>:ValueError: x", CTX).rank == 6
    assert parse_line("[1,6]<stderr>: ValueError: x", CTX).message == "ValueError: x"  # Open MPI 5
    h = parse_line("[gpu-a02:5]: IndexError: x", CTX)
    assert (h.host, h.rank, h.message) == ("gpu-a02", 5, "IndexError: x")
    h = parse_line("worker-1: [2026-11-02 10:00:00,000] INFO step 5", CTX)
    assert h.host == "worker-1" and h.time == datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    assert parse_line("RuntimeError: boom", CTX).host is None  # only the attempt's hosts are pdsh prefixes
    h = parse_line(" 3: [default2]:[rank14]: KeyError: 'x'", CTX)  # srun --label padded, torchrun --tee
    assert (h.task, h.local_rank, h.rank, h.message) == (3, 2, 14, "KeyError: 'x'")
    assert parse_line("[node01:4242] *** Process received signal ***", CTX).host == "node01"


def test_unstamped_line_shows_the_stamps_around_it(tmp_path: Path) -> None:
    (tmp_path / "logs" / "gpu-a01").mkdir(parents=True)
    (tmp_path / "logs" / "gpu-a01" / "rank0.log").write_text(
        "2026-11-02T10:00:00Z job started\n"
        "gpu-a01:1201:1201 [0] NCCL WARN Bootstrap : no socket interface found\n"
        "2026-11-02T13:00:00Z shutting down\n"
    )
    (tmp_path / "attempt.yaml").write_text(
        yaml.safe_dump(
            {
                "workload": {"id": "b", "attempt": 0, "scheduler": "none"},
                "window": {"start": "2026-11-02T09:00:00Z", "end": "2026-11-02T14:00:00Z"},
                "state": "FAILED",
                "nodes": ["gpu-a01"],
                "timezone": "UTC",
            }
        )
    )
    d = analyze_bundle(tmp_path)
    cause = next(e for e in d.evidence if e.role == "root_cause")
    assert cause.inherited and (cause.time, cause.time_max) == (
        "2026-11-02T10:00:00Z",
        "2026-11-02T13:00:00Z",
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(tmp_path), "--color", "never"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    ).stdout
    assert "2026-11-02T10:00:00Z .. 2026-11-02T13:00:00Z" in out
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "hypocenter.cli", "analyze", str(tmp_path), "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        ).stdout
    )
    assert "first_failure" not in doc  # only an unattributed diagnosis carries one
