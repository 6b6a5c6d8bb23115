"""Same inputs and rules give byte-identical diagnoses, whatever order the inputs arrive in."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.sources import AttemptInput, MetricSource, RecordSource, Source

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUNDLES = sorted(p for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())
LOADED = {p.name: load_bundle(p) for p in BUNDLES}
ENGINE = default_engine()
BASELINE = {name: ENGINE.analyze(b).to_json() for name, b in LOADED.items()}


def _shuffled(sources: list[Source], rnd: random.Random) -> list[Source]:
    out: list[Source] = []
    for s in sources:
        if isinstance(s, RecordSource):
            recs = list(s.records)
            rnd.shuffle(recs)
            s = RecordSource(name=s.name, records=recs)
        elif isinstance(s, MetricSource):
            series = list(s.series)
            rnd.shuffle(series)
            s = MetricSource(name=s.name, series=series)
        out.append(s)
    rnd.shuffle(out)
    return out


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(LOADED)), seed=st.integers(0, 2**32 - 1))
def test_arrival_order_does_not_change_the_diagnosis(name: str, seed: int) -> None:
    b = LOADED[name]
    rnd = random.Random(seed)
    coverage = list(b.coverage)
    rnd.shuffle(coverage)
    d = ENGINE.analyze(AttemptInput(b.context, _shuffled(b.sources, rnd), coverage))
    assert d.to_json() == BASELINE[name]


def test_repeated_runs_are_byte_identical() -> None:
    for name, b in LOADED.items():
        assert ENGINE.analyze(b).to_json() == BASELINE[name]
