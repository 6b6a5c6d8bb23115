"""Prometheus /metrics: the families and their bounds, exemplars, `promtool check metrics` on a real
scrape, and a real Prometheus (Debian package) scraping a running hypocenter."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_families
from prometheus_support import PrometheusProcess, needs_prometheus, needs_promtool, promtool
from server_support import EXAMPLES, ServerProcess, analyze, replay, wait_for_diagnosis

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.prometheus import HypocenterCollector, MetricsEndpoint, top_n
from hypocenter.model import Diagnosis
from hypocenter.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow

NVLINK = next(p for p in EXAMPLES if p.name == "nvlink-xid149")
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}


def store_diagnosis(store: SQLiteStore, doc: dict[str, Any], *, provisional: bool = False) -> None:
    """Store a diagnosis document the way the server does (its summary columns derived from it)."""
    a = doc["attempt"]
    store.set_context(a["workload_id"], a["attempt"], {"workload": {"id": a["workload_id"]}}, time.time())
    row = store.attempt(a["workload_id"], a["attempt"])
    assert row is not None
    store.put_diagnosis(row.id, json.dumps(doc), diagnosis_summary(doc), provisional, time.time())


def diagnosis_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The summary columns the server derives from a diagnosis document."""
    a, rc = doc["attempt"], doc["root_cause"] or {}
    culprits = sorted({*rc.get("nodes", []), *(n for c in doc["candidates"] for n in c["nodes"])})
    return {
        "id": doc["id"],
        "workload": a["workload_id"],
        "attempt": a["attempt"],
        "cluster": a["cluster"],
        "outcome": doc["outcome"],
        "domain": rc.get("domain"),
        "subdomain": rc.get("subdomain"),
        "terminal_state": doc["terminal_state"],
        "window_start_ns": 1,
        "window_end_ns": 2,
        "culprits": culprits,
        "affected": doc["affected_nodes"],
    }


def variant(base: dict[str, Any], ident: str, node: str, gpu: str, cluster: str = "eos") -> dict[str, Any]:
    d = copy.deepcopy(base)
    d["id"] = ident
    d["attempt"]["workload_id"] = ident
    d["attempt"]["cluster"] = cluster
    d["root_cause"]["nodes"] = [node]
    d["root_cause"]["components"] = [{"node": node, "kind": "gpu", "id": gpu}]
    return d


@pytest.fixture(scope="module")
def nvlink_doc() -> dict[str, Any]:
    return analyze(NVLINK)


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_collector_counts_and_bounds_culprits(nvlink_doc: dict[str, Any]) -> None:
    store = SQLiteStore(":memory:")
    activity = Activity()
    nodes = ["n1", "n1", "n1", "n2", "n2", "n3", "n4", "n5"]
    for i, node in enumerate(nodes):
        doc = variant(nvlink_doc, f"dx-{i:02d}", node, "0000:3b:00")
        store_diagnosis(store, doc)
        activity.analysed(Diagnosis.model_validate(doc), False, 0.02 * (i + 1))
    # analysed again with the same verdict (an explicit trigger racing the settle timer): timed, not recounted
    activity.analysed(Diagnosis.model_validate(variant(nvlink_doc, "dx-00", "n1", "0000:3b:00")), False, 0.01)
    store_diagnosis(store, variant(nvlink_doc, "dx-prov", "n9", "gpu0"), provisional=True)
    activity.analysed(Diagnosis.model_validate(variant(nvlink_doc, "dx-prov", "n9", "gpu0")), True, 0.5)
    activity.ingested("logs", "otlp_grpc", 10, 1000, {"no_node_or_workload": 2})
    activity.refused("logs", "otlp_http", "malformed")
    endpoint = MetricsEndpoint(HypocenterCollector(activity, store, exporters=("loki",), top=2))
    address = endpoint.start("127.0.0.1:0")
    try:
        r = httpx.get(f"http://{address}/metrics", headers=OPENMETRICS)
    finally:
        endpoint.stop()
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    fam = _families(r.text)
    for f in fam.values():  # Prometheus owns these target labels: a clash would rename ours exported_*
        for s in f.samples:
            assert not {"job", "instance"} & set(s.labels), s
    nodes_series = {s.labels["node"]: s.value for s in fam["hypocenter_recent_node_root_causes"].samples}
    assert nodes_series == {"n1": 3, "n2": 2, "other": 3}  # top 2, the rest summed; provisional ones left out
    comps = {
        (s.labels["node"], s.labels["component"]): s.value
        for s in fam["hypocenter_recent_component_root_causes"].samples
    }
    assert comps == {("n1", "0000:3b:00"): 3, ("n2", "0000:3b:00"): 2, ("other", "other"): 3}
    totals = [s for s in fam["hypocenter_diagnoses"].samples if s.name == "hypocenter_diagnoses_total"]
    # Every verdict of a cluster with diagnoses is there from 0, so increase() sees its first one.
    assert {
        (s.labels["outcome"], s.labels["subdomain"])
        for s in totals
        if s.labels["cluster"] == "eos" and s.value == 0
    } >= {("unattributed", ""), ("attributed", "gpu_memory"), ("ambiguous", "")}
    (diag,) = [s for s in totals if s.value > 0]
    assert diag.labels == {
        "cluster": "eos",
        "outcome": "attributed",
        "domain": "hardware",
        "subdomain": "nvlink",
    }
    assert diag.value == 8 and diag.exemplar is not None and diag.exemplar.labels == {"diagnosis_id": "dx-07"}
    assert [
        s.value for s in fam["hypocenter_provisional_diagnoses"].samples if s.name.endswith("_total")
    ] == [1]
    lat = fam["hypocenter_analysis_duration_seconds"]
    count = next(s.value for s in lat.samples if s.name.endswith("_count"))
    assert count == 10
    assert any(s.exemplar is not None and s.exemplar.labels["diagnosis_id"] == "dx-prov" for s in lat.samples)
    recent = fam["hypocenter_recent_diagnoses"].samples
    assert [(s.labels["subdomain"], s.value) for s in recent] == [("nvlink", 8)]
    rejected = fam["hypocenter_rejected_records"].samples
    assert [(s.labels, s.value) for s in rejected if s.name.endswith("_total")] == [
        ({"signal": "logs", "reason": "no_node_or_workload"}, 2)
    ]
    pending = {s.labels["exporter"]: s.value for s in fam["hypocenter_export_pending"].samples}
    assert pending == {"loki": 0}
    assert next(iter(fam["hypocenter_store_up"].samples)).value == 1


