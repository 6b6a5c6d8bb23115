"""The line-format cascade is a declared table (lineformat.LAYERS): each layer is the first to peel
its own example line, so the table's order is the specification and a reordering that changes what
a line means fails here, naming the layer."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hypocenter.lineformat import LAYERS, Layer, LineHeader, TimeContext, peel, zone

CTX = TimeContext(
    tz=zone("UTC"),
    start=datetime(2026, 11, 2, 10, tzinfo=timezone.utc),
    end=datetime(2026, 11, 2, 11, tzinfo=timezone.utc),
    hosts=frozenset({"node01"}),
)


def test_layer_names_are_unique() -> None:
    names = [layer.name for layer in LAYERS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_each_layer_is_the_first_to_peel_its_example(layer: Layer) -> None:
    found = peel(layer.example, LineHeader(message=layer.example), CTX)
    assert found is not None
    assert found[0].name == layer.name
    assert len(found[1]) < len(layer.example)


def test_a_layer_that_reads_nothing_lets_the_next_one_try() -> None:
    """An ISO stamp inside a line already stamped by CRI is not peeled as a time: the rest is kept."""
    h = LineHeader(message="")
    h.time = datetime(2026, 11, 2, 10, tzinfo=timezone.utc)
    assert peel("2026-11-02 10:15:03 step 5", h, CTX) is None
    assert h.time == datetime(2026, 11, 2, 10, tzinfo=timezone.utc)


def test_pdsh_prefixes_are_peeled_only_for_the_attempts_hosts() -> None:
    assert peel("node01: boom", LineHeader(message=""), CTX) is not None
    assert peel("RuntimeError: boom", LineHeader(message=""), CTX) is None
    no_hosts = TimeContext(tz=CTX.tz, start=CTX.start, end=CTX.end)
    assert peel("node01: boom", LineHeader(message=""), no_hosts) is None
