"""Candidate lines no rule can make an event of (engine/extract.py `inert`, the evidence's quiet lines).

What a user relies on: a stream full of lines that carry a rule's token without being what the rule
reads — training progress `step 1200 ppl 3.1 lr …` lines pass the `step` token, a train-step rule
wants `step 1200 loss …` — is stored as its evidence, not as every such line, and the events a
stream rebuilt from the kept lines gives are still those of the whole stream, times included (a line
without a stamp that looks back past 4,096 lines without one takes the last known time, which can be
such a line's).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hypocenter.engine import default_engine
from hypocenter.engine.extract import STAMP_HINT
from hypocenter.engine.matching import compile_pattern, suffix_pattern
from hypocenter.lineformat import LAYERS, parse_line, time_context
from hypocenter.model import AttemptContext
from hypocenter.sources import TextSource

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 2, 11, tzinfo=timezone.utc)
PORT_ERROR = "n1:4242:4243 [3] misc/ibvwrap.cc:266 NCCL WARN NET/IB : Got async event : port error"


def _progress(i: int) -> str:
    return f"[2026-11-02 10:{i // 60 % 60:02d}:{i % 60:02d}] step {i} ppl {i % 7}.25 lr 3.0e-4 tokens/s 98304"


def _info(i: int) -> str:
    return f"n1:4242:4243 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : 1[0] -> 2[0] [send] via NET/IB/0"


def _context() -> AttemptContext:
    return AttemptContext.model_validate(
        {
            "workload": {"id": "w"},
            "window": {"start": NOW - timedelta(hours=2), "end": NOW},
            "nodes": ["n1"],
        }
    )


def _rebuilt_events(lines: list[str]) -> tuple[set[int], list[dict[str, object]], list[dict[str, object]]]:
    """(kept line indices, events of the whole stream, events of the stream rebuilt from them)."""
    engine = default_engine()
    ctx = _context()
    tctx = time_context(ctx)
    keep = engine.extractor.evidence_lines(list(enumerate(lines, 1)), tctx)
    kept = "\n".join(x if i in keep else "" for i, x in enumerate(lines))
    ex = engine.extractor
    whole = ex.extract([TextSource("rank.log", "\n".join(lines), node="n1")], ctx, tctx).events
    rebuilt = ex.extract([TextSource("rank.log", kept, node="n1")], ctx, tctx).events
    return keep, [e.model_dump() for e in whole], [e.model_dump() for e in rebuilt]


def test_a_storm_keeps_its_warnings_not_every_progress_line() -> None:
    # one line in ten a port error (no stamp: it inherits the progress line before it, and the one
    # after it bounds that time), six in ten progress lines
    lines = [
        PORT_ERROR if i % 10 == 5 else _info(i) if i % 10 in (0, 4, 6) else _progress(i) for i in range(6000)
    ]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert whole and rebuilt == whole
    assert {e["kind"] for e in whole} == {"nccl_ib_async"}
    progress = [i for i, x in enumerate(lines) if " ppl " in x]
    # a progress line is kept only as a stamp a port error reads (the ones just before and after it)
    assert len(keep & set(progress)) <= len(progress) // 3 + 10
    assert len(keep) < 0.35 * len(lines)  # each port error and its two stamps; before: 70 %


def test_real_progress_lines_stay_evidence() -> None:
    lines = [_progress(i).replace(" ppl ", " loss ") if i % 2 else _info(i) for i in range(400)]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert rebuilt == whole
    assert sum(1 for e in whole if e["kind"] == "train_step") == 200
    assert all(i in keep for i in range(1, 400, 2))


def test_a_line_past_4096_unstamped_lines_still_takes_the_last_known_time() -> None:
    """The port error's look back ends without a stamp: it takes the time of the last candidate
    before it whose time is known — a progress line no rule reads, which must therefore be kept
    (although a later one is the stream's last)."""
    lines = [_info(i) for i in range(50)]
    syslog = "Nov  2 09:30:00 n1 systemd[1]: Started Session 7 of User root."  # stamped, no candidate
    lines += [_progress(60), syslog, *(_info(i) for i in range(5000)), PORT_ERROR, _progress(61), _info(0)]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert rebuilt == whole
    assert whole[0]["time"] == datetime(2026, 11, 2, 10, 1, tzinfo=timezone.utc)  # the progress line's
    assert 50 in keep


def test_a_line_whose_look_back_ends_at_an_inert_line_takes_its_time() -> None:
    """The port error finds no stamp in the 4,096 lines before it; extraction's look back stops at the
    last line whose time is known: an unstamped progress line no rule reads, which inherited 10:00."""
    syslog = "Nov  2 10:{m:02d}:00 n1 systemd[1]: Started Session {m} of User root."
    unstamped = "n1:4242:4243 [0] NCCL INFO step 5 ppl 3.5"  # the `step` token, no step, no stamp
    lines = [syslog.format(m=0), *(_info(i) for i in range(100)), unstamped, *(_info(i) for i in range(4050))]
    lines += [PORT_ERROR, *(_info(i) for i in range(9)), _progress(2400), syslog.format(m=50)]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert rebuilt == whole
    assert whole[0]["time"] == datetime(2026, 11, 2, 10, tzinfo=timezone.utc)
    assert 101 in keep


def test_a_line_whose_look_ahead_ends_without_a_stamp_is_kept() -> None:
    """Extraction takes a look ahead for the next stamp that ends without one (4,096 lines) to hold for
    the rest of the stream: the port error after it gets no upper bound. Without the progress line
    that looked, it would."""
    syslog = "Nov  2 10:{m:02d}:00 n1 systemd[1]: Started Session {m} of User root."
    unstamped = "n1:4242:4243 [0] NCCL INFO step 5 ppl 3.5"  # the `step` token, no step, no stamp
    lines = [syslog.format(m=0), unstamped, *(_info(i) for i in range(4100)), syslog.format(m=20)]
    lines += [PORT_ERROR, syslog.format(m=30), _progress(2400)]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert rebuilt == whole
    assert whole[0]["time_max"] is None  # what the look ahead before it left
    assert 1 in keep


def test_a_boot_anchor_is_kept_even_when_no_rule_reads_it() -> None:
    """A kernel line with a wall and an uptime stamp places the uptime-only lines of its node."""
    anchor = "Nov  2 10:00:00 n1 kernel: [1000.000000] step 3 ppl 5.5"
    xid = "[1500.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    later = "Nov  2 10:05:00 n1 systemd[1]: Started Session 7 of User root."  # the stamp the Xid reads
    lines = [*(_info(i) for i in range(40)), anchor, *(_info(i) for i in range(40)), later, xid, _progress(9)]
    keep, whole, rebuilt = _rebuilt_events(lines)
    assert rebuilt == whole
    assert whole[0]["time"] == datetime(2026, 11, 2, 10, 8, 20, tzinfo=timezone.utc)  # anchor + 500 s
    assert 40 in keep


@pytest.mark.parametrize(
    ("pattern", "line", "message"),
    [
        (r"\b(?:global_step|step)\b\s*[:=]?\s*(?P<n>\d+)\s*$", "[2026-11-02 10:00:00] step 12", "step 12"),
        (r"^NET/IB : Got", "host:1:2 [0] NCCL WARN NET/IB : Got", "NET/IB : Got"),
        (r"\Aworld\B", "x: worldx", "worldx"),
        (r"[[:alpha:]]+\b: (?P<w>[^\]]+)$", "[x] a: b^", "a: b^"),
    ],
)
def test_a_suffix_pattern_finds_what_the_pattern_finds_in_a_suffix(
    pattern: str, line: str, message: str
) -> None:
    relaxed = suffix_pattern(pattern)
    assert relaxed is not None
    assert compile_pattern(pattern).search(message) is not None
    assert relaxed.search(line) is not None


def test_patterns_whose_relaxation_cannot_be_told_are_never_relaxed() -> None:
    assert suffix_pattern(r"(?<=a)b") is None  # not RE2: the bounded fallback reads a text's start
    assert suffix_pattern(r"\Q^x\E") is None


def test_every_firing_case_of_the_catalog_is_found_by_its_suffix_pattern() -> None:
    """Over the built-in rules' own examples: where a rule's pattern finds its message, its suffix
    pattern finds the whole line (a line told inert is one no rule could fire on)."""
    engine = default_engine()
    tctx = time_context(_context())
    checked = 0
    for rule in engine.ruleset.rules:
        spec = rule.extract
        if spec is None or spec.lines_before or spec.lines_after:
            continue
        relaxed = suffix_pattern(spec.pattern)
        if relaxed is None:
            continue
        pattern = compile_pattern(spec.pattern)
        for case in rule.cases:
            for text in (case.logs or {}).values():
                for line in str(text).splitlines():
                    if pattern.search(parse_line(line, tctx).message) is not None:
                        assert relaxed.search(line) is not None, (rule.id, line)
                        checked += 1
    assert checked > 100


def test_every_stamped_line_holds_what_the_stamp_hint_looks_for() -> None:
    """`has_stamp` parses only lines with an hour and minutes (or a JSON document): every line of the
    examples and of the rules' cases that `parse_line` finds a time in has one, in its first 512 characters."""
    tctx = time_context(_context())
    lines = [layer.example for layer in LAYERS]
    for rule in default_engine().ruleset.rules:
        for case in rule.cases:
            lines.extend(x for text in (case.logs or {}).values() for x in str(text).splitlines())
    for path in sorted(REPO.glob("examples/*/logs/**/*")):
        if path.is_file() and path.suffix != ".gz":
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines()[:2000])
    lines += ["٢٠٢٦-١١-٠٢ ١٠:١٥:٠٣ x", '{"ts": 1793613600, "msg": "x"}']  # other digits; a number
    stamped = [x for x in lines if parse_line(x[:512], tctx).time is not None]
    assert len(stamped) > 1000
    assert [x for x in stamped if STAMP_HINT.search(x[:512]) is None] == []
