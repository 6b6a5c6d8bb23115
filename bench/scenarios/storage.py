"""storage/filesystem: an NFS/Lustre stall on one node during a checkpoint (S05), and a checkpoint
write that fails with ENOSPC / EDQUOT / EIO on the writer rank (S13)."""

from __future__ import annotations

from bench import metrics, pytorch
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed
from bench.training import checkpoint_lines


def _hung_task(sc: Scenario, pid: int, lustre: bool) -> list[str]:
    rng = sc.rng
    frames = (
        [
            "cl_sync_io_wait+0x1a5/0x2c0 [obdclass]",
            "ll_file_io_generic+0x45e/0x6b0 [lustre]",
            "ll_file_write_iter+0x4f1/0x7a0 [lustre]",
        ]
        if lustre
        else [
            "rpc_wait_bit_killable+0x1e/0xa0 [sunrpc]",
            "__rpc_execute+0x10b/0x3f0 [sunrpc]",
            "nfs_wait_on_request+0x30/0x40 [nfs]",
            "nfs_file_write+0x14c/0x2a0 [nfs]",
        ]
    )
    return [
        f"INFO: task python:{pid} blocked for more than {rng.choice((120, 122, 241))} seconds.",
        f"      Tainted: P           OE     {sc.w.stack.kernel} #1",
        '"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.',
        f"task:python          state:D stack:0     pid:{pid} ppid:{pid - rng.randint(20, 60)} flags:0x00004002",
        "Call Trace:",
        " <TASK>",
        " __schedule+0x2eb/0x8a0",
        " schedule+0x5d/0xd0",
        *[f" {f}" for f in frames],
        " vfs_write+0x2bf/0x3e0",
        " ksys_write+0x67/0xe0",
        " do_syscall_64+0x59/0x90",
        " entry_SYSCALL_64_after_hwframe+0x6e/0xd8",
        " </TASK>",
    ]


