"""A simulated day of hypocenter's real `/metrics`, for bench/render_panels.py to backfill into Prometheus.

Dashboards show hours of history; a live scrape of a few minutes cannot. So a real `hypocenter serve`
is fed a generated corpus in simulated time, and its real `/metrics` is scraped once per simulated
scrape interval:

    sim clock    0 ───────── scrape ── scrape ── … ─────────── span_s
    per tick     feed the attempts due by then (OTLP replay, gRPC or HTTP, then analyze over REST),
                 send the junk due (a malformed request, an unscoped record), scrape /metrics
    at the end   every snapshot, stamped with its simulated time, as one OpenMetrics file (`# EOF`)
                 for `promtool tsdb create-blocks-from openmetrics`

Only the clock is simulated: every number is what the exporter printed at that tick. Target labels
`job`/`instance` and `up` are added as Prometheus would on a successful scrape. The exports go to
`ExportSink`, a loopback stand-in for Loki (JSON push) and Grafana (annotations) that keeps what it is
sent and answers 503 through a simulated Loki outage, so the export panels have real failures to show.

This module must not invent values: if a scrape fails, the run fails.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from random import Random
from typing import Any

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from hypocenter.cli.replay import replay, trigger
from hypocenter.exporter.loki import BACKDATE_S
from hypocenter.model import AttemptContext

JOB = "hypocenter"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


# ----------------------------------------------------------------------------------------- the sink


@dataclass(slots=True)
class LokiRecord:
    labels: dict[str, str]
    ts_ns: int
    line: str
    metadata: dict[str, str]


class ExportSink:
    """Loki push (`--loki-encoding json`) and Grafana annotations on one loopback port; keeps what it gets."""

    def __init__(self) -> None:
        self.loki: list[LokiRecord] = []
        self.annotations: list[dict[str, Any]] = []
        self.loki_down = False
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"", media: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", media)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                if self.path == "/loki/api/v1/push":
                    if sink.loki_down:
                        self._answer(503, b"simulated outage\n", "text/plain")
                        return
                    sink._push(json.loads(raw))
                    self._answer(204)
                elif self.path == "/api/annotations":
                    with sink._lock:
                        sink.annotations.append(json.loads(raw))
                        n = len(sink.annotations)
                    self._answer(200, json.dumps({"id": n, "message": "Annotation added"}).encode())
                else:
                    self._answer(404, b"{}")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _push(self, doc: dict[str, Any]) -> None:
        with self._lock:
            for stream in doc.get("streams", []):
                for value in stream.get("values", []):
                    meta = value[2] if len(value) > 2 else {}
                    self.loki.append(LokiRecord(dict(stream["stream"]), int(value[0]), value[1], dict(meta)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def start(self) -> ExportSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


# ----------------------------------------------------------------------------------------- the server


class Server:
    """`hypocenter serve` on loopback ephemeral ports, exporting to `sink`."""

    def __init__(self, workdir: Path, sink_url: str) -> None:
        self.workdir = workdir
        self.sink_url = sink_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc = self.http = self.metrics = ""

    def start(self, timeout: float = 60.0) -> Server:
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
            "127.0.0.1:0",
            "--store",
            str(self.workdir / "hypocenter.db"),
            "--settle-s",
            "0.3",
            "--tick-s",
            "0.05",
            "--log-level",
            "warning",
            "--loki-url",
            self.sink_url,
            "--loki-encoding",
            "json",
            "--grafana-url",
            self.sink_url,
            "--export-retry-max-s",
            "1",
            # the generated attempts keep their own dates: a cost window that holds them all
            "--cost-window-s",
            str(20 * 365 * 86400),
        ]
        with (self.workdir / "hypocenter.log").open("ab") as log:
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        line: list[bytes] = []
        out = self.proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0]:
            self.stop()
            raise RuntimeError(
                "hypocenter serve did not start: "
                + (self.workdir / "hypocenter.log").read_text(errors="replace")[-2000:]
            )
        addrs = json.loads(line[0])
        self.grpc, self.http, self.metrics = addrs["grpc"], addrs["http"], addrs["metrics"]
        return self

    def scrape(self) -> str:
        r = httpx.get(f"http://{self.metrics}/metrics", headers={"Accept": OPENMETRICS}, timeout=30.0)
        r.raise_for_status()
        return r.text

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, 15 s to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ----------------------------------------------------------------------------------------- the day


@dataclass(slots=True)
class Fed:
    """One attempt as fed: when (simulated offset, s), its scope and the diagnosis the server returned."""

    at: float
    ctx: AttemptContext
    diagnosis: dict[str, Any]


@dataclass(slots=True)
class Plan:
    """What happens when, in simulated seconds from the start of the span."""

    span_s: float
    scrape_s: float
    arrivals: list[float]
    outage: tuple[float, float]
    malformed: list[float]
    unscoped: list[float]

    @classmethod
    def draw(cls, count: int, seed: int, span_s: float, scrape_s: float) -> Plan:
        """Arrivals follow a day's rhythm (busier in the working day); the outage and junk sit at fixed fractions."""
        rng = Random(f"panels:{seed}")
        arrivals: list[float] = []
        while len(arrivals) < count:
            t = rng.uniform(0.02 * span_s, span_s)
            if rng.random() < 0.55 + 0.45 * math.sin(2 * math.pi * t / span_s):
                arrivals.append(t)
        # Inside the last quarter, so that a 6 h view of a 24 h day (the service dashboard's) shows them.
        return cls(
            span_s,
            scrape_s,
            sorted(arrivals),
            (0.82 * span_s, 0.82 * span_s + span_s / 24),
            [0.78 * span_s, 0.79 * span_s, 0.93 * span_s],
            [0.86 * span_s, 0.95 * span_s],
        )


