"""Compaction and streaming extraction on ingest (server/compaction.py, server/service.IngestEvents).

What a user relies on:
* the server does not keep whole logs: lines no rule can read lose their text once old enough;
* that never changes a diagnosis: a stream rebuilt from the kept lines (blank lines in place of
  the others) gives byte-identical diagnoses, on every example and on a generated corpus;
* a hanging job (watchdog timeouts, no terminal state) gets a provisional diagnosis as soon as it
  goes quiet, not after the idle timeout; events extracted on ingest show up in /metrics.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from server_support import EXAMPLES, ServerProcess, analyze, essence, replay, wait_for_diagnosis

from bench.generate import generate
from bench.throughput import write_log
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext
from hypocenter.sources import AttemptInput, Source, TextSource

pytestmark = pytest.mark.slow

GENERATED = 60


def _compacted(sources: list[Source], tctx_bundle: Path) -> tuple[list[Source], int, int]:
    """Every text source with the lines no rule can read blanked; (sources, lines, blanked)."""
    engine = default_engine()
    tctx = time_context(load_bundle(tctx_bundle).context)
    out: list[Source] = []
    total = blanked = 0
    for src in sources:
        if not isinstance(src, TextSource):
            out.append(src)
            continue
        text = src.text if isinstance(src.text, str) else src.text.decode("utf-8", "surrogateescape")
        lines = text.split("\n")
        keep = engine.extractor.evidence_lines(list(enumerate(lines, 1)), tctx)
        total += len(lines)
        blanked += len(lines) - len(keep)
        out.append(
            TextSource(
                name=src.name,
                text="\n".join(x if i in keep else "" for i, x in enumerate(lines)),
                node=src.node,
                source=src.source,
            )
        )
    return out, total, blanked


def _same_diagnosis(bundle: Path) -> tuple[int, int]:
    engine = default_engine()
    b = load_bundle(bundle)
    whole = engine.analyze(b).to_json()
    sources, total, blanked = _compacted(b.sources, bundle)
    assert engine.analyze(AttemptInput(b.context, sources, b.coverage)).to_json() == whole, bundle.name
    return total, blanked


@pytest.mark.parametrize("bundle", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_kept_lines_give_the_same_diagnosis_on_every_example(bundle: Path) -> None:
    _same_diagnosis(bundle)


def test_kept_lines_give_the_same_diagnosis_on_a_generated_corpus(tmp_path: Path) -> None:
    bundles = generate(tmp_path, GENERATED, seed=4242, prior="uniform", nodes_max=16)
    total = blanked = 0
    for bundle in bundles:
        t, b = _same_diagnosis(bundle)
        total += t
        blanked += b
    # Generated failures are dense in errors and progress lines (which are evidence), yet a good
    # share of their lines is noise no rule reads.
    assert blanked / total > 0.2, f"only {blanked} of {total} lines could be blanked"


def test_a_healthy_node_log_keeps_almost_nothing(tmp_path: Path) -> None:
    """A day of a healthy node's logs (NCCL INFO, audit noise, progress elsewhere) with two faults:
    what compaction keeps is a few KB, and the events extracted from it are the same."""
    path = tmp_path / "node.log"
    write_log(path, 4, seed=7)
    lines = path.read_text().split("\n")
    engine = default_engine()
    now = datetime(2026, 11, 2, tzinfo=timezone.utc)
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": "w"},
            "window": {"start": now - timedelta(days=1), "end": now + timedelta(days=1)},
            "nodes": ["n1"],
        }
    )
    tctx = time_context(ctx)
    keep = engine.extractor.evidence_lines(list(enumerate(lines, 1)), tctx)
    kept = "\n".join(x if i in keep else "" for i, x in enumerate(lines))
    assert len(kept.encode()) - len(lines) < 0.01 * path.stat().st_size
    whole = engine.extractor.extract([TextSource("node.log", "\n".join(lines), node="n1")], ctx, tctx).events
    rebuilt = engine.extractor.extract([TextSource("node.log", kept, node="n1")], ctx, tctx).events
    assert whole and [e.model_dump() for e in rebuilt] == [e.model_dump() for e in whole]


# ------------------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def compacting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Compaction as eager as it gets: every line is eligible as soon as it is stored.
    srv = ServerProcess(
        tmp_path_factory.mktemp("compact") / "store.db",
        "--compact-after-s",
        "0",
        "--collapse-after-s",
        "0",
        "--retention-interval-s",
        "0.2",
    ).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("bundle", EXAMPLES[:6], ids=[p.name for p in EXAMPLES[:6]])
def test_server_with_eager_compaction_matches_analyze(compacting: ServerProcess, bundle: Path) -> None:
    expected = analyze(bundle)
    r = replay(bundle, compacting.grpc)
    assert r.returncode == 0, r.stderr
    workload = expected["attempt"]["workload_id"]
    with compacting.client() as client:
        got = wait_for_diagnosis(client, workload)
        assert essence(got) == essence(expected)
        assert got["id"] == expected["id"]
        # Compaction ran over this attempt's lines; a re-analysis from what is left is the same.
        _settle(compacting.store)
        again = client.post(f"/v1/attempts/{workload}/{expected['attempt']['attempt']}/analyze")
        assert again.status_code == 200, again.text
        assert again.json()["id"] == expected["id"] and essence(again.json()) == essence(expected)


def test_the_store_keeps_only_evidence_text(compacting: ServerProcess, tmp_path: Path) -> None:
    """An example with 1 MB of healthy node chatter added: the server's diagnosis is still `analyze`'s,
    and compaction leaves that chatter's text out of the store."""
    bundle = tmp_path / "noisy"
    shutil.copytree(EXAMPLES[0], bundle)
    node = sorted(p.name for p in (bundle / "logs").iterdir() if p.name != "_job")[0]
    write_log(bundle / "logs" / node / "nccl-debug.log", 1, seed=3)
    expected = analyze(bundle)
    assert replay(bundle, compacting.grpc).returncode == 0
    with compacting.client() as client:
        got = wait_for_diagnosis(client, expected["attempt"]["workload_id"])
    assert got["id"] == expected["id"]
    _settle(compacting.store)
    with sqlite3.connect(str(compacting.store)) as db:
        rows = dict(
            db.execute(
                "SELECT kind, COUNT(*) FROM log_entries WHERE stream LIKE '%nccl-debug.log' GROUP BY kind"
            )
        )
        kept_bytes = db.execute(
            "SELECT SUM(LENGTH(body)) FROM log_entries WHERE stream LIKE '%nccl-debug.log' AND kind = 'text'"
        ).fetchone()[0]
        merged = db.execute(
            "SELECT COALESCE(SUM(CAST(body AS INTEGER)), 0) FROM log_entries WHERE kind = 'gap'"
        ).fetchone()[0]
    lines = (bundle / "logs" / node / "nccl-debug.log").read_text().count("\n")
    assert sum(rows.values()) < 0.01 * lines, rows  # the chatter's rows merged into a few gap rows
    assert kept_bytes < 20_000
    metrics = httpx.get(f"http://{compacting.metrics}/metrics").text
    assert _value(metrics, "hypocenter_compacted_lines_total") == merged
    # and the stream still counts every line it had: coverage is the same as before compaction
    with compacting.client() as client:
        again = client.post(f"/v1/attempts/{expected['attempt']['workload_id']}/0/analyze").json()
    (cov,) = [c for c in again["coverage"] if c["source"].endswith("nccl-debug.log")]
    assert cov["observations"] == lines and cov["status"] == "ok"
    assert again["id"] == expected["id"]


