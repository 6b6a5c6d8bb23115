"""resource/gpu_oom, resource/host_oom, resource/time_limit: CUDA OOM on some ranks, the host OOM
killer (S09) in Slurm and Kubernetes forms, and a genuine wall-time limit with progress to the end."""

from __future__ import annotations

from bench import kube, pytorch, slurm
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed


def gpu_oom(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time(120, 4 * 3600)
    sc.train(t - rng.uniform(1, 30))
    pick = rng.random()
    if pick < 0.7:
        ranks = [rng.randrange(w.world_size)]
    elif pick < 0.85:
        ranks = list(w.ranks_of(rng.choice(w.nodes)))
    else:
        nodes = rng.sample(w.nodes, k=min(len(w.nodes), rng.randint(2, 3)))
        ranks = [w.rank(n, rng.randrange(w.gpus_per_node)) for n in nodes]
    frames = [
        *pytorch.train_frames(w, rng),
        (
            f"/workspace/model/{rng.choice(('attention.py', 'mlp.py', 'moe.py'))}",
            rng.randint(60, 400),
            "forward",
            rng.choice(
                (
                    "attn = torch.softmax(scores, dim=-1)",
                    "h = self.act(self.up(x)) * self.gate(x)",
                    "logits = self.lm_head(h).float()",
                )
            ),
        ),
    ]
    first = ranks[0]
    for r in ranks:
        tr = t if r == first else t + rng.uniform(0.05, 2.0)
        exc = pytorch.gpu_oom(w, w.local_of(r), rng)
        sc.crash(r, tr, frames, exc)
        if r == first:
            root = exc[0].split(". Tried")[0] + ("." if ". Tried" in exc[0] else "")
            sc.root_event(w.node_of(first), sc.rank_stream(first).path, root)
    sc.culprit(w.node_of(r) for r in ranks)
    t_detect = sc.after_crash(t, [first])
    finish_failed(sc, t_detect)


def host_oom(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes)
    rank = w.rank(node, rng.randrange(w.gpus_per_node))
    t = sc.fault_time(300, 5 * 3600)
    sc.train(t - rng.uniform(1, 30))
    worker = rng.random() < 0.4
    victim_pid = w.rank_pid(rank) + rng.randint(50, 400) if worker else w.rank_pid(rank)
    comm = "pt_data_worker" if worker else "python"
    if w.scheduler == "slurm":
        memcg = f"/slurm/uid_{w.uid}/job_{w.job_id}"
        task_memcg = f"{memcg}/step_0/task_{w.task_id(rank)}"
    else:
        pod_uid = w.uuid(node.pod, "uid").replace("-", "_")
        memcg = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid}.slice"
        task_memcg = f"{memcg}/cri-containerd-{w.hexid(64, node.pod, 'cid')}.scope"
    rss = rng.randint(150, 1900) * 1024 * 1024
    lines = [
        f"{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj={0 if w.scheduler == 'slurm' else 937}",
        f"CPU: {rng.randint(0, 223)} PID: {victim_pid + 3} Comm: {comm} Tainted: P           OE     {w.stack.kernel} #129-Ubuntu",
        f"memory: usage {rss + 40960}kB, limit {rss + 40960}kB, failcnt {rng.randint(1, 400)}",
        f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={'/' if w.scheduler == 'slurm' else 'cri-containerd-' + w.hexid(12, node.pod) + '.scope'},"
        f"mems_allowed=0-1,oom_memcg={memcg},task_memcg={task_memcg},task={comm},pid={victim_pid},uid={w.uid if w.scheduler == 'slurm' else 0}",
        f"Memory cgroup out of memory: Killed process {victim_pid} ({comm}) total-vm:{rss + rng.randint(10**7, 10**8)}kB, anon-rss:{rss - rng.randint(10**5, 10**6)}kB, "
        f"file-rss:{rng.randint(10**4, 10**6)}kB, shmem-rss:{rng.randint(0, 10**6)}kB, UID:{w.uid if w.scheduler == 'slurm' else 0} "
        f"pgtables:{rng.randint(10**5, 10**6)}kB oom_score_adj:{0 if w.scheduler == 'slurm' else 937}",
    ]
    sc.root_kernel(node, t, lines, root_line=len(lines) - 1)
    sc.culprit([node])
    if w.scheduler == "kubernetes":
        for r in w.ranks_of(node):
            sc.exit(r, t + rng.uniform(0.01, 0.5), -9)
        sc.lost_nodes.pop(node.name, None)
        t_detect = sc.after_crash(t, [rank])
        sc.teardown(t_detect)
        ev = [
            kube.event(
                w,
                kind="Node",
                name=node.name,
                reason="OOMKilling",
                message=lines[-1],
                t=t + 1,
                etype="Warning",
                component="kernel-monitor",
                host=node.name,
                namespace="default",
            )
        ]
        cond = (
            (
                "Failed",
                "PyTorchJobFailed",
                f"PyTorchJob {w.job_id} is failed because 1 Worker replica(s) failed.",
            )
            if w.k8s_kind == "PyTorchJob"
            else ("Failed", "FailedJobs", "jobset failed due to one or more job failures")
        )
        sc.finish_k8s(
            state="FAILED",
            reason=None,
            pod_exit={node.name: ("OOMKilled", 137, None)},
            events=ev,
            job_condition=cond,
        )
        return
    if worker:
        site = w.python_site
        frames = [
            *pytorch.train_frames(w, rng),
            (
                f"{site}/torch/utils/data/dataloader.py",
                1133,
                "_try_get_data",
                "raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly') from e",
            ),
        ]
        sc.crash(
            rank,
            t + rng.uniform(0.5, 5),
            frames,
            [f"RuntimeError: DataLoader worker (pid(s) {victim_pid}) exited unexpectedly"],
            key=False,
        )
    else:
        sc.exit(rank, t + rng.uniform(0.01, 0.3), -9)
    sc.oom_tasks.add(rank)
    if rng.random() < 0.35:
        sc.oom_word = "Killed"  # srun's plain signal line: only the oom_kill line and the state say OOM
    sc.srun(t + rng.uniform(1, 4), slurm.oom_detected(w, f"{w.job_id}.0", 1), key=True)
    t_detect = sc.after_crash(t, [rank])
    sc.teardown(t_detect)
    sc.finish_slurm(
        state="OUT_OF_MEMORY",
        reason="OutOfMemory",
        exit_code=0,
        signal=125 if rng.random() < 0.5 else 9,
        attempt_exit=None,
    )


