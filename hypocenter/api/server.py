"""`hypocenter serve`: OTLP/gRPC on :4317, OTLP/HTTP + REST on :4318, one store, one engine.

The gRPC port also serves `hypocenter.v1.Attribution` (api/attribution_grpc.py), gRPC health
checking (`grpc.health.v1.Health`: NOT_SERVING until both listeners are up, SERVING while ready,
NOT_SERVING again on shutdown) and server reflection (for grpcurl and friends).

The gRPC OTLP services take raw bytes and decode them here, so a malformed request is answered
INVALID_ARGUMENT with the reason (grpcio's own deserialisation would answer INTERNAL). A full
ingest queue is UNAVAILABLE with a `google.rpc.RetryInfo`, which OTLP exporters retry after the
given delay; a request over the size limit is RESOURCE_EXHAUSTED (not retried).

Prometheus `/metrics` listens on its own address (`metrics_listen`), and diagnoses go out to Loki
and Grafana through the store's outbox (exporter/outputs.py).

Binding: loopback unless configured. Port 0 binds any free port; the bound addresses are printed
as one JSON line on stdout (`{"grpc": "127.0.0.1:…", "http": "127.0.0.1:…", "metrics": "…"}`) once
they listen ("metrics" is empty when /metrics is off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import uvicorn
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from hypocenter import limits
from hypocenter.api.attribution_grpc import SERVICE_NAME, AttributionGrpc
from hypocenter.api.http import build_app
from hypocenter.api.logfmt import SafeFormatter
from hypocenter.api.service import Attribution, Backpressure
from hypocenter.api.v1 import attribution_pb2_grpc
from hypocenter.collector import otlp
from hypocenter.config import Settings, listen_address
from hypocenter.errors import InputError, TransientError
from hypocenter.exporter.outputs import Outputs
from hypocenter.exporter.store import Store, open_store

log = logging.getLogger("hypocenter.server")

LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


class OTLPGrpc:
    """LogsService/Export and MetricsService/Export over the shared ingest queue."""

    def __init__(self, service: Attribution) -> None:
        self.service = service

    def _abort_unavailable(self, context: grpc.ServicerContext, message: str, delay: float) -> None:
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=int(delay), nanos=int((delay - int(delay)) * 1e9)))
        detail = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message)
        detail.details.add().Pack(retry)
        context.abort_with_status(rpc_status.to_status(detail))

    @staticmethod
    def _commit_wait(context: grpc.ServicerContext) -> float:
        """How long to wait for the store: the client's deadline, within [5 s, 60 s]. A client that
        sends no deadline (rotel, grpcurl) gets a `time_remaining()` near 2**63 ns, which no wait takes."""
        remaining = context.time_remaining()
        return min(60.0, max(5.0, remaining if remaining is not None else 60.0))

    def _export(self, signal: str, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            tagged, warnings = otlp.receive_bounded(signal, raw, None, otlp.PROTOBUF_TYPES[0],
                                                    self.service.settings.max_message_bytes)
            logs, points = (tagged.accepted, []) if signal == "logs" else ([], tagged.accepted)
            self.service.queue.submit(logs, points).result(timeout=self._commit_wait(context))
        except Backpressure as exc:
            self.service.activity.refused(signal, "otlp_grpc", "backpressure")
            self._abort_unavailable(context, str(exc), exc.retry_after)
            raise AssertionError("unreachable") from None  # abort raises
        except TimeoutError:
            self.service.activity.refused(signal, "otlp_grpc", "store_unavailable")
            self._abort_unavailable(context, "the store did not commit in time", self.service.settings.retry_after_s)
            raise AssertionError("unreachable") from None
        except TransientError as exc:
            self.service.activity.refused(signal, "otlp_grpc", "store_unavailable")
            self._abort_unavailable(context, str(exc), self.service.settings.retry_after_s)
            raise AssertionError("unreachable") from None
        except (otlp.MessageTooLarge, limits.LimitExceeded) as exc:
            self.service.activity.refused(signal, "otlp_grpc", "too_large")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except InputError as exc:
            self.service.activity.refused(signal, "otlp_grpc", "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.service.activity.ingested(signal, "otlp_grpc", len(tagged.accepted), len(raw), tagged.rejected_by)
        return otlp.export_response(signal, tagged, warnings).SerializeToString()

    def handlers(self) -> list[grpc.GenericRpcHandler]:  # type: ignore[type-arg]
        def logs(raw: bytes, context: grpc.ServicerContext) -> bytes:
            return self._export("logs", raw, context)

        def metrics(raw: bytes, context: grpc.ServicerContext) -> bytes:
            return self._export("metrics", raw, context)

        return [
            grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(logs)}),
            grpc.method_handlers_generic_handler(METRICS_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(metrics)}),
        ]


class Server:
    """The running server: build with settings, `start()` the gRPC side, `serve()` the HTTP side."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        limits.configure(limits.Limits.from_settings(settings))
        self.store = store if store is not None else open_store(settings.store, synchronous=settings.store_synchronous)
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
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self._health_services():
            self.health.set(name, status)

    def start_grpc(self) -> None:
        limit = self.settings.max_message_bytes
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.settings.grpc_workers, thread_name_prefix="hypocenter-grpc"),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", 4 << 20)],
        )
        server.add_generic_rpc_handlers(OTLPGrpc(self.service).handlers())
        attribution_pb2_grpc.add_AttributionServicer_to_server(
            AttributionGrpc(self.service, max_watchers=self.settings.grpc_workers // 2), server)
        self.health = health.HealthServicer()
        self._set_health(False)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, LOGS_SERVICE, METRICS_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        host, port = listen_address(self.settings.grpc_listen, "grpc_listen")
        bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if bound == 0:
            raise InputError(f"cannot listen on {self.settings.grpc_listen} (gRPC): address in use or not local")
        server.start()
        self.grpc_server = server
        self.grpc_address = f"{host}:{bound}"

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
        app = build_app(self.service, ready=self._ready.is_set)
        config = uvicorn.Config(app, log_level=self.settings.log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5)
        self._http = uvicorn.Server(config)
        self.service.start()
        self.outputs.start()
        task = asyncio.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started and not task.done():
            await asyncio.sleep(0.01)
        self._ready.set()
        self._set_health(True)
        if announce:
            sys.stdout.write(json.dumps({"grpc": self.grpc_address, "http": self.http_address,
                                         "metrics": self.outputs.metrics_address}) + "\n")
            sys.stdout.flush()
        await task

    def shutdown(self) -> None:
        if self._http is not None:
            self._http.should_exit = True

    def close(self) -> None:
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=2.0).wait(5.0)
        self.service.close()
        self.outputs.close()
        self.store.close()


def run(settings: Settings) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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

