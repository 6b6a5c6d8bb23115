"""The built-in engine as tests use it: analyse a bundle directory the way `hypocenter analyze DIR`
does (load, then analyse), and the rules' queries that pull connectors are handed; one log file
read in pieces checked against reading it whole."""

from __future__ import annotations

from pathlib import Path

from hypocenter.collector import logstream
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import Engine, default_engine
from hypocenter.model import Diagnosis

QUERIES = default_engine().ruleset.queries()

# A user's own rule file with one extraction rule the built-in catalog does not have.
EXTRA_RULE = """\
rules:
  - id: frobnicator-exploded
    title: the frobnicator exploded
    status: experimental
    runbook: https://example.com/frobnicator
    extract:
      source: kernel
      tokens: ["frobnicator exploded"]
      pattern: 'frobnicator exploded'
      event: frobnicator_exploded
"""


def analyze_bundle(path: Path | str, engine: Engine | None = None) -> Diagnosis:
    bundle = load_bundle(Path(path))
    return (engine or default_engine()).analyze(bundle)


def write_attempt(root: Path, workload: str, nodes: list[str], ranks: dict[str, str] | None = None) -> None:
    """A failed attempt's attempt.yaml under `root` (window 2026, UTC), for bundles a test writes."""
    import yaml

    attempt: dict[str, object] = {
        "workload": {"id": workload, "attempt": 0, "scheduler": "none"},
        "window": {"start": "2026-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
        "state": "FAILED",
        "exit_code": 1,
        "nodes": nodes,
        "timezone": "UTC",
    }
    if ranks:
        attempt["ranks"] = ranks
    (root / "attempt.yaml").write_text(yaml.safe_dump(attempt), encoding="utf-8")


def assert_pieces_read_as_whole(path: Path) -> None:
    """`scan_log` and `log_pieces` (in pieces of logstream.CHUNK_BYTES) say and give what `read_log`
    (the whole file at once) does: usable or not, status, reason, line count, the text."""
    data, status, reason = logstream.read_log(path)
    facts = logstream.scan_log(path)
    assert (facts.usable, facts.status, facts.reason) == (data is not None, status, reason), path.name
    if data is None:
        return
    assert (facts.newlines, facts.ends_with_newline) == (data.count(b"\n"), data.endswith(b"\n")), path.name
    pieces = list(logstream.log_pieces(path, status == "ok"))
    assert b"".join(pieces) == data, path.name
    assert all(p.endswith(b"\n") for p in pieces[:-1]), path.name
