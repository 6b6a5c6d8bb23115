"""Diagnoses out to Loki and Grafana through the store's outbox: the wire formats (checked by fakes
that decode them as the APIs document), retries with back-off on transient failures, counted drops
of permanent ones, delivery after a restart, and analysis never waiting for an exporter. Real Loki /
Grafana tests run when LOKI_URL / GRAFANA_URL (and GRAFANA_TOKEN) are set."""

from __future__ import annotations

import json
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from loki_ingest import IngestLimits
from observability_fakes import FakeGrafana, FakeLoki
from prometheus_client import CollectorRegistry, generate_latest
from server_support import ServerProcess, replay, wait_for_diagnosis

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.grafana import GrafanaAnnotations, annotation
from hypocenter.exporter.loki import BACKDATE_S, LokiExporter, entry_time
from hypocenter.exporter.outbox import Backoff, ExportUnavailable, InMemoryExporter, Outbox
from hypocenter.exporter.prometheus import HypocenterCollector
from hypocenter.server.outputs import EXPORTERS
from hypocenter.store.memory import InMemoryDiagnoses, InMemoryExportQueue
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import NVLINK, diagnosis_summary, store_diagnosis, variant

pytestmark = pytest.mark.slow

FAST = Backoff(base_s=0.05, max_s=0.2)


def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    from server_support import analyze

    return analyze(NVLINK)


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki().start()
    yield fake
    fake.stop()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana(token="s3cret").start()
    yield fake
    fake.stop()


def outbox_for(
    store: SQLiteStore | InMemoryExportQueue, *exporters: Any, activity: Activity | None = None
) -> Outbox:
    store.exporters = tuple(e.name for e in exporters)
    box = Outbox(store, list(exporters), activity or Activity(), backoff=FAST, poll_s=0.05)
    box.start()
    return box


def analysed(diagnoses: InMemoryDiagnoses, doc: dict[str, Any]) -> None:
    """A diagnosis stored as the server stores it, in the in-memory double of the diagnoses and outbox roles
    (one attempt id per workload and attempt: the double keeps no attempt rows)."""
    attempt_id = zlib.crc32(f"{doc['attempt']['workload_id']}/{doc['attempt']['attempt']}".encode())
    diagnoses.put_diagnosis(attempt_id, json.dumps(doc), diagnosis_summary(doc), False, time.time())


def test_registry_is_complete() -> None:
    assert set(EXPORTERS) == {"loki", "grafana"}


def test_the_outbox_row_is_written_with_the_diagnosis(doc: dict[str, Any]) -> None:
    store = SQLiteStore(":memory:")
    store.exporters = ("loki", "grafana")
    store_diagnosis(store, doc)
    store_diagnosis(store, doc)  # re-analysed: queued again, once
    assert store.export_backlog().keys() == {"loki", "grafana"}
    assert {n for n, _ in store.export_backlog().values()} == {1}


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_loki_push_decodes_as_loki_documents_it(loki: FakeLoki, doc: dict[str, Any], encoding: str) -> None:
    store = SQLiteStore(":memory:")
    activity = Activity()
    box = outbox_for(store, LokiExporter(loki.url, encoding=encoding, tenant="team-a"), activity=activity)
    try:
        store_diagnosis(store, doc)
        box.wake()
        until(lambda: len(loki.entries) == 1 + len(doc["evidence"]))
    finally:
        box.close()
    head, *evidence = loki.entries
    assert head.labels == {
        "service_name": "hypocenter",
        "cluster": "eos",
        "outcome": "attributed",
        "domain": "hardware",
    }
    assert {e.labels == head.labels for e in evidence} == {True}
    assert head.metadata["record"] == "diagnosis" and head.metadata["diagnosis_id"] == doc["id"]
    assert head.metadata["workload_id"] == "81234" and head.metadata["attempt"] == "0"
    assert head.metadata["nodes"] == "node02" and head.metadata["rule"] == doc["root_cause"]["rule"]
    assert head.metadata["components"] == "node02/gpu/0000:3b:00"
    line = json.loads(head.line)
    assert line["summary"] == doc["root_cause"]["summary"] and line["diagnosis_id"] == doc["id"]
    row = store.get_diagnosis(doc["id"])
    assert row is not None
    created = int(row.created * 1e9)
    assert created - BACKDATE_S * 10**9 <= head.ts_ns <= created  # dated where Loki still takes it
    assert [e.ts_ns - head.ts_ns for e in evidence] == list(range(1, len(evidence) + 1))
    assert {e.metadata["record"] for e in evidence} == {"evidence"}
    assert sum(e.metadata["role"] == "root_cause" for e in evidence) >= 1
    assert loki.tenants == ["team-a"]
    assert store.export_backlog() == {}
    assert activity.snapshot().exported == {"loki": 1}


