"""What connectors hand to the engine: text streams, metric series and scheduler records.

A connector (local files, Loki, Prometheus, Slurm, Kubernetes …) turns whatever it reads into
these three shapes and a coverage entry per source. The engine never sees a connector type, and
connectors never see the engine: what the rules read reaches them as `RuleQueries`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from hypocenter.errors import HypocenterError
from hypocenter.model import AttemptContext, Coverage, SourceKind


@dataclass(slots=True)
class TextSource:
    """A stream of raw log text, as written on a node (`node` set) or by the job (`node` None)."""

    name: str
    text: str | bytes  # bytes are scanned as they are; undecodable bytes are replaced line by line
    node: str | None = None
    source: SourceKind | None = None  # None: decided line by line from content


class NotText(HypocenterError):
    """Raised by a FileTextSource's pieces when reading them to the end finds that the file is not
    text the engine can use after all (gzip data damaged near its end, a read that fails part way):
    the engine drops what it found in the pieces before (the file counts as never read)."""


class FileTextSource(TextSource):
    """A TextSource whose text is read when the engine asks for it and not kept: a bundle's files are
    then in memory one at a time, however many there are. `read` returns the text as UTF-8 bytes;
    `chunks`, when given, the same bytes as a stream of pieces that each end with a whole line
    (but the last), so that a file is never in memory whole (the engine prefers it). Either may raise
    `NotText` once it has read the file to the end."""

    __slots__ = ("_chunks", "_read", "facts", "nbytes", "newlines")

    def __init__(
        self,
        name: str,
        read: Callable[[], bytes],
        node: str | None = None,
        source: SourceKind | None = None,
        *,
        newlines: int | None = None,
        chunks: Callable[[], Iterable[bytes]] | None = None,
        nbytes: int | None = None,
    ) -> None:
        self.name = name
        self.node = node
        self.source = source
        self._read = read
        self._chunks = chunks
        self.newlines = newlines  # counted when the file was first read, if it was
        self.nbytes = nbytes  # its size, when known: how the engine spreads files over processes
        # What its reader learned while reading it, for the connector (a bundle's coverage of a file
        # read once): opaque to the engine, which carries it back from a forked extraction.
        self.facts: object = None

    @property
    def text(self) -> bytes:
        return self._read()

    @text.setter
    def text(self, value: str | bytes) -> None:
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        self._read = lambda: data
        self._chunks = None

    def chunks(self) -> Iterable[bytes]:
        """The text in line-aligned pieces (one piece when the reader gives no stream)."""
        return self._chunks() if self._chunks is not None else (self._read(),)

    def __repr__(self) -> str:
        return f"FileTextSource(name={self.name!r}, node={self.node!r})"


def text_lines(src: TextSource) -> Iterator[str]:
    """A source's text split at every "\\n" (`split_lines`); a file's read in its pieces, never whole."""
    return split_lines(src.chunks() if isinstance(src, FileTextSource) else (src.text,))


SPLIT_BYTES = 1 << 20


def split_lines(pieces: Iterable[str | bytes], errors: str = "replace") -> Iterator[str]:
    """The text of `pieces` laid end to end, split at every "\\n": what `text.split("\\n")` gives,
    the empty string after a final newline included. Bytes are decoded as UTF-8 with `errors`, about
    SPLIT_BYTES at a time, cut after a newline (pieces cut so, as a file's are, decode as the whole
    text would), so that a large piece is never held again decoded and split whole."""
    tail: str | None = None
    for part in (part for piece in pieces for part in _parts(piece)):
        lines = (part.decode("utf-8", errors) if isinstance(part, bytes) else part).split("\n")
        if tail is not None:
            lines[0] = tail + lines[0]
        tail = lines.pop()
        yield from lines
    yield tail or ""


def _parts(piece: str | bytes) -> Iterator[str | bytes]:
    """A piece of bytes in parts of about SPLIT_BYTES, each cut after a newline."""
    if isinstance(piece, str) or len(piece) <= SPLIT_BYTES:
        yield piece
        return
    start = 0
    while start < len(piece):
        end = piece.find(b"\n", start + SPLIT_BYTES) + 1 or len(piece)
        yield piece[start:end]
        start = end


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


@dataclass
class AttemptInput:
    """One attempt as the engine takes it (`Engine.analyze`): its scope, its evidence, what was read.

    Made from a bundle directory (collector/bundle.py `load_bundle`, a `Bundle`), a pull
    (collector/pull.py `gather`) or the server's store (server/attempts.py `assemble`).
    """

    context: AttemptContext
    sources: list[Source] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the person: "attempt 2 of 3", "window ends now"


@dataclass(frozen=True)
class RuleQueries:
    """What the rules read, so that pull connectors ask their backends for that and no more.

    The engine computes it (`Ruleset.queries()`); connectors are handed it and never import the engine.
    """

    tokens: tuple[str, ...] = ()
    """Every extraction token (the engine's prefilter), sorted."""
    context_tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """token → (lines before, lines after) for the tokens whose rules read context lines."""
    metrics: tuple[str, ...] = ()
    """The metric names the metric rules read, sorted."""
    node_labels: tuple[str, ...] = ()
    """The labels those rules take a node from, in the rules' order."""
