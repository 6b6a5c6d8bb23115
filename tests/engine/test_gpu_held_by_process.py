"""A GPU held by a process outside the job (nvidia-smi's process table on the failing node) turns the
job's CUDA OOM or 'busy or unavailable' into that finding, not a batch-size or hardware verdict."""

from __future__ import annotations

from pathlib import Path

from engine_support import analyze_bundle, write_attempt

from hypocenter.model import Diagnosis

BUSY = "[rank0]: RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.12 GiB is free.\n"
TABLE = (
    "|    0   N/A  N/A     81441      C   ...unners/cuda_v11/ollama_llama_server     6100MiB |\n"
    "|    0   N/A  N/A      2341      G   /usr/lib/xorg/Xorg                          312MiB |\n"
)


def _diagnose(tmp_path: Path, app: str, smi: str | None) -> Diagnosis:
    logs = tmp_path / "logs" / "gpu-a01"
    logs.mkdir(parents=True)
    (logs / "out.log").write_text(app, encoding="utf-8")
    if smi is not None:
        (logs / "nvidia-smi.txt").write_text(smi, encoding="utf-8")
    write_attempt(tmp_path, "held", ["gpu-a01"], {"gpu-a01": "0"})
    return analyze_bundle(tmp_path)


def test_busy_gpu_with_a_foreign_compute_process_is_that_process_not_hardware(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, BUSY, TABLE)
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.rule) == (
        "resource",
        "gpu_oom",
        "gpu-held-by-process",
    )
    assert "PID 81441" in d.root_cause.summary and "6100 MiB on GPU 0" in d.root_cause.summary
    assert "2341" not in d.root_cause.summary  # a display server's 312 MiB is no reason


def test_oom_with_a_foreign_process_names_it(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, OOM, TABLE)
    assert d.root_cause is not None and d.root_cause.rule == "gpu-held-by-process"
    assert "ran out of GPU memory on gpu-a01" in d.root_cause.summary


def test_without_the_process_table_busy_is_a_lead_not_a_hardware_verdict(tmp_path: Path) -> None:
    """CUDA documents cudaErrorDevicesUnavailable as the compute mode or another program holding the
    device: without nvidia-smi's table the diagnosis abstains, the GPU's holder its first candidate."""
    d = _diagnose(tmp_path, BUSY, None)
    assert d.outcome == "unattributed" and d.root_cause is None
    first = d.candidates[0]
    assert (first.domain, first.subdomain, first.rule) == ("resource", "gpu_oom", "lead-gpu-busy")
    assert "compute mode" in first.summary and "falls short" in first.summary
    assert any("busy or unavailable" in e.text for e in d.evidence)
