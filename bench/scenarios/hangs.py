"""Hangs that only the forensics reveal: Flight Recorder dumps (several format versions, pickle and
JSON, some ranks' dumps missing, ring buffers that no longer reach back to the first collective) and
`ncclras` reports, next to logs that say nothing but "time limit".

These modes are dealt after the others (`LATE`): under `--prior real` they replace a share of the
picks equal to their weight, so every other bundle of a corpus stays what it was before them.
"""

from __future__ import annotations

from bench import flight_recorder as fr
from bench import kube, nvidia, pytorch
from bench.scenario import Mode, Scenario
from bench.scenarios.common import pick_gpu

LATE = frozenset(
    {"fr-laggard-time-limit", "fr-desync-time-limit", "fr-stalled-gpu-hang", "ras-dead-process-time-limit"}
)
MAX_NODES = 48


def _version(sc: Scenario) -> str:
    """The dump format the world's torch writes (approximately; docs/hangs.md)."""
    t = sc.w.stack.torch
    return "1.4" if t < (2, 4) else "2.2" if t < (2, 5) else "2.3" if t < (2, 8) else "2.7"


def _frames(sc: Scenario, op: str) -> list[dict[str, object]]:
    site = sc.w.python_site
    return [
        {"name": op, "filename": f"{site}/torch/distributed/distributed_c10d.py", "line": 2501},
        {"name": "wrapper", "filename": f"{site}/torch/distributed/c10d_logger.py", "line": 83},
        {"name": "train_step", "filename": pytorch.script_path(sc.w), "line": sc.rng.randint(80, 400)},
        {"name": "main", "filename": pytorch.script_path(sc.w), "line": sc.rng.randint(401, 900)},
    ]


def write_dumps(
    sc: Scenario,
    t_stall: float,
    stuck: int,
    behind: dict[int, int],
    *,
    odd: dict[int, str] | None = None,
    missing: set[int] | None = None,
) -> dict[int, str]:
    """Every rank's Flight Recorder dump: collectives up to `stuck` (started, never completed) on the
    waiting ranks, up to their own last one on the ranks `behind`; `odd` ranks record another
    operation at `stuck`; `missing` ranks leave no dump. Returns each written dump's path by rank."""
    w, rng = sc.w, sc.rng
    version = _version(sc)
    fmt = "json" if tuple(map(int, version.split("."))) >= fr.JSON_FROM and rng.random() < 0.35 else "pickle"
    # Collected into one traces/ folder (only where the attempt has a rank map to place them: pod
    # bundles may lack one), else left in each node's logs.
    flat = w.output != "pods" and rng.random() < 0.4
    depth = rng.choice((6, 20, 64))  # how far back the ring buffer still reaches
    step = sc.plan.iter_s / max(1, sc.plan.colls_per_iter)
    world = list(range(w.world_size))
    name = "all_reduce" if rng.random() < 0.7 else "_reduce_scatter_base"
    paths: dict[int, str] = {}
    for r in world:
        if r in (missing or set()):
            continue
        last = behind.get(r, stuck)
        ops = []
        for s in range(max(1, last - depth + 1), last + 1):
            op = (odd or {}).get(r, name) if s == stuck else name
            state = "completed" if s < stuck else "started"
            ops.append(fr.Op(s, f"nccl:{op}", sc.numel, state, int((t_stall - (stuck - s) * step) * 1e9)))
        doc = fr.dump_doc(
            version,
            ops,
            world,
            frames=_frames(sc, name),
            timeout_ms=w.timeout_ms,
            status=(last, last, min(last, stuck - 1)),
        )
        file = f"nccl_trace_rank_{r}" + (".json" if fmt == "json" else "")
        where = "traces" if flat else f"logs/{w.node_of(r).name}"
        paths[r] = f"{where}/{file}"
        sc.bundle.put_bytes(paths[r], fr.encode(doc, fmt))
    return paths


