"""Bounds on label values that clients choose: `cluster` becomes a Prometheus series and a Loki
stream label, and a client can send any number of distinct ones, of any length.

    bounded(value)            a value of at most LABEL_MAX_CHARS characters: a longer one is cut
                              and ends with `~` and 8 hex digits of its SHA-256, so that two long
                              values stay two series, each of a bounded size

    LabelLimit(max_values)    the first `max_values` distinct values of each label are exported as
                              themselves, every later one as "other"; `folded` counts, per label,
                              the diagnoses exported under "other" (hypocenter_label_values_folded_total).

One instance per process is shared by /metrics and the Loki exporter, so a value is folded the
same way in both. Node and component labels are already bounded per cluster (`metrics_top_n`).
This module only decides names; it knows no wire format.
"""

from __future__ import annotations

import hashlib
import threading
from collections import defaultdict

OTHER = "other"
LABEL_MAX_CHARS = 128


def bounded(value: str, limit: int = LABEL_MAX_CHARS) -> str:
    """`value`, or its first characters and a short hash of the whole when it is over `limit`."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{value[: limit - 9]}~{digest}"


class LabelLimit:
    def __init__(self, max_values: int = 100) -> None:
        self.max_values = max_values
        self._kept: dict[str, set[str]] = defaultdict(set)
        self._folded: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def value(self, label: str, value: str, *, count: bool = False) -> str:
        """The value to export for `label` (`bounded` in length); `count` one fold in `folded` (once per
        diagnosis, not per scrape)."""
        value = bounded(value)
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
