"""Every shipped example bundle gets the diagnosis its expected.yaml states."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from engine_support import analyze_bundle

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUNDLES = sorted(p for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())


def test_the_promised_examples_are_shipped() -> None:
    names = {p.name for p in BUNDLES}
    assert "nvlink-xid149" in names
    assert len(names) >= 10


@pytest.mark.parametrize("bundle", BUNDLES, ids=[p.name for p in BUNDLES])
def test_example_diagnosis_matches_expected(bundle: Path) -> None:
    expected = yaml.safe_load((bundle / "expected.yaml").read_text())
    d = analyze_bundle(bundle)
    rc = d.root_cause
    got = {
        "outcome": d.outcome,
        "domain": rc.domain if rc else None,
        "subdomain": rc.subdomain if rc else None,
        "nodes": sorted(rc.nodes) if rc else [],
    }
    want = {k: expected.get(k) for k in ("outcome", "domain", "subdomain")}
    want["nodes"] = sorted(expected.get("nodes") or [])
    assert got == want, f"{bundle.name}: {rc.summary if rc else d.quality.reasons}"
    if expected.get("action") and rc is not None:  # ambiguous too: its root cause carries the action
        assert rc.action == expected["action"]
    # every outcome says what to do next: the root cause's action, INVESTIGATE when unattributed
    assert d.next_step is not None and d.next_step.action == (expected.get("action") or "NONE")
    if d.outcome == "unattributed":
        assert d.next_step.look_at and "first failure signal" in d.next_step.look_at[0]
    if expected.get("components"):
        assert rc is not None
        want_c = {(c["node"], c["id"]) for c in expected["components"]}
        assert {(c.node, c.id) for c in rc.components} == want_c
    kinds = {s.kind for s in d.symptoms}
    for kind in expected.get("symptoms_include") or []:
        assert kind in kinds, f"symptom {kind} missing; have {sorted(kinds)}"
    # Every claim cites evidence: the root cause has at least one root_cause evidence line with a ref.
    if rc is not None:
        causes = [e for e in d.evidence if e.role == "root_cause"]
        assert causes and all(":" in e.ref or "#" in e.ref for e in causes)


def test_headline_example_keeps_three_nccl_errors_as_symptoms() -> None:
    d = analyze_bundle(EXAMPLES / "nvlink-xid149")
    kinds = {s.kind for s in d.symptoms}
    assert {"nccl_remote_error", "nccl_system_error", "nccl_internal_error"} <= kinds
    assert d.root_cause is not None
    assert d.root_cause.components[0].id == "0000:3b:00"
    assert any(e.ref.startswith("logs/node02/kern.log:") and e.role == "root_cause" for e in d.evidence)
