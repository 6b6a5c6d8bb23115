"""A real hang made by PyTorch itself (needs the `torch` extra; skipped without torch).

Four gloo processes with TORCH_FR_BUFFER_SIZE set; rank 1 goes to load a batch and never issues the
all_reduce the other three wait in. Every rank dumps its Flight Recorder buffer; the bundle's only
log line says the job hit its time limit. The diagnosis must name rank 1's node.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from engine_support import analyze_bundle

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

MAKE_HANG = Path(__file__).parents[1] / "fixtures" / "flight_recorder" / "make_hang.py"
NODES = ["gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04"]


def test_a_real_gloo_hang_names_the_laggards_node(tmp_path: Path) -> None:
    out = tmp_path / "dumps"
    done = subprocess.run(
        [sys.executable, str(MAKE_HANG), str(out), "--world", "4", "--laggard", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    now = datetime.now(timezone.utc).replace(microsecond=0)
    root = tmp_path / "bundle"
    (root / "logs" / "_job").mkdir(parents=True)
    (root / "attempt.yaml").write_text(
        'workload: {id: "9001", attempt: 0, scheduler: slurm, cluster: lab}\n'
        f'window: {{start: "{(now - timedelta(hours=1)).isoformat()}", end: "{(now + timedelta(minutes=5)).isoformat()}"}}\n'
        f"state: TIMEOUT\nnodes: [{', '.join(NODES)}]\n"
        "ranks: {" + ", ".join(f'{n}: "{i}"' for i, n in enumerate(NODES)) + "}\n"
    )
    end = (now + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    (root / "logs" / "_job" / "slurm-9001.out").write_text(
        f"slurmstepd: error: *** JOB 9001 ON gpu-b01 CANCELLED AT {end} DUE TO TIME LIMIT ***\n"
    )
    assert analyze_bundle(root).outcome == "unattributed"
    for rank, node in enumerate(
        NODES
    ):  # where TORCH_NCCL_DUMP_ON_TIMEOUT leaves them: one per rank, on its node
        (root / "logs" / node).mkdir()
        (root / "logs" / node / f"nccl_trace_rank_{rank}").write_bytes(
            (out / "pickle" / f"nccl_trace_rank_{rank}").read_bytes()
        )
    d = analyze_bundle(root)
    assert d.outcome == "attributed", d.quality.reasons
    assert d.root_cause is not None and d.root_cause.nodes == ["gpu-b02"]
    assert "rank(s) 1 last enqueued collective 3" in d.root_cause.summary
    assert "make_hang.py" in d.root_cause.summary  # the laggard's own Python frames
    for rank, node in enumerate(NODES):  # the JSON twins, collected in one folder: the rank map places them
        (root / "logs" / node / f"nccl_trace_rank_{rank}").unlink()
        (root / "traces").mkdir(exist_ok=True)
        (root / "traces" / f"nccl_trace_rank_{rank}.json").write_bytes(
            (out / "json" / f"nccl_trace_rank_{rank}.json").read_bytes()
        )
    d = analyze_bundle(root)
    assert d.root_cause is not None and d.root_cause.nodes == ["gpu-b02"], d.quality.reasons
