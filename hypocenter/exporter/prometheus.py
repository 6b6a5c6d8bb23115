"""Prometheus `/metrics` on its own port: diagnoses, culprits, ingest, drops, latency, exports.

One custom collector on a private `CollectorRegistry` computes every family on each scrape from
current state: the process' tallies (`Activity`) and the store. Nothing is registered globally,
so two servers in one process (tests, embedding) never share series.

Families (all prefixed `hypocenter_`; no label is named `job` or `instance`, which Prometheus
reserves for the target; `cluster` is the workload's cluster, at most `label_max_values` distinct
ones, the rest "other"):

    diagnoses_total{cluster,outcome,domain,subdomain}       counter  final diagnoses this process made, every
                                                                     verdict of every cluster seen from 0 (a
                                                                     re-analysis reaching the same verdict is
                                                                     not counted again); exemplar: the latest
                                                                     diagnosis_id
    provisional_diagnoses_total                             counter  analyses of attempts not yet ended
    label_values_folded_total{label}                        counter  diagnoses exported under cluster="other": more
                                                                     than label_max_values clusters (cardinality.py)
    analysis_duration_seconds                               histogram  store read + engine; exemplars
    analysis_failures_total{reason}                         counter  attempts quarantined: analysis hit a bound
                                                                     (limit), raised (error), or the process died
                                                                     in it twice (interrupted); server/quarantine.py
    symptom_events_total{kind}                              counter  events diagnoses classed as symptoms
    extracted_events_total{kind}                            counter  events extracted from records as they arrived
    compacted_lines_total, compacted_bytes_total            counter  raw lines blanked by compaction, and their bytes
    ingest_records_total / ingest_bytes_total{signal,source}  counter  committed OTLP records / wire bytes
    refused_requests_total{signal,source,reason}            counter  requests refused whole
    rejected_records_total{signal,reason}                   counter  records left out of accepted requests
    attempts_open                                           gauge    attempts awaiting a verdict (store: the counts /readyz
                                                                     shows, as of the last ask; store/stats.py)
    recent_diagnoses{cluster,outcome,domain,subdomain}      gauge    final diagnoses stored in the window (store)
    recent_node_root_causes{cluster,node}                   gauge    of those, naming the node as (candidate)
                                                                     root cause: top N nodes, the rest in node="other"
    recent_component_root_causes{cluster,node,component_kind,component}
                                                            gauge    the same per GPU / port, top N + "other"
    recent_window_seconds                                   gauge    the window of the recent_* families
    export_pending{exporter}, export_oldest_pending_age_seconds{exporter}   gauge  the outbox (store)
    exported_diagnoses_total / export_failures_total{exporter,kind} / export_dropped_total{exporter,reason}
    fleet_suspect_score{kind,suspect}, fleet_suspect_workloads{kind,suspect}, fleet_finding{kind,suspect}
                                                            gauge    fleet memory (engine/fleet.py): the top
                                                                     fleet_top_k suspects (node, gpu, port,
                                                                     switch_port, switch, cable) (store)
    gpu_hours_lost_total{cluster,domain,subdomain}          counter  GPU-hours the failures this process diagnosed
                                                                     cost, and the restart overhead of their next
                                                                     attempts (engine/cost.py, docs/cost.md)
    cost_gpu_hours_lost{domain,subdomain}, cost_component_gpu_hours_lost{kind,component},
    cost_time_to_detect_seconds{domain,subdomain}, cost_mttf_seconds{domain},
    cost_workload_ettr{cluster,workload}, cost_window_seconds
                                                            gauge    the cost roll-up of cost_window_s
                                                                     (engine/fleet_cost.py), = GET /v1/fleet/cost (store)
    store_up                                                gauge    1 when the store answered this scrape
    build_info{version,ruleset}, start_time_seconds

The `recent_*` gauges come from the shared store, so every replica reports the same values:
aggregate them with `max without (instance, pod)`, never `sum` (deploy/prometheus/ does).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from hypocenter import __version__
from hypocenter.config import listen_address
from hypocenter.engine.fleet import FleetView, findings
from hypocenter.engine.fleet_cost import CostView
from hypocenter.errors import InputError
from hypocenter.exporter.activity import LATENCY_BUCKETS, Activity
from hypocenter.exporter.activity import Exemplar as Last
from hypocenter.exporter.cardinality import bounded
from hypocenter.model import TAXONOMY
from hypocenter.store.base import DiagnosisFacts, Store
from hypocenter.store.stats import StatsCache

log = logging.getLogger("hypocenter.metrics")

OTHER = "other"


def _exemplar(last: Last | None) -> Exemplar | None:
    if last is None:
        return None
    return Exemplar({"diagnosis_id": last.diagnosis_id}, last.value, last.time)


def top_n(counts: Tally[tuple[str, ...]], n: int) -> list[tuple[tuple[str, ...], int]]:
    """The `n` largest series, then one `other` series per cluster (the first key part) for the rest.

    Ties break by name so that the same state always exposes the same series."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = ranked[:n]
    rest: Tally[str] = Tally()
    for key, value in ranked[n:]:
        rest[key[0]] += value
    width = len(ranked[0][0]) if ranked else 0
    other = [((cluster, *([OTHER] * (width - 1))), value) for cluster, value in sorted(rest.items())]
    return kept + other