def _time_limit_end(sc: Scenario, t: float) -> None:
    """Nothing is printed after the stall; the job runs into its time limit hours later."""
    w, rng = sc.w, sc.rng
    limit = t + rng.uniform(1, 6) * 3600
    for r in range(w.world_size):
        sc.exit(r, limit + rng.uniform(0.5, 4), -15)
    sc.end = limit + rng.uniform(5, 60)
    sc.forbid.update({"truncated"})
    if w.scheduler == "slurm":
        sc.srun(
            limit + 0.3,
            f"srun: Job step aborted: Waiting up to {rng.choice((32, 62))} seconds for job step to finish.",
        )
        sc.teardown(limit)
        sc.finish_slurm(
            state="TIMEOUT",
            reason="TimeLimit",
            exit_code=0,
            banner="TIME LIMIT",
            limit_min=int((limit - w.start) // 60),
            attempt_exit=None,
        )
    else:
        sc.teardown(limit)
        sc.finish_k8s(
            state="FAILED",
            reason="DeadlineExceeded",
            events=[
                kube.event(
                    w,
                    kind=w.k8s_kind,
                    name=w.job_id,
                    reason="DeadlineExceeded",
                    message="Job was active longer than specified deadline",
                    t=limit,
                    etype="Warning",
                    component="job-controller",
                )
            ],
            job_condition=("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"),
        )


def fr_laggard(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.kernel_logs = False
    sc.begin()
    t = sc.fault_time(1800, 6 * 3600)
    sc.train(t)
    rank = rng.randrange(w.world_size)
    node = w.node_of(rank)
    stuck = sc.plan.seq_at(t) + 1
    if w.output != "pods" and rng.random() < 0.2:
        # The laggard's own dump is missing (its process is wedged): the others and the rank map still say it.
        missing = {rank}
    else:  # a few other ranks' dumps were not collected
        others = [r for r in range(w.world_size) if r != rank]
        missing = set(rng.sample(others, min(len(others) // 4, rng.choice((0, 0, 1, 2)))))
    paths = write_dumps(sc, t, stuck, {rank: stuck - 1}, missing=missing)
    shown = rank if rank in paths else min(paths)  # the laggard's dump, else a waiting rank's
    sc.root_event(w.node_of(shown), paths[shown], "nccl:")
    sc.culprit([node])
    sc.collateral(f"rank {rank} never enqueued collective {stuck}; only the Flight Recorder dumps show it")
    _time_limit_end(sc, t)


def fr_desync(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.kernel_logs = False
    sc.begin()
    t = sc.fault_time(1800, 6 * 3600)
    sc.train(t)
    rank = rng.randrange(w.world_size)
    stuck = sc.plan.seq_at(t) + 1
    paths = write_dumps(sc, t, stuck, {}, odd={rank: "broadcast"})
    sc.root_event(w.node_of(rank), paths[rank], "nccl:broadcast")
    sc.culprit([w.node_of(rank)])
    sc.collateral(f"rank {rank} issued broadcast where the others all-reduce at collective {stuck}")
    _time_limit_end(sc, t)


def fr_stalled_gpu_hang(sc: Scenario) -> None:
    """A GPU hangs inside a collective: every rank started it, none completed it; the node's kernel
    log names the GPU. The dumps say "not a laggard"; the Xid explains the hang."""
    rng = sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time(1800, 6 * 3600)
    sc.train(t)
    stuck = sc.plan.seq_at(t) + 1
    paths = write_dumps(sc, t, stuck, {})
    code = rng.choice((46, 109))
    t_xid = t + rng.uniform(1, 60)
    sc.root_kernel(node, t_xid, [nvidia.gpu_hang_xid(gpu, code, rng, node.rank_pids[gpu.index], "python")])
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    sc.collateral(f"collective {stuck} started on every rank ({len(paths)} dumps) and completed on none")
    _time_limit_end(sc, t_xid)


def ras_dead_process(sc: Scenario) -> None:
    """One rank's process vanished without a word; the others wait until the time limit. ncclras
    names it dead; its Flight Recorder dump is the one missing."""
    w, rng = sc.w, sc.rng
    sc.kernel_logs = False
    sc.begin()
    t = sc.fault_time(1800, 6 * 3600)
    sc.train(t)
    rank = rng.randrange(w.world_size)
    node = w.node_of(rank)
    stuck = sc.plan.seq_at(t) + 1
    paths = write_dumps(sc, t, stuck, {}, missing={rank})
    gpu = rank % w.gpus_per_node
    nccl = ".".join(map(str, w.stack.nccl))
    behind = [] if rng.random() < 0.7 else [(rank, stuck - 1, gpu, node.name, w.rank_pid(rank))]
    report = fr.ras_report(
        nccl, [(w.rank_pid(rank), node.name, gpu)], behind, w.world_size, len(w.nodes), w.world_size - 1
    )
    where = (
        "traces/ncclras.txt"
        if w.output != "pods" and rng.random() < 0.5
        else f"logs/_job/ncclras-{w.job_id}.txt"
    )
    sc.bundle.put(where, report)
    sc.root_event(node, where, f"Process {w.rank_pid(rank)} on node {node.name}")
    sc.culprit([node])
    sc.collateral(
        f"rank {rank}'s process is gone: no dump ({len(paths)} others wait in collective {stuck}), ncclras says DEAD"
    )
    _time_limit_end(sc, t)


MODES = (
    Mode(
        "fr-laggard-time-limit",
        "attributed",
        "software",
        "hang",
        1.0,
        fr_laggard,
        "silent hang until the time limit; only the Flight Recorder dumps name the rank that never issued the collective",
        min_torch=(2, 3),
        max_nodes=MAX_NODES,
    ),
    Mode(
        "fr-desync-time-limit",
        "attributed",
        "software",
        "user_code",
        0.5,
        fr_desync,
        "silent hang until the time limit; the dumps show one rank recorded another collective at the same sequence id",
        min_torch=(2, 3),
        max_nodes=MAX_NODES,
    ),
    Mode(
        "fr-stalled-gpu-hang",
        "attributed",
        "hardware",
        "gpu",
        0.5,
        fr_stalled_gpu_hang,
        "a GPU hangs inside a collective (Xid 46/109): the dumps show it started everywhere, the kernel log names the GPU",
        min_torch=(2, 3),
        max_nodes=MAX_NODES,
    ),
    Mode(
        "ras-dead-process-time-limit",
        "attributed",
        "software",
        "hang",
        0.3,
        ras_dead_process,
        "a rank's process vanishes silently; ncclras reports it dead and its Flight Recorder dump is the one missing",
        min_torch=(2, 3),
        max_nodes=MAX_NODES,
    ),
)
