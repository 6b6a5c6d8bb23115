"""The prefilter: where the rules' literal tokens occur in raw bytes, without a Python loop per line.

    TokenScanner(tokens).scan(data) → [(token index, start, end), …] ordered by start

Hyperscan where it is installed (Linux x86-64), else an `ahocorasick-rs` automaton; they may differ
in overlapping occurrences on a line, which no caller depends on.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from itertools import accumulate, count
from operator import add
from typing import Any

from ahocorasick_rs import BytesAhoCorasick

try:
    import hyperscan
except ImportError:  # not on this platform: the automaton
    hyperscan = None  # type: ignore[assignment]


class TokenScanner:
    """Every occurrence of any of `tokens` (literal, case-sensitive) in a byte string."""

    def __init__(self, tokens: Sequence[str]) -> None:
        literals = [t.encode() for t in tokens]
        self._lock = threading.Lock()  # one Hyperscan scratch space, used by one scan at a time
        self._db: Any = None
        self._ac: BytesAhoCorasick | None = None
        if not literals:
            return
        if hyperscan is not None:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(
                expressions=literals,
                ids=list(range(len(literals))),
                elements=len(literals),
                flags=[hyperscan.HS_FLAG_SOM_LEFTMOST] * len(literals),
                literal=True,
            )
            self._db = db
        else:
            self._ac = BytesAhoCorasick(literals)

    @property
    def engine(self) -> str:
        return "hyperscan" if self._db is not None else "aho-corasick" if self._ac is not None else "none"

    def scan(self, data: bytes) -> list[tuple[int, int, int]]:
        if self._ac is not None:
            return self._ac.find_matches_as_indexes(data)
        if self._db is None or not data:
            return []
        hits: list[tuple[int, int, int]] = []

        def found(token: int, start: int, end: int, flags: int, context: Any) -> None:
            hits.append((token, start, end))

        with self._lock:
            self._db.scan(data, match_event_handler=found)
        hits.sort(key=lambda h: (h[1], h[0]))
        return hits


class PatternScanner:
    """Where a few byte regexes match (pattern index, start of each match), in one Hyperscan pass.
    `PatternScanner.of(patterns)` is None without Hyperscan: the caller then runs Python's `re`.
    Every match is reported with its leftmost start, so patterns whose matches cannot overlap
    give what `re.finditer` gives."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._lock = threading.Lock()  # one scratch space, used by one scan at a time

    @classmethod
    def of(cls, patterns: Sequence[bytes]) -> PatternScanner | None:
        if hyperscan is None or not patterns:
            return None
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(
            expressions=list(patterns),
            ids=list(range(len(patterns))),
            elements=len(patterns),
            flags=[hyperscan.HS_FLAG_SOM_LEFTMOST] * len(patterns),
        )
        return cls(db)

    def scan(self, data: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []

        def found(pattern: int, start: int, end: int, flags: int, context: Any) -> None:
            hits.append((pattern, start))

        if data:
            with self._lock:
                self._db.scan(data, match_event_handler=found)
        hits.sort(key=lambda h: (h[1], h[0]))
        return hits


def joined(lines: Sequence[str]) -> tuple[bytes, list[int]]:
    """`lines` joined by newlines as bytes (surrogateescape, as read), and where each line starts in
    them: one scan covers them all, and `bisect_right(starts, offset) - 1` names a hit's line."""
    text = "\n".join(lines)
    sizes: Iterable[int]
    if text.isascii():
        data = text.encode("ascii")
        sizes = map(len, lines)
    else:
        data = text.encode("utf-8", "surrogateescape")
        sizes = [len(x.encode("utf-8", "surrogateescape")) for x in lines]
    starts = [0, *map(add, accumulate(sizes), count(1))]  # each line's bytes and its newline
    starts.pop()
    return data, starts
