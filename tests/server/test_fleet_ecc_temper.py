"""Fleet memory tempers a GPU OOM: on a node whose GPU memory failed with uncorrectable errors in an
earlier attempt, a fresh `resource/gpu_oom` verdict becomes ambiguous with that hardware cause (a real
`hypocenter serve`, attempts replayed over OTLP one after the other). Elsewhere the OOM verdict stands."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from server_support import ServerProcess, replay, wait_for_diagnosis

pytestmark = pytest.mark.slow

# Fleet memory looks back a window from the wall clock: the attempts happened in the last days.
DAY1 = datetime.now(timezone.utc).replace(hour=10, minute=0, second=0, microsecond=0) - timedelta(days=2)
DAY2 = DAY1 + timedelta(days=1)
XID48 = (
    f"{DAY1:%b} {DAY1.day:2d} 10:15:03 gpu-a01 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, "
    "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
    "0x7fdd60000 partition 3, subpartition 0.\n"
)
OOM = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free.\n"
)


def _bundle(root: Path, workload: str, day: datetime, node: str, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / "logs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "logs" / rel).write_text(text, encoding="utf-8")
    attempt = {
        "workload": {"id": workload, "attempt": 0, "scheduler": "none"},
        "window": {"start": f"{day:%Y-%m-%d}T10:00:00Z", "end": f"{day:%Y-%m-%d}T11:00:00Z"},
        "state": "FAILED",
        "exit_code": 1,
        "nodes": [node],
        "ranks": {node: "0"},
        "timezone": "UTC",
    }
    (root / "attempt.yaml").write_text(yaml.safe_dump(attempt), encoding="utf-8")
    return root


def test_gpu_oom_after_ecc_history_on_that_node_is_ambiguous(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "store.db").start()
    try:
        with srv.client() as client:

            def post(b: Path) -> dict[str, Any]:
                assert replay(b, srv.grpc).returncode == 0
                return wait_for_diagnosis(
                    client, yaml.safe_load((b / "attempt.yaml").read_text())["workload"]["id"]
                )

            ecc = post(_bundle(tmp_path / "a", "job-a", DAY1, "gpu-a01", {"gpu-a01/kern.log": XID48}))
            assert ecc["outcome"] == "attributed" and ecc["root_cause"]["subdomain"] == "gpu_memory"
            other = post(_bundle(tmp_path / "b", "job-b", DAY2, "gpu-a02", {"gpu-a02/out.log": OOM}))
            assert other["outcome"] == "attributed"  # no history on gpu-a02: the OOM verdict stands
            d = post(_bundle(tmp_path / "c", "job-c", DAY2, "gpu-a01", {"gpu-a01/out.log": OOM}))
        assert d["outcome"] == "ambiguous"
        cands = [(c["domain"], c["subdomain"], c["rule"]) for c in d["candidates"]]
        assert cands[:2] == [
            ("resource", "gpu_oom", "cuda-oom"),
            ("hardware", "gpu_memory", "fleet-ecc-history"),
        ]
        assert f"diagnosis {ecc['id']}" in d["candidates"][1]["summary"]
        assert any("tempered to ambiguous" in r for r in d["quality"]["reasons"])
    finally:
        srv.stop()
