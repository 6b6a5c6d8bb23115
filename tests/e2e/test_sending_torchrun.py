"""docs/sending.md's training-script recipe, end to end: a real torchrun job (torch CPU, gloo, two
processes) whose script only adds the SDK's logging handler, tagged by the `hypocenter` resource
detector and diagnosed by a real `hypocenter serve`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from otel_detector_support import REPO, entry_points_path
from sending_doc import snippets
from server_support import ServerProcess, serving, wait_for_diagnosis

pytestmark = [pytest.mark.torch, pytest.mark.slow]

pytest.importorskip("torch")

RECIPE = "The OpenTelemetry Python SDK inside a training script"
RUN_ID = "sdk-run-7"

# The user's training code, below the recipe's lines: it logs as it always did. Rank 1 meets a
# sample without `input_ids` and dies; rank 0 is left waiting in the next all_reduce.
TRAINING = """
import torch
import torch.distributed as dist

log = logging.getLogger("train")
logging.getLogger().setLevel(logging.INFO)
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    t = torch.ones(4)
    dist.all_reduce(t)
    log.info("step %d loss %.3f", step, 2.0 / (step + 1))
try:
    batch = {"labels": torch.zeros(2)} if rank == 1 else {"input_ids": torch.zeros(2)}
    ids = batch["input_ids"]
    dist.all_reduce(ids)
except Exception:
    log.exception("rank %d: training step failed", rank)
    raise
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(tmp_path / "store.db") as s:
        yield s


def test_a_torchrun_job_tagged_by_the_detector_is_diagnosed(server: ServerProcess, tmp_path: Path) -> None:
    setup, end_attempt = snippets(RECIPE, "python")
    (tmp_path / "train.py").write_text(setup + TRAINING)
    (tmp_path / "end_attempt.py").write_text(end_attempt)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(entry_points_path(tmp_path / "meta")), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "hypocenter",
        "OTEL_EXPORTER_OTLP_ENDPOINT": server.base,
    }
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-id",
            RUN_ID,
            str(tmp_path / "train.py"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert job.returncode != 0, job.stderr[-3000:]
    assert "KeyError" in job.stderr, job.stderr[-3000:]
    ended = subprocess.run(
        [sys.executable, str(tmp_path / "end_attempt.py"), "FAILED", str(job.returncode)],
        env={**env, "TORCHELASTIC_RUN_ID": RUN_ID},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ended.returncode == 0, ended.stderr
    with server.client() as client:
        d = wait_for_diagnosis(client, RUN_ID, timeout=60)
        attempt = client.get(f"/v1/attempts/{RUN_ID}/0").json()
    host = socket.gethostname()
    assert d["terminal_state"] == "FAILED"
    assert d["attempt"]["nodes"] == [host]
    assert attempt["scope"][f"ranks@{host}"] == "0-1"  # both workers told their node's ranks
    assert d["outcome"] == "attributed", d["quality"]["reasons"]
    assert (d["root_cause"]["domain"], d["root_cause"]["subdomain"]) == ("software", "user_code")
    assert "KeyError" in " ".join(e["text"] for e in d["evidence"])