VERDICTS: tuple[tuple[str, str, str], ...] = (
    ("ambiguous", "", ""),
    ("unattributed", "", ""),
    ("not_failed", "", ""),
    *(("attributed", domain, sub) for domain, subs in sorted(TAXONOMY.items()) for sub in subs),
)
"""(outcome, domain, subdomain) of hypocenter_diagnoses_total that exist from the start, at 0."""


class HypocenterCollector(Collector):
    """Builds every family from the tallies and the store at scrape time."""

    def __init__(
        self,
        activity: Activity,
        store: Store,
        *,
        exporters: Sequence[str] = (),
        window_s: float = 86400.0,
        top: int = 20,
        ruleset: str = "",
        fleet: FleetView | None = None,
        fleet_top: int = 20,
        cost: CostView | None = None,
        stats: StatsCache | None = None,
    ) -> None:
        self.activity = activity
        self.store = store
        self.stats = stats or StatsCache(store)  # the snapshot /readyz shows, when the server shares it
        self.exporters = tuple(exporters)
        self.window_s = window_s
        self.top = top
        self.ruleset = ruleset
        self.fleet = fleet
        self.fleet_top = fleet_top
        self.cost = cost
        self._clusters: set[str] = {""}  # clusters with diagnoses: their verdict series start at 0

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._process()
        yield from self._from_store()

    # ------------------------------------------------------------------------------- process tallies

    def _process(self) -> Iterator[Metric]:
        snap = self.activity.snapshot()
        info = InfoMetricFamily(
            "hypocenter_build", "hypocenter version and the fingerprint of its loaded ruleset"
        )
        info.add_metric([], {"version": __version__, "ruleset": self.ruleset})
        yield info
        yield GaugeMetricFamily(
            "hypocenter_start_time_seconds", "When this process started (Unix time)", value=snap.started
        )

        d = CounterMetricFamily(
            "hypocenter_diagnoses",
            "Final diagnoses made by this process",
            labels=["cluster", "outcome", "domain", "subdomain"],
        )
        # Every verdict of every cluster seen starts at 0, so that increase() and rate() count a
        # series' first diagnosis too (a counter that appears at 1 loses it).
        clusters = self._clusters | {k[0] for k in snap.diagnoses}
        zero = {(c, *v): (0, None) for c in clusters for v in VERDICTS}
        for verdict, (value, last) in sorted({**zero, **snap.diagnoses}.items()):
            d.add_metric(list(verdict), value, exemplar=_exemplar(last))
        yield d
        lost = CounterMetricFamily(
            "hypocenter_gpu_hours_lost",
            "GPU-hours the failures this process diagnosed cost (lost work, time to detect, and the "
            "restart overhead of the next attempt when it was diagnosed here too), by cause",
            labels=["cluster", "domain", "subdomain"],
        )
        for key3, hours in sorted(snap.gpu_hours_lost.items()):
            lost.add_metric(list(key3), round(hours, 4))
        yield lost
        folded = CounterMetricFamily(
            "hypocenter_label_values_folded",
            'Diagnoses whose client-supplied label value was exported as "other" because '
            "label_max_values distinct values of that label were already exported",
            labels=["label"],
        )
        for label, n in sorted({"cluster": 0, **self.activity.labels.folded()}.items()):
            folded.add_metric([label], n)
        yield folded
        yield CounterMetricFamily(
            "hypocenter_provisional_diagnoses",
            "Analyses of attempts that had not ended (idle timeout), counted apart",
            value=snap.provisional,
        )
        failed = CounterMetricFamily(
            "hypocenter_analysis_failures",
            "Attempts quarantined because their analysis failed, by reason",
            labels=["reason"],
        )
        for kind in ("limit", "error", "interrupted"):  # server/quarantine.py FAILURE_KINDS
            failed.add_metric([kind], snap.analysis_failures.get(kind, 0))
        yield failed

        h = HistogramMetricFamily(
            "hypocenter_analysis_duration_seconds",
            "Time to analyse an attempt: read its records from the store, extract, decide",
            labels=[],
        )
        totals = list(accumulate(snap.latency.counts))
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        for i, bound in enumerate([*(str(b) for b in LATENCY_BUCKETS), "+Inf"]):
            ex = _exemplar(snap.latency.exemplars[i])
            buckets.append((bound, float(totals[i]), ex) if ex is not None else (bound, float(totals[i])))
        h.add_metric([], buckets, snap.latency.total)
        yield h

        s = CounterMetricFamily(
            "hypocenter_symptom_events",
            "Events that final diagnoses classed as symptoms, by kind",
            labels=["kind"],
        )
        for kind, value in sorted(snap.symptom_events.items()):
            s.add_metric([kind], value)
        yield s

        e = CounterMetricFamily(
            "hypocenter_extracted_events",
            "Events extracted from log records as they were committed, by kind",
            labels=["kind"],
        )
        for kind, value in sorted(snap.extracted_events.items()):
            e.add_metric([kind], value)
        yield e
        yield CounterMetricFamily(
            "hypocenter_compacted_lines",
            "Raw log lines whose text compaction blanked (no rule can read them)",
            value=snap.compacted_lines,
        )
        yield CounterMetricFamily(
            "hypocenter_compacted_bytes",
            "Bytes of raw log text compaction blanked",
            value=snap.compacted_bytes,
            unit="bytes",
        )

        rec = CounterMetricFamily(
            "hypocenter_ingest_records", "Records committed to the store", labels=["signal", "source"]
        )
        byt = CounterMetricFamily(
            "hypocenter_ingest_bytes",
            "Request bytes received (as sent, before decompression)",
            labels=["signal", "source"],
            unit="bytes",
        )
        for pair, value in sorted(snap.ingested_records.items()):
            rec.add_metric(list(pair), value)
        for pair, value in sorted(snap.ingested_bytes.items()):
            byt.add_metric(list(pair), value)
        yield rec
        yield byt
        ref = CounterMetricFamily(
            "hypocenter_refused_requests",
            "Requests refused whole, by reason",
            labels=["signal", "source", "reason"],
        )
        for key3, value in sorted(snap.refused_requests.items()):
            ref.add_metric(list(key3), value)
        yield ref
        rej = CounterMetricFamily(
            "hypocenter_rejected_records",
            "Records left out of an accepted request (OTLP partial success), by reason",
            labels=["signal", "reason"],
        )
        for pair, value in sorted(snap.rejected_records.items()):
            rej.add_metric(list(pair), value)
        yield rej

        ok = CounterMetricFamily(
            "hypocenter_exported_diagnoses", "Diagnoses delivered, by exporter", labels=["exporter"]
        )
        for name in sorted({*self.exporters, *snap.exported}):
            ok.add_metric([name], snap.exported.get(name, 0))
        yield ok
        fail = CounterMetricFamily(
            "hypocenter_export_failures",
            "Failed deliveries, by exporter and kind (transient: retried; permanent: dropped)",
            labels=["exporter", "kind"],
        )
        for name in self.exporters:
            for kind in ("transient", "permanent"):
                fail.add_metric([name, kind], snap.export_failures.get((name, kind), 0))
        for (name, kind), value in sorted(snap.export_failures.items()):
            if name not in self.exporters:
                fail.add_metric([name, kind], value)
        yield fail
        drop = CounterMetricFamily(
            "hypocenter_export_dropped",
            "Diagnoses that will never reach an exporter: rejected (Loki: too_old, out_of_order), expired or superseded",
            labels=["exporter", "reason"],
        )
        for (name, reason), value in sorted(snap.export_dropped.items()):
            drop.add_metric([name, reason], value)
        yield drop

    # ------------------------------------------------------------------------------- store state

    def _from_store(self) -> Iterator[Metric]:
        now = time.time()
        try:
            stats = self.stats.read().counts  # counted off the scrape (store/stats.py)
            backlog = self.store.export_backlog()
            facts = self.store.diagnosis_facts(now - self.window_s)
        except Exception as exc:  # a scrape must not fail because the store did: say so instead
            log.warning("metrics: store unavailable: %s", exc)
            yield GaugeMetricFamily("hypocenter_store_up", "1 when the store answered this scrape", value=0)
            return
        yield GaugeMetricFamily("hypocenter_store_up", "1 when the store answered this scrape", value=1)
        yield GaugeMetricFamily(
            "hypocenter_attempts_open",
            "Attempts awaiting a verdict: never analysed, or data arrived since",
            value=stats.get("attempts_open", 0),
        )
        pending = GaugeMetricFamily(
            "hypocenter_export_pending", "Diagnoses waiting in the outbox, by exporter", labels=["exporter"]
        )
        age = GaugeMetricFamily(
            "hypocenter_export_oldest_pending_age_seconds",
            "Age of the oldest diagnosis waiting in the outbox (0 when empty)",
            labels=["exporter"],
        )
        for name in sorted({*self.exporters, *backlog}):
            count, oldest = backlog.get(name, (0, now))
            pending.add_metric([name], count)
            age.add_metric([name], max(0.0, now - oldest) if count else 0.0)
        yield pending
        yield age
        fold = self.activity.labels.value
        self._clusters |= {fold("cluster", f.cluster or "") for f in facts}
        yield from self._recent(facts)
        if self.fleet is not None:
            yield from self._fleet(now)
        if self.cost is not None:
            yield from self._cost(now)

    def _cost(self, now: float) -> Iterator[Metric]:
        """The cost roll-up of the cost window (cost_window_s) (engine/fleet_cost.py): the numbers GET /v1/fleet/cost gives."""
        try:
            doc = self.cost.report(now, limit=self.fleet_top) if self.cost is not None else {}
        except Exception as exc:  # the other families are already out: skip these, say why
            log.warning("metrics: cost roll-up unavailable: %s", exc)
            return
        yield GaugeMetricFamily(
            "hypocenter_cost_window_seconds",
            "The window of the hypocenter_cost_* gauges",
            value=doc["window_s"],
        )
        causes = GaugeMetricFamily(
            "hypocenter_cost_gpu_hours_lost",
            "GPU-hours lost to failures whose attempts ended in the window, by cause (restart overhead joined)",
            labels=["domain", "subdomain"],
        )
        detect = GaugeMetricFamily(
            "hypocenter_cost_time_to_detect_seconds",
            "Median time from the first cause line to the terminal state, by cause, in the window",
            labels=["domain", "subdomain"],
        )
        for c in doc["causes"]:
            causes.add_metric([c["domain"], c["subdomain"]], c["gpu_hours_lost"])
            if c["median_time_to_detect_s"] is not None:
                detect.add_metric([c["domain"], c["subdomain"]], c["median_time_to_detect_s"])
        yield causes
        yield detect
        comps = GaugeMetricFamily(
            "hypocenter_cost_component_gpu_hours_lost",
            "GPU-hours lost to failures a node, GPU, host port or switch port was behind, in the window; "
            "the top fleet_top_k only",
            labels=["kind", "component"],
        )
        for c in doc["components"]:
            comps.add_metric([c["kind"], c["name"]], c["gpu_hours_lost"])
        yield comps
        mttf = GaugeMetricFamily(
            "hypocenter_cost_mttf_seconds",
            "Mean time to failure per domain: attempts' run time in the window / failures of the domain",
            labels=["domain"],
        )
        for dom in doc["domains"]:
            mttf.add_metric([dom["domain"]], dom["mttf_s"])
        yield mttf
        ettr = GaugeMetricFamily(
            "hypocenter_cost_workload_ettr",
            "Effective training time ratio per workload (productive / run time over its attempts in the "
            "window), where step lines give every part; the fleet_top_k lowest",
            labels=["cluster", "workload"],
        )
        for w in doc["workloads"]:
            ettr.add_metric([self.activity.labels.value("cluster", w["cluster"]), w["workload"]], w["ettr"])
        yield ettr

    def _fleet(self, now: float) -> Iterator[Metric]:
        """The top-k fleet suspects (engine/fleet.py): bounded, whatever the fleet's size."""
        try:
            ranked = self.fleet.suspects(now) if self.fleet is not None else []
        except Exception as exc:  # the other families are already out: skip these, say why
            log.warning("metrics: fleet view unavailable: %s", exc)
            return
        top = ranked[: self.fleet_top]
        found = (
            {(s.kind, s.name) for s in findings(top, min_workloads=self.fleet.min_workloads)}
            if self.fleet
            else set()
        )
        score = GaugeMetricFamily(
            "hypocenter_fleet_suspect_score",
            "Fleet suspects: sum over the distinct workloads behind it of 0.5^(age/half-life); "
            "the top fleet_top_k only",
            labels=["kind", "suspect"],
        )
        workloads = GaugeMetricFamily(
            "hypocenter_fleet_suspect_workloads",
            "Distinct workloads whose failures a fleet suspect was behind (fleet_window_s)",
            labels=["kind", "suspect"],
        )
        finding = GaugeMetricFamily(
            "hypocenter_fleet_finding",
            "1 for a top suspect behind at least fleet_min_workloads workloads (a switch, "
            "switch port or cable: with errors on several hosts)",
            labels=["kind", "suspect"],
        )
        for s in top:
            name = bounded(s.name)
            score.add_metric([s.kind, name], round(s.score, 6))
            workloads.add_metric([s.kind, name], s.workloads)
            finding.add_metric([s.kind, name], 1 if (s.kind, s.name) in found else 0)
        yield score
        yield workloads
        yield finding

    def _recent(self, facts: list[DiagnosisFacts]) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "hypocenter_recent_window_seconds",
            "The window of the hypocenter_recent_* gauges",
            value=self.window_s,
        )
        by_verdict: Tally[tuple[str, ...]] = Tally()
        by_node: Tally[tuple[str, ...]] = Tally()
        by_component: Tally[tuple[str, ...]] = Tally()
        for f in facts:
            cluster = self.activity.labels.value("cluster", f.cluster or "")
            by_verdict[(cluster, f.outcome, f.domain or "", f.subdomain or "")] += 1
            for node in f.culprits:
                by_node[(cluster, bounded(node))] += 1
            for node, kind, ident in sorted(set(f.components)):
                by_component[(cluster, bounded(node), bounded(kind), bounded(ident))] += 1
        v = GaugeMetricFamily(
            "hypocenter_recent_diagnoses",
            "Final diagnoses stored within the window",
            labels=["cluster", "outcome", "domain", "subdomain"],
        )
        for key, value in sorted(by_verdict.items()):
            v.add_metric(list(key), value)
        yield v
        n = GaugeMetricFamily(
            "hypocenter_recent_node_root_causes",
            "Final diagnoses within the window naming the node as (a candidate) root cause; "
            'the top nodes by count, the rest summed in node="other"',
            labels=["cluster", "node"],
        )
        for key, value in top_n(by_node, self.top):
            n.add_metric(list(key), value)
        yield n
        c = GaugeMetricFamily(
            "hypocenter_recent_component_root_causes",
            "Final diagnoses within the window naming the component (GPU, port) in their root cause; "
            'the top components by count, the rest summed in component="other"',
            labels=["cluster", "node", "component_kind", "component"],
        )
        for key, value in top_n(by_component, self.top):
            c.add_metric(list(key), value)
        yield c


