"""Request bodies held by the HTTP listener are bounded in all (`http_body_budget_bytes`): many large
bodies sent in parallel and never finished leave the server's memory (RSS, read from /proc) near the
budget, the requests that do not fit are answered 503 with Retry-After (which OTLP exporters retry),
and an export succeeds once they are gone. Loopback only, bounded in count and size."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest
from server_support import ServerProcess

pytestmark = pytest.mark.slow

MIB = 1 << 20
ATTACKERS = 16
BODY = 15 * MIB  # each under max_message_bytes (16 MiB): only their number is hostile


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class Unfinished:
    """A POST /v1/logs declaring one byte more than it sends: the server waits for the last byte."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_connection(_host_port(address), timeout=10)
        self.answer = b""

    def run(self) -> None:
        try:
            self.sock.sendall(
                b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                + f"Content-Length: {BODY + 1}\r\n\r\n".encode()
            )
            chunk = b"\x0a" * MIB
            for _ in range(BODY // MIB):
                self.sock.sendall(chunk)
        except OSError:  # answered and closed mid-body
            pass
        self.sock.settimeout(3)
        with contextlib.suppress(OSError):
            self.answer = self.sock.recv(4096)


def test_parallel_unfinished_bodies_stay_within_the_budget(tmp_path: Path) -> None:
    srv = ServerProcess(
        tmp_path / "store.db",
        "--max-message-bytes",
        str(16 * MIB),
        "--http-body-budget-bytes",
        str(32 * MIB),
        "--http-request-timeout-s",
        "120",
    ).start()
    assert srv.proc is not None
    attackers: list[Unfinished] = []
    try:
        with srv.client() as c:  # warm: the first request's imports are not the attack's memory
            assert c.get("/healthz").status_code == 200
        before = rss(srv.proc.pid)
        attackers = [Unfinished(srv.http) for _ in range(ATTACKERS)]
        threads = [threading.Thread(target=a.run, daemon=True) for a in attackers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        grown = rss(srv.proc.pid) - before
        refused = [a.answer for a in attackers if a.answer.startswith(b"HTTP/1.1 503")]
        # 16 x 15 MiB held would be 240 MiB; the budget keeps two of them (30 MiB) in memory
        assert grown < 100 * MIB, f"RSS grew by {grown / MIB:.0f} MiB"
        assert len(refused) >= ATTACKERS - 3
        assert all(b"retry-after: 1" in a.lower() for a in refused)
    finally:
        for a in attackers:
            a.sock.close()
    try:
        with srv.client() as c:  # the budget is given back when they go
            r = c.post("/v1/logs", content=b"", headers={"Content-Type": "application/x-protobuf"})
            assert r.status_code == 200, r.text
    finally:
        srv.stop()
