"""`GET /readyz` answers from a snapshot of the store's counts: a probe runs no query over the log
table (only a trivial one proving the store answers), says how old its counts are (`stats_age_s`),
gets current counts once the snapshot is stale, and still answers 503 while the store is down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from own_postgres import OwnPostgres

from hypocenter.api.http import build_app
from hypocenter.config import Settings
from hypocenter.server.service import Attribution
from hypocenter.store import open_store
from hypocenter.store.base import Entry, Store
from hypocenter.store.sqlite import SQLiteStore
from hypocenter.store.stats import MAX_AGE_S, StatsCache

T0 = 1_793_000_000_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _settings(tmp: Path) -> Settings:
    return Settings(store=str(tmp / "store.db"))  # nothing listens: the app is called in-process


def _entries(n: int, start: int = 0) -> list[Entry]:
    return [
        Entry(
            workload="81234",
            attempt=0,
            node="node01",
            stream="logs/node01/train.log",
            kind="text",
            body=f"line {i}",
            time_ns=T0 + i * 1_000_000_000,
            line=i + 1,
            dedup=f"81234|node01|train|{i + 1}",
        )
        for i in range(start, start + n)
    ]


def _get(service: Attribution, path: str, times: int = 1) -> list[httpx.Response]:
    async def calls() -> list[httpx.Response]:
        app = build_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            return [await client.get(path) for _ in range(times)]

    return asyncio.run(calls())


@pytest.fixture()
def sqlite_service(tmp_path: Path) -> Iterator[tuple[Attribution, SQLiteStore, Clock]]:
    store = SQLiteStore(str(tmp_path / "store.db"))
    service = Attribution(_settings(tmp_path), store)
    clock = Clock()
    service.stats = StatsCache(store, clock=clock)
    yield service, store, clock
    store.close()


def test_a_probe_runs_no_count_over_the_store(sqlite_service: tuple[Attribution, SQLiteStore, Clock]) -> None:
    service, store, _ = sqlite_service
    store.ingest(_entries(50), [], time.time())
    assert _get(service, "/readyz")[0].json()["log_entries"] == 50  # the first ask of a process counts
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # every statement SQLite runs on the store's connection
    try:
        answers = _get(service, "/readyz", times=5)
    finally:
        store._db.set_trace_callback(None)
    assert [r.status_code for r in answers] == [200] * 5
    assert all(r.json()["log_entries"] == 50 and r.json()["status"] == "ready" for r in answers)
    counting = [s for s in statements if "COUNT(" in s.upper() or "SUM(" in s.upper()]
    assert statements and not counting, counting  # a trivial query each, no table read


def test_counts_become_current_once_the_snapshot_is_stale(
    sqlite_service: tuple[Attribution, SQLiteStore, Clock],
) -> None:
    service, store, clock = sqlite_service
    store.ingest(_entries(50), [], time.time())
    first = _get(service, "/readyz")[0].json()
    assert (first["log_entries"], first["stats_age_s"]) == (50, 0.0)
    store.ingest(_entries(30, start=50), [], time.time())
    clock.now += 1.5
    cached = _get(service, "/readyz")[0].json()
    assert (cached["log_entries"], cached["stats_age_s"]) == (50, 1.5)  # younger than MAX_AGE_S: as counted
    clock.now += MAX_AGE_S  # stale: the next probe has them recounted in the background
    deadline = time.monotonic() + 30
    seen: dict[str, object] = {}
    while time.monotonic() < deadline:
        seen = _get(service, "/readyz")[0].json()
        if seen["log_entries"] == 80:
            break
        time.sleep(0.02)
    assert seen["log_entries"] == 80 and seen["stats_age_s"] == 0.0, seen


def test_a_closed_store_is_not_ready(sqlite_service: tuple[Attribution, SQLiteStore, Clock]) -> None:
    service, store, _ = sqlite_service
    assert _get(service, "/readyz")[0].status_code == 200
    store.close()  # the snapshot is warm, but the store answers nothing now
    r = _get(service, "/readyz")[0]
    assert r.status_code == 503 and "store unavailable" in r.json()["detail"]


@pytest.mark.slow
def test_postgresql_down_is_not_ready_and_back_is(tmp_path: Path) -> None:
    pg = OwnPostgres().start()
    store: Store | None = None
    try:
        store = open_store(pg.url)
        service = Attribution(_settings(tmp_path), store)
        assert _get(service, "/readyz")[0].status_code == 200  # the snapshot is warm from here on
        pg.stop()
        down = _get(service, "/readyz")[0]
        assert down.status_code == 503 and "store unavailable" in down.json()["detail"], down.text
        pg.start()
        up = _get(service, "/readyz")[0]
        assert up.status_code == 200 and up.json()["status"] == "ready", up.text
    finally:
        if store is not None:
            store.close()
        pg.destroy()
