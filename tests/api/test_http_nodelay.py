"""The REST listener answers at loopback speed: every accepted HTTP connection has Nagle's algorithm
off (TCP_NODELAY), so a response written as head then body is not held back until the client's
delayed ACK (~40 ms on Linux) — over plain TCP and over TLS alike."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from hypocenter.cli.assembly import serve_in_thread
from hypocenter.config import Settings


def _server_side_nodelay(tmp: Path) -> list[int]:
    settings = Settings(
        grpc_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        metrics_listen="",
        store=str(tmp / "store.db"),
        log_level="warning",
    )
    srv, thread = serve_in_thread(settings)
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
