"""What Slurm writes: srun / slurmstepd lines in job output, and sacct / scontrol JSON.

Formats from Slurm's srun and slurmstepd: `srun: error: <node>: task N: …`, the slurmstepd
banners (the scancel banner changed in 25.05), oom_kill detection, `sacct --json` in the
data_parser v0.0.38 (state as text) and v0.0.39+ (state as list) shapes, `scontrol show node
--json` for drained nodes, and slurmctld log lines. Times in banners are the cluster's local time.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from bench.world import World


def task_list(tasks: list[int]) -> str:
    tasks = sorted(set(tasks))
    parts: list[str] = []
    start = prev = tasks[0]
    for t in [*tasks[1:], -2]:
        if t == prev + 1:
            prev = t
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = t
    return ",".join(parts)


def task_exit(node: str, tasks: list[int], what: str) -> str:
    word = "task" if len(tasks) == 1 else "tasks"
    return f"srun: error: {node}: {word} {task_list(tasks)}: {what}"


def banner(world: World, entity: str, node: str, at: datetime, why: str | None) -> str:
    """slurmstepd's `*** JOB|STEP … ON node CANCELLED AT … ***` banner (the node is the one printing it)."""
    ts = at.strftime("%Y-%m-%dT%H:%M:%S")
    if why is None:  # scancel
        if world.stack.slurm >= (25, 5):
            return f"slurmstepd: error: *** {entity} ON {node} CANCELLED AT {ts} DUE to SIGNAL Terminated ***"
        return f"slurmstepd: error: *** {entity} ON {node} CANCELLED AT {ts} ***"
    return f"slurmstepd: error: *** {entity} ON {node} CANCELLED AT {ts} DUE TO {why} ***"


def oom_detected(world: World, step: str, count: int) -> str:
    if world.stack.slurm >= (22, 5):
        s = "" if count == 1 else "s"
        return f"slurmstepd: error: Detected {count} oom_kill event{s} in StepId={step}. Some of the step tasks have been OOM Killed."
    return f"slurmstepd: error: Detected {count} oom-kill event(s) in StepId={step} cgroup. Some of your processes may have been killed by the cgroup out-of-memory handler."


def ctld_line(d: datetime, text: str) -> str:
    return f"[{d:%Y-%m-%dT%H:%M:%S}.{d.microsecond // 1000:03d}] {text}"


def _number(world: World, value: int) -> Any:
    if world.stack.slurm >= (23, 11):
        return {"set": True, "infinite": False, "number": value}
    return value


def _state(world: World, state: str, reason: str) -> dict[str, Any]:
    if world.stack.slurm >= (23, 2):
        return {"current": [state], "reason": reason}
    return {"current": state, "reason": reason}


