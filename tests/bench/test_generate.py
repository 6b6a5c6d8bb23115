"""The scenario generator (bench.generate): reproducible, complete, and writes valid bundles."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from bench.generate import build, choose_modes, generate, scenario_seed
from bench.scenario import DOMAINS, OUTCOMES, SUBDOMAINS
from bench.scenarios import MODES
from hypocenter.model import TAXONOMY, AttemptContext

TRUTH_KEYS = {
    "mode",
    "seed",
    "outcome",
    "domain",
    "subdomain",
    "nodes",
    "components",
    "root_event",
    "collateral",
    "distractors",
    "cost",  # the true timeline the cost estimates are scored against (bench/cost.py)
}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def uniform_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uniform")
    generate(out, 5 * len(MODES) + 17, seed=424242, prior="uniform", nodes_max=8, jobs=2)
    return out


def test_registry_has_enough_valid_modes() -> None:
    assert len(MODES) >= 25
    for mode_id, mode in MODES.items():
        assert mode.id == mode_id
        assert mode.outcome in OUTCOMES
        if mode.outcome in ("not_failed", "unattributed"):
            assert (mode.domain, mode.subdomain) == (None, None), mode_id
        elif mode.outcome == "ambiguous":
            assert mode.subdomain == "ambiguous", mode_id
        else:
            assert mode.domain in TAXONOMY and mode.subdomain in TAXONOMY[mode.domain], mode_id
        assert mode.weight > 0 and mode.summary


def test_every_recipe_and_taxonomy_leaf_is_covered() -> None:
    for n in range(1, 17):
        assert any(m.startswith(f"s{n:02d}-") for m in MODES), f"recipe S{n:02d} has no mode"
    leaves = {(m.domain, m.subdomain) for m in MODES.values() if m.outcome == "attributed"}
    for domain, subs in TAXONOMY.items():
        for sub in subs:
            assert (domain, sub) in leaves, f"no mode for {domain}/{sub}"
    assert {m.outcome for m in MODES.values()} == set(OUTCOMES)


def test_same_seed_gives_byte_identical_corpus(tmp_path: Path) -> None:
    generate(tmp_path / "a", 45, seed=77, prior="uniform", nodes_max=8)
    generate(tmp_path / "b", 45, seed=77, prior="uniform", nodes_max=8, jobs=2)
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert a.keys() == b.keys()
    assert a == b


def test_different_seeds_differ(tmp_path: Path) -> None:
    generate(tmp_path / "a", 12, seed=1, prior="uniform", nodes_max=8)
    generate(tmp_path / "b", 12, seed=2, prior="uniform", nodes_max=8)
    assert _tree(tmp_path / "a") != _tree(tmp_path / "b")
    assert scenario_seed(1, 0) != scenario_seed(2, 0) != scenario_seed(1, 1)


def test_every_mode_appears_in_a_uniform_corpus(uniform_corpus: Path) -> None:
    seen = Counter(yaml.safe_load((d / "truth.yaml").read_text())["mode"] for d in uniform_corpus.iterdir())
    assert set(seen) == set(MODES)
    assert sum(seen.values()) >= 200 and max(seen.values()) - min(seen.values()) <= 1


def test_real_prior_follows_field_frequencies() -> None:
    picks = Counter(m.domain for m in choose_modes(4000, 5, "real"))
    assert picks["hardware"] / 4000 > 0.5
    assert picks["hardware"] > picks["network"] > picks["external"]
    assert all(picks[m.domain] for m in MODES.values())


def _contains(path: Path, text: str) -> bool:
    body = path.read_bytes().decode("utf-8", "replace")  # Flight Recorder dumps may be pickles
    return text in body or json.dumps(text)[1:-1] in body


def _check_json(path: Path) -> None:
    """A JSON document, or JSON lines (journalctl -o json) whose last line may be cut by truncation."""
    text = path.read_text(encoding="utf-8")
    try:
        json.loads(text)
        return
    except json.JSONDecodeError:
        pass
    lines = text.splitlines()
    if not text.endswith("\n"):
        lines = lines[:-1]
    for line in lines:
        json.loads(line)


def test_bundles_are_valid(uniform_corpus: Path) -> None:
    for bundle in sorted(uniform_corpus.iterdir()):
        attempt = yaml.safe_load((bundle / "attempt.yaml").read_text())
        ctx = AttemptContext.model_validate(attempt)
        assert ctx.nodes and len(ctx.nodes) <= 8
        truth = yaml.safe_load((bundle / "truth.yaml").read_text())
        assert bundle.name.split("-", 1)[1] == truth["mode"]
        assert set(truth) == TRUTH_KEYS, bundle.name
        assert truth["outcome"] in OUTCOMES
        assert truth["domain"] in (*DOMAINS, None) and truth["subdomain"] in (*SUBDOMAINS, None)
        assert truth["nodes"] == sorted(set(truth["nodes"])) and set(truth["nodes"]) <= set(ctx.nodes), (
            bundle.name
        )
        if truth["outcome"] in ("not_failed", "unattributed"):
            assert truth["domain"] is None and truth["subdomain"] is None and truth["nodes"] == []
            assert ctx.completed == (truth["outcome"] == "not_failed")
        else:
            assert truth["domain"] and truth["subdomain"]
            assert not ctx.completed
        if truth["outcome"] == "ambiguous":
            assert truth["subdomain"] == "ambiguous" and len(truth["nodes"]) >= 2
        if truth["domain"] == "external" and truth["subdomain"] != "maintenance":
            assert truth["nodes"] == []
        for comp in truth["components"]:
            assert comp["node"] in truth["nodes"] and comp["kind"] and comp["id"]
            if comp["kind"] == "gpu":
                assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}", comp["id"]), comp
        event = truth["root_event"]
        if truth["outcome"] in ("attributed", "ambiguous"):
            assert event is not None, bundle.name
        if (
            event is not None
        ):  # the file the root cause is in survives the distractors (missing logs, truncation)
            path = bundle / event["file"]
            assert path.is_file(), f"{bundle.name}: {event['file']}"
            if event["file"].startswith("logs/"):
                assert _contains(path, event["text"]), f"{bundle.name}: root text not in {event['file']}"
        for p in bundle.rglob("*.json"):
            _check_json(p)


def test_large_job_writes_per_node_files_not_per_rank() -> None:
    files = build(MODES["s01-xid79-fallen-off-bus"], 12345, nodes=512)
    attempt = yaml.safe_load(files["attempt.yaml"])
    assert len(attempt["nodes"]) == 512
    logs = [p for p in files if p.startswith("logs/")]
    assert len(logs) <= 2 * 512 + 4
    assert sum(len(v) for v in files.values()) < 40_000_000
