"""The built-in engine as tests use it: analyse a bundle directory the way `hypocenter analyze DIR`
does (load, then analyse), and the rules' queries that pull connectors are handed."""

from __future__ import annotations

from pathlib import Path

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
