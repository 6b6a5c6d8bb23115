"""The prefilter (engine/prefilter.py): Hyperscan, where installed, passes exactly the lines the
Aho-Corasick automaton passes, so a diagnosis does not depend on which one ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from ahocorasick_rs import BytesAhoCorasick

from bench.throughput import _CANDIDATES, write_log
from hypocenter.engine import default_engine
from hypocenter.engine.prefilter import TokenScanner


def _lines(data: bytes, hits: list[tuple[int, int, int]]) -> set[int]:
    return {data.rfind(b"\n", 0, start) + 1 for _, start, _ in hits}


def test_hyperscan_passes_the_lines_the_automaton_passes(tmp_path: Path) -> None:
    scanner = TokenScanner(default_engine().extractor.tokens)
    if scanner.engine != "hyperscan":
        pytest.skip("hyperscan is not installed here: the automaton is the prefilter")
    log = tmp_path / "node.log"
    write_log(log, 2, seed=11)
    tokens = default_engine().extractor.tokens
    # every token on a line of its own, and twice on one line, between healthy lines
    data = (
        log.read_bytes()
        + "".join(f"x {t} y\n{t}{t}\n" for t in tokens).encode()
        + "\n".join(c.format(m=1, s=2) for c in _CANDIDATES).encode()
    )
    reference = BytesAhoCorasick([t.encode() for t in tokens]).find_matches_as_indexes(data)
    hits = scanner.scan(data)
    assert hits == sorted(hits, key=lambda h: (h[1], h[0]))
    assert _lines(data, hits) == _lines(data, reference)
    assert all(data[s:e] == tokens[t].encode() for t, s, e in hits)
    assert scanner.scan(b"") == [] and TokenScanner([]).scan(data) == []
