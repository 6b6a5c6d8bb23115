"""How pull connectors put an attempt's nodes and window to a backend that speaks RE2 label
regexes (Loki, Prometheus): which names match a node, and how far around the window to look."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from hypocenter.config import Settings

# The server joins node streams this long before / after an attempt's window (config.py); pull the same.
NODE_LOOKBACK_S = float(Settings.model_fields["node_lookback_s"].default)
NODE_SLACK_S = float(Settings.model_fields["node_slack_s"].default)
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def re2_escape(text: str) -> str:
    """Quote RE2 metacharacters (Go's regexp.QuoteMeta); everything else stands for itself."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def node_regex(nodes: Sequence[str]) -> str:
    """A label regex (Loki and Prometheus anchor it at both ends) for the nodes' names in any case,
    alone or followed by a domain (`node01.cluster.local`) or a port (`node01:9400`)."""
    return "(?i)(?:" + "|".join(re2_escape(n) for n in nodes) + ")(?:[.:].*)?"


def epoch_ns(dt: datetime) -> int:
    """An aware time as integer Unix nanoseconds, exactly (no float rounding)."""
    dt = dt.astimezone(timezone.utc)
    whole = int((dt.replace(microsecond=0) - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds())
    return whole * 1_000_000_000 + dt.microsecond * 1000
