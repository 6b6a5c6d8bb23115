"""gRPC calls that never send their request message: refused on their metadata before a worker waits
for the body (no token), and cut after `grpc_receive_timeout_s` (a valid token), so that a handful of
them cannot hold every gRPC worker while a collector's export and a reader's list wait behind them.
TLS and tokens on, as an exposed server runs; the attack stays on loopback and is bounded in count."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pki_support import CA

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import bearer, settings, tokens_file
from tests.api.test_tls import _export_grpc

pytestmark = pytest.mark.slow

EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
LIST = "/hypocenter.v1.Attribution/ListDiagnoses"
HEALTH = "/grpc.health.v1.Health/Check"
STALLED = 12  # more than the 8 gRPC workers


@pytest.fixture()
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, bytes]]:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    ca = CA("hypocenter test CA")
    cert, key = ca.issue("hypocenter.test", server=True).write(tmp_path, "server")
    srv, thread = serve_in_thread(
        settings(
            tmp_path,
            auth_tokens_file=str(tokens_file(tmp_path)),
            tls_cert_file=str(cert),
            tls_key_file=str(key),
            grpc_workers=8,
            grpc_receive_timeout_s=2.0,
        )
    )
    yield srv, ca.pem
    srv.shutdown()
    thread.join(30)


def _channel(server: Server, ca: bytes) -> grpc.Channel:
    return grpc.secure_channel(server.grpc_address, grpc.ssl_channel_credentials(ca))


class Stall:
    """Calls whose request iterator never yields: the client sends headers, then nothing."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[Any] = []

    def messages(self) -> Iterator[bytes]:
        self.release.wait(120)
        return
        yield b""  # a generator that yields nothing until released

    def open(self, channel: grpc.Channel, method: str, n: int, metadata: Any = None) -> None:
        call = channel.stream_unary(method, request_serializer=None, response_deserializer=None)
        for _ in range(n):
            self.calls.append(call.future(self.messages(), metadata=metadata))

    def close(self) -> None:
        self.release.set()
        for c in self.calls:
            c.cancel()


def _serves_promptly(server: Server, ca: bytes) -> None:
    """A collector's export (the official OTel SDK exporter) and a reader's list both succeed."""
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    assert _export_grpc(server.grpc_address, ca, "ingest", timeout=20) == LogRecordExportResult.SUCCESS
    with _channel(server, ca) as ch:
        reply = pb_grpc.AttributionStub(ch).ListDiagnoses(
            pb.ListDiagnosesRequest(),
            metadata=(("authorization", bearer("read")["Authorization"]),),
            timeout=20,
        )
        assert isinstance(reply, pb.ListDiagnosesResponse)


def test_stalled_calls_without_a_token_are_refused_at_once(tls_server: tuple[Server, bytes]) -> None:
    server, ca = tls_server
    stall = Stall()
    attacker = _channel(server, ca)
    try:
        stall.open(attacker, EXPORT, STALLED // 2)
        stall.open(attacker, LIST, STALLED // 2)
        for call in stall.calls:  # each is answered on its metadata, without its message ever coming
            with pytest.raises(grpc.RpcError) as exc:
                call.result(timeout=20)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        _serves_promptly(server, ca)
    finally:
        stall.close()
        attacker.close()


def test_stalled_calls_with_a_token_or_none_needed_are_cut(tls_server: tuple[Server, bytes]) -> None:
    server, ca = tls_server
    stall = Stall()
    attacker = _channel(server, ca)
    try:
        stall.open(attacker, EXPORT, 6, metadata=(("authorization", bearer("ingest")["Authorization"]),))
        stall.open(attacker, HEALTH, 6)  # open to everyone: no token to check, the wait is still bounded
        _serves_promptly(server, ca)
        for call in stall.calls:  # grpc_receive_timeout_s: no message in 2 s ends the call
            with pytest.raises(grpc.RpcError) as exc:
                call.result(timeout=30)
            assert exc.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
    finally:
        stall.close()
        attacker.close()
