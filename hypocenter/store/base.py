"""What the store takes in: OTLP records and samples, tagged with their node and workload.

The OTLP receiver (collector/otlp.py) produces these and the store keeps them; they live here,
below both, so that the store never imports the collector.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Entry:
    """One accepted log record, tagged: text (a log line) or doc (a structured document body)."""

    workload: str | None
    attempt: int
    node: str | None
    stream: str
    kind: str  # "text" (a log line) | "doc" (a structured document) | "state" (the terminal-state marker)
    body: str  # the line, or the document as canonical JSON
    time_ns: int
    line: int | None
    dedup: str
    scope: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Point:
    """One accepted metric sample, tagged like a log record."""

    workload: str | None
    attempt: int
    node: str | None
    source: str
    name: str
    labels: dict[str, str]
    time_ns: int
    value: float
    scope: dict[str, str] = field(default_factory=dict)
