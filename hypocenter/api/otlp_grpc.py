"""The OTLP/gRPC receiver (:4317): LogsService/Export and MetricsService/Export.

Decodes and tags with collector/otlp.py, hands records to the service's ingest queue and answers
the way OTLP exporters expect: UNAVAILABLE with RetryInfo to retry, INVALID_ARGUMENT to drop.
"""

from __future__ import annotations

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from hypocenter import limits
from hypocenter.collector import otlp
from hypocenter.errors import InputError, TransientError
from hypocenter.server.service import Attribution, Backpressure

LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


class OTLPGrpc:
    """LogsService/Export and MetricsService/Export over the shared ingest queue."""

    def __init__(self, service: Attribution) -> None:
        self.service = service

    def _abort_unavailable(self, context: grpc.ServicerContext, message: str, delay: float) -> None:
        retry = error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=int(delay), nanos=int((delay - int(delay)) * 1e9))
        )
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
            tagged, warnings = otlp.receive_bounded(
                signal, raw, None, otlp.PROTOBUF_TYPES[0], self.service.settings.max_message_bytes
            )
            logs, points = (tagged.accepted, []) if signal == "logs" else ([], tagged.accepted)
            self.service.queue.submit(logs, points, tagged.blocks).result(timeout=self._commit_wait(context))
        except Backpressure as exc:
            self.service.activity.refused(signal, "otlp_grpc", "backpressure")
            self._abort_unavailable(context, str(exc), exc.retry_after)
            raise AssertionError("unreachable") from None  # abort raises
        except TimeoutError:
            self.service.activity.refused(signal, "otlp_grpc", "store_unavailable")
            self._abort_unavailable(
                context, "the store did not commit in time", self.service.settings.retry_after_s
            )
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
        self.service.activity.ingested(signal, "otlp_grpc", tagged.count, len(raw), tagged.rejected_by)
        return otlp.export_response(signal, tagged, warnings).SerializeToString()

    def handlers(self) -> list[grpc.GenericRpcHandler]:  # type: ignore[type-arg]
        def logs(raw: bytes, context: grpc.ServicerContext) -> bytes:
            return self._export("logs", raw, context)

        def metrics(raw: bytes, context: grpc.ServicerContext) -> bytes:
            return self._export("metrics", raw, context)

        return [
            grpc.method_handlers_generic_handler(
                LOGS_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(logs)}
            ),
            grpc.method_handlers_generic_handler(
                METRICS_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(metrics)}
            ),
        ]
