"""Outcomes other than a single attributed cause: a completed job full of scary-but-harmless lines
(not_failed), two independent hard faults at once (ambiguous), and two abstention tests —
a silent hang with no host evidence (S15) and NCCL timeouts everywhere with nothing behind them."""

from __future__ import annotations

from datetime import datetime

from bench import kube, metrics, nccl, nvidia, pytorch
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed, pick_gpu
from bench.timeline import LineFn

# Dealt after the other modes (bench.generate), so the corpora that existed before them keep their bundles.
LATE = frozenset({"ambiguous-cross-domain-double-fault"})


def _pg_not_destroyed(sc: Scenario, rank: int) -> LineFn:
    w = sc.w

    def render(d: datetime) -> str:
        return pytorch.prefixed(
            w,
            rank,
            [
                f"{pytorch.glog(w, d, 'W', 'ProcessGroupNCCL.cpp:1250')} Warning: WARNING: process group has NOT been destroyed before we destruct "
                "ProcessGroupNCCL. On normal program exit, the application should call destroy_process_group to ensure that any pending NCCL "
                "operations have finished in this process. In rare cases this process can exit before this point and block the progress of another "
                "member of the process group. This constraint has always been present,  but this warning has only been added since PyTorch 2.4 "
                "(function operator())"
            ],
            c10d=True,
        )

    return render


