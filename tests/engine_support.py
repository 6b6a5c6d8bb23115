"""The built-in engine as tests use it: analyse a bundle directory the way `hypocenter analyze DIR`
does (load, then analyse), and the rules' queries that pull connectors are handed."""

from __future__ import annotations

from pathlib import Path

from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import Engine, default_engine
from hypocenter.model import Diagnosis

QUERIES = default_engine().ruleset.queries()


def analyze_bundle(path: Path | str, engine: Engine | None = None) -> Diagnosis:
    bundle = load_bundle(Path(path))
    return (engine or default_engine()).analyze(bundle.context, bundle.sources, bundle.coverage)