def _shut(connection: socket.socket) -> None:
    """End a connection whose request did not arrive in time: its handler's read returns at once."""
    with contextlib.suppress(OSError):  # already gone
        connection.shutdown(socket.SHUT_RDWR)


def _refuse(connection: socket.socket) -> None:
    """503 to a connection over the limit, written without waiting (a TLS one just closes)."""
    if isinstance(connection, ssl.SSLSocket):
        return
    with contextlib.suppress(OSError):
        connection.setblocking(False)
        connection.send(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n")


class MetricsEndpoint:
    """`/metrics` (OpenMetrics with exemplars when asked for, else text 0.0.4) on its own listener."""

    def __init__(self, collector: HypocenterCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(
        self,
        listen: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        wrap: Callable[[Any], Any] | None = None,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        max_connections: int | None = None,
    ) -> str:
        """Listen; over TLS with `ssl_context`, through `wrap` (an auth guard: WSGI app -> WSGI app),
        dropping clients idle for `timeout_s` and those whose request (handshake included) has not
        arrived `deadline_s` after they connected, and answering 503 past `max_connections` open
        connections (each holds a thread). The peer certificate is in environ["hypocenter.peercert"]."""
        host, port = listen_address(listen, "metrics_listen")
        app = make_wsgi_app(self.registry)
        open_connections = threading.BoundedSemaphore(max_connections) if max_connections else None

        class Handler(WSGIRequestHandler):
            timeout = timeout_s  # socketserver applies it to the connection: a stalled client is dropped
            _cut: threading.Timer | None = None

            def setup(self) -> None:
                super().setup()
                if deadline_s is not None:  # a client trickling its request a byte at a time is cut too
                    connection = self.connection
                    self._cut = threading.Timer(deadline_s, lambda: _shut(connection))
                    self._cut.daemon = True
                    self._cut.start()

            def finish(self) -> None:
                if self._cut is not None:
                    self._cut.cancel()
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: a scrape is not worth a line on stderr (the server logs what matters)."""

            def get_environ(self) -> dict[str, Any]:
                if self._cut is not None:  # the request has arrived: the answer takes what it takes
                    self._cut.cancel()
                environ = super().get_environ()
                getpeercert = getattr(self.connection, "getpeercert", None)
                environ["hypocenter.peercert"] = getpeercert() if getpeercert is not None else None
                return environ

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

            def process_request(self, request: Any, client_address: Any) -> None:
                if open_connections is not None and not open_connections.acquire(blocking=False):
                    _refuse(request)
                    self.shutdown_request(request)
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    if open_connections is not None:
                        open_connections.release()

            def get_request(self) -> Any:
                conn, addr = self.socket.accept()
                if ssl_context is not None:  # the handshake happens in the handler thread, under its timeout
                    conn = ssl_context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                return conn, addr

        try:
            httpd = make_server(host, port, wrap(app) if wrap else app, Server, handler_class=Handler)
        except OSError as exc:
            raise InputError(f"cannot listen on {listen} (metrics): {exc.strerror}") from None
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="hypocenter-metrics", daemon=True)
        self._thread.start()
        self.address = f"{host}:{httpd.server_port}"
        return self.address

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
