"""TLS on every listener, with certificates reloaded when their files change.

    CertificateReloader   watches tls_cert_file / tls_key_file (every tls_reload_s) and swaps the new
                          pair into every live SSLContext (uvicorn's, /metrics') and into gRPC's
                          dynamic credentials (asked at each handshake); a half-written or mismatched
                          pair is logged and the old one kept serving.
    http_protocol(...)    uvicorn's h11 protocol with TCP_NODELAY and one write per response (no
                          delayed-ACK wait, one segment), a request timeout (a client that sends no
                          headers, or stalls mid-body, is disconnected), a request deadline (one
                          that trickles in is too), the connection cap of api/listener_limits.py
                          and, over mTLS, the peer certificate's CN kept for the auth guard
                          (`PeerNames`).

Client certificates (`tls_client_ca_file`): HTTP and /metrics ask for one and verify it if given
(CERT_OPTIONAL: token clients still connect); gRPC's Python server can only require one or not ask,
so with a client CA the gRPC port requires a verified certificate (docs/security.md).

Nothing here decides who may do what: api/auth.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import grpc
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hypocenter.api.listener_limits import BUSY_RESPONSE, ConnectionCap
from hypocenter.config import Settings
from hypocenter.errors import InputError

log = logging.getLogger("hypocenter.server")


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{setting}: {path}: {exc.strerror}") from None


def tls_enabled(settings: Settings) -> bool:
    if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
        raise InputError("tls_cert_file and tls_key_file go together: give both, or neither")
    if settings.tls_client_ca_file and not settings.tls_cert_file:
        raise InputError(
            "tls_client_ca_file needs tls_cert_file and tls_key_file (client certificates ride on TLS)"
        )
    return bool(settings.tls_cert_file)


class CertificateReloader:
    """The current certificate pair, reloaded into every registered listener when the files change."""

    def __init__(self, settings: Settings) -> None:
        self.cert_file = settings.tls_cert_file
        self.key_file = settings.tls_key_file
        self.client_ca_file = settings.tls_client_ca_file
        self.interval = settings.tls_reload_s
        self.client_ca = _read(self.client_ca_file, "tls_client_ca_file") if self.client_ca_file else None
        self._lock = threading.Lock()
        self._contexts: list[ssl.SSLContext] = []
        self._stamp = self._mtimes()
        self.cert, self.key = _read(self.cert_file, "tls_cert_file"), _read(self.key_file, "tls_key_file")
        self.version = 0
        self.ssl_context()  # a bad pair is refused at start, in one line
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _mtimes(self) -> tuple[float, ...]:
        out: list[float] = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
                out += [st.st_mtime, float(st.st_size), float(st.st_ino)]
            except OSError:
                out += [-1.0, -1.0, -1.0]
        return tuple(out)

    # -------------------------------------------------------------------------------- Python ssl

    def ssl_context(self) -> ssl.SSLContext:
        """A server SSLContext for uvicorn or /metrics, kept up to date by `reload`."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(
                f"tls_cert_file/tls_key_file: cannot load {self.cert_file} with {self.key_file}: {exc}"
            ) from None
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise InputError(f"tls_client_ca_file: {self.client_ca_file}: {exc}") from None
            ctx.verify_mode = ssl.CERT_OPTIONAL
        with self._lock:
            self._contexts.append(ctx)
        return ctx

    # -------------------------------------------------------------------------------- gRPC

    def _grpc_config(self) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(self.key, self.cert)], root_certificates=self.client_ca
        )

    def grpc_credentials(self) -> grpc.ServerCredentials:
        served = [self.version]

        def fetch() -> Any:  # called by gRPC at every handshake: cheap unless the pair changed
            with self._lock:
                if served[0] == self.version:
                    return None
                served[0] = self.version
                return self._grpc_config()

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(), fetch, require_client_authentication=self.client_ca is not None
        )

    # -------------------------------------------------------------------------------- reloading

    def reload(self) -> bool:
        """Load the files again if they changed; True when a new pair is now served."""
        stamp = self._mtimes()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            cert, key = Path(self.cert_file).read_bytes(), Path(self.key_file).read_bytes()
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            probe.load_cert_chain(self.cert_file, self.key_file)  # the pair must match before it is served
            changing = (Path(self.cert_file).read_bytes(), Path(self.key_file).read_bytes()) != (cert, key)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS certificate reload failed, still serving the previous one: %s", exc)
            return False
        if changing:  # caught between the key's write and the certificate's: read both again next time
            self._stamp = ()
            return False
        with self._lock:
            for ctx in self._contexts:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            self.cert, self.key = cert, key
            self.version += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self.reload()
                except Exception:  # a reload problem must never stop serving the old certificate
                    log.exception("TLS certificate reload")

        self._thread = threading.Thread(target=loop, name="hypocenter-tls-reload", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate as `SSLSocket.getpeercert()` gives it."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class PeerNames:
    """Verified client-certificate CNs of the open HTTP connections, by client (host, port)."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], str] = {}

    def get(self, client: Any) -> str | None:
        if not client:
            return None
        return self._names.get((str(client[0]), int(client[1])))

    def set(self, client: tuple[str, int], name: str) -> None:
        self._names[client] = name

    def discard(self, client: tuple[str, int] | None) -> None:
        if client is not None:
            self._names.pop(client, None)


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on an accepted TCP connection. uvicorn writes a response's head and
    body separately; with Nagle on, the body waits for the ACK of the head, which the client delays
    (~40 ms on Linux). asyncio sets TCP_NODELAY itself only on sockets whose `proto` is IPPROTO_TCP,
    which a listener made with `socket.socket(family, SOCK_STREAM)` (proto 0) does not pass on."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):  # the peer may already be gone
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class OneWrite:
    """An accepted connection's transport whose writes of one event-loop step leave as one write:
    uvicorn writes a response's head, body and end separately, and each write of a TCP_NODELAY
    socket is a segment of its own (and a wake-up of the client). Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol(
    request_timeout_s: float,
    peers: PeerNames,
    *,
    request_deadline_s: float | None = None,
    cap: ConnectionCap | None = None,
) -> type[H11Protocol]:
    """uvicorn's h11 protocol that drops clients stalling a request, and records peer certificate CNs.

    Two clocks run while the server waits for a client's request: `request_timeout_s` restarts at every
    byte (a client gone silent), `request_deadline_s` does not (a client trickling a byte at a time):
    a request's headers and body must arrive within it, counted from its first byte (or from the
    connection, for the first request). `cap` bounds the open connections (api/listener_limits.py)."""

    class GuardedH11Protocol(H11Protocol):
        _stall: asyncio.TimerHandle | None = None
        _deadline: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            no_delay(transport)
            super().connection_made(transport)
            if cap is not None:
                client = self.client[0] if self.client else ""
                if not cap.admit(client):
                    transport.write(BUSY_RESPONSE)
                    transport.close()
                    return
                self._counted = client
            self.transport = cast(asyncio.Transport, OneWrite(transport, self.loop))
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None and self.client is not None:
                name = common_name(ssl_object.getpeercert())
                if name is not None:
                    peers.set(self.client, name)
            self._arm()
            self._arm_deadline()

        def data_received(self, data: bytes) -> None:
            self._arm()
            if self._deadline is None:  # the first byte of the next request on a kept-alive connection
                self._arm_deadline()
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY) and self._deadline is not None:
                self._deadline.cancel()  # all of it arrived: the server's turn, not the client's
                self._deadline = None

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._stall, self._deadline):
                if timer is not None:
                    timer.cancel()
            if cap is not None and self._counted is not None:
                cap.release(self._counted)
                self._counted = None
            peers.discard(self.client)
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._stall is not None:
                self._stall.cancel()
            self._stall = self.loop.call_later(request_timeout_s, self._expire)

        def _arm_deadline(self) -> None:
            if request_deadline_s is not None:
                self._deadline = self.loop.call_later(request_deadline_s, self._expire_deadline)

        def _waiting_for_client(self) -> bool:
            # No request yet (or a partial one), or a body part that does not come; not when the app
            # has stopped reading (it is working) or the client reads a long response.
            return self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.flow.read_paused

        def _expire(self) -> None:
            if self.transport.is_closing():
                return
            if not self._waiting_for_client():
                self._arm()
                return
            self.transport.close()

        def _expire_deadline(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and self.flow.read_paused:
                self._deadline = self.loop.call_later(
                    1.0, self._expire_deadline
                )  # the app's turn: look again
                return
            if self._waiting_for_client():
                self.transport.close()

    return GuardedH11Protocol


def guard_wsgi(
    app: Callable[..., Any], check: Callable[[str | None, str | None], int | None]
) -> Callable[..., Any]:
    """A WSGI app answering 401/403 when `check(authorization, peer_cn)` says so (for /metrics)."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        status = check(environ.get("HTTP_AUTHORIZATION"), common_name(environ.get("hypocenter.peercert")))
        if status is None:
            return app(environ, start_response)
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if status == 401:
            headers.append(("WWW-Authenticate", 'Bearer realm="hypocenter"'))
        start_response("401 Unauthorized" if status == 401 else "403 Forbidden", headers)
        return [b"authentication required\n" if status == 401 else b"this needs the read role\n"]

    return guarded