def test_transient_failures_are_retried_with_backoff(loki: FakeLoki, doc: dict[str, Any]) -> None:
    store = SQLiteStore(":memory:")
    activity = Activity()
    loki.fail_next([503, 429, 502], retry_after="0")
    box = outbox_for(store, LokiExporter(loki.url), activity=activity)
    try:
        store_diagnosis(store, doc)
        box.wake()
        until(lambda: bool(loki.entries))
    finally:
        box.close()
    assert len([e for e in loki.entries if e.metadata["record"] == "diagnosis"]) == 1
    snap = activity.snapshot()
    assert snap.export_failures == {("loki", "transient"): 3} and snap.exported == {"loki": 1}
    assert len(loki.behaviour.requests) == 4


def test_permanent_failures_are_counted_and_dropped_one_at_a_time(
    loki: FakeLoki, doc: dict[str, Any]
) -> None:
    diagnoses = InMemoryDiagnoses(exporters=("loki",))
    activity = Activity()
    exporter = LokiExporter(loki.url)
    for i in range(3):
        analysed(diagnoses, variant(doc, f"dx-{i}", f"n{i}", "gpu0"))
    loki.fail_next([400, 400])  # the batch of three, then the first of them alone
    box = outbox_for(diagnoses.exports, exporter, activity=activity)
    try:
        until(lambda: diagnoses.exports.export_backlog() == {})
    finally:
        box.close()
    delivered = {e.metadata["diagnosis_id"] for e in loki.entries if e.metadata["record"] == "diagnosis"}
    assert delivered == {"dx-1", "dx-2"}
    snap = activity.snapshot()
    assert snap.export_dropped == {("loki", "rejected"): 1}
    assert snap.export_failures == {("loki", "permanent"): 2} and snap.exported == {"loki": 2}


def test_a_diagnosis_delivered_late_is_not_refused_as_out_of_order(doc: dict[str, Any]) -> None:
    """Loki refuses an entry more than an hour behind its stream's newest, and in a request with
    several streams only the last one's refusal is answered. A diagnosis held back two hours (Loki
    down, back-off) goes to a stream that has newer entries since: it must still be taken."""
    loki = FakeLoki().start()
    store = SQLiteStore(":memory:")
    activity = Activity()
    box = outbox_for(store, LokiExporter(loki.url), activity=activity)
    try:
        store_diagnosis(store, variant(doc, "dx-new", "node02", "gpu0"))
        box.wake()
        until(lambda: store.export_backlog() == {})
        store_diagnosis(
            store, variant(doc, "dx-late", "node03", "gpu1")
        )  # same stream (cluster, outcome, domain)
        with store._tx() as db:  # analysed two hours ago, delivered only now
            db.execute("UPDATE diagnoses SET created = created - 7200 WHERE id = 'dx-late'")
        box.wake()
        until(lambda: store.export_backlog() == {})
    finally:
        box.close()
        loki.stop()
    heads = {e.metadata["diagnosis_id"]: e for e in loki.entries if e.metadata["record"] == "diagnosis"}
    assert set(heads) == {"dx-new", "dx-late"}, loki.pushes
    assert activity.snapshot().export_dropped == {}
    late = json.loads(heads["dx-late"].line)
    assert late["first_seen"] == doc["root_cause"]["first_seen"]  # the verdict keeps when it began
    assert heads["dx-new"].ts_ns - heads["dx-late"].ts_ns < 3600 * 10**9


def test_entry_times_stay_within_lokis_window_and_repeat_on_a_quick_retry() -> None:
    hour, minute = 3600 * 10**9, 60 * 10**9
    created = 100 * hour
    assert entry_time(created - 30 * minute, created, created) == created - 30 * minute  # where it began
    assert entry_time(0, created, created) == created - 50 * minute  # never more than 50 min before storing
    late = entry_time(0, created, created + 2 * hour)
    assert created + 2 * hour - 55 * minute <= late <= created + 2 * hour
    assert entry_time(0, created, created + 2 * hour + minute) == late  # a retry a minute later: same entry


def test_lokis_final_refusals_are_dropped_by_reason_not_retried(doc: dict[str, Any]) -> None:
    """A Loki that keeps only the last 10 minutes refuses every diagnosis entry as too old (400):
    dropped at once, counted as too_old in /metrics, not retried."""
    loki = FakeLoki(limits=IngestLimits(reject_old_samples_max_age_s=600)).start()
    store = SQLiteStore(":memory:")
    activity = Activity()
    box = outbox_for(store, LokiExporter(loki.url), activity=activity)
    try:
        store_diagnosis(store, doc)
        box.wake()
        until(lambda: store.export_backlog() == {})
        time.sleep(0.3)  # several back-off periods: nothing is sent again
    finally:
        box.close()
        loki.stop()
    assert [status for status, _ in loki.pushes] == [400] and "has timestamp too old" in loki.pushes[0][1]
    assert activity.snapshot().export_dropped == {("loki", "too_old"): 1}
    registry = CollectorRegistry()
    registry.register(HypocenterCollector(activity, store, exporters=["loki"]))
    assert (
        'hypocenter_export_dropped_total{exporter="loki",reason="too_old"} 1.0'
        in generate_latest(registry).decode()
    )