def _settle(store: Path | str) -> None:
    """Wait until compaction has looked at every line and merged every blanked one."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with sqlite3.connect(str(store)) as db:
            left = db.execute(
                "SELECT COUNT(*) FROM log_entries WHERE kind = 'text' AND (compacted = 0"
                " OR compacted = 2 AND line IS NOT NULL)"
            ).fetchone()[0]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"compaction did not settle: {left} line(s) left")


def _value(metrics: str, name: str, labels: str = "") -> float:
    for line in metrics.splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not in /metrics")


# ------------------------------------------------------------------------------------- hang trigger


def _post(client: httpx.Client, workload: str, lines: list[str], attrs: dict[str, str] | None = None) -> None:
    start = 1_793_000_000_000_000_000
    records = [
        {
            "timeUnixNano": str(start + i * 1_000_000_000),
            "body": {"stringValue": line},
            "attributes": [
                {"key": "log.file.path", "value": {"stringValue": "/var/log/train.log"}},
                {"key": "log.file.record_number", "value": {"intValue": str(i + 1)}},
                *({"key": k, "value": {"stringValue": v}} for k, v in (attrs or {}).items()),
            ],
        }
        for i, line in enumerate(lines)
    ]
    doc = {
        "resourceLogs": [
            {
                "resource": {
                    "attributes": [
                        {"key": "slurm.job.id", "value": {"stringValue": workload}},
                        {"key": "host.name", "value": {"stringValue": "gpu07"}},
                    ]
                },
                "scopeLogs": [{"logRecords": records}],
            }
        ]
    }
    r = client.post("/v1/logs", content=json.dumps(doc), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def _diagnoses(client: httpx.Client, workload: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = client.get("/v1/diagnoses", params={"workload": workload}).json()[
        "diagnoses"
    ]
    return rows


def test_a_hanging_job_gets_a_provisional_diagnosis_long_before_the_idle_timeout(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "store.db", "--idle-timeout-s", "600", "--settle-s", "1").start()
    try:
        with srv.client() as client:
            _post(
                client,
                "5501",
                [
                    "2026-10-26T09:30:00Z [rank3]: step 100 loss 2.1",
                    "2026-10-26T09:33:20Z [rank3]:[E1026 09:33:20.000000000 ProcessGroupNCCL.cpp:616] "
                    "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                    "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
                    "600020 milliseconds before timing out.",
                ],
            )
            _post(client, "5502", ["2026-10-26T09:30:00Z [rank3]: step 100 loss 2.1"])  # healthy, just quiet
            deadline = time.monotonic() + 20
            rows: list[dict[str, object]] = []
            while time.monotonic() < deadline and not rows:
                rows = _diagnoses(client, "5501")
                time.sleep(0.1)
            assert rows and rows[0]["provisional"] is True
            assert (
                _diagnoses(client, "5502") == []
            )  # no timeout seen: waits for its terminal state or the idle timeout
            metrics = httpx.get(f"http://{srv.metrics}/metrics").text
            assert _value(metrics, "hypocenter_extracted_events_total", '{kind="watchdog_timeout"}') == 1
            _post(client, "5501", ["job ended"], {"hypocenter.attempt.state": "FAILED"})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and rows[0]["provisional"] is not False:
                rows = _diagnoses(client, "5501")
                time.sleep(0.1)
            assert rows[0]["provisional"] is False
    finally:
        srv.stop()
