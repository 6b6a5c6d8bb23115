"""An abstention with no other suggestion points at the cause-like lines it has (engine/leads.py):
each lead is a candidate with its lines as context evidence and why it falls short; nothing is
attributed because of them."""

from __future__ import annotations

from pathlib import Path

from engine_support import analyze_bundle, write_attempt

from hypocenter.model import Diagnosis


def _diagnose(tmp_path: Path, lines: str, nodes: list[str] | None = None) -> Diagnosis:
    (tmp_path / "logs" / "_job").mkdir(parents=True)
    (tmp_path / "logs" / "_job" / "out.log").write_text(lines, encoding="utf-8")
    write_attempt(tmp_path, "lead", nodes or ["worker-1"])
    return analyze_bundle(tmp_path)


IB = "-worker-1:946:988 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129\n"


def test_a_lone_ib_completion_error_offers_fabric_and_roce_addressing(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, IB)
    assert d.outcome == "unattributed" and d.root_cause is None
    assert [(c.domain, c.subdomain, c.rule) for c in d.candidates] == [
        ("network", "fabric", "lead-ib-transport"),
        ("software", "configuration", "lead-ib-addressing"),
    ]
    assert all("it falls short" in c.summary and c.action == "INVESTIGATE" for c in d.candidates)
    assert "NCCL_IB_GID_INDEX" in d.candidates[1].summary
    assert any("lead(s) from lines no rule attributes alone" in r for r in d.quality.reasons)
    assert not any("configuration lines alone" in r for r in d.quality.reasons)
    shown = [e for e in d.evidence if e.rule == "nccl-ib-completion-error"]
    assert shown and "Got completion with error 12" in shown[0].text


def test_a_checkpoint_that_cannot_be_opened_is_a_storage_lead_not_a_code_bug(tmp_path: Path) -> None:
    d = _diagnose(
        tmp_path,
        "Traceback (most recent call last):\n"
        "RuntimeError: File my_out/checkpoints/checkpoint_0.pt cannot be opened.\n",
    )
    assert d.outcome == "unattributed"
    assert [(c.domain, c.subdomain) for c in d.candidates] == [("storage", "filesystem")]
    assert "full or read-only filesystem" in d.candidates[0].summary


def test_a_cuda_error_naming_no_fault_is_a_gpu_lead(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, "[rank1]: RuntimeError: CUDA error: unspecified launch failure\n")
    assert d.outcome == "unattributed"
    assert [(c.domain, c.subdomain, c.rule) for c in d.candidates] == [("hardware", "gpu", "lead-cuda-error")]


def test_an_attributed_cause_gets_no_leads(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, IB + "[rank0]: KeyError: 'input_ids'\n")
    assert d.outcome == "attributed" and not [c for c in d.candidates if c.rule.startswith("lead-")]
