"""Client-chosen label values are bounded: past `label_max_values` distinct clusters, a diagnosis is
exported under cluster="other" in /metrics and Loki, and hypocenter_label_values_folded_total counts it."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.cardinality import LabelLimit
from hypocenter.exporter.loki import diagnosis_entries
from hypocenter.exporter.prometheus import HypocenterCollector, MetricsEndpoint
from hypocenter.model import Diagnosis
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import NVLINK, analyze, store_diagnosis, variant


def _samples(text: str, family: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples]


def test_many_clusters_fold_into_other_and_are_counted() -> None:
    base = analyze(NVLINK)
    store = SQLiteStore(":memory:")
    activity = Activity(label_max_values=3)
    clusters = [f"c{i}" for i in range(50)]
    for i, cluster in enumerate(clusters):
        doc = variant(base, f"dx-{i:02d}", "node02", "0000:3b:00", cluster=cluster)
        store_diagnosis(store, doc)
        activity.analysed(Diagnosis.model_validate(doc), False, 0.01)
    endpoint = MetricsEndpoint(HypocenterCollector(activity, store, top=5))
    address = endpoint.start("127.0.0.1:0")
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=30).text
        text_again = httpx.get(f"http://{address}/metrics", timeout=30).text
    finally:
        endpoint.stop()
    for family in (
        "hypocenter_diagnoses",
        "hypocenter_recent_diagnoses",
        "hypocenter_recent_node_root_causes",
    ):
        seen = {s.labels["cluster"] for s in _samples(text, family) if "cluster" in s.labels}
        assert seen <= {"", "c0", "c1", "c2", "other"}, (family, seen)
        assert "other" in seen
    totals = {
        s.labels["cluster"]: s.value
        for s in _samples(text, "hypocenter_diagnoses")
        if s.name.endswith("_total")
        and s.labels["outcome"] == "attributed"
        and s.labels["subdomain"] == "nvlink"
    }
    assert totals["other"] == 47 and totals["c0"] == 1  # nothing lost: the rest summed under "other"
    folded = [s for s in _samples(text_again, "hypocenter_label_values_folded") if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in folded] == [
        ({"label": "cluster"}, 47.0)
    ]  # per diagnosis, not per scrape

    row = store.get_diagnosis("dx-49")
    assert row is not None
    labels, _ = diagnosis_entries(row, labels_limit=activity.labels)  # Loki: the same fold
    assert labels["cluster"] == "other"
    labels, _ = diagnosis_entries(store.get_diagnosis("dx-01"), labels_limit=activity.labels)  # type: ignore[arg-type]
    assert labels["cluster"] == "c1"


def test_the_limit_keeps_the_first_values_seen() -> None:
    limit = LabelLimit(2)
    assert [limit.value("cluster", v, count=True) for v in ("a", "b", "c", "a", "d", "", "other")] == [
        "a",
        "b",
        "other",
        "a",
        "other",
        "",
        "other",
    ]
    assert limit.folded() == {"cluster": 2}
