"""Pull mode end to end: an example bundle's logs pushed into (fake) Loki, its metrics backfilled
into a real Prometheus, then the Loki and Prometheus connectors collect the attempt and the engine
must reach the verdict `hypocenter analyze` reaches on the bundle itself.

How the bundle is published, as a cluster's agents would have: every line of logs/<node>/<file>
in a stream {host=<node>, filename=/var/log/<file>}; job-level logs (logs/_job) in
{job="slurm", workload=<id>, filename=…}; each entry timed by its line's own stamp, else by the
time the engine gives that line in the bundle (an inherited or uptime-anchored stamp), else by the
stamp before it. The scheduler's records (events/) are what a scope connector (Slurm, Kubernetes)
contributes, so they are passed through as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_support import QUERIES
from observability_fakes import FakeLoki
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from prometheus_support import backfilled_prometheus, needs_prometheus, needs_promtool

from hypocenter.cli import main
from hypocenter.collector.bundle import Bundle, load_bundle
from hypocenter.collector.connectors.base import Collected, RetryPolicy, merge
from hypocenter.collector.connectors.loki import LokiConnector
from hypocenter.collector.connectors.prometheus import PrometheusConnector
from hypocenter.collector.connectors.scope import epoch_ns
from hypocenter.engine import default_engine
from hypocenter.lineformat import parse_line, time_context
from hypocenter.sources import AttemptInput, MetricSource, RecordSource, Source, TextSource

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POLICY = RetryPolicy(timeout_s=10.0, attempts=2, backoff_s=0.05, max_backoff_s=0.1)
CASES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki(ties="random").start()
    yield fake
    fake.stop()


def push_logs(bundle: Bundle, loki: FakeLoki) -> None:
    """The bundle's lines (`timed_streams`) through Loki's JSON push API."""
    streams = timed_streams(bundle)
    # pushed as the agents would have, as the lines were written: Loki refuses entries older than a
    # week or more than 10 min ahead of its clock
    written = max(int(v[0]) for s in streams for v in s["values"]) / 1e9 + 60
    loki.ingest.clock = lambda: written
    answer = httpx.post(f"{loki.url}/loki/api/v1/push", json={"streams": streams}, timeout=30)
    assert answer.status_code == 204, answer.text


def timed_streams(bundle: Bundle) -> list[dict[str, Any]]:
    """Every log line of the bundle into Loki through its JSON push API, timed as an agent tailing
    the file would have: a line's own stamp; for raw dmesg, boot time + uptime (boot time from the
    engine's anchoring of that stream's candidate lines, else counted back from the window end as
    the engine does); a line with no stamp was written before the next stamped line."""
    tctx = time_context(bundle.context)
    events = default_engine().extractor.extract(bundle.sources, bundle.context, tctx).events
    streams = []
    for src in bundle.sources:
        if not isinstance(src, TextSource):
            continue
        text = src.text.decode("utf-8", "replace") if isinstance(src.text, bytes) else src.text
        headers = [parse_line(line, tctx) for line in text.split("\n")]
        boots = [
            e.time - timedelta(seconds=u)
            for e in events
            if e.ref.startswith(f"{src.name}:")
            and e.time
            and not e.approx
            and (u := parse_line(e.text, tctx).uptime) is not None
        ]
        uptimes = [h.uptime for h in headers if h.uptime is not None]
        boot = boots[0] if boots else bundle.context.window.end - timedelta(seconds=max(uptimes, default=0.0))
        times: list[datetime | None] = [
            h.time or (boot + timedelta(seconds=h.uptime) if h.uptime is not None else None) for h in headers
        ]
        following = bundle.context.window.end
        for i in range(len(times) - 1, -1, -1):  # an unstamped line: the next stamp (none: the window end)
            following = times[i] = times[i] or following
        file = src.name.rsplit("/", 1)[-1]
        labels = (
            {"host": src.node, "filename": f"/var/log/{file}"}
            if src.node
            else {"job": "slurm", "workload": bundle.context.workload.id, "filename": f"/shared/{file}"}
        )
        values = [
            [str(epoch_ns(t)), line]
            for t, line in zip(times, text.split("\n"), strict=True)
            if line.strip() and t is not None
        ]
        streams.append({"stream": labels, "values": values})
    return streams


def cli_diagnosis(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["analyze", str(path), "--format", "json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def verdict(doc: dict[str, object]) -> tuple[object, ...]:
    rc = doc.get("root_cause") or {}
    assert isinstance(rc, dict)
    candidates = doc.get("candidates") or []
    assert isinstance(candidates, list)
    return (
        doc["outcome"],
        rc.get("domain"),
        rc.get("subdomain"),
        tuple(rc.get("nodes") or ()),
        tuple(sorted((c.get("domain"), c.get("subdomain"), tuple(c.get("nodes") or ())) for c in candidates)),
    )


@needs_prometheus
@needs_promtool
@pytest.mark.parametrize("example", CASES)
def test_pulled_from_loki_and_prometheus_gives_the_bundle_verdict(
    example: str, loki: FakeLoki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / example
    expected = cli_diagnosis(path, capsys)
    bundle = load_bundle(path)
    ctx = bundle.context
    push_logs(bundle, loki)
    parts = [
        LokiConnector(
            loki.url, queries=QUERIES, policy=POLICY, workload_selector='{job="slurm", workload="{workload}"}'
        ).collect(ctx)
    ]
    # raw series only: a recorded expression result (no metric name, e.g. a rate()) is no stored data
    series = [s for src in bundle.sources if isinstance(src, MetricSource) for s in src.series if s.name]
    if series:
        prom = backfilled_prometheus(tmp_path / "prometheus", series)
        try:
            parts.append(PrometheusConnector(prom.url, queries=QUERIES, policy=POLICY).collect(ctx))
        finally:
            prom.stop()
    scheduler: list[Source] = [s for s in bundle.sources if isinstance(s, RecordSource)]
    pulled = merge([*parts, Collected(sources=scheduler)])
    assert not [c for c in pulled.coverage if c.status in ("failed", "partial")], pulled.coverage
    diagnosis = default_engine().analyze(AttemptInput(ctx, pulled.sources, pulled.coverage))
    assert verdict(json.loads(diagnosis.to_json())) == verdict(expected)


def push_otlp(bundle: Bundle, loki: FakeLoki) -> None:
    """The same lines as an OpenTelemetry Collector sends them to Loki's own `/otlp/v1/logs`: node
    logs with resource `host.name`, the job's with `hypocenter.workload.id` (Contract 2), the file
    as the log attribute `log.file.name` (filelog receiver); records in the order they were
    written, as a collector tailing the files forwards them."""
    records: list[tuple[int, dict[str, str], str, str]] = []
    for stream in timed_streams(bundle):
        labels = stream["stream"]
        resource = (
            {"host.name": labels["host"]}
            if "host" in labels
            else {
                "hypocenter.workload.id": bundle.context.workload.id,
                "hypocenter.workload.attempt": str(bundle.context.workload.attempt),
            }
        )
        file = labels["filename"].rsplit("/", 1)[1]
        records += [(int(ts), resource, file, line) for ts, line in stream["values"]]
    records.sort(key=lambda r: r[0])
    request = ExportLogsServiceRequest()
    for ts, resource, file, line in records:
        rl = request.resource_logs.add()
        for key, value in resource.items():
            kv = rl.resource.attributes.add()
            kv.key, kv.value.string_value = key, value
        rec = rl.scope_logs.add().log_records.add()
        rec.time_unix_nano, rec.body.string_value = ts, line
        attr = rec.attributes.add()
        attr.key, attr.value.string_value = "log.file.name", file
    written = records[-1][0] / 1e9 + 60
    loki.ingest.clock = lambda: written
    answer = httpx.post(
        f"{loki.url}/otlp/v1/logs",
        content=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=30,
    )
    assert answer.status_code == 204, answer.content


def test_job_logs_sent_to_lokis_otlp_endpoint_are_found_by_structured_metadata(
    loki: FakeLoki, capsys: pytest.CaptureFixture[str]
) -> None:
    """dataloader-hang's culprit is only in the job's stdout. Through Loki's OTLP endpoint with its
    default otlp_config, `hypocenter.workload.id` is structured metadata, not a label: the workload
    selector names no stream, and the pull finds the job's lines by the metadata instead."""
    path = EXAMPLES / "dataloader-hang"
    expected = cli_diagnosis(path, capsys)
    bundle = load_bundle(path)
    push_otlp(bundle, loki)
    assert {tuple(sorted(e.labels)) for e in loki.entries} == {("service_name",)}  # unknown_service only
    connector = LokiConnector(
        loki.url,
        queries=QUERIES,
        policy=POLICY,
        selector='service_name=~".+"',
        node_label="host_name",
        node_label_kind="metadata",
        workload_selector='hypocenter_workload_id="{workload}"',
    )
    pulled = connector.collect(bundle.context)
    scheduler: list[Source] = [s for s in bundle.sources if isinstance(s, RecordSource)]
    merged = merge([pulled, Collected(sources=scheduler)])
    assert {c.source: c.status for c in merged.coverage if c.connector == "loki"}["logs/_job"] == "ok"
    assert any(s.name.startswith("loki/_job/") for s in merged.sources)
    assert any(' | hypocenter_workload_id="77120"' in q["query"] for q in loki.queries)
    diagnosis = default_engine().analyze(AttemptInput(bundle.context, merged.sources, merged.coverage))
    assert verdict(json.loads(diagnosis.to_json())) == verdict(expected)
