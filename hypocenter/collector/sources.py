"""What connectors hand to the engine: text streams, metric series and scheduler records.

A connector (local files, Loki, Prometheus, Slurm, Kubernetes …) turns whatever it reads into
these three shapes and a coverage entry per source. The engine never sees a connector type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from hypocenter.model import SourceKind


@dataclass(slots=True)
class TextSource:
    """A stream of raw log text, as written on a node (`node` set) or by the job (`node` None)."""

    name: str
    text: str | bytes  # bytes are scanned as they are; undecodable bytes are replaced line by line
    node: str | None = None
    source: SourceKind | None = None  # None: decided line by line from content


@dataclass(slots=True)
class Series:
    name: str
    labels: dict[str, str]
    samples: list[tuple[datetime, float]]


@dataclass(slots=True)
class MetricSource:
    name: str
    series: list[Series]


@dataclass(slots=True)
class Record:
    """One structured scheduler fact rendered as a canonical line (see scheduler_records)."""

    ref: str
    time: datetime | None
    node: str | None
    text: str


@dataclass(slots=True)
class RecordSource:
    name: str
    records: list[Record] = field(default_factory=list)


Source = TextSource | MetricSource | RecordSource
