"""`hypocenter replay BUNDLE`: send an attempt bundle to a server as OTLP, the way collectors would.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from hypocenter.cli.console import EXIT_OK, EXIT_PROBLEMS
from hypocenter.collector import flight_recorder, logstream
from hypocenter.collector.bundle import JOB_DIR, documents, load_context
from hypocenter.collector.metrics import MetricFormatError, parse_metrics
from hypocenter.config import read_secret_file
from hypocenter.errors import HypocenterError, InputError, TransientError
from hypocenter.lineformat import TimeContext, parse_line, time_context
from hypocenter.model import AttemptContext
from hypocenter.names import NODE_LABELS
from hypocenter.server.attempts import NodeMatcher
from hypocenter.sources import split_lines

NODE_FILES = re.compile(
    r"^(kern|dmesg|journal|messages|syslog|nvidia-smi|dcgmi|perfquery|ibstat|ibdiagnet|mlx|ipmi|sel)",
    re.IGNORECASE,
)
BATCH = 512


@dataclass(slots=True)
class LogLine:
    body: Any
    time_ns: int
    attributes: dict[str, Any]


@dataclass(slots=True)
class Stream:
    """One resource's worth of records (one file, or one metrics file's node). `lines` is a list from
    `plan`; in `replay` it is read as it is sent (a file's lines, a batch at a time)."""

    resource: dict[str, Any]
    lines: Iterable[LogLine]


MetricGroup = tuple[dict[str, Any], list[Any]]


@dataclass(slots=True)
class ReplayReport:
    log_records: int = 0
    metric_points: int = 0
    requests: int = 0
    partial_rejections: int = 0


def _ns(dt: datetime) -> int:
    return int(dt.timestamp() * 1_000_000) * 1000


def workload_attributes(ctx: AttemptContext) -> dict[str, Any]:
    wl = ctx.workload
    attrs: dict[str, Any] = {
        "service.name": "hypocenter-replay",
        "hypocenter.workload.id": wl.id,
        "hypocenter.workload.attempt": wl.attempt,
        "hypocenter.attempt.window.start": ctx.window.start.isoformat().replace("+00:00", "Z"),
        "hypocenter.attempt.timezone": ctx.timezone,
    }
    for key, value in (("name", wl.name), ("scheduler", wl.scheduler), ("cluster", wl.cluster)):
        if value:
            attrs[f"hypocenter.workload.{key}"] = value
    if ctx.nodes:
        attrs["hypocenter.attempt.nodes"] = ",".join(ctx.nodes)
    if ctx.ranks:
        attrs["hypocenter.attempt.ranks"] = json.dumps(dict(ctx.ranks), sort_keys=True)
    return attrs


PENDING_LINES = 4096
"""Lines without a time held while looking for a file's first one; past them, the file is read ahead."""


def _records(
    read: Callable[[], Iterator[str]], rel: str, tctx: TimeContext, fallback_ns: int
) -> Iterator[LogLine]:
    """One record per line of `read()`, timed like a collector's timestamp parser: a line without a
    time takes the previous line's, and the lines before the first time take that first time (the
    window's end when the file has none). Read as a stream: the lines before the first time are
    held (up to PENDING_LINES; past them, the file is read ahead for it), nothing else is."""

    def stamp(line: str) -> int | None:
        when = parse_line(line[:4096], tctx).time if line.strip() else None
        return _ns(when) if when is not None else None

    def record(i: int, line: str, ns: int) -> LogLine:
        return LogLine(body=line, time_ns=ns, attributes={"log.file.path": rel, "log.file.record_number": i})

    last: int | None = None
    pending: list[str] = []
    for i, line in enumerate(read(), start=1):
        ns = stamp(line)
        if last is None:
            if ns is None and len(pending) < PENDING_LINES:
                pending.append(line)
                continue
            last = (
                ns if ns is not None else next((t for t in map(stamp, read()) if t is not None), fallback_ns)
            )
            yield from (record(j, held, last) for j, held in enumerate(pending, start=1))
            pending = []
        last = ns if ns is not None else last
        yield record(i, line, last)
    yield from (record(j, held, fallback_ns) for j, held in enumerate(pending, start=1))  # no line has a time


def _file_pieces(path: Path, rel: str) -> Iterable[str | bytes]:
    """The text of one file of a bundle, a piece at a time: a log's as `analyze` reads it (gzip undone,
    NUL bytes dropped, undecodable bytes replaced), a Flight Recorder dump's rendered lines (never its
    bytes); nothing for a file that is not usable text."""
    dump = flight_recorder.read_source(path, rel, None)
    if dump is not None:
        return (str(dump[0].text),) if dump[0] is not None else ()
    facts = logstream.scan_log(path)
    return logstream.log_pieces(path, facts.status == "ok") if facts.usable else ()


def _file_lines(path: Path, rel: str) -> Iterator[str]:
    """The lines of `_file_pieces`; the empty string after a final newline is no line."""
    held: str | None = None
    for line in split_lines(_file_pieces(path, rel), "surrogateescape"):
        if held is not None:
            yield held
        held = line
    if held:
        yield held


def _files(root: Path, top: Path) -> list[tuple[Path, str]]:
    """(path, bundle-relative path) of each file below `top`, in path order."""
    if not top.is_dir():
        return []
    return [
        (path, path.relative_to(root).as_posix())
        for path in sorted(p for p in top.rglob("*") if p.is_file() and not p.name.startswith("."))
    ]


def _whole(path: Path, rel: str) -> str:
    """A small file's whole text (an events document, a metrics file)."""
    return "".join(
        p.decode("utf-8", "surrogateescape") if isinstance(p, bytes) else p for p in _file_pieces(path, rel)
    )


def _lazy_plan(root: Path) -> tuple[AttemptContext, list[Stream], list[Stream], Iterator[MetricGroup]]:
    """`plan`, with every file read only when its stream (or metric group) is reached."""
    ctx = load_context(root)
    tctx = time_context(ctx)
    wattrs = workload_attributes(ctx)
    end_ns = _ns(ctx.window.end)

    def lines(path: Path, rel: str) -> Iterator[LogLine]:
        return _records(partial(_file_lines, path, rel), rel, tctx, end_ns)

    node_streams: list[Stream] = []
    app_streams: list[Stream] = []
    logs = root / "logs"
    if logs.is_dir():
        for node_dir in sorted(p for p in logs.iterdir() if p.is_dir() and not p.name.startswith(".")):
            node = None if node_dir.name == JOB_DIR else node_dir.name
            for path, rel in _files(root, node_dir):
                if node is not None and NODE_FILES.match(path.name):
                    node_streams.append(
                        Stream(
                            resource={"host.name": node, "service.name": "node-agent"}, lines=lines(path, rel)
                        )
                    )
                else:
                    res = dict(wattrs)
                    if node is not None:
                        res["host.name"] = node
                    app_streams.append(Stream(resource=res, lines=lines(path, rel)))
    traces = root / "traces"
    for path, rel in _files(root, traces):
        res = dict(wattrs)
        parts = path.relative_to(traces).parts
        if len(parts) > 1:
            res["host.name"] = parts[0]
        app_streams.append(Stream(resource=res, lines=lines(path, rel)))
    for path, rel in _files(root, root / "events"):
        app_streams.append(Stream(resource=dict(wattrs), lines=_documents(path, rel, end_ns)))
    return ctx, node_streams, app_streams, _metric_groups(root, ctx, wattrs)


def _documents(path: Path, rel: str, end_ns: int) -> Iterator[LogLine]:
    """Each scheduler / Kubernetes document of an events file as one record (none when it is not one)."""
    text = _whole(path, rel)
    if not text:
        return
    try:
        docs = documents(text)
    except ValueError:
        return
    for i, doc in enumerate(docs, start=1):
        yield LogLine(
            body=doc, time_ns=end_ns, attributes={"log.file.path": rel, "log.file.record_number": i}
        )


def _metric_groups(root: Path, ctx: AttemptContext, wattrs: dict[str, Any]) -> Iterator[MetricGroup]:
    """Each metrics file's series by node (one file read at a time)."""
    matcher = NodeMatcher(ctx.nodes)
    for path, rel in _files(root, root / "metrics"):
        text = _whole(path, rel)
        if not text:
            continue
        try:
            series = parse_metrics(text, default_time=ctx.window.end)
        except (MetricFormatError, ValueError):
            continue
        by_node: dict[str | None, list[Any]] = {}
        for s in series:
            node = next((m for k in NODE_LABELS if (m := matcher.resolve(s.labels.get(k))) is not None), None)
            by_node.setdefault(node, []).append(s)
        for node, group in sorted(by_node.items(), key=lambda kv: kv[0] or ""):
            res = {"host.name": node, "service.name": "node-agent"} if node else dict(wattrs)
            res["hypocenter.source"] = rel
            yield res, group


def plan(root: Path) -> tuple[AttemptContext, list[Stream], list[Stream], list[MetricGroup]]:
    """(context, node streams, workload streams, metric groups) of a bundle, in send order, every
    file read (`replay` reads each as it sends it)."""
    ctx, node_streams, app_streams, metric_groups = _lazy_plan(Path(root))

    def read(streams: list[Stream]) -> list[Stream]:
        return [Stream(s.resource, lines) for s in streams if (lines := list(s.lines))]

    return ctx, read(node_streams), read(app_streams), list(metric_groups)


def state_record(ctx: AttemptContext) -> Stream:
    attrs: dict[str, Any] = {
        "hypocenter.attempt.state": ctx.state or "UNKNOWN",
        "hypocenter.attempt.window.end": ctx.window.end.isoformat().replace("+00:00", "Z"),
        "log.file.path": "hypocenter/attempt-state",
        "log.file.record_number": 1,  # one state per attempt: a resent one is stored once
    }
    if ctx.exit_code is not None:
        attrs["hypocenter.attempt.exit_code"] = ctx.exit_code
    if ctx.reason:
        attrs["hypocenter.attempt.reason"] = ctx.reason
    body = f"attempt {ctx.workload.id}.{ctx.workload.attempt} ended: state={ctx.state or 'UNKNOWN'}"
    return Stream(
        resource=workload_attributes(ctx),
        lines=[LogLine(body=body, time_ns=_ns(ctx.window.end), attributes=attrs)],
    )


class Sender:
    """The OpenTelemetry SDK exporters, pointed at one endpoint."""

    def __init__(
        self,
        endpoint: str,
        http: bool,
        timeout: float = 30.0,
        *,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.http = http
        # The same header the Collector's bearertokenauth sends, as HTTP header or gRPC metadata.
        headers = {"authorization": f"Bearer {token}"} if token else None
        tls = bool(ca_file) or endpoint.startswith("https://")
        if http:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HTTPLogs
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter as HTTPMetrics,
            )

            base = (
                endpoint
                if endpoint.startswith(("http://", "https://"))
                else f"{'https' if tls else 'http'}://{endpoint}"
            )
            session = None
            if ca_file:
                import requests

                # requests lets $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE override a session's CA file
                # (psf/requests#3829): the CA asked for on the command line must win.
                session = requests.Session()
                session.trust_env = False
            self.logs: Any = HTTPLogs(
                endpoint=f"{base.rstrip('/')}/v1/logs",
                timeout=timeout,
                headers=headers,
                certificate_file=ca_file,
                session=session,
            )
            self.metrics: Any = HTTPMetrics(
                endpoint=f"{base.rstrip('/')}/v1/metrics",
                timeout=timeout,
                headers=headers,
                certificate_file=ca_file,
                session=session,
            )
        else:
            import grpc
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetrics,
            )

            target = endpoint.removeprefix("http://").removeprefix("https://")
            creds = (
                grpc.ssl_channel_credentials(Path(ca_file).read_bytes() if ca_file else None) if tls else None
            )
            self.logs = GrpcLogs(
                endpoint=target, insecure=not tls, credentials=creds, timeout=timeout, headers=headers
            )
            self.metrics = GrpcMetrics(
                endpoint=target, insecure=not tls, credentials=creds, timeout=timeout, headers=headers
            )

    def send_logs(self, stream: Stream, report: ReplayReport, batch_size: int = BATCH) -> None:
        from opentelemetry._logs import LogRecord
        from opentelemetry.sdk._logs import ReadableLogRecord
        from opentelemetry.sdk._logs.export import LogRecordExportResult
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        resource = Resource(stream.resource)
        scope = InstrumentationScope("hypocenter.cli.replay")
        now = time.time_ns()
        for chunk in _chunks(stream.lines, batch_size):  # one file's lines, a batch at a time
            batch = [
                ReadableLogRecord(
                    LogRecord(
                        timestamp=line.time_ns,
                        observed_timestamp=now,
                        body=line.body,
                        attributes=line.attributes,
                    ),
                    resource,
                    scope,
                )
                for line in chunk
            ]
            if self.logs.export(batch) != LogRecordExportResult.SUCCESS:
                raise TransientError(
                    f"the server did not accept {len(batch)} log record(s) "
                    f"({chunk[0].attributes.get('log.file.path')}): see the exporter's log above"
                )
            report.log_records += len(batch)
            report.requests += 1

    def send_metrics(self, resource_attrs: dict[str, Any], series: list[Any], report: ReplayReport) -> None:
        from opentelemetry.sdk.metrics.export import (
            Gauge,
            Metric,
            MetricExportResult,
            MetricsData,
            NumberDataPoint,
            ResourceMetrics,
            ScopeMetrics,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        metrics = []
        count = 0
        for s in series:
            points = [
                NumberDataPoint(
                    attributes=dict(s.labels), start_time_unix_nano=0, time_unix_nano=_ns(when), value=value
                )
                for when, value in s.samples
            ]
            count += len(points)
            metrics.append(Metric(name=s.name, description=None, unit=None, data=Gauge(data_points=points)))
        data = MetricsData(
            resource_metrics=[
                ResourceMetrics(
                    resource=Resource(resource_attrs),
                    schema_url="",
                    scope_metrics=[
                        ScopeMetrics(
                            scope=InstrumentationScope("hypocenter.cli.replay"),
                            metrics=metrics,
                            schema_url="",
                        )
                    ],
                )
            ]
        )
        if self.metrics.export(data) != MetricExportResult.SUCCESS:
            raise TransientError(
                f"the server did not accept metrics from {resource_attrs.get('hypocenter.source')}"
            )
        report.metric_points += count
        report.requests += 1

    def close(self) -> None:
        self.logs.shutdown()
        self.metrics.shutdown()


def _chunks(items: Iterable[LogLine], n: int) -> Iterator[list[LogLine]]:
    it = iter(items)
    while chunk := list(islice(it, n)):
        yield chunk


def replay(
    bundle: Path,
    endpoint: str,
    *,
    http: bool = False,
    send_state: bool = True,
    timeout: float = 30.0,
    token: str | None = None,
    ca_file: str | None = None,
) -> tuple[AttemptContext, ReplayReport]:
    """Send the bundle; raises InputError for an unusable bundle, TransientError when the server refuses.
    `token`: a bearer token with the ingest role; `ca_file`: the CA to verify a TLS server with."""
    ctx, node_streams, app_streams, metric_groups = _lazy_plan(Path(bundle))
    sender = Sender(endpoint, http, timeout, token=token, ca_file=ca_file)
    report = ReplayReport()
    try:
        for stream in node_streams:
            sender.send_logs(stream, report)
        for attrs, series in metric_groups:
            sender.send_metrics(attrs, series, report)
        for stream in app_streams:
            sender.send_logs(stream, report)
        if send_state:
            sender.send_logs(state_record(ctx), report)
    finally:
        sender.close()
    return ctx, report


def trigger(
    rest: str,
    ctx: AttemptContext,
    timeout: float = 60.0,
    *,
    token: str | None = None,
    ca_file: str | None = None,
) -> tuple[int, str]:
    """POST /v1/attempts/{workload}/{attempt}/analyze on the REST base URL (needs the admin role); (status, body)."""
    import ssl

    import httpx

    base = rest if rest.startswith(("http://", "https://")) else f"{'https' if ca_file else 'http'}://{rest}"
    url = f"{base.rstrip('/')}/v1/attempts/{ctx.workload.id}/{ctx.workload.attempt}/analyze"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    try:
        resp = httpx.post(url, timeout=timeout, headers=headers, verify=verify)
    except httpx.HTTPError as exc:
        raise TransientError(f"{url}: {exc}") from None
    return resp.status_code, resp.text


def may_trigger(rest: str, *, token: str | None = None, ca_file: str | None = None) -> str | None:
    """None when `token` may trigger an analysis on `rest`; else why not, asked before anything is sent.
    The question is an empty `POST /v1/scopes`: the server's guard answers 401/403 before it reads a
    body, and an admin gets 422 for the empty scope (nothing is done)."""
    import ssl

    import httpx

    base = rest if rest.startswith(("http://", "https://")) else f"{'https' if ca_file else 'http'}://{rest}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"} if token else {}
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    try:
        resp = httpx.post(
            f"{base.rstrip('/')}/v1/scopes", content=b"{}", timeout=10, headers=headers, verify=verify
        )
    except httpx.HTTPError:
        return None  # unreachable now: the trigger will say so after the records are sent
    if resp.status_code == 401:
        return "the server wants a token, and triggering an analysis needs one with the admin role"
    if resp.status_code == 403:
        return "this token may send records (ingest) but triggering an analysis needs the admin role"
    return None


