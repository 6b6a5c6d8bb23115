"""The store's counts (`Store.stats`) kept as a snapshot that `GET /readyz` and the metrics scrape
answer from at once. Counting reads whole tables (a SUM over every log row), so it does not run on
a request: whoever asks after the snapshot is older than `max_age_s` starts one refresh in a worker
thread and gets the last snapshot meanwhile, with its age; only the first ask of a process waits for
a count. Each replica on a shared PostgreSQL counts the shared tables, so replicas agree to within
`max_age_s`. A snapshot outlives an outage: it says nothing of whether the store answers now
(`Store.ping` does), and a failed refresh keeps the last snapshot (the store logs its outages).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypocenter.store.base import Store

log = logging.getLogger(__name__)

MAX_AGE_S = 2.0
"""How old the counts may be before the next ask starts a recount."""


@dataclass(frozen=True)
class StatsSnapshot:
    """`Store.stats()` as counted `age_s` seconds ago (from when the count began)."""

    counts: dict[str, int]
    age_s: float


class StatsCache:
    """One `Store.stats()` snapshot per process, recounted off the caller's thread once stale."""

    def __init__(
        self, store: Store, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] | None = None
        self._taken = 0.0
        self._refreshing = False

    def read(self) -> StatsSnapshot:
        """The last snapshot at once (starting a recount if it is stale); the first ask counts."""
        with self._lock:
            counts, taken = self._counts, self._taken
            stale = counts is not None and self._clock() - taken >= self.max_age_s
            start = stale and not self._refreshing
            if start:
                self._refreshing = True
        if counts is None:
            counts, taken = self._count()
        elif start:
            threading.Thread(target=self._refresh, name="store-stats", daemon=True).start()
        return StatsSnapshot(dict(counts), max(0.0, self._clock() - taken))

    def _count(self) -> tuple[dict[str, int], float]:
        began = self._clock()
        counts = self.store.stats()
        with self._lock:
            if self._counts is None or began >= self._taken:
                self._counts, self._taken = counts, began
        return counts, began

    def _refresh(self) -> None:
        try:
            self._count()
        except Exception as exc:  # the store down or closed: keep the last snapshot, the next ask retries
            log.debug("store stats not refreshed: %s", exc)
        finally:
            with self._lock:
                self._refreshing = False
