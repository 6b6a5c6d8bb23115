"""The `hypocenter` OpenTelemetry resource detector: the attempt's tags from the job's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from otel_detector_support import REPO, declared_entry_points, entry_points_path

from hypocenter.collector.otlp import identify
from hypocenter.resource_detector import attributes
from hypocenter.server.attempts import context_for
from hypocenter.store.base import AttemptRow

SLURM = {
    "SLURM_JOB_ID": "81234",
    "SLURM_JOB_NAME": "llama-pretrain",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_JOB_NODELIST": "gpu-n[01-04]",
    "SLURM_CLUSTER_NAME": "eos",
    "SLURMD_NODENAME": "gpu-n02",
    "SLURM_PROCID": "9",
    "SLURM_GTIDS": "8,9,10,11",
}


def test_a_slurm_task_names_its_job_requeue_count_nodes_and_ranks() -> None:
    assert attributes(SLURM, "gpu-n02.cluster.example") == {
        "hypocenter.workload.id": "81234",
        "hypocenter.workload.attempt": 2,
        "hypocenter.workload.name": "llama-pretrain",
        "hypocenter.workload.scheduler": "slurm",
        "hypocenter.workload.cluster": "eos",
        "hypocenter.attempt.nodes": "gpu-n[01-04]",
        "host.name": "gpu-n02",  # Slurm's node name, as in the node list, not the FQDN
        "hypocenter.rank": 9,
        "hypocenter.node.ranks": "8-11",
    }


def test_a_slurm_array_task_is_named_as_sacct_names_it() -> None:
    env = {"SLURM_JOB_ID": "81241", "SLURM_ARRAY_JOB_ID": "81234", "SLURM_ARRAY_TASK_ID": "7"}
    got = attributes(env, "gpu-n02")
    assert (got["hypocenter.workload.id"], got["hypocenter.workload.attempt"], got["host.name"]) == (
        "81234_7",
        0,
        "gpu-n02",
    )


def test_torchrun_alone_names_its_run_and_restart_and_the_node_ranks() -> None:
    env = {
        "TORCHELASTIC_RUN_ID": "f3b1c0de",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "8",
    }
    assert attributes(env, "trainer-7") == {
        "hypocenter.workload.id": "f3b1c0de",
        "hypocenter.workload.attempt": 1,
        "hypocenter.workload.scheduler": "torchrun",
        "host.name": "trainer-7",
        "hypocenter.rank": 5,
        "hypocenter.node.ranks": "4-7",
    }


def test_torchrun_under_slurm_keeps_the_slurm_job_and_takes_torchruns_ranks() -> None:
    env = {
        **SLURM,
        "TORCHELASTIC_RUN_ID": "81234",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "RANK": "13",
        "LOCAL_RANK": "5",
        "LOCAL_WORLD_SIZE": "8",
        "SLURM_PROCID": "1",  # one srun task per node: torchrun's agent, not a rank
        "SLURM_GTIDS": "1",
    }
    got = attributes(env, "gpu-n02")
    assert got["hypocenter.workload.id"] == "81234" and got["hypocenter.workload.attempt"] == 2
    assert (got["hypocenter.rank"], got["hypocenter.node.ranks"]) == (13, "8-15")


def test_a_jobset_pod_names_the_jobset_its_restart_and_its_node() -> None:
    env = {
        "K8S_NODE_NAME": "gke-a3-pool-7",
        "K8S_POD_NAMESPACE": "research",
        "JOBSET_NAME": "llama-70b",
        "JOBSET_RESTART_ATTEMPT": "1",
        "K8S_JOB_NAME": "llama-70b-workers-0",
        "KUEUE_QUEUE_NAME": "a3-queue",
        "TORCHELASTIC_RUN_ID": "none",
        "RANK": "3",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "8",
    }
    assert attributes(env, "llama-70b-workers-0-0-x7k2p") == {
        "hypocenter.workload.id": "research/llama-70b",
        "hypocenter.workload.name": "llama-70b",
        "hypocenter.workload.attempt": 1,
        "hypocenter.workload.scheduler": "kueue",
        "k8s.node.name": "gke-a3-pool-7",
        "host.name": "gke-a3-pool-7",  # the pod's hostname is the pod, not the node
        "hypocenter.rank": 3,
        "hypocenter.node.ranks": "0-7",
    }


def test_a_plain_kubernetes_job_pod_is_named_by_its_job() -> None:
    env = {"K8S_POD_NAMESPACE": "ml", "K8S_JOB_NAME": "bert-ft", "K8S_NODE_NAME": "node-3"}
    got = attributes(env, "bert-ft-abcde")
    assert (got["hypocenter.workload.id"], got["hypocenter.workload.scheduler"], got["host.name"]) == (
        "ml/bert-ft",
        "kubernetes",
        "node-3",
    )


def test_an_environment_naming_no_job_adds_nothing() -> None:
    assert attributes({"HOME": "/root", "RANK": "3", "SLURM_RESTART_COUNT": "x"}, "laptop") == {}


@pytest.mark.parametrize("bad", ["", "x", "-1", "1e3", "99999999999"])
def test_odd_counters_are_not_taken_for_numbers(bad: str) -> None:
    got = attributes({"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": bad, "RANK": bad}, "n")
    assert got["hypocenter.workload.attempt"] == 0 and "hypocenter.rank" not in got


def test_the_node_ranks_of_every_node_add_up_to_the_attempts_rank_map() -> None:
    """Each process tells its own node's ranks; the server keeps them per node, so the last record
    to arrive does not overwrite the other nodes' ranks."""
    scope: dict[str, str] = {}
    for node, ranks in (("gpu-n01", "0-7"), ("gpu-n02.cluster.example", "8-15"), ("gpu-n01", "0-7")):
        scope.update(
            identify(
                {"host.name": node, "hypocenter.workload.id": "81234", "hypocenter.node.ranks": ranks}
            ).scope
        )
    scope["nodes"] = "gpu-n[01-02]"
    row = AttemptRow(
        id=1,
        workload="81234",
        attempt=0,
        scope=scope,
        context=None,
        nodes=["gpu-n01", "gpu-n02.cluster.example"],
        first_ns=1_700_000_000 * 10**9,
        last_ns=1_700_000_060 * 10**9,
        terminal_ns=None,
        activity=0.0,
        dirty=True,
        analyzed_at=None,
    )
    ctx, _notes = context_for(row, datetime.now(timezone.utc))
    assert ctx.ranks == {"gpu-n01": "0-7", "gpu-n02": "8-15"}


def test_the_package_declares_the_detector_for_the_sdk() -> None:
    assert declared_entry_points()["opentelemetry_resource_detector"] == {
        "hypocenter": "hypocenter.resource_detector:HypocenterResourceDetector"
    }


def test_the_sdk_loads_it_by_name_from_otel_experimental_resource_detectors(tmp_path: Path) -> None:
    """What a training process gets from `Resource.create()` with only two variables set."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(entry_points_path(tmp_path / "meta")), str(REPO)]),
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "hypocenter",
        **SLURM,
    }
    code = (
        "import json; from opentelemetry.sdk.resources import Resource; "
        "print(json.dumps(dict(Resource.create().attributes)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {k: got.get(k) for k in ("hypocenter.workload.id", "host.name", "hypocenter.node.ranks")} == {
        "hypocenter.workload.id": "81234",
        "host.name": "gpu-n02",
        "hypocenter.node.ranks": "8-11",
    }
    assert "Failed to load resource detector" not in r.stderr
