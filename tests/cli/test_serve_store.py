"""`hypocenter serve` that cannot start leaves nothing behind: no store file in the working directory."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server_support import REPO, clean_env

pytestmark = pytest.mark.slow


def test_a_taken_port_refuses_the_start_before_the_default_store_is_created(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable, "-m", "hypocenter.cli", "serve", "--grpc-listen", "127.0.0.1:0",
                "--http-listen", f"127.0.0.1:{port}", "--metrics-listen", "",
            ],
            cwd=tmp_path,
            env={**clean_env(), "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port} (HTTP)" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no hypocenter.db, no -wal / -shm


def test_the_default_store_is_ignored_by_git() -> None:
    r = subprocess.run(
        ["git", "check-ignore", "hypocenter.db", "hypocenter.db-wal"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.stdout.split() == ["hypocenter.db", "hypocenter.db-wal"]
