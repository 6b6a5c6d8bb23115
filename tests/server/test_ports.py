"""A second `hypocenter serve` on a taken port stops at start with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from server_support import REPO, ServerProcess, clean_env

pytestmark = pytest.mark.slow


def _second(tmp_path: Path, *listen: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "hypocenter.cli",
        "serve",
        "--store",
        str(tmp_path / "second.db"),
        "--metrics-listen",
        "127.0.0.1:0",
        *listen,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env=clean_env(), cwd=REPO, check=False
    )


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_taken_port_is_refused_at_start(tmp_path: Path, which: str) -> None:
    first = ServerProcess(tmp_path / "first.db").start()
    try:
        taken = first.grpc if which == "grpc" else first.http
        listen = (
            ["--grpc-listen", taken, "--http-listen", "127.0.0.1:0"]
            if which == "grpc"
            else ["--grpc-listen", "127.0.0.1:0", "--http-listen", taken]
        )
        r = _second(tmp_path, *listen)
        assert r.returncode == 2, r.stderr
        assert r.stdout == ""  # never announced as listening
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "cannot listen on" in lines[0] and taken in lines[0], r.stderr
        assert "Traceback" not in r.stderr
        with first.client() as client:
            assert first.alive() and client.get("/readyz").status_code == 200
    finally:
        first.stop()