def sacct_json(
    world: World,
    *,
    state: str,
    reason: str,
    exit_code: int,
    signal: int,
    start: float,
    end: float,
    limit_min: int,
    steps: list[dict[str, Any]],
    kill_user: str | None = None,
) -> str:
    """`sacct -j <id> --json` for the job and its steps."""
    status = "SUCCESS" if exit_code == 0 and signal == 0 else ("SIGNALED" if signal else "ERROR")
    job: dict[str, Any] = {
        "account": world.rng.choice(("llm", "research", "prod-train", "default")),
        "cluster": world.cluster,
        "derived_exit_code": {
            "status": [status] if world.stack.slurm >= (23, 2) else status,
            "return_code": _number(world, exit_code),
            "signal": {"id": _number(world, signal), "name": ""},
        },
        "exit_code": {
            "status": [status] if world.stack.slurm >= (23, 2) else status,
            "return_code": _number(world, exit_code),
            "signal": {
                "id": _number(world, signal),
                "name": {0: "", 9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT"}.get(signal, ""),
            },
        },
        "job_id": int(world.job_id),
        "name": world.job_name,
        "nodes": world.hostlist(),
        "partition": world.rng.choice(("gpu", "batch", "hpc", "a3", "pretrain")),
        "state": _state(world, state, reason),
        "steps": steps,
        "time": {
            "elapsed": int(end - start),
            "end": int(end),
            "limit": _number(world, limit_min),
            "start": int(start),
            "submission": int(start) - world.rng.randint(30, 7200),
        },
        "user": world.user,
        "allocation_nodes": len(world.nodes),
        "tres": {
            "allocated": [
                {"type": "gres", "name": "gpu", "count": world.world_size},
                {"type": "node", "name": "", "count": len(world.nodes)},
            ]
        },
    }
    if kill_user is not None:
        job["kill_request_user"] = kill_user
    doc = {
        "meta": {
            "plugin": {"type": "openapi/slurmdbd", "name": "Slurm OpenAPI slurmdbd"},
            "Slurm": {
                "version": {
                    "major": str(world.stack.slurm[0]),
                    "minor": f"{world.stack.slurm[1]:02d}",
                    "micro": "1",
                },
                "release": f"{world.stack.slurm[0]}.{world.stack.slurm[1]:02d}.1",
            },
        },
        "jobs": [job],
        "warnings": [],
        "errors": [],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def scontrol_job_json(
    world: World,
    *,
    state: str,
    reason: str,
    exit_code: int,
    signal: int,
    start: float,
    end: float,
    limit_min: int,
) -> str:
    """`scontrol show job <id> --json` of the finished job (kept by slurmctld for MinJobAge)."""
    job: dict[str, Any] = {
        "job_id": int(world.job_id),
        "name": world.job_name,
        "user_name": world.user,
        "account": "research",
        "job_state": [state] if world.stack.slurm >= (23, 2) else state,
        "state_reason": reason,
        "exit_code": {
            "status": ["SUCCESS" if exit_code == 0 and signal == 0 else "ERROR"],
            "return_code": _number(world, exit_code),
            "signal": {"id": _number(world, signal), "name": ""},
        },
        "nodes": world.hostlist(),
        "node_count": _number(world, len(world.nodes)),
        "batch_host": world.master.name,
        "start_time": _number(world, int(start)),
        "end_time": _number(world, int(end)),
        "time_limit": _number(world, limit_min),
        "partition": "gpu",
        "cluster": world.cluster,
    }
    return (
        json.dumps(
            {"meta": {"plugin": {"type": "openapi/slurmctld"}}, "jobs": [job], "errors": [], "warnings": []},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def step(
    world: World,
    step_id: str,
    name: str,
    state: str,
    exit_code: int,
    signal: int,
    start: float,
    end: float,
    nodes: list[str] | None = None,
) -> dict[str, Any]:
    names = nodes if nodes is not None else [n.name for n in world.nodes]
    status = "SUCCESS" if exit_code == 0 and signal == 0 else ("SIGNALED" if signal else "ERROR")
    return {
        "step": {
            "id": step_id
            if world.stack.slurm < (23, 2)
            else {"job_id": int(world.job_id), "step_id": step_id.split(".")[-1]},
            "name": name,
        },
        "state": [state] if world.stack.slurm >= (23, 2) else state,
        "exit_code": {
            "status": [status] if world.stack.slurm >= (23, 2) else status,
            "return_code": _number(world, exit_code),
            "signal": {"id": _number(world, signal), "name": ""},
        },
        "nodes": {"count": len(names), "range": world.hostlist(names)},
        "time": {"elapsed": int(end - start), "end": int(end), "start": int(start)},
    }


def scontrol_nodes(world: World, nodes: list[dict[str, Any]]) -> str:
    return (
        json.dumps(
            {"meta": {"plugin": {"type": "openapi/slurmctld"}}, "nodes": nodes, "errors": [], "warnings": []},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def node_record(
    world: World, name: str, state: list[str], reason: str, reason_user: str, reason_time: float
) -> dict[str, Any]:
    return {
        "name": name,
        "hostname": name,
        "state": state,
        "reason": reason,
        "reason_set_by_user": reason_user,
        "reason_changed_at": _number(world, int(reason_time)),
        "gres": f"gpu:{world.platform}:{world.gpus_per_node}",
        "partitions": ["gpu"],
        "cpus": 224,
        "real_memory": 2063000,
    }
