"""A throwaway PostgreSQL instance of a test's own (initdb, pg_ctl from Debian's package) on a free
loopback port, that the test may stop, start and restart without disturbing the shared test
database other tests use. Skips when the server binaries are not installed."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.skip(f"PostgreSQL server binaries not installed (no /usr/lib/postgresql/*/bin/{name})")
    return found[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnPostgres:
    """`initdb` into a new directory, then `start()` / `stop()` / `url`. As root the server runs as
    the `postgres` user (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hypocenter-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(
            _bin("initdb"),
            "-D",
            str(self.data),
            "-U",
            "hypocenter",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        self.also_listen: list[str] = []

    def allow(self, address: str, network: str) -> None:
        """Listen on `address` too (from the next `start`), and trust clients from `network` (CIDR)."""
        self.also_listen.append(address)
        hba = self.data / "pg_hba.conf"
        hba.write_text(hba.read_text() + f"host all all {network} trust\n")

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as, *cmd], check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql://hypocenter@127.0.0.1:{self.port}/postgres"

    def start(self) -> OwnPostgres:
        listen = ",".join(["127.0.0.1", *self.also_listen])
        options = f"-p {self.port} -k {self.root} -c listen_addresses={listen} -c fsync=off"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")
        return self

    def stop(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
