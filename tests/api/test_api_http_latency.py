"""The REST listener answers at loopback speed: every accepted HTTP connection has Nagle's algorithm
off (TCP_NODELAY) and each response leaves in one write, so no part of it waits for the client's
delayed ACK (~40 ms on Linux)."""

from __future__ import annotations

import socket
import time
from asyncio.selector_events import _SelectorSocketTransport
from pathlib import Path
from typing import Any

import pytest

from hypocenter.cli.assembly import serve_in_thread
from hypocenter.config import Settings


def _settings(tmp: Path) -> Settings:
    return Settings(
        grpc_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        metrics_listen="",
        store=str(tmp / "store.db"),
        log_level="warning",
    )


def _server_side_nodelay(tmp: Path) -> list[int]:
    srv, thread = serve_in_thread(_settings(tmp))
    try:
        host, port = srv.http_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n")
            assert client.recv(65536).startswith(b"HTTP/1.1 200")
            assert srv._http is not None
            deadline = time.monotonic() + 10
            while not srv._http.server_state.connections and time.monotonic() < deadline:
                time.sleep(0.01)
            return [
                conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                for conn in srv._http.server_state.connections
            ]
    finally:
        srv.shutdown()
        thread.join(30)


def test_accepted_http_connections_have_tcp_nodelay(tmp_path: Path) -> None:
    flags = _server_side_nodelay(tmp_path)
    assert flags and all(flags), f"TCP_NODELAY on the server's accepted sockets: {flags}"


def test_each_response_leaves_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head, body and end of a response go to the socket as one write: one segment, one wake-up of
    the client, nothing for Nagle or a delayed ACK to hold back."""
    writes: list[bytes] = []
    real = _SelectorSocketTransport.write

    def spy(self: _SelectorSocketTransport, data: Any) -> None:
        writes.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(_SelectorSocketTransport, "write", spy)
    srv, thread = serve_in_thread(_settings(tmp_path))
    try:
        host, port = srv.http_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            for path in ("/readyz", "/healthz", "/v1/diagnoses", "/no-such-page"):
                writes.clear()
                client.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
                got = b""
                while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < _length(got):
                    got += client.recv(65536)
                assert len(writes) == 1 and writes[0] == got, (path, [w[:40] for w in writes])
    finally:
        srv.shutdown()
        thread.join(30)


def _length(response: bytes) -> int:
    head = response.split(b"\r\n\r\n", 1)[0]
    return next(
        int(h.split(b":", 1)[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")
    )
