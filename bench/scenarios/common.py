"""Fault patterns shared by several failure modes: a GPU that dies under a rank, the standard end
of a failed job on Slurm or Kubernetes, DCGM series for one GPU, a node that stops.

These only combine `Scenario` helpers; labels stay in the mode modules.
"""

from __future__ import annotations

from bench import kube, metrics, nvidia, pytorch, slurm
from bench.scenario import Scenario
from bench.world import GPU, Node


def pick_gpu(sc: Scenario) -> tuple[Node, GPU, int]:
    node = sc.rng.choice(sc.w.nodes)
    gpu = sc.rng.choice(node.gpus)
    return node, gpu, sc.w.rank(node, gpu.index)


def gpu_death(sc: Scenario, node: Node, gpu: GPU, t: float, *, cuda_msg: str, crash_p: float) -> float:
    """The rank on a failed GPU either dies on a sticky CUDA error or hangs; the rest of the job follows."""
    w, rng = sc.w, sc.rng
    rank = w.rank(node, gpu.index)
    if rng.random() < crash_p:
        tc = t + rng.uniform(0.05, 6)
        if rng.random() < 0.6 or w.stack.torch < (2, 0):
            frames = pytorch.train_frames(w, rng)
            sc.crash(rank, tc, frames, pytorch.cuda_error(w, cuda_msg), key=False)
        else:
            sc.out(rank, tc, pytorch.watchdog_cuda_error(w, rank, cuda_msg))
            sc.exit(rank, tc + rng.uniform(0.1, 1), -6)
        sc.collateral(f"CUDA error '{cuda_msg}' on rank {rank} ({node.name})")
        return sc.after_crash(tc, [rank])
    sc.unkillable.add(rank)
    sc.collateral(f"rank {rank} hung in the driver on {node.name}")
    return sc.timeouts(t, wedged=[rank])


def finish_failed(sc: Scenario, t: float) -> None:
    """Launcher teardown and the scheduler's FAILED record."""
    w, rng = sc.w, sc.rng
    if w.scheduler == "slurm" and sc.kill_on_bad_exit and w.stack.slurm >= (22, 5):
        sc.srun(
            t + rng.uniform(0.5, 2.5), f"srun: launch/slurm: _step_signal: Terminating StepId={w.job_id}.0"
        )
    sc.teardown(t)
    if w.scheduler == "slurm":
        if sc.unkillable:
            node = w.node_of(min(sc.unkillable))
            rec = slurm.node_record(
                w,
                node.name,
                ["IDLE", "DRAIN"] if rng.random() < 0.5 else ["MIXED", "DRAIN"],
                "Kill task failed",
                "slurm",
                sc.end + 60,
            )
            sc.bundle.put("events/scontrol-nodes.json", slurm.scontrol_nodes(w, [rec]))
            sc.collateral(f"slurmd 'Kill task failed' drain of {node.name}")
        banner = "TASK FAILURE" if sc.kill_on_bad_exit and rng.random() < 0.4 else ""
        sc.finish_slurm(state="FAILED", reason="NonZeroExitCode", exit_code=1, banner=banner)
        return
    if w.k8s_kind == "PyTorchJob":
        cond = (
            "Failed",
            "PyTorchJobFailed",
            f"PyTorchJob {w.job_id} is failed because 1 Worker replica(s) failed.",
        )
    else:
        cond = (
            "Failed",
            rng.choice(("FailedJobs", "ReachedMaxRestarts")),
            rng.choice(
                (
                    "jobset failed due to one or more job failures",
                    "jobset failed due to reaching max number of restarts",
                )
            ),
        )
    sc.finish_k8s(state="FAILED", reason=None, job_condition=cond)


def xid_gauge(sc: Scenario, node: Node, gpu: GPU, code: int, t: float, *, vanish: bool = False) -> None:
    """dcgm-exporter's XID gauge for the node's GPUs: last Xid value, sticky; a lost GPU's series stops."""
    w, rng = sc.w, sc.rng
    if rng.random() < 0.35:
        # one scrape, saved as exposition text; a GPU that fell off the bus has no series at all
        t_scrape = t + rng.uniform(20, 90)
        samples = [
            (
                metrics.dcgm_labels(w, node, g, "DCGM_FI_DEV_XID_ERRORS"),
                str(code if g is gpu else 0),
                t_scrape,
            )
            for g in node.gpus
            if not (vanish and g is gpu)
        ]
        fam = ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", samples)
        sc.bundle.put(f"metrics/dcgm-exporter-{node.name}.txt", metrics.openmetrics([fam]))
        return
    step = max(15.0, round((sc.end - w.start) / 150))
    series = []
    for g in node.gpus:
        labels = metrics.dcgm_labels(w, node, g, "DCGM_FI_DEV_XID_ERRORS")
        if g is gpu:

            def val(tt: float) -> float | None:
                if vanish and tt > t + step:
                    return None
                return float(code) if tt >= t else 0.0

            series.append((labels, metrics.sample(w.start, sc.end, step, val)))
        else:
            series.append((labels, metrics.constant(w.start, sc.end, step, 0.0)))
    sc.bundle.put(f"metrics/xid_errors_{node.name}.json", metrics.query_range(series))


def kernel_gpu_teardown(sc: Scenario, node: Node, gpu: GPU, t: float, cause: int | None) -> None:
    """Xid 45 on the node's other GPUs when the driver tears down their channels."""
    rng = sc.rng
    others = [g for g in node.gpus if g is not gpu]
    if not others:
        return
    lines = [
        nvidia.xid45(
            g,
            node.rank_pids[g.index],
            rng.choice(("python", "python3", "pt_main_thread")),
            rng,
            cause if rng.random() < 0.3 else None,
        )
        for g in rng.sample(others, k=rng.randint(1, len(others)))
    ]
    sc.kernel(node, t, lines, level="warning", gap=0.0011)
    sc.collateral(f"Xid 45 on {len(lines)} other GPU(s) of {node.name} during teardown")


def node_stopped_k8s(sc: Scenario, node: Node, t_lost: float) -> str:
    """Node controller view of a node that stopped posting status; returns the file written."""
    w, rng = sc.w, sc.rng
    t_nr = t_lost + rng.uniform(38, 55)
    nobj = kube.node_obj(
        w,
        node,
        ready="Unknown",
        reason="NodeStatusUnknown",
        message="Kubelet stopped posting node status.",
        t=t_nr,
        taints=[
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": kube.ts(t_nr)},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": kube.ts(t_nr)},
        ],
    )
    path = rng.choice(("events/nodes.json", f"events/node-{node.name}.json"))
    sc.bundle.put(path, kube.as_list([nobj]))
    return path