__all__ = ["HypocenterError", "InputError", "may_trigger", "plan", "replay", "trigger"]


TOKEN_ENV = "HYPOCENTER_TOKEN"


def client_token(token_file: str | None) -> str | None:
    """A client's bearer token: from --token-file, else $HYPOCENTER_TOKEN (never a flag value, which
    `ps` would show to every user of the machine)."""
    if token_file:
        return read_secret_file(token_file, "--token-file")
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _cmd_replay(args: argparse.Namespace) -> int:
    endpoint = args.endpoint or ("127.0.0.1:4318" if args.http else "127.0.0.1:4317")
    token = client_token(args.token_file)
    rest = args.rest or (endpoint if args.http else None)
    refusal = may_trigger(rest, token=token, ca_file=args.ca_file) if rest is not None else None
    if refusal is not None:
        print(
            f"hypocenter: {refusal}: the records are sent, the analysis is not requested (the attempt's "
            "terminal state makes the server analyse it; read it with GET /v1/diagnoses?workload=…)",
            file=sys.stderr,
        )
        rest = None
    try:
        ctx, report = replay(
            Path(args.bundle),
            endpoint,
            http=args.http,
            timeout=args.timeout,
            token=token,
            ca_file=args.ca_file,
        )
    except TransientError as exc:
        print(f"hypocenter: replay to {endpoint} stopped: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    print(
        f"replayed {args.bundle} to {endpoint} ({'OTLP/HTTP' if args.http else 'OTLP/gRPC'}): "
        f"{report.log_records} log records, {report.metric_points} metric points in {report.requests} requests; "
        f"workload {ctx.workload.id} attempt {ctx.workload.attempt} state {ctx.state or 'UNKNOWN'} sent last",
        file=sys.stderr,
    )
    if rest is None:
        if refusal is None:
            print(
                "the terminal state triggers analysis on the server; pass --rest URL to wait for the diagnosis",
                file=sys.stderr,
            )
        return EXIT_OK
    try:
        status, body = trigger(rest, ctx, token=token, ca_file=args.ca_file)
    except TransientError as exc:
        print(f"hypocenter: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    if status != 200:
        print(f"hypocenter: analysis request failed: HTTP {status}: {body.strip()[:300]}", file=sys.stderr)
        return EXIT_PROBLEMS
    sys.stdout.write(body)
    return EXIT_OK


def add_parser(sub: Any) -> None:
    r = sub.add_parser("replay", help="send an attempt bundle to a server as OTLP, then trigger its analysis")
    r.add_argument("bundle", help="path to the attempt bundle directory")
    r.add_argument(
        "--endpoint", help="OTLP endpoint host:port (default 127.0.0.1:4317, or :4318 with --http)"
    )
    r.add_argument("--http", action="store_true", help="use OTLP/HTTP (protobuf) instead of OTLP/gRPC")
    r.add_argument(
        "--rest",
        metavar="URL",
        help="REST base URL to trigger the analysis and print the diagnosis (default: the --http endpoint)",
    )
    r.add_argument(
        "--timeout", type=float, default=30.0, help="exporter timeout per request, seconds (default 30)"
    )
    r.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"file holding a bearer token (default: ${TOKEN_ENV}); "
        "OTLP needs the ingest role, the analysis trigger admin",
    )
    r.add_argument(
        "--ca-file", metavar="PATH", help="CA certificate(s) to verify a TLS server with (turns on TLS)"
    )
    r.set_defaults(func=_cmd_replay)
