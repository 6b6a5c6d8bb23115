"""What leaves `hypocenter serve` besides its APIs: `/metrics`, and diagnoses pushed to Loki and Grafana.

    EXPORTERS            the registry: exporter name → builder from settings (None when not configured)
    Outputs(settings, store, service)
        .start()         /metrics listener; the outbox thread; wake the outbox on every new diagnosis
        .close()

The server builds one `Outputs` before analysis starts, so that the store knows which exporters
to queue each diagnosis for from the first one on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypocenter.config import Settings, secret
from hypocenter.exporter.grafana import GrafanaAnnotations
from hypocenter.exporter.loki import LokiExporter
from hypocenter.exporter.outbox import Backoff, Exporter, Outbox
from hypocenter.exporter.prometheus import HypocenterCollector, MetricsEndpoint
from hypocenter.server.leadership import OUTBOX
from hypocenter.server.service import Attribution
from hypocenter.store.base import DiagnosisRow, Store


def _loki(s: Settings) -> Exporter | None:
    if not s.loki_url:
        return None
    return LokiExporter(
        s.loki_url,
        encoding=s.loki_encoding,
        tenant=s.loki_tenant,
        basic_auth=secret(s, "loki_basic_auth"),
        timeout_s=s.export_timeout_s,
    )


def _grafana(s: Settings) -> Exporter | None:
    if not s.grafana_url:
        return None
    return GrafanaAnnotations(
        s.grafana_url,
        token=secret(s, "grafana_token"),
        dashboard_uid=s.grafana_dashboard_uid,
        timeout_s=s.export_timeout_s,
    )


EXPORTERS: dict[str, Callable[[Settings], Exporter | None]] = {"loki": _loki, "grafana": _grafana}


class Outputs:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        service: Attribution,
        *,
        exporters: list[Exporter] | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        built = [e for build in EXPORTERS.values() if (e := build(settings)) is not None]
        self.exporters: list[Exporter] = built if exporters is None else exporters
        store.exporters = tuple(e.name for e in self.exporters)
        for e in self.exporters:
            if isinstance(e, LokiExporter):  # the same cluster names as /metrics (exporter/cardinality.py)
                e.labels_limit = service.activity.labels
        self.outbox = (
            Outbox(
                store,
                self.exporters,
                service.activity,
                backoff=Backoff(max_s=settings.export_retry_max_s),
                max_age_s=settings.export_max_age_s,
                active=lambda: service.leadership.holds(OUTBOX),  # one replica delivers
            )
            if self.exporters
            else None
        )
        self.collector = HypocenterCollector(
            service.activity,
            store,
            exporters=store.exporters,
            window_s=settings.metrics_window_s,
            top=settings.metrics_top_n,
            ruleset=service.engine.ruleset.fingerprint,
            fleet=service.fleet,
            fleet_top=settings.fleet_top_k,
            cost=service.cost,
            stats=service.stats,
        )
        self.metrics = MetricsEndpoint(self.collector)
        self.metrics_address = ""
        self._unwatch: Callable[[], None] | None = None

    def start(self, **listener: Any) -> None:
        """`listener`: TLS and auth of /metrics (MetricsEndpoint.start's keywords), given by the server."""
        if self.settings.metrics_listen:
            self.metrics_address = self.metrics.start(self.settings.metrics_listen, **listener)
        if self.outbox is not None:
            outbox = self.outbox

            def wake(_row: DiagnosisRow) -> None:
                outbox.wake()

            self._unwatch = self.service.watch(wake)
            outbox.start()

    def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        if self.outbox is not None:
            self.outbox.close()
        self.metrics.stop()