@dataclass
class Day:
    """The snapshots of one simulated day and the attempts fed during it."""

    plan: Plan
    snapshots: list[tuple[float, str]] = field(default_factory=list)
    fed: list[Fed] = field(default_factory=list)
    instance: str = ""


def feed(server: Server, bundle: Path, *, http: bool) -> tuple[AttemptContext, dict[str, Any]]:
    """`hypocenter replay BUNDLE --rest …` in process: OTLP, then analyze; returns the diagnosis."""
    ctx, _ = replay(bundle, server.http if http else server.grpc, http=http, timeout=30.0)
    status, body = trigger(server.http, ctx)
    if status != 200:
        raise RuntimeError(f"analysis of {bundle.name} failed: HTTP {status}: {body[:300]}")
    doc: dict[str, Any] = json.loads(body)
    return ctx, doc


def send_junk(server: Server, kind: str) -> None:
    """What a misconfigured client sends: a body that is not protobuf, or a record with no node or workload."""
    url = f"http://{server.http}/v1/logs"
    if kind == "malformed":
        httpx.post(
            url,
            content=b"\x0a\xffnot protobuf",
            headers={"Content-Type": "application/x-protobuf"},
            timeout=30,
        )
        return
    record = {"timeUnixNano": str(time.time_ns()), "body": {"stringValue": "hello from nowhere"}}
    doc = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [record] * 3}]}]}
    httpx.post(url, json=doc, timeout=30)