def s05_fs_stall(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes)
    t = sc.fault_time()
    it = sc.train(t - rng.uniform(2, 20))
    start, _done = checkpoint_lines(w, it, rng, 0.0)
    sc.out(0, t - 1.5, start, err=False)
    lustre = rng.random() < 0.5
    if lustre:
        fs = rng.choice(("scratch", "lustre1", "work"))
        ost = f"{fs}-OST{rng.randint(0, 63):04x}"
        nid = f"172.16.{rng.randint(1, 9)}.{rng.randint(2, 60)}@o2ib"
        lines = [
            f"Lustre: {ost}-osc-ffff{rng.randint(0x8F00, 0x9FFF):x}{rng.randint(0, 0xFFFFFFFF):08x}: Connection to {ost} (at {nid}) was lost; "
            "in progress operations using this service will wait for recovery to complete",
            f"Lustre: {rng.randint(1000, 9999)}:0:(client.c:2328:ptlrpc_expire_one_request()) @@@ Request sent has timed out for slow reply: "
            f"[sent {int(t) - 47}/real {int(t) - 47}]  req@ffff{rng.randint(0, 0xFFFFFFFF):08x} x{rng.randint(10**15, 10**16)}/t0(0) "
            f"o4->{ost}-osc-ffff@{nid}:6/4 lens 488/448 e 1 to 1 dl {int(t)} ref 2 fl Rpc:X/0/ffffffff rc 0/-1",
        ]
        recover = f"Lustre: {ost}-osc-ffff{rng.randint(0x8F00, 0x9FFF):x}{rng.randint(0, 0xFFFFFFFF):08x}: Connection restored to {ost} (at {nid})"
        comp = ("filesystem", ost)
    else:
        server = rng.choice(("fs01", "nfs-ckpt", "vast-vip-3", "10.0.8.20", "filer2"))
        lines = [f"nfs: server {server} not responding, still trying"]
        recover = f"nfs: server {server} OK"
        comp = ("filesystem", server)
    sc.root_kernel(node, t, lines, level="warning")
    pid = node.rank_pids[rng.randrange(w.gpus_per_node)]
    sc.kernel(node, t + rng.uniform(121, 250), _hung_task(sc, pid, lustre), key=True, gap=0.00002)
    sc.culprit([node], [(node, comp[0], comp[1])])
    t_saved = t + rng.uniform(20, 60)
    seq = sc.plan.seq_at(t) + 1
    laggards = dict.fromkeys(w.ranks_of(node), seq - 1)
    if rng.random() < 0.2 and w.stack.torch < (2, 4):
        # no collective timeout (async error handling off): the job sits until its time limit
        limit = t + rng.uniform(2, 10) * 3600
        sc.kernel(node, t + rng.uniform(600, 1800), recover, level="info")
        for r in range(w.world_size):
            sc.exit(r, limit + rng.uniform(0.5, 3), -15)
        if w.scheduler == "slurm":
            sc.srun(
                limit + 0.3,
                f"srun: Job step aborted: Waiting up to {rng.choice((32, 62))} seconds for job step to finish.",
            )
        sc.end = limit + rng.uniform(5, 40)
        sc.teardown(limit)
        if w.scheduler == "slurm":
            sc.finish_slurm(
                state="TIMEOUT",
                reason="TimeLimit",
                exit_code=0,
                banner="TIME LIMIT",
                limit_min=int((limit - w.start) // 60),
                attempt_exit=None,
            )
        else:
            sc.finish_k8s(
                state="FAILED",
                reason="DeadlineExceeded",
                job_condition=("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"),
            )
        sc.collateral("job hung in the next collective until its time limit")
        return
    t_first = sc.timeouts(
        t_saved, waiting=[r for r in range(w.world_size) if r not in laggards], lagging=laggards, seq=seq
    )
    sc.kernel(node, t + rng.uniform(700, 1200), recover, level="info")
    finish_failed(sc, t_first)


_CKPT_ERRORS = (  # ENOSPC, EDQUOT, ENOSPC as torch's zip writer reports it, EIO
    "OSError: [Errno 28] No space left on device",
    "OSError: [Errno 122] Disk quota exceeded",
    "RuntimeError: [enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/{n}: file write failed",
    "OSError: [Errno 5] Input/output error",
)


def s13_ckpt_write(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    writer = 0 if rng.random() < 0.7 else w.rank(rng.choice(w.nodes), 0)
    node = w.node_of(writer)
    t = sc.fault_time()
    it = sc.train(t - rng.uniform(2, 20))
    start, _ = checkpoint_lines(w, it, rng, 0.0)
    sc.out(0, t - rng.uniform(5, 40), start, err=False)
    msg = rng.choice(_CKPT_ERRORS)
    msg = msg.format(n=rng.randint(12, 900))
    ckdir = rng.choice(("/checkpoints", "/lustre/ckpt", "/mnt/nfs/ckpt"))
    if msg.startswith("OSError") and rng.random() < 0.6:
        msg += f": '{ckdir}/{w.job_name}/iter_{it:07d}/mp_rank_00/model_optim_rng.pt'"
    site = w.python_site
    frames = [
        *pytorch.train_frames(w, rng),
        (
            "/workspace/megatron-lm/megatron/training/checkpointing.py"
            if w.framework == "megatron"
            else f"{pytorch.script_path(w)}",
            rng.randint(300, 500),
            "save_checkpoint",
            "torch.save(state_dict, checkpoint_name)",
        ),
        (
            f"{site}/torch/serialization.py",
            628 if w.stack.torch < (2, 4) else 850,
            "save",
            "_save(obj, opened_zipfile, pickle_module, pickle_protocol)",
        ),
        (
            f"{site}/torch/serialization.py",
            862 if w.stack.torch < (2, 4) else 1114,
            "_save",
            "zip_file.write_record(name, storage, num_bytes)",
        ),
    ]
    sc.crash(writer, t, frames, [msg])
    sc.root_event(node, sc.rank_stream(writer).path, msg)
    sc.culprit([node], [(node, "filesystem", ckdir)])
    if writer == 0:
        master = w.hostname(node)
        for r in sc.alive()[:: max(1, w.world_size // 12)]:
            sc.out(r, t + rng.uniform(1, 10), pytorch.tcpstore_reset(w, r, master, rng))
        sc.collateral("TCPStore errors on other ranks after rank 0 (store host) exited")
    t_detect = sc.after_crash(t, [writer])
    finish_failed(sc, t_detect)
    if rng.random() < 0.4:
        step = max(30.0, round((sc.end - w.start) / 120))
        series = []
        for n in w.nodes[:16] if node in w.nodes[:16] else [node, *w.nodes[:8]]:
            hit = n is node
            total = 50e12

            def avail(tt: float, hit: bool = hit, total: float = total) -> float:
                if not hit:
                    return total * 0.41
                return (
                    max(0.0, total * 0.02 * (1 - (tt - w.start) / max(1.0, t - w.start))) if tt < t else 0.0
                )

            series.append(
                (
                    {
                        "__name__": "node_filesystem_avail_bytes",
                        "instance": f"{n.name}:9100",
                        "job": "node",
                        "mountpoint": ckdir,
                        "device": "fs01:/ckpt" if "nfs" in ckdir else "172.16.3.7@o2ib:/scratch",
                        "fstype": "nfs4" if "nfs" in ckdir else "lustre",
                    },
                    metrics.sample(w.start, sc.end, step, avail, "{:.0f}"),
                )
            )
        sc.bundle.put("metrics/node_filesystem_avail_bytes.json", metrics.query_range(series))


MODES = (
    Mode(
        "s05-fs-stall-checkpoint",
        "attributed",
        "storage",
        "filesystem",
        2.5,
        s05_fs_stall,
        "NFS/Lustre stall on one node during a checkpoint: hung task, that node's ranks lag (lower last enqueued)",
    ),
    Mode(
        "s13-checkpoint-enospc",
        "attributed",
        "storage",
        "filesystem",
        1.5,
        s13_ckpt_write,
        "checkpoint write fails on the writer rank (ENOSPC / EDQUOT / EIO / PytorchStreamWriter)",
    ),
)
