"""Retention takes a stream's state (record-number ranges, version) with the stream: an attempt's
streams when the attempt goes, a node's stream once all its lines went. A stream with lines left
keeps its state, so a retry of stored records is still recognised."""

from __future__ import annotations

import time
from collections.abc import Callable

from interleave_support import EXTRACTOR

from hypocenter.server.arrival import Arrival
from hypocenter.store.base import Entry, Retention, Store
from hypocenter.store.sql import sql
from tests.store.test_contract import open_url, pg_schema  # noqa: F401  (fixtures)

T0 = 1_793_613_600_000_000_000


def _lines(workload: str | None, node: str, stream: str, n: int) -> list[Entry]:
    return [
        Entry(workload, 0, node, stream, "text", f"line {i}", T0 + i, i + 1, f"{workload}{node}{stream}{i}")
        for i in range(n)
    ]


def _states(store: Store) -> list[tuple[str, str]]:
    return sorted((r[0], r[1]) for r in store._tuples(sql("SELECT workload, stream FROM stream_state")))  # type: ignore[attr-defined]


def test_retention_takes_a_stream_state_with_its_stream(open_url: Callable[[], Store]) -> None:  # noqa: F811
    store = open_url()
    arrival = Arrival(EXTRACTOR)
    old = time.time() - 40 * 86400
    for workload, node, stream, when in (
        ("job-old", "n1", "app", old),
        (None, "n1", "kern-old", old),
        (None, "n2", "kern-new", time.time()),
    ):
        reduced = arrival.split(store, _lines(workload, node, stream, 5), when)
        store.ingest(reduced.rest, [], when, (), reduced.writes)
    assert _states(store) == [("", "kern-new"), ("", "kern-old"), ("job-old", "app")]
    store.sweep(time.time(), Retention(max_age_s=7 * 86400))
    assert _states(store) == [("", "kern-new")]
    # the stream left keeps its ranges: its records sent again are not stored again
    before = store._tuples(sql("SELECT COUNT(*) FROM log_entries"))[0][0]  # type: ignore[attr-defined]
    reduced = arrival.split(store, _lines(None, "n2", "kern-new", 5), time.time())
    store.ingest(reduced.rest, [], time.time(), (), reduced.writes)
    assert store._tuples(sql("SELECT COUNT(*) FROM log_entries"))[0][0] == before  # type: ignore[attr-defined]
