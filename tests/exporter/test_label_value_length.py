"""Client-chosen label values are bounded in length as well as in number.

A `cluster` (or node, or GPU id) of 100,000 characters used to become a Prometheus series and a Loki
stream label as sent: ten such diagnoses made every scrape megabytes. Now every such value is at most
LABEL_MAX_CHARS characters, a cut one ending in a short hash so that two values stay two series.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.cardinality import LABEL_MAX_CHARS, LabelLimit, bounded
from hypocenter.exporter.loki import diagnosis_entries
from hypocenter.exporter.prometheus import HypocenterCollector, MetricsEndpoint
from hypocenter.model import Diagnosis
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import NVLINK, analyze, store_diagnosis, variant


def _samples(text: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_long_cluster_and_node_values_cannot_bloat_metrics_or_loki() -> None:
    base = analyze(NVLINK)
    store = SQLiteStore(":memory:")
    activity = Activity(label_max_values=100)
    long_clusters = [f"c{i}-" + "x" * 100_000 for i in range(10)]
    for i, cluster in enumerate(long_clusters):
        doc = variant(base, f"dx-{i:02d}", f"n{i}-" + "y" * 50_000, "g" * 50_000, cluster=cluster)
        store_diagnosis(store, doc)
        activity.analysed(Diagnosis.model_validate(doc), False, 0.01)
    endpoint = MetricsEndpoint(HypocenterCollector(activity, store, top=5))
    address = endpoint.start("127.0.0.1:0")
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=30).text
    finally:
        endpoint.stop()
    assert len(text) < 200_000, f"a scrape of {len(text):,} bytes"
    values = [v for s in _samples(text) for v in s.labels.values()]
    assert values and max(len(v) for v in values) <= LABEL_MAX_CHARS
    clusters = {s.labels["cluster"] for s in _samples(text) if s.labels.get("cluster")}
    assert clusters == {bounded(c) for c in long_clusters}  # ten clusters stay ten series
    row = store.get_diagnosis("dx-03")
    assert row is not None
    labels, _ = diagnosis_entries(row, labels_limit=activity.labels)
    assert labels["cluster"] == bounded(long_clusters[3]) and len(labels["cluster"]) == LABEL_MAX_CHARS


def test_bounded_keeps_short_values_and_tells_long_ones_apart() -> None:
    assert bounded("eos") == "eos"
    assert bounded("a" * LABEL_MAX_CHARS) == "a" * LABEL_MAX_CHARS
    one, two = bounded("a" * 500 + "1"), bounded("a" * 500 + "2")
    assert len(one) == len(two) == LABEL_MAX_CHARS and one != two
    assert one.startswith("a" * (LABEL_MAX_CHARS - 9) + "~")
    limit = LabelLimit(1)
    assert limit.value("cluster", "a" * 1000) == bounded("a" * 1000)
    assert limit.value("cluster", "a" * 1000) == bounded("a" * 1000)  # the same value: kept, not folded
