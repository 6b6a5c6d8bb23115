"""Time of the five built-in patterns that backtracked quadratically on Python's `re` (issue #12), on
lines built to make them backtrack, beside a benign line of the same length: `python -m bench.redos`.

Python's `re` is timed on a 16 KiB line (a 1 MiB one would take hours), the matcher the engine uses
(engine/matching.py: RE2) on 1 MiB.
"""

from __future__ import annotations

import re
import time

from hypocenter.engine import default_engine
from hypocenter.engine.matching import compile_pattern

HOSTILE = {  # rule: (before, repeated, after)
    "oom-killer": ("out of memory: Killed", "/", ""),
    "k8s-record": ("", "1", " k8s pod "),
    "lustre-connection-lost": ("Request sent has timed out", "1", ""),
    "watchdog-progress": ("last enqueued", "a b", ""),
    "progress-line": ("iteration", "1", ""),
}


def _time(search: object, text: str) -> float:
    t = time.perf_counter()
    search(text)  # type: ignore[operator]
    return time.perf_counter() - t


def main() -> int:
    rules = {r.id: r for r in default_engine().ruleset.rules}
    print(
        f"{'rule':<24} {'re 16 KiB benign':>16} {'re 16 KiB hostile':>18} {'RE2 1 MiB benign':>17} {'RE2 1 MiB hostile':>18}"
    )
    for rule_id, (before, filler, after) in HOSTILE.items():
        spec = rules[rule_id].extract
        assert spec is not None
        cells = []
        for size, rx in ((16 << 10, re.compile(spec.pattern)), (1 << 20, compile_pattern(spec.pattern))):
            benign = ("the quick brown fox jumps over the lazy dog " * (size // 44))[:size]
            hostile = before + filler * (size // len(filler)) + after
            cells += [_time(rx.search, benign), _time(rx.search, hostile)]
        print(f"{rule_id:<24} {cells[0]:>15.4f}s {cells[1]:>17.3f}s {cells[2]:>16.4f}s {cells[3]:>17.4f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