def time_limit(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    limit_s = rng.choice((2, 4, 6, 8, 12, 24, 48)) * 3600
    end = w.start + limit_s
    sc.train(end - rng.uniform(0.5, 3), key_last=True)
    # Tasks that do not exit on SIGTERM are SIGKILLed after KillWait: srun then says `task N: Killed`,
    # the same words as after an OOM kill; the TIME LIMIT banner and the TIMEOUT state decide.
    stubborn = (
        set(w.ranks_of(rng.choice(w.nodes))) if w.launcher == "srun_tasks" and rng.random() < 0.35 else set()
    )
    for r in range(w.world_size):
        sc.exit(
            r,
            end + (rng.uniform(30, 34) if r in stubborn else rng.uniform(0.2, 4)),
            -9 if r in stubborn else -15,
        )
    sc.end = end + rng.uniform(1, 40)
    sc.forbid.add("truncated")
    if w.scheduler == "slurm":
        sc.srun(
            end + 0.3,
            f"srun: Job step aborted: Waiting up to {rng.choice((32, 62, 92))} seconds for job step to finish.",
        )
        sc.teardown(end)
        sc.finish_slurm(
            state="TIMEOUT",
            reason="TimeLimit",
            exit_code=0,
            banner="TIME LIMIT",
            limit_min=limit_s // 60,
            attempt_exit=None,
        )
        sc.root_event(None, sc.job_stream().path, "DUE TO TIME LIMIT")
        sc.collateral("all tasks terminated by the time limit")
        return
    sc.teardown(end)
    sc.root_event(
        None, "events/" + w.k8s_kind.lower() + ".json", "Job was active longer than specified deadline"
    )
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
                t=end,
                etype="Warning",
                component="job-controller",
            )
        ],
        job_condition=("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"),
    )
    sc.collateral("pods terminated at activeDeadlineSeconds")


MODES = (
    Mode(
        "gpu-oom",
        "attributed",
        "resource",
        "gpu_oom",
        1.5,
        gpu_oom,
        "torch.OutOfMemoryError (CUDA OOM) on one or a few ranks",
    ),
    Mode(
        "s09-host-oom-killer",
        "attributed",
        "resource",
        "host_oom",
        1.0,
        host_oom,
        "the host/cgroup OOM killer kills a rank or its DataLoader worker (Slurm OUT_OF_MEMORY, Kubernetes OOMKilled)",
    ),
    Mode(
        "time-limit-genuine",
        "attributed",
        "resource",
        "time_limit",
        1.0,
        time_limit,
        "the job makes progress until its wall-time limit and is killed by the scheduler",
    ),
)