def test_top_n_is_deterministic_and_keeps_cluster_totals() -> None:
    from collections import Counter

    counts = Counter({("a", "x"): 2, ("a", "y"): 2, ("b", "z"): 2, ("b", "w"): 1})
    assert top_n(counts, 2) == [(("a", "x"), 2), (("a", "y"), 2), (("b", "other"), 3)]
    assert top_n(Counter(), 3) == []


def test_a_failing_store_fails_no_scrape() -> None:
    store = SQLiteStore(":memory:")
    store.close()
    collector = HypocenterCollector(Activity(), store)
    names = {m.name: m for m in collector.collect()}
    assert names["hypocenter_store_up"].samples[0].value == 0
    assert "hypocenter_diagnoses" in names


# ---------------------------------------------------------------------------------------------- a real scrape


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("metrics") / "store.db").start()
    try:
        r = replay(NVLINK, srv.http, "--http")
        assert r.returncode == 0, r.stderr
        with srv.client() as client:
            wait_for_diagnosis(client, "81234")
            client.post("/v1/logs", content=b"{not json", headers={"Content-Type": "application/json"})
        yield srv
    finally:
        srv.stop()


def test_scrape_has_the_attempt_and_the_ingest(server: ServerProcess) -> None:
    text = httpx.get(f"http://{server.metrics}/metrics", timeout=10).text
    fam = {f.name: f for f in text_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fam.values() for s in f.samples}
    key = (
        "hypocenter_diagnoses_total",
        (("cluster", "eos"), ("domain", "hardware"), ("outcome", "attributed"), ("subdomain", "nvlink")),
    )
    assert samples[key] == 1
    assert samples[("hypocenter_ingest_records_total", (("signal", "logs"), ("source", "otlp_http")))] > 0
    assert samples[("hypocenter_ingest_bytes_total", (("signal", "metrics"), ("source", "otlp_http")))] > 0
    assert (
        samples[
            (
                "hypocenter_refused_requests_total",
                (("reason", "malformed"), ("signal", "logs"), ("source", "otlp_http")),
            )
        ]
        == 1
    )
    assert samples[("hypocenter_recent_node_root_causes", (("cluster", "eos"), ("node", "node02")))] == 1
    om = httpx.get(f"http://{server.metrics}/metrics", headers=OPENMETRICS, timeout=10).text
    assert om.rstrip().endswith("# EOF") and '# {diagnosis_id="dx-' in om


@needs_promtool
def test_promtool_check_metrics_is_clean(server: ServerProcess) -> None:
    text = httpx.get(f"http://{server.metrics}/metrics", timeout=10).text
    r = promtool("check", "metrics", stdin=text)
    # GPU-hours are the unit of lost capacity operators and the literature report (not a duration):
    # promtool's name lint reads `_hours` as time. That one finding on those families is deliberate.
    rest = [
        line
        for line in (r.stdout + r.stderr).splitlines()
        if not re.fullmatch(
            r'hypocenter_\w*gpu_hours_lost\w* use base unit "seconds" instead of "hours"', line
        )
    ]
    assert r.returncode in (0, 3) and not rest, r.stdout + r.stderr


@needs_prometheus
def test_real_prometheus_scrapes_hypocenter(server: ServerProcess, tmp_path: Path) -> None:
    prom = PrometheusProcess(tmp_path, [server.metrics]).start()
    try:
        result = prom.wait_for('hypocenter_diagnoses_total{outcome="attributed"} > 0')
        (series,) = result
        labels = series["metric"]
        assert labels["job"] == "hypocenter" and labels["instance"] == server.metrics
        assert {labels[k] for k in ("cluster", "domain", "subdomain")} == {"eos", "hardware", "nvlink"}
        assert float(series["value"][1]) == 1
        assert prom.query('{__name__=~"hypocenter_.+", exported_job!=""}') == []
        nodes = prom.query('max without (instance) (hypocenter_recent_node_root_causes{node!="other"}) >= 1')
        assert [s["metric"]["node"] for s in nodes] == ["node02"]
        ex = httpx.get(
            f"{prom.url}/api/v1/query_exemplars",
            params={
                "query": "hypocenter_diagnoses_total",
                "start": time.time() - 600,
                "end": time.time() + 60,
            },
            timeout=10,
        ).json()
        ids = {e["labels"]["diagnosis_id"] for s in ex["data"] for e in s["exemplars"]}
        assert ids and all(i.startswith("dx-") for i in ids)
    finally:
        prom.stop()