def test_unreachable_loki_keeps_the_rows_and_a_restart_delivers_them(
    tmp_path: Path, loki: FakeLoki, doc: dict[str, Any]
) -> None:
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    dead = FakeLoki()
    dead_url = dead.url
    dead.httpd.server_close()  # nothing listens there any more: connection refused
    activity = Activity()
    box = outbox_for(store, LokiExporter(dead_url, timeout_s=1.0), activity=activity)
    try:
        store_diagnosis(store, doc)
        box.wake()
        until(lambda: activity.snapshot().export_failures.get(("loki", "transient"), 0) >= 2)
    finally:
        box.close()
    assert store.export_backlog()["loki"][0] == 1
    store.close()
    store = SQLiteStore(db)  # the next start, with Loki back
    box = outbox_for(store, LokiExporter(loki.url))
    try:
        until(lambda: bool(loki.entries))
    finally:
        box.close()
    assert store.export_backlog() == {}


def test_superseded_and_expired_rows_are_dropped_not_sent(doc: dict[str, Any]) -> None:
    diagnoses = InMemoryDiagnoses(exporters=("memory",))
    analysed(diagnoses, doc)
    analysed(diagnoses, variant(doc, "dx-old", "n1", "gpu0"))
    newer = {**doc, "id": "dx-reanalysed"}
    analysed(diagnoses, newer)  # the attempt re-analysed before delivery: its first diagnosis is superseded
    for row in diagnoses.exports.rows.values():
        if row.diagnosis_id == "dx-old":
            row.created -= 1e6  # stored long ago, never delivered
    memory = InMemoryExporter()
    activity = Activity()
    box = Outbox(diagnoses.exports, [memory], activity, max_age_s=3600)
    assert box.deliver(memory)
    assert [r.id for r in memory.sent] == ["dx-reanalysed"] and diagnoses.exports.export_backlog() == {}
    assert activity.snapshot().export_dropped == {("memory", "superseded"): 1, ("memory", "expired"): 1}


def test_an_exporter_bug_is_retried_not_raised(doc: dict[str, Any]) -> None:
    diagnoses = InMemoryDiagnoses(exporters=("memory",))
    memory = InMemoryExporter(fail_with=[RuntimeError("boom"), ExportUnavailable("later")])
    activity = Activity()
    analysed(diagnoses, doc)
    box = Outbox(diagnoses.exports, [memory], activity, backoff=Backoff(base_s=0.0, max_s=0.0))
    for _ in range(3):
        box.deliver(memory)
    assert [r.id for r in memory.sent] == [doc["id"]]
    assert activity.snapshot().export_failures == {("memory", "transient"): 2}


def test_grafana_annotation_shape_auth_and_failures(grafana: FakeGrafana, doc: dict[str, Any]) -> None:
    diagnoses = InMemoryDiagnoses(exporters=("grafana",))
    activity = Activity()
    analysed(diagnoses, doc)
    analysed(diagnoses, variant(doc, "dx-bad", "n1", "gpu0"))
    grafana.fail_next([401])  # a wrong token is an operator's to fix: kept and retried
    box = outbox_for(diagnoses.exports, GrafanaAnnotations(grafana.url, token="s3cret"), activity=activity)
    try:
        until(lambda: len(grafana.annotations) == 2)
    finally:
        box.close()
    ann = next(a for a in grafana.annotations if doc["id"] in a["text"])
    rc = doc["root_cause"]
    assert ann["time"] == int(datetime.fromisoformat(rc["first_seen"]).timestamp() * 1000)
    assert ann["timeEnd"] >= ann["time"]
    assert {"hypocenter", "cluster:eos", "domain:hardware", "node:node02", "workload:81234"} <= set(
        ann["tags"]
    )
    assert "hardware/nvlink on node02" in ann["text"] and "RESET_GPU" in ann["text"]
    assert "dashboardUID" not in ann
    assert activity.snapshot().export_failures == {("grafana", "transient"): 1}
    row = diagnoses.get_diagnosis(doc["id"])
    assert row is not None and annotation(row, "hypocenter-attempt")["dashboardUID"] == "hypocenter-attempt"


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "grafana-token"
    path.write_text("t\n")
    return path


