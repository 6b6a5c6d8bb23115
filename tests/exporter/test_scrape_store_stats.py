"""A /metrics scrape reads `hypocenter_attempts_open` from the store-count snapshot it shares with
`GET /readyz` (store/stats.py): once that snapshot is warm a scrape counts nothing over the log table,
and `hypocenter_store_up` still says whether the store answered the scrape."""

from __future__ import annotations

import time

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.prometheus import HypocenterCollector
from hypocenter.store.base import Entry
from hypocenter.store.sqlite import SQLiteStore
from hypocenter.store.stats import StatsCache

T0 = 1_793_000_000_000_000_000


def _value(collector: HypocenterCollector, name: str) -> float:
    return next(m for m in collector.collect() if m.name == name).samples[0].value


def test_a_scrape_reads_the_shared_snapshot() -> None:
    store = SQLiteStore(":memory:")
    one = Entry("81234", 0, "node01", "train.log", "text", "a line", T0, 1, "81234|node01|train.log|1")
    store.ingest([one], [], time.time())
    snapshot = StatsCache(store, clock=lambda: 0.0)  # never stale: only the first ask counts
    assert snapshot.read().counts["attempts_open"] == 1  # warm, as /readyz leaves it
    collector = HypocenterCollector(Activity(), store, stats=snapshot)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # every statement SQLite runs on the store's connection
    try:
        assert _value(collector, "hypocenter_attempts_open") == 1
        assert _value(collector, "hypocenter_store_up") == 1
    finally:
        store._db.set_trace_callback(None)
    assert not [s for s in statements if "FROM log_entries" in s], statements
    store.close()
    assert _value(collector, "hypocenter_store_up") == 0  # the snapshot hides no outage
