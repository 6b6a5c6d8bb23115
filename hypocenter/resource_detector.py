"""Tagging without code: an OpenTelemetry resource detector that names the attempt from the environment.

A training script, or an agent started beside it, that uses the OpenTelemetry SDK gets its records
tagged by setting two variables, with no line of code about hypocenter:

    OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=hypocenter
    OTEL_EXPORTER_OTLP_ENDPOINT=http://hypocenter:4318

The SDK loads this detector through the `opentelemetry_resource_detector` entry point named
`hypocenter`, and every `Resource.create()` (the SDK's default resource included) then carries the
workload, attempt, node and rank attributes of `hypocenter.names`, read from what the job's
environment already says: Slurm (`SLURM_*`), torchrun (`TORCHELASTIC_*`, `RANK`, `LOCAL_RANK`,
`LOCAL_WORLD_SIZE`), Kubernetes JobSet / Job pods (downward-API variables, docs/sending.md). A
scheduler's ids win over torchrun's: the workload is the Slurm job or the JobSet, and torchrun's own
run id names it only when torchrun runs alone.

`attributes(environ)` is the whole mapping, a pure function; the detector class only hands it the
process environment. It reads nothing else (no file, no network) and never raises: an environment
it does not recognise gives no attributes, and the SDK's other detectors are unaffected.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource, ResourceDetector

from hypocenter.names import NODE_RANKS_KEY

WORKLOAD = "hypocenter.workload.id"
ATTEMPT = "hypocenter.workload.attempt"
NAME = "hypocenter.workload.name"
SCHEDULER = "hypocenter.workload.scheduler"
CLUSTER = "hypocenter.workload.cluster"
NODES = "hypocenter.attempt.nodes"
HOST = "host.name"
K8S_NODE = "k8s.node.name"
RANK = "hypocenter.rank"

# The downward-API variables a pod spec sets for the detector (docs/sending.md shows the snippet).
K8S_VARIABLES = {
    "K8S_NODE_NAME": "spec.nodeName",
    "K8S_POD_NAMESPACE": "metadata.namespace",
    "JOBSET_NAME": "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
    "JOBSET_RESTART_ATTEMPT": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']",
    "K8S_JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']",
    "KUEUE_QUEUE_NAME": "metadata.labels['kueue.x-k8s.io/queue-name']",
}

_COUNT = re.compile(r"\d{1,9}")


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and _COUNT.fullmatch(text.strip()) else None


def _ranges(ranks: list[int]) -> str:
    """`0,1,2,3,8` → `0-3,8`: the rank-map spelling of `hypocenter.attempt.ranks`."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == r - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        elif out and "-" not in out[-1] and int(out[-1]) == r - 1:
            out[-1] = f"{out[-1]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)


def _node_ranks(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """This process's global rank and the ranks its node runs. torchrun numbers a node's workers
    consecutively (RANK = the node's first rank + LOCAL_RANK); `srun` lists a node's tasks in
    SLURM_GTIDS, which are the ranks when srun starts one task per rank."""
    rank, local, per_node = (_count(env.get(k)) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    if rank is not None and local is not None and per_node and local <= rank:
        first = rank - local
        return rank, _ranges(list(range(first, first + per_node)))
    if rank is not None:
        return rank, None
    gtids = env.get("SLURM_GTIDS", "")
    tasks = [int(t) for t in gtids.split(",") if _COUNT.fullmatch(t.strip())]
    procid = _count(env.get("SLURM_PROCID"))
    if tasks and procid is not None:
        return procid, _ranges(tasks)
    return None, None


def attributes(env: Mapping[str, str], hostname: str | None = None) -> dict[str, str | int]:
    """The resource attributes the environment names (empty when it names no workload)."""
    attrs: dict[str, str | int] = {}
    slurm_job = env.get("SLURM_JOB_ID")
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    jobset, k8s_job = env.get("JOBSET_NAME"), env.get("K8S_JOB_NAME")
    namespace = env.get("K8S_POD_NAMESPACE")
    torch_run = env.get("TORCHELASTIC_RUN_ID")
    if slurm_job:
        # sacct's and the Slurm prolog's spelling: an array task is `<array job>_<task>`
        attrs[WORKLOAD] = f"{array_job}_{array_task}" if array_job and array_task else slurm_job
        attrs[ATTEMPT] = _count(env.get("SLURM_RESTART_COUNT")) or 0
        attrs[SCHEDULER] = "slurm"
        if env.get("SLURM_CLUSTER_NAME"):
            attrs[CLUSTER] = env["SLURM_CLUSTER_NAME"]
        if env.get("SLURM_JOB_NAME"):
            attrs[NAME] = env["SLURM_JOB_NAME"]
        if env.get("SLURM_JOB_NODELIST"):
            attrs[NODES] = env["SLURM_JOB_NODELIST"]
        node = env.get("SLURMD_NODENAME") or hostname
    elif jobset or k8s_job:
        # `namespace/name`: the id the Kueue poller and `analyze --kube` give the same job
        name = jobset or k8s_job or ""
        attrs[WORKLOAD] = f"{namespace}/{name}" if namespace else name
        attrs[NAME] = name
        attrs[ATTEMPT] = _count(env.get("JOBSET_RESTART_ATTEMPT")) or 0
        attrs[SCHEDULER] = "kueue" if env.get("KUEUE_QUEUE_NAME") else "kubernetes"
        node = env.get("K8S_NODE_NAME")  # a pod's hostname is the pod's name, not its node's
        if node:
            attrs[K8S_NODE] = node
    elif torch_run:
        attrs[WORKLOAD] = torch_run
        attrs[ATTEMPT] = _count(env.get("TORCHELASTIC_RESTART_COUNT")) or 0
        attrs[SCHEDULER] = "torchrun"
        node = hostname
    else:
        return {}
    if node:
        attrs[HOST] = node
    rank, ranks = _node_ranks(env)
    if rank is not None:
        attrs[RANK] = rank
    if ranks is not None:
        attrs[NODE_RANKS_KEY] = ranks
    return attrs


class HypocenterResourceDetector(ResourceDetector):
    """The `hypocenter` resource detector (entry point group `opentelemetry_resource_detector`)."""

    def detect(self) -> Resource:
        try:
            hostname: str | None = socket.gethostname()
        except OSError:
            hostname = None
        return Resource(attributes(os.environ, hostname))


__all__ = ["K8S_VARIABLES", "HypocenterResourceDetector", "attributes"]
