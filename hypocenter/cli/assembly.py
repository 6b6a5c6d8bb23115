"""`hypocenter serve`'s composition root: OTLP/gRPC on :4317, OTLP/HTTP + REST on :4318, one store,
one engine. It builds the store, the service (server/) and the listeners (api/) and wires them, so
that the service never knows its listeners.

The gRPC port also serves `hypocenter.v1.Attribution` (api/attribution_grpc.py), gRPC health
checking (`grpc.health.v1.Health`: NOT_SERVING until both listeners are up, SERVING while ready,
NOT_SERVING again on shutdown) and server reflection (for grpcurl and friends).

The gRPC OTLP services take raw bytes and decode them here, so a malformed request is answered
INVALID_ARGUMENT with the reason (grpcio's own deserialisation would answer INTERNAL). A full
ingest queue is UNAVAILABLE with a `google.rpc.RetryInfo`, which OTLP exporters retry after the
given delay; a request over the size limit is RESOURCE_EXHAUSTED (not retried).

Prometheus `/metrics` listens on its own address (`metrics_listen`), and diagnoses go out to Loki
and Grafana through the store's outbox (server/outputs.py).

Binding: loopback unless configured. Port 0 binds any free port; the bound addresses are printed
as one JSON line on stdout (`{"grpc": "127.0.0.1:…", "http": "127.0.0.1:…", "metrics": "…"}`) once
they listen ("metrics" is empty when /metrics is off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hypocenter import limits
from hypocenter.api import auth, tls
from hypocenter.api.attribution_grpc import SERVICE_NAME, AttributionGrpc
from hypocenter.api.http import build_app
from hypocenter.api.listener_limits import ConnectionCap
from hypocenter.api.otlp_grpc import LOGS_SERVICE, METRICS_SERVICE, OTLPGrpc
from hypocenter.api.v1 import attribution_pb2_grpc
from hypocenter.config import Settings, listen_address, redact_text
from hypocenter.errors import InputError, TransientError
from hypocenter.server.logfmt import SafeFormatter
from hypocenter.server.outputs import Outputs
from hypocenter.server.service import Attribution
from hypocenter.store import open_store
from hypocenter.store.base import Store

log = logging.getLogger("hypocenter.server")


class Server:
    """The running server: build with settings, `start()` the gRPC side, `serve()` the HTTP side."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        # Who may connect is settled before anything listens or opens (a refusal is one line, exit 2).
        self.auth = auth.Authenticator.from_settings(settings)
        auth.check_exposure(settings, self.auth)
        self.tls = tls.CertificateReloader(settings) if tls.tls_enabled(settings) else None
        self.peers = tls.PeerNames()
        limits.configure(limits.Limits.from_settings(settings))
        if store is None:  # a start that is going to fail on a taken port leaves no store file behind
            self._probe_listeners()
        self.store = (
            store if store is not None else open_store(settings.store, synchronous=settings.store_synchronous)
        )
        self.service = Attribution(settings, self.store)
        self.outputs = Outputs(settings, self.store, self.service)  # /metrics; the Loki / Grafana outbox
        self.grpc_server: grpc.Server | None = None
        self.grpc_address = ""
        self.http_address = ""
        self._http: uvicorn.Server | None = None
        self._ready = threading.Event()
        self.health: Any = None

    def _health_services(self) -> tuple[str, ...]:
        return ("", SERVICE_NAME, LOGS_SERVICE, METRICS_SERVICE)

    def _set_health(self, serving: bool) -> None:
        if self.health is None:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._health_services():
            self.health.set(name, status)

    def start_grpc(self) -> None:
        limit = self.settings.max_message_bytes
        s = self.settings
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 4 << 20),
            # Each stream of a connection buffers up to a flow-control window of its message (docs/security.md).
            ("grpc.max_concurrent_streams", s.grpc_max_streams_per_connection),
            # Idle and dead clients give their connection back (docs/security.md, "Timeouts").
            ("grpc.keepalive_time_ms", int(s.grpc_keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(s.grpc_keepalive_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(s.grpc_max_connection_idle_s * 1000)),
            # a client that connects and never completes the TLS / HTTP/2 handshake (a slowloris)
            ("grpc.server_handshake_timeout_ms", int(s.http_request_timeout_s * 1000)),
            # so_reuseport off: gRPC's default lets a second server bind a taken port, and collectors'
            # batches would then be split silently between two servers.
            ("grpc.so_reuseport", 0),
        ]
        if s.grpc_max_connection_age_s > 0:
            options += [
                ("grpc.max_connection_age_ms", int(s.grpc_max_connection_age_s * 1000)),
                ("grpc.max_connection_age_grace_ms", 30_000),
            ]
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.settings.grpc_workers, thread_name_prefix="hypocenter-grpc"),
            options=options,
            interceptors=[auth.GrpcAuth(self.auth, receive_timeout_s=s.grpc_receive_timeout_s)],
            maximum_concurrent_rpcs=s.grpc_max_concurrent_rpcs or None,
        )
        server.add_generic_rpc_handlers(OTLPGrpc(self.service).handlers())
        attribution_pb2_grpc.add_AttributionServicer_to_server(
            AttributionGrpc(
                self.service,
                max_watchers=self.settings.grpc_workers // 2,
                max_per_client=self.settings.watch_max_per_client,
            ),
            server,
        )
        self.health = health.HealthServicer()
        self._set_health(False)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, LOGS_SERVICE, METRICS_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server,
        )
        host, port = listen_address(self.settings.grpc_listen, "grpc_listen")
        if port:  # a taken port is refused here in one line, before gRPC's core logs its own error
            self._probe(host, port, self.settings.grpc_listen, "gRPC")
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = (
                server.add_secure_port(address, self.tls.grpc_credentials())
                if self.tls is not None
                else server.add_insecure_port(address)
            )
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise InputError(
                f"cannot listen on {self.settings.grpc_listen} (gRPC): address in use or not local"
            )
        server.start()
        self.grpc_server = server
        self.grpc_address = f"{host}:{bound}"

    def _probe_listeners(self) -> None:
        for setting, value, what in (
            ("grpc_listen", self.settings.grpc_listen, "gRPC"),
            ("http_listen", self.settings.http_listen, "HTTP"),
        ):
            host, port = listen_address(value, setting)
            if port:
                self._probe(host, port, value, what)

    @staticmethod
    def _probe(host: str, port: int, setting: str, what: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise InputError(f"cannot listen on {setting} ({what}): {exc.strerror}") from None

    def _http_socket(self) -> socket.socket:
        host, port = listen_address(self.settings.http_listen, "http_listen")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise InputError(f"cannot listen on {self.settings.http_listen} (HTTP): {exc.strerror}") from None
        sock.listen(512)
        self.http_address = f"{host}:{sock.getsockname()[1]}"
        return sock

    async def serve(self, announce: bool = True) -> None:
        sock = self._http_socket()
        app = build_app(self.service, ready=self._ready.is_set, authenticator=self.auth, peers=self.peers)
        bound = _connection_bound(self.settings.http_max_connections)
        config = uvicorn.Config(
            app,
            # asyncio accepts up to `backlog` connections at once before any can be refused: keep the
            # burst small beside the bound, so that refusing never runs the process out of files.
            backlog=max(16, min(2048, bound // 4)),
            log_level=self.settings.log_level,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=int(max(1, self.settings.http_keep_alive_s)),
            http=tls.http_protocol(
                self.settings.http_request_timeout_s,
                self.peers,
                request_deadline_s=self.settings.http_request_deadline_s,
                cap=ConnectionCap(
                    bound,
                    self.settings.http_max_connections_per_client,
                ),
            ),
        )
        config.load()
        if self.tls is not None:
            config.ssl = self.tls.ssl_context()
            self.tls.start()
        self._http = uvicorn.Server(config)
        self.service.start()
        self.outputs.start(**self._metrics_listener())
        task = asyncio.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started and not task.done():
            await asyncio.sleep(0.01)
        self._ready.set()
        self._set_health(True)
        if announce:
            sys.stdout.write(
                json.dumps(
                    {
                        "grpc": self.grpc_address,
                        "http": self.http_address,
                        "metrics": self.outputs.metrics_address,
                    }
                )
                + "\n"
            )
            sys.stdout.flush()
        await task

    def _metrics_listener(self) -> dict[str, Any]:
        authenticator = self.auth
        wrap = None
        exposed = bool(self.settings.metrics_listen) and not auth.is_loopback(
            self.settings.metrics_listen, "metrics_listen"
        )
        if authenticator.enabled and (self.settings.metrics_auth or exposed):

            def check(authorization: str | None, peer_cn: str | None) -> int | None:
                try:
                    authenticator.authorize(authorization, peer_cn, "read")
                except auth.Unauthenticated:
                    return 401
                except auth.Forbidden:
                    return 403
                return None

            def wrap(app: Any) -> Any:
                return tls.guard_wsgi(app, check)

        return {
            "ssl_context": self.tls.ssl_context() if self.tls is not None else None,
            "wrap": wrap,
            "timeout_s": self.settings.http_request_timeout_s,
            "deadline_s": self.settings.http_request_deadline_s,
            "max_connections": self.settings.metrics_max_connections,
        }

    def shutdown(self) -> None:
        if self._http is not None:
            self._http.should_exit = True

    def close(self) -> None:
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=2.0).wait(5.0)
        if self.tls is not None:
            self.tls.close()
        self.service.close()
        self.outputs.close()
        self.store.close()


def _connection_bound(wanted: int) -> int:
    """`http_max_connections`, kept to half the open-file limit (raised to its hard limit first, as
    servers do): past that, accept() fails with EMFILE, and gRPC, the store and the log need files too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):  # not allowed here: keep the soft limit
            pass
    if soft == resource.RLIM_INFINITY or wanted <= soft // 2:
        return wanted
    bound = max(1, soft // 2)
    log.warning(
        "http_max_connections=%d is more than half the open-file limit (%d): using %d", wanted, soft, bound
    )
    return bound


class RedactingFormatter(SafeFormatter):
    """Log lines with control characters escaped (SafeFormatter: a client value cannot forge a line) and
    credentials in URLs hidden (an exporter's error quotes the URL it failed on)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def run(settings: Settings) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler])
    server = Server(settings)
    # SIGTERM stops the server like Ctrl-C, and the store is closed: uvicorn hands a SIGTERM it caught
    # back to the handler that was installed before it, which by default ends the process at once.
    signal.signal(signal.SIGTERM, lambda signum, frame: server.shutdown())
    try:
        server.start_grpc()
        asyncio.run(server.serve())
    finally:
        server.close()
    return 0


def serve_in_thread(settings: Settings, store: Store | None = None) -> tuple[Server, threading.Thread]:
    """Start a server in this process (tests, embedding); stop it with `server.shutdown()` and join."""
    server = Server(settings, store)
    server.start_grpc()

    def target() -> None:
        try:
            asyncio.run(server.serve(announce=False))
        finally:
            server.close()

    thread = threading.Thread(target=target, name="hypocenter-serve", daemon=True)
    thread.start()
    if not server._ready.wait(30.0):
        raise TransientError("the server did not start within 30 s")
    return server, thread