def test_server_never_waits_for_exporters(tmp_path: Path) -> None:
    """A server whose Loki answers 503 and whose Grafana stalls: the diagnosis is there at once,
    /metrics shows the backlog, and both deliveries happen once the receivers recover."""
    loki, grafana = FakeLoki().start(), FakeGrafana(token="t").start()
    loki.fail_next([503] * 1000)
    grafana.behaviour.stall_s = 3.0
    srv = ServerProcess(
        tmp_path / "s.db",
        "--loki-url",
        loki.url,
        "--grafana-url",
        grafana.url,
        "--grafana-token-file",
        str(_token_file(tmp_path)),
        "--export-timeout-s",
        "0.5",
        "--export-retry-max-s",
        "0.3",
    ).start()
    try:
        assert replay(NVLINK, srv.http, "--http").returncode == 0
        with srv.client() as client:  # while Loki refuses and Grafana stalls
            d = wait_for_diagnosis(client, "81234")
        metrics = httpx.get(f"http://{srv.metrics}/metrics", timeout=10).text
        assert 'hypocenter_export_pending{exporter="loki"} 1.0' in metrics
        with loki.behaviour.lock:
            loki.behaviour.statuses.clear()
        grafana.behaviour.stall_s = 0.0
        until(lambda: bool(loki.entries) and bool(grafana.annotations), timeout=30)
        assert loki.entries[0].metadata["diagnosis_id"] == d["id"]

        def delivered() -> bool:
            text = httpx.get(f"http://{srv.metrics}/metrics", timeout=10).text
            return (
                'hypocenter_exported_diagnoses_total{exporter="loki"} 1.0' in text
                and 'hypocenter_exported_diagnoses_total{exporter="grafana"} 1.0' in text
                and 'hypocenter_export_pending{exporter="loki"} 0.0' in text
            )

        until(delivered, timeout=30)
    finally:
        srv.stop()
        loki.stop()
        grafana.stop()


# ---------------------------------------------------------------------------------------------- real servers


@pytest.mark.skipif(not os.environ.get("LOKI_URL"), reason="set LOKI_URL to push to a real Loki")
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_real_loki_takes_the_push(doc: dict[str, Any], encoding: str) -> None:
    url = os.environ["LOKI_URL"].rstrip("/")
    ident = f"dx-test-{uuid.uuid4().hex[:12]}"
    store = SQLiteStore(":memory:")
    store_diagnosis(store, variant(doc, ident, "node02", "0000:3b:00", cluster="hypocenter-test"))
    row = store.get_diagnosis(ident)
    assert row is not None
    exporter = LokiExporter(url, encoding=encoding, tenant=os.environ.get("LOKI_TENANT", ""))
    try:
        exporter.send([row])
    finally:
        exporter.close()  # its connection pool: left open it is a ResourceWarning, an error here
    query = f'{{service_name="hypocenter", cluster="hypocenter-test"}} | diagnosis_id="{ident}"'
    headers = {"X-Loki-Response-Encoding-Flags": "categorize-labels"}
    if os.environ.get("LOKI_TENANT"):
        headers["X-Scope-OrgID"] = os.environ["LOKI_TENANT"]

    def found() -> bool:
        r = httpx.get(
            f"{url}/loki/api/v1/query_range",
            headers=headers,
            timeout=10,
            params={"query": query, "start": str(int((time.time() - 7200) * 1e9)), "limit": 200},
        )
        r.raise_for_status()
        values = [v for s in r.json()["data"]["result"] for v in s["values"]]
        return len(values) == 1 + len(doc["evidence"])

    until(found, timeout=30)


@pytest.mark.skipif(
    not (os.environ.get("GRAFANA_URL") and os.environ.get("GRAFANA_TOKEN")),
    reason="set GRAFANA_URL and GRAFANA_TOKEN to annotate a real Grafana",
)
def test_real_grafana_takes_the_annotation(doc: dict[str, Any]) -> None:
    url, token = os.environ["GRAFANA_URL"].rstrip("/"), os.environ["GRAFANA_TOKEN"]
    ident = f"dx-test-{uuid.uuid4().hex[:12]}"
    store = SQLiteStore(":memory:")
    store_diagnosis(store, variant(doc, ident, "node02", "0000:3b:00", cluster="hypocenter-test"))
    row = store.get_diagnosis(ident)
    assert row is not None
    GrafanaAnnotations(url, token=token).send([row])
    auth = {"Authorization": f"Bearer {token}"}
    found = httpx.get(
        f"{url}/api/annotations",
        headers=auth,
        timeout=10,
        params={"tags": ["hypocenter", f"workload:{ident}"], "limit": 10},
    ).json()
    assert [a for a in found if ident in a["text"]]
    for a in found:
        httpx.delete(f"{url}/api/annotations/{a['id']}", headers=auth, timeout=10)