def completed(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    end = sc.plan.t_begin + rng.uniform(1800, 10 * 3600)
    sc.train(end - rng.uniform(2, 5), key_last=True)
    sc.out(
        0,
        end - 1,
        "[after training is done] datetime: "
        if w.framework == "megatron"
        else "Training completed. Saving final model...",
        err=False,
    )
    scary = 0
    if w.nccl_debug:
        for r in rng.sample(range(w.world_size), k=min(3, w.world_size)):
            node = w.node_of(r)
            sc.out(
                r,
                w.start + rng.uniform(20, 40),
                nccl.warn(
                    w,
                    node,
                    w.rank_pid(r),
                    w.local_of(r),
                    "transport/net_ib.cc:112",
                    f"NET/IB : {node.hcas[0].name}:1 Got non-fatal async event: GID table changed(18)",
                ),
            )
        scary += 1
    if w.stack.torch >= (2, 4):
        for r in range(0, w.world_size, max(1, w.world_size // 64)):
            sc.out(r, end + rng.uniform(0.1, 2), _pg_not_destroyed(sc, r))
        scary += 1
    r = rng.randrange(w.world_size)
    from bench.training import benign_c10d_warning

    sc.out(r, w.start + rng.uniform(10, 20), benign_c10d_warning(w, r, rng))
    node, gpu, _ = pick_gpu(sc)
    t_old = w.start - rng.uniform(1800, 4 * 3600)
    if t_old > node.boot_time + 60:
        sc.kernel(node, t_old, nvidia.xid13(gpu, rng))
        sc.distractor(f"Xid 13 on {node.name} from an earlier job")
    node2 = rng.choice(w.nodes)
    sc.kernel(
        node2,
        rng.uniform(w.start, end),
        nvidia.aer_corrected(node2.gpu_root_port(node2.gpus[0]), rng, newer_kernel=True),
        level="warning",
    )
    sc.distractor(f"correctable AER on {node2.name}; benign NCCL/c10d warnings ({scary + 1} kinds)")
    for r in range(w.world_size):
        sc.exit(r, end + rng.uniform(0.5, 3), 0)
    sc.end = end + rng.uniform(5, 30)
    if w.uses_torchrun:
        for n in w.nodes:
            agent = n.agent_pid

            def done(d: datetime, agent: int = agent) -> str:
                if w.stack.torch >= (2, 3):
                    return (
                        f"I{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {agent} torch/distributed/elastic/agent/server/api.py:879] [default] "
                        "worker group successfully finished. Waiting 300 seconds for other agents to finish."
                    )
                return "INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish"

            sc.node_out(n, end + rng.uniform(3, 5), done)
    sc.forbid.update({"xid45_teardown", "truncated"})
    if w.scheduler == "slurm":
        sc.finish_slurm(state="COMPLETED", reason="None", exit_code=0)
    else:
        sc.finish_k8s(
            state="SUCCEEDED",
            reason=None,
            pod_exit={n.name: ("Completed", 0, None) for n in w.nodes},
            job_condition=(
                "Succeeded",
                "PyTorchJobSucceeded" if w.k8s_kind == "PyTorchJob" else "AllJobsCompleted",
                f"{w.k8s_kind} {w.job_id} is successfully completed."
                if w.k8s_kind == "PyTorchJob"
                else "jobset completed successfully",
            ),
        )


_SYSLOG_FORMATS = frozenset(
    {"syslog", "syslog_uptime", "rsyslog_iso", "rfc5424", "journal_iso", "journal_precise", "journal_json"}
)


def _fault(sc: Scenario, kind: str, t: float, exclude: set[str]) -> tuple[str, str]:
    """Emit one hard fault of `kind` on a node not in `exclude`; returns (node name, domain)."""
    w, rng = sc.w, sc.rng
    pool = [n for n in w.nodes if n.name not in exclude]
    if kind == "gpulost":
        # a health check's output reaches the syslog or journal, not the kernel's own log or dmesg
        pool = [n for n in pool if n.kernel_format in _SYSLOG_FORMATS]
        if not pool:
            return _fault(sc, "xid79", t, exclude)
    node = rng.choice(pool)
    gpu = rng.choice(node.gpus)
    if kind == "xid79":
        lines = nvidia.xid79_lines(gpu, rng)
        sc.kernel(node, t, lines, key=True)
        sc.culprit([node], [(node, "gpu", gpu.pci)])
        text, domain = lines[0], "hardware"
    elif kind == "xid48":
        text = nvidia.xid48(gpu, rng)
        sc.kernel(node, t, text, key=True)
        sc.culprit([node], [(node, "gpu", gpu.pci)])
        domain = "hardware"
    elif kind == "xid119":
        lines = nvidia.xid119(gpu, w, rng, node.rank_pids[gpu.index], "python")
        sc.kernel(node, t, lines, key=True)
        sc.culprit([node], [(node, "gpu", gpu.pci)])
        text, domain = lines[0], "hardware"
    elif kind == "link":
        hca = rng.choice(node.hcas)
        text = (
            nvidia.mlx5_link(hca, "DOWN")
            if not hca.netdev.startswith("enp")
            else nvidia.mlx5_eth_link(hca, False)
        )
        sc.kernel(node, t, text, key=True, level="warning")
        sc.culprit([node], [sc.hca_component(node, hca, "port")])
        domain = "network"
    elif kind == "nicfw":
        hca = rng.choice(node.hcas)
        text = nvidia.mlx5_cmd_timeout(hca, rng)
        sc.kernel(node, t, text, key=True)
        sc.culprit([node], [sc.hca_component(node, hca, "nic")])
        domain = "network"
    elif kind == "xid94":
        text = nvidia.xid94(gpu, rng, node.rank_pids[gpu.index], "python")
        sc.kernel(node, t, text, key=True)
        sc.culprit([node], [(node, "gpu", gpu.pci)])
        domain = "hardware"
    elif kind == "module":
        hca = rng.choice(node.hcas)
        text = nvidia.mlx5_module_error(hca, rng, module=node.hcas.index(hca))
        sc.kernel(node, t, text, key=True)
        sc.culprit([node], [sc.hca_component(node, hca, "nic")])
        domain = "network"
    elif kind == "lustre":
        fs = rng.choice(("scratch", "lustre1", "work"))
        ost = f"{fs}-OST{rng.randint(0, 63):04x}"
        nid = f"172.16.{rng.randint(1, 9)}.{rng.randint(2, 60)}@o2ib"
        text = (
            f"Lustre: {ost}-osc-ffff{rng.randint(0x8F00, 0x9FFF):x}{rng.randint(0, 0xFFFFFFFF):08x}: Connection to {ost} (at {nid}) was lost; "
            "in progress operations using this service will wait for recovery to complete"
        )
        sc.kernel(node, t, text, key=True, level="warning")
        sc.culprit([node], [(node, "filesystem", ost)])
        domain = "storage"
    elif kind == "nfs":
        server = rng.choice(("fs01", "nfs-ckpt", "vast-vip-3", "10.0.8.20", "filer2"))
        text = f"nfs: server {server} not responding, still trying"
        sc.kernel(node, t, text, key=True, level="warning")
        sc.culprit([node], [(node, "filesystem", server)])
        domain = "storage"
    elif kind == "gpulost":
        # A health check's nvidia-smi run, logged to the journal (`nvidia-smi 2>&1 | logger -t gpu-health`):
        # NVML's NVML_ERROR_GPU_IS_LOST, as nvidia-smi prints it.
        text = f"Unable to determine the device handle for GPU {gpu.pci.upper()}.0: GPU is lost.  Reboot the system to recover this GPU"
        sc.daemon(node, t, "gpu-health", text, level="err", key=True)
        sc.culprit([node], [(node, "gpu", gpu.pci)])
        domain = "hardware"
    else:
        assert kind == "oom", kind
        pid = node.rank_pids[gpu.index]
        rss = rng.randint(150, 1900) * 1024 * 1024
        lines = [
            "python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
            f"Out of memory: Killed process {pid} (python) total-vm:{rss + rng.randint(10**7, 10**8)}kB, "
            f"anon-rss:{rss}kB, file-rss:{rng.randint(10**4, 10**6)}kB, shmem-rss:0kB, UID:{w.uid} "
            f"pgtables:{rng.randint(10**5, 10**6)}kB oom_score_adj:0",
        ]
        sc.kernel(node, t, lines, key=True)
        sc.culprit([node])
        text, domain = lines[-1], "resource"
    if sc.truth.root_event is None:
        sc.root_event(node, sc.kstream(node).path, text)
    return node.name, domain


def double_fault(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 20))
    kinds = rng.sample(("xid79", "xid48", "xid119", "link", "nicfw"), k=2)
    n1, d1 = _fault(sc, kinds[0], t, set())
    n2, d2 = _fault(sc, kinds[1], t + rng.uniform(0.5, 8), {n1})
    sc.truth.domain = d1 if d1 == d2 else "ambiguous"
    sc.truth.subdomain = "ambiguous"
    sc.collateral(f"two independent faults: {kinds[0]} on {n1}, {kinds[1]} on {n2}")
    wedged = [w.rank(w.node(n), 0) for n, k in ((n1, kinds[0]), (n2, kinds[1])) if k in ("xid79", "xid119")]
    for r in wedged:
        sc.unkillable.add(r)
    t_first = sc.timeouts(t, wedged=wedged)
    finish_failed(sc, t_first)


# Pairs of independent faults in different domains, from the kernel's own wording: a GPU that fell
# off the bus beside an InfiniBand port going down, a double-bit ECC error beside a lost Lustre or
# NFS server, a host OOM kill beside a GPU Xid. Every rank's collective then times out, so each
# fault's node also shows the other's symptoms.
_CROSS_PAIRS = (
    ("xid79", "link"),
    ("xid79", "module"),
    ("xid48", "lustre"),
    ("xid94", "nfs"),
    ("xid48", "nfs"),
    ("oom", "xid79"),
    ("oom", "xid48"),
    ("oom", "link"),
    ("lustre", "link"),
    ("nicfw", "oom"),
    ("gpulost", "oom"),
    ("gpulost", "lustre"),
)


def cross_domain_double_fault(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 20))
    kinds = list(rng.choice(_CROSS_PAIRS))
    rng.shuffle(kinds)
    n1, d1 = _fault(sc, kinds[0], t, set())
    n2, d2 = _fault(sc, kinds[1], t + rng.uniform(0.5, 45), {n1})
    assert d1 != d2
    sc.truth.domain = "ambiguous"
    sc.truth.subdomain = "ambiguous"
    sc.collateral(f"two independent faults in two domains: {kinds[0]} on {n1}, {kinds[1]} on {n2}")
    wedged = [w.rank(w.node(n), 0) for n, k in ((n1, kinds[0]), (n2, kinds[1])) if k == "xid79"]
    for r in wedged:
        sc.unkillable.add(r)
    killed = [w.rank(w.node(n), 0) for n, k in ((n1, kinds[0]), (n2, kinds[1])) if k == "oom"]
    for r in killed:
        sc.exit(r, t + rng.uniform(0.01, 0.3), -9)
    t_first = sc.timeouts(t, wedged=wedged, waiting=[r for r in range(w.world_size) if r not in killed])
    finish_failed(sc, t_first)


def s15_silent_hang(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.kernel_logs = False
    sc.begin()
    t = sc.fault_time(1800, 6 * 3600)
    sc.train(t)
    limit = t + rng.uniform(2, 10) * 3600
    for r in range(w.world_size):
        sc.exit(r, limit + rng.uniform(0.5, 4), -15)
    sc.end = limit + rng.uniform(5, 60)
    if rng.random() < 0.6:
        node = rng.choice(w.nodes)
        diag = [
            "$ dmesg | tail -n 50",
            "dmesg: read kernel buffer failed: Operation not permitted",
            "$ nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE | grep -E 'Pending|Uncorr|HW Slowdown|Remapping Failure'",
            *[
                "        Pending Page Blacklist            : No",
                "            Uncorrectable Error           : 0",
                "        Remapping Failure Occurred        : No",
                "            HW Slowdown                   : Not Active",
            ]
            * 2,
        ]
        sc.bundle.put(f"logs/{node.name}/diag-{rng.randint(100, 999)}.txt", "\n".join(diag) + "\n")
        sc.distractor("container diagnostics: dmesg not permitted, nvidia-smi clean")
    sc.forbid.update({"truncated"})
    sc.collateral(f"training output stops at {sc.utc(t)} on every rank; no error anywhere")
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
    if rng.random() < 0.5:
        step = max(60.0, round((sc.end - w.start) / 100))
        series = [
            (
                metrics.dcgm_labels(w, n, g, "DCGM_FI_DEV_GPU_UTIL"),
                metrics.sample(w.start, sc.end, step, lambda tt: 100.0 if tt > sc.plan.t_begin else 0.0),
            )
            for n in w.nodes[:8]
            for g in n.gpus[:2]
        ]
        sc.bundle.put("metrics/dcgm_gpu_util.json", metrics.query_range(series))


def unknown_timeouts(sc: Scenario) -> None:
    rng = sc.rng
    sc.begin()
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    t_first = sc.timeouts(t)
    sc.collateral(
        "every rank enqueued the same collective and none completed it; no host, fabric or GPU evidence"
    )
    finish_failed(sc, t_first)


MODES = (
    Mode(
        "completed-scary-but-harmless",
        "not_failed",
        None,
        None,
        1.0,
        completed,
        "a job that completed although its logs hold alarming lines (benign NCCL/c10d warnings, old Xids, correctable AER)",
    ),
    Mode(
        "ambiguous-double-fault",
        "ambiguous",
        "ambiguous",
        "ambiguous",
        0.5,
        double_fault,
        "two independent hard faults on different nodes within seconds, neither explaining the other",
    ),
    Mode(
        "ambiguous-cross-domain-double-fault",
        "ambiguous",
        "ambiguous",
        "ambiguous",
        0.5,
        cross_domain_double_fault,
        "two independent faults on different nodes in different domains (GPU and fabric, GPU and storage, host memory and GPU) within the ambiguity window",
    ),
    Mode(
        "s15-silent-hang-no-host-logs",
        "unattributed",
        None,
        None,
        1.0,
        s15_silent_hang,
        "training stops silently, no kernel logs, no watchdog; the job runs into its time limit",
    ),
    Mode(
        "unknown-nccl-timeout",
        "unattributed",
        None,
        None,
        1.0,
        unknown_timeouts,
        "NCCL watchdog timeouts on every rank with no other evidence anywhere",
    ),
)
