"""Bounds on label values that clients choose: `cluster` becomes a Prometheus series and a Loki
stream label, and a client can send any number of distinct ones.

    LabelLimit(max_values)    the first `max_values` distinct values of each label are exported as
                              themselves, every later one as "other"; `folded` counts, per label,
                              the diagnoses exported under "other" (hypocenter_label_values_folded_total).

One instance per process is shared by /metrics and the Loki exporter, so a value is folded the
same way in both. Node and component labels are already bounded per cluster (`metrics_top_n`).
This module only decides names; it knows no wire format.
"""

from __future__ import annotations

import threading
from collections import defaultdict

OTHER = "other"


class LabelLimit:
    def __init__(self, max_values: int = 100) -> None:
        self.max_values = max_values
        self._kept: dict[str, set[str]] = defaultdict(set)
        self._folded: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def value(self, label: str, value: str, *, count: bool = False) -> str:
        """The value to export for `label`; `count` one fold in `folded` (once per diagnosis, not per scrape)."""
        if not value or value == OTHER:
            return value
        with self._lock:
            kept = self._kept[label]
            if value in kept:
                return value
            if len(kept) < self.max_values:
                kept.add(value)
                return value
            if count:
                self._folded[label] += 1
            return OTHER

    def folded(self) -> dict[str, int]:
        with self._lock:
            return dict(self._folded)