def run_day(server: Server, sink: ExportSink, bundles: list[Path], plan: Plan, progress: Any = None) -> Day:
    """Feed and scrape tick by tick; see the module docstring."""
    day = Day(plan, instance=server.metrics)
    pending = list(zip(plan.arrivals, bundles, strict=True))
    junk = sorted([(t, "malformed") for t in plan.malformed] + [(t, "unscoped") for t in plan.unscoped])
    ticks = int(plan.span_s // plan.scrape_s)
    for k in range(ticks + 1):
        now = k * plan.scrape_s
        sink.loki_down = plan.outage[0] <= now < plan.outage[1]
        while pending and pending[0][0] <= now:
            at, bundle = pending.pop(0)
            ctx, doc = feed(server, bundle, http=len(day.fed) % 3 == 2)
            day.fed.append(Fed(at, ctx, doc))
        while junk and junk[0][0] <= now:
            send_junk(server, junk.pop(0)[1])
        day.snapshots.append((now, server.scrape()))
        if progress is not None and k % 60 == 0:
            progress(f"  t={now / 3600:5.1f} h  fed {len(day.fed)}/{len(bundles)}")
    sink.loki_down = False
    return day


# ----------------------------------------------------------------------------------------- OpenMetrics out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}" if labels else ""


def openmetrics(snapshots: Iterable[tuple[float, str]], *, start: float, instance: str) -> str:
    """Every snapshot as one OpenMetrics text: each family once, each series' samples in time order.

    `start` is the absolute time (Unix s) of simulated offset 0. Exemplars are left out (backfill
    drops them anyway); `job` and `instance` are added, and `up 1` for each scrape."""
    families: dict[str, tuple[str, str, str]] = {
        "up": ("gauge", "1 if the scrape of the target succeeded", "")
    }
    series: dict[str, dict[tuple[tuple[str, str], ...], list[str]]] = {"up": {}}
    target = {"job": JOB, "instance": instance}
    for offset, text in snapshots:
        ts = f"{start + offset:.3f}"
        for fam in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
            families.setdefault(fam.name, (fam.type, fam.documentation, fam.unit))
            by_key = series.setdefault(fam.name, {})
            for s in fam.samples:
                labels = {**s.labels, **target}
                key = tuple(sorted((k, v) for k, v in labels.items() if k not in ("le", "quantile")))
                by_key.setdefault(key, []).append(f"{s.name}{_labels(labels)} {s.value!r} {ts}")
        series["up"].setdefault((), []).append(f"up{_labels(target)} 1.0 {ts}")
    out: list[str] = []
    for name, (kind, doc, unit) in families.items():
        out.append(f"# TYPE {name} {kind}")
        if unit:
            out.append(f"# UNIT {name} {unit}")
        out.append(f"# HELP {name} {_escape(doc)}")
        for lines in series[name].values():
            out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------- Loki, in simulated time


def loki_in_sim_time(sink: ExportSink, fed: list[Fed], start: float) -> list[LokiRecord]:
    """The Loki entries hypocenter pushed, re-dated into the simulated clock.

    The exporter dates a diagnosis entry at its root cause's first_seen, but no earlier than
    BACKDATE_S before it was stored (hypocenter/exporter/loki.py). Here the attempt's own clock is
    shifted so that its window ends when it was fed, and the same rule is applied; evidence entries
    keep their nanosecond offsets after it."""
    by_id = {f.diagnosis["id"]: f for f in fed}
    firsts: dict[str, int] = {}
    for rec in sink.loki:
        if rec.metadata.get("record") == "diagnosis":
            firsts.setdefault(rec.metadata["diagnosis_id"], rec.ts_ns)
    out: list[LokiRecord] = []
    seen: set[tuple[str, str, str]] = set()
    for rec in sink.loki:
        ident = rec.metadata.get("diagnosis_id", "")
        f = by_id.get(ident)
        key = (ident, rec.metadata.get("record", ""), rec.line)
        if f is None or key in seen or ident not in firsts:
            continue
        seen.add(key)
        stored = start + f.at
        shift = stored - f.ctx.window.end.timestamp()
        first_seen = (f.diagnosis.get("root_cause") or {}).get("first_seen")
        began = _iso_s(first_seen) + shift if first_seen else stored
        ts = min(stored, max(began, stored - BACKDATE_S))
        out.append(
            LokiRecord(rec.labels, int(ts * 1e9) + (rec.ts_ns - firsts[ident]), rec.line, rec.metadata)
        )
    return sorted(out, key=lambda r: r.ts_ns)


def _iso_s(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
