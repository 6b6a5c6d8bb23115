"""Slow HTTP clients: a request that trickles in a byte at a time is cut at `http_request_deadline_s`
(the per-byte timeout alone restarts at every byte), and a crowd of trickling connections from one
address is held to `http_max_connections_per_client`, so requests from elsewhere are still served and
the server neither runs out of file descriptors nor floods its log. Loopback only, bounded counts."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import REPO, clean_env, terminate

from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    srv, thread = serve_in_thread(
        settings(tmp_path, http_request_deadline_s=2.0, http_request_timeout_s=30.0)
    )
    yield srv
    srv.shutdown()
    thread.join(30)


def _trickle_until_closed(address: str, head: bytes, rest: bytes, steps: int) -> bool:
    """Send `head`, then `rest` a byte every 0.25 s; True when the server closed the connection."""
    with socket.create_connection(_host_port(address), timeout=5) as sock:
        sock.sendall(head)
        for i in range(steps):
            try:
                sock.sendall(rest[i % len(rest) : i % len(rest) + 1])
            except OSError:  # reset or broken pipe: closed
                return True
            sock.settimeout(0.25)
            try:
                if sock.recv(4096) == b"":
                    return True
            except TimeoutError:
                continue
            except OSError:
                return True
    return False


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_trickling_request_is_cut_at_the_deadline(server: Server, part: str) -> None:
    headers = (
        b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
    )
    head, rest = (b"", headers) if part == "headers" else (headers, b"{" * 4000)
    # 80 bytes over ~20 s: each within the 30 s per-byte timeout, the whole far past the 2 s deadline
    assert _trickle_until_closed(server.http_address, head, rest, steps=80)
    assert httpx.get(f"http://{server.http_address}/healthz", timeout=10).status_code == 200


class LimitedServer:
    """`hypocenter serve` in a process allowed 256 open files, so that an fd flood is reachable."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        self.log = tmp / "server.log"
        cmd = [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "",
            "--store",
            str(tmp / "store.db"),
            "--log-level",
            "warning",
            *flags,
        ]

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, env=clean_env(), cwd=REPO, preexec_fn=limit
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.log.read_text()
        self.http = json.loads(line)["http"]

    def stop(self) -> None:
        terminate(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_trickling_crowd_from_one_address_leaves_others_served(tmp_path: Path) -> None:
    srv = LimitedServer(tmp_path, "--http-max-connections-per-client", "50", "--http-request-timeout-s", "60")
    host, port = _host_port(srv.http)
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def attack() -> None:  # 400 connections from 127.0.0.1, one header byte each every 0.5 s
        for _ in range(400):
            try:
                s = socket.create_connection((host, port), timeout=2)
            except OSError:
                continue
            s.setblocking(False)
            sockets.append(s)
        while not stop.wait(0.5):
            for s in list(sockets):
                try:
                    s.send(b"G")
                except OSError:
                    sockets.remove(s)
                    s.close()

    attacker = threading.Thread(target=attack, daemon=True)
    try:
        attacker.start()
        time.sleep(3)  # the crowd is connected and trickling
        # Normal requests from another loopback address are served meanwhile.
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=transport, timeout=15) as client:
            codes = [client.get(f"http://{srv.http}/healthz").status_code for _ in range(8)]
        assert codes == [200] * 8
    finally:
        stop.set()
        attacker.join(10)
        for s in sockets:
            s.close()
        srv.stop()
    log = srv.log.read_text(errors="replace")
    assert "Too many open files" not in log
    assert log.count("\n") < 10, log[-3000:]  # one line per change of state, not one per refusal
    assert log.count("HTTP connection limit reached for 127.0.0.1 (50 open") == 1, log


def test_metrics_listener_cuts_trickling_requests_and_caps_connections(tmp_path: Path) -> None:
    # The deadline: long enough for the four held connections to outlive the fifth's connect on a
    # loaded machine, short enough to cut the trickle.
    srv, thread = serve_in_thread(
        settings(
            tmp_path, http_request_deadline_s=6.0, http_request_timeout_s=30.0, metrics_max_connections=4
        )
    )
    address = srv.outputs.metrics_address
    held: list[socket.socket] = []
    try:
        # header lines that never end: 80 bytes over ~20 s, each within the per-byte timeout
        assert _trickle_until_closed(address, b"GET /metrics HTTP/1.1\r\n", b"X-Slow: 1\r\n", steps=80)
        while len(held) < 4:  # each holds a thread, trickling (once the trickle's thread has let go)
            s = socket.create_connection(_host_port(address), timeout=5)
            s.sendall(b"G")
            s.settimeout(0.3)
            try:
                answer = s.recv(64)
            except TimeoutError:  # taken, and waiting for the rest of its request
                held.append(s)
                continue
            assert answer.startswith(b"HTTP/1.1 503"), answer  # refused while the trickle's thread ended
            s.close()
            time.sleep(0.1)
        with socket.create_connection(_host_port(address), timeout=10) as extra:
            assert extra.recv(64).startswith(b"HTTP/1.1 503")  # the fifth is refused at once
        for s in held:
            s.close()
        for _ in range(50):  # their threads end as the server notices the closed sockets
            try:
                if httpx.get(f"http://{address}/metrics", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("/metrics did not serve again after the crowd left")
    finally:
        for s in held:
            s.close()
        srv.shutdown()
        thread.join(30)
