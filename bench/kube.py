"""Kubernetes, Kueue, PyTorchJob and JobSet objects as `kubectl … -o json` / YAML would print them.

Pod container termination states (`Error`/1, `OOMKilled`/137, 143 after SIGTERM), pod
`DisruptionTarget` conditions, `kubectl get events -o json` lists, node `Ready=Unknown`
(`NodeStatusUnknown`), Kueue Workload conditions (`Evicted`/`Preempted` with the preemption
message template) — as the Kubernetes, Kueue and JobSet controllers write them. Pure data builders; no timing decisions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import yaml

from bench.world import Node, World


def ts(t: float) -> str:
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_list(items: list[dict[str, Any]]) -> str:
    return (
        json.dumps(
            {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def pod(
    world: World,
    node: Node,
    *,
    start: float,
    end: float | None,
    phase: str,
    reason: str | None,
    exit_code: int | None,
    message: str | None = None,
    restarts: int = 0,
    conditions: list[dict[str, Any]] | None = None,
    pod_reason: str | None = None,
    pod_message: str | None = None,
) -> dict[str, Any]:
    labels = (
        {"app": world.job_name, "training.kubeflow.org/job-name": world.job_id}
        if world.k8s_kind == "PyTorchJob"
        else {
            "jobset.sigs.k8s.io/jobset-name": world.job_id,
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/restart-attempt": str(world.attempt),
        }
    )
    if world.kueue:
        labels["kueue.x-k8s.io/queue-name"] = "lq-" + world.namespace
    state: dict[str, Any]
    if end is None or exit_code is None:
        state = {"running": {"startedAt": ts(start)}}
    else:
        term: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason or "Error",
            "startedAt": ts(start),
            "finishedAt": ts(end),
            "containerID": f"containerd://{world.hexid(64, node.pod, 'cid')}",
        }
        if message:
            term["message"] = message
        state = {"terminated": term}
    conds = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(start - 20)},
        {"type": "Initialized", "status": "True", "lastTransitionTime": ts(start - 5)},
        {
            "type": "Ready",
            "status": "True" if end is None else "False",
            "lastTransitionTime": ts(start if end is None else end),
        },
    ]
    conds += conditions or []
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": node.mgmt_ip,
        "podIP": f"192.168.{node.index // 200}.{node.index % 200 + 10}",
        "startTime": ts(start - 20),
        "conditions": conds,
        "containerStatuses": [
            {
                "name": "pytorch" if world.k8s_kind == "PyTorchJob" else "trainer",
                "ready": end is None,
                "restartCount": restarts,
                "state": state,
                "image": "nvcr.io/nvidia/pytorch:"
                + {
                    (2, 1): "23.10",
                    (2, 2): "24.01",
                    (2, 3): "24.04",
                    (2, 4): "24.07",
                    (2, 5): "24.10",
                    (2, 6): "25.01",
                    (2, 7): "25.04",
                    (2, 8): "25.06",
                }.get(world.stack.torch, "24.07")
                + "-py3",
            }
        ],
    }
    if pod_reason:
        status["reason"] = pod_reason
    if pod_message:
        status["message"] = pod_message
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": node.pod,
            "namespace": world.namespace,
            "labels": labels,
            "uid": world.uuid(node.pod, "uid"),
            "creationTimestamp": ts(start - 30),
        },
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "pytorch" if world.k8s_kind == "PyTorchJob" else "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": str(world.gpus_per_node), "memory": "1800Gi"}},
                }
            ],
        },
        "status": status,
    }


def disruption(reason: str, message: str, t: float) -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": ts(t),
    }


def event(
    world: World,
    *,
    kind: str,
    name: str,
    reason: str,
    message: str,
    t: float,
    etype: str = "Normal",
    component: str = "kubelet",
    host: str | None = None,
    count: int = 1,
    namespace: str | None = None,
) -> dict[str, Any]:
    src: dict[str, str] = {"component": component}
    if host:
        src["host"] = host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{name}.{world.hexid(16, name, reason, t)}",
            "namespace": namespace if namespace is not None else world.namespace,
            "creationTimestamp": ts(t),
        },
        "involvedObject": {
            "kind": kind,
            "name": name,
            "namespace": world.namespace if kind != "Node" else "",
            "apiVersion": {
                "Pod": "v1",
                "Node": "v1",
                "Workload": "kueue.x-k8s.io/v1beta1",
                "PyTorchJob": "kubeflow.org/v1",
                "JobSet": "jobset.x-k8s.io/v1alpha2",
            }.get(kind, "v1"),
        },
        "reason": reason,
        "message": message,
        "type": etype,
        "count": count,
        "firstTimestamp": ts(t),
        "lastTimestamp": ts(t),
        "source": src,
        "reportingComponent": component,
    }


def node_obj(
    world: World,
    node: Node,
    *,
    ready: str,
    reason: str,
    message: str,
    t: float,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "nvidia.com/gpu.product": world.model_name().replace(" ", "-"),
            },
        },
        "spec": spec,
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": ts(t),
                    "lastHeartbeatTime": ts(t - 40),
                },
            ],
            "allocatable": {"nvidia.com/gpu": str(world.gpus_per_node)},
        },
    }


def kueue_workload(world: World, conditions: list[dict[str, Any]], *, as_yaml: bool) -> str:
    obj = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": f"{world.k8s_kind.lower()}-{world.job_id}-{world.hexid(5, 'wl')}",
            "namespace": world.namespace,
            "uid": world.uuid("workload"),
        },
        "spec": {
            "queueName": "lq-" + world.namespace,
            "priority": world.rng.choice((0, 100, 1000)),
            "podSets": [{"name": "workers", "count": len(world.nodes)}],
        },
        "status": {"conditions": conditions},
    }
    if as_yaml:
        return yaml.safe_dump(obj, sort_keys=True, width=1000)
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def condition(ctype: str, status: str, reason: str, message: str, t: float) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": ts(t),
    }


def job_status(world: World, conditions: list[dict[str, Any]], restarts: int = 0) -> str:
    kind = world.k8s_kind
    obj: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1" if kind == "PyTorchJob" else "jobset.x-k8s.io/v1alpha2",
        "kind": kind,
        "metadata": {"name": world.job_id, "namespace": world.namespace},
        "status": {"conditions": conditions},
    }
    if kind == "JobSet":
        obj["status"]["restarts"] = restarts
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"
