"""software/user_code, software/configuration, software/hang.

User code: one rank's exception fanning out into "network" errors (S06), a collective mismatch
(S08), an application-caused illegal memory access with Xid 13/31/43, and the same exception on
every rank. Configuration: wrong NCCL_SOCKET_IFNAME, duplicate GPU, rendezvous port in use.
Hang: a DataLoader deadlock on one rank found by its lower `last enqueued NCCL work` (S07).
"""

from __future__ import annotations

from bench import nccl, nvidia, pytorch
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed
from bench.world import Node

_DATA_ERRORS = (
    ("KeyError", "'input_ids'", 'ids = sample["input_ids"]'),
    ("IndexError", "list index out of range", "doc = self.documents[self.index[idx]]"),
    (
        "json.decoder.JSONDecodeError",
        "Expecting value: line 1 column 1 (char 0)",
        "record = json.loads(line)",
    ),
    (
        "UnicodeDecodeError",
        "'utf-8' codec can't decode byte 0x8b in position 1: invalid start byte",
        "text = raw.decode('utf-8')",
    ),
    (
        "FileNotFoundError",
        "[Errno 2] No such file or directory: '/data/shards/shard-{n:05d}.arrow'",
        "table = pa.ipc.open_file(path).read_all()",
    ),
    ("ValueError", "cannot reshape array of size 0 into shape (2048,)", "tokens = arr.reshape(self.seq_len)"),
)
_MODEL_ERRORS = (
    "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension 1",
    "AssertionError: sequence length {b} exceeds max_position_embeddings {a}",
    "ZeroDivisionError: division by zero",
    "TypeError: unsupported operand type(s) for +: 'NoneType' and 'Tensor'",
    "AttributeError: 'NoneType' object has no attribute 'shape'",
)
_EVERYWHERE = (
    "TypeError: forward() got an unexpected keyword argument 'position_ids'",
    "ModuleNotFoundError: No module named 'flash_attn'",
    'RuntimeError: Error(s) in loading state_dict for GPTModel:\n\tMissing key(s) in state_dict: "decoder.layers.0.self_attention.linear_qkv.weight".',
    "ValueError: Attempting to unscale FP16 gradients.",
    "AttributeError: 'DistributedDataParallel' object has no attribute 'generate'",
    "ValueError: Expected input batch_size (512) to match target batch_size (256).",
)


def _user_exception(sc: Scenario) -> tuple[list[pytorch.Frame], list[str]]:
    w, rng = sc.w, sc.rng
    if rng.random() < 0.55:
        cls, msg, code = rng.choice(_DATA_ERRORS)
        msg = msg.format(n=rng.randint(0, 4000))
        site = w.python_site
        worker = rng.randint(0, 7)
        exc = [
            f"{cls}: Caught {cls.split('.')[-1]} in DataLoader worker process {worker}.",
            "Original Traceback (most recent call last):",
            f'  File "{site}/torch/utils/data/_utils/worker.py", line 308, in _worker_loop',
            "    data = fetcher.fetch(index)",
            f'  File "{site}/torch/utils/data/_utils/fetch.py", line 51, in fetch',
            "    data = [self.dataset[idx] for idx in possibly_batched_index]",
            f'  File "/workspace/data/{rng.choice(("dataset.py", "indexed_dataset.py", "loader.py"))}", line {rng.randint(40, 300)}, in __getitem__',
            f"    {code}",
            f"{cls}: {msg}",
        ]
        return pytorch.train_frames(w, rng, depth="data"), exc
    a = rng.choice((4096, 8192, 2048))
    line = rng.choice(_MODEL_ERRORS).format(a=a, b=a + rng.randint(1, 7))
    frames = [
        *pytorch.train_frames(w, rng),
        (
            f"/workspace/model/{rng.choice(('attention.py', 'transformer.py', 'moe.py'))}",
            rng.randint(80, 600),
            "forward",
            "x = x + self.pos_emb[:, : x.size(1)]",
        ),
    ]
    return frames, [line]


def s06_single_rank(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    rank = rng.randrange(w.world_size) if rng.random() < 0.85 else 0
    node = w.node_of(rank)
    t = sc.fault_time()
    sc.train(t - rng.uniform(2, 40))
    frames, exc = _user_exception(sc)
    sc.crash(rank, t, frames, exc)
    sc.root_event(node, sc.rank_stream(rank).path, exc[-1])
    sc.culprit([node])
    if rank == 0:
        master = w.hostname(node)
        for r in sc.alive()[:: max(1, w.world_size // 12)]:
            sc.out(r, t + rng.uniform(1, 10), pytorch.tcpstore_reset(w, r, master, rng))
        sc.collateral("TCPStore errors after rank 0 exited")
    t_detect = sc.after_crash(t, [rank])
    finish_failed(sc, t_detect)


def s08_mismatch(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 10))
    node = rng.choice(w.nodes)
    odd = [w.rank(node, rng.randrange(w.gpus_per_node))] if rng.random() < 0.7 else list(w.ranks_of(node))
    base = sc.op
    odd_op = rng.choice([o for o in ("BROADCAST", "ALLREDUCE", "_ALLGATHER_BASE", "BARRIER") if o != base])
    seq = sc.plan.seq_at(t)
    sc.timeouts(t, ops=dict.fromkeys(odd, odd_op), seq=seq, key_ranks=odd)
    t_first = t + w.timeout_ms / 1000
    sc.root_event(
        node,
        sc.rank_stream(odd[0]).path,
        f"[Rank {odd[0]}] Watchdog caught collective operation timeout: {pytorch.work_desc(w, seq, odd_op, sc.numel, w.timeout_ms)}",
    )
    sc.culprit([node])
    sc.collateral(
        f"ranks {min(odd)}..{max(odd)} issued {odd_op} while the others issued {base} at SeqNum={seq}"
    )
    finish_failed(sc, t_first)


def app_illegal_access(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time(60, 3 * 3600)
    sc.train(t - rng.uniform(1, 20))
    everywhere = rng.random() < 0.4
    ranks = list(range(w.world_size)) if everywhere else [rng.randrange(w.world_size)]
    frames = [
        *pytorch.train_frames(w, rng),
        (
            f"{w.python_site}/{rng.choice(('flash_attn/flash_attn_interface.py', 'apex/normalization/fused_layer_norm.py', 'transformer_engine/pytorch/module/linear.py'))}",
            rng.randint(80, 900),
            rng.choice(("forward", "_flash_attn_forward", "apply")),
            "out = kernel(*args)",
        ),
    ]
    exc = pytorch.cuda_error(w, "an illegal memory access was encountered")
    first = ranks[0] if not everywhere else rng.choice(ranks)
    xid_kind = rng.choice((31, 31, 13))
    nodes_hit: dict[str, Node] = {}
    for r in ranks:
        node = w.node_of(r)
        gpu = node.gpus[w.local_of(r)]
        tr = t + (0 if r == first else rng.uniform(0.01, 3.0))
        if xid_kind == 31:
            sc.kernel(
                node,
                tr - 0.002,
                nvidia.xid31(
                    gpu, rng, node.rank_pids[gpu.index], "python", newer=w.stack.driver_major >= 525
                ),
                key=True,
            )
        else:
            sc.kernel(node, tr - 0.004, nvidia.xid13(gpu, rng), key=True, gap=0.00005)
            if rng.random() < 0.5:
                sc.kernel(node, tr + 0.5, nvidia.xid43(gpu, rng, node.rank_pids[gpu.index]))
        sc.crash(r, tr, frames if not sc.compact else frames[-2:], exc, key=r == first or not sc.compact)
        nodes_hit[node.name] = node
    sc.root_event(w.node_of(first), sc.rank_stream(first).path, exc[0])
    sc.culprit(nodes_hit.values())
    sc.collateral(f"Xid {xid_kind} on the GPUs of the faulting rank(s)")
    t_detect = t + 5 if everywhere else sc.after_crash(t, [first])
    finish_failed(sc, t_detect)


def identical_everywhere(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    early = rng.random() < 0.6
    t = sc.plan.t_begin + (rng.uniform(5, 200) if early else rng.uniform(600, 4 * 3600))
    sc.train(t - 1)
    exc = [rng.choice(_EVERYWHERE)]
    exc = exc[0].split("\n")
    frames = pytorch.train_frames(w, rng)
    if sc.compact:
        frames = frames[-2:]
    for r in range(w.world_size):
        sc.crash(r, t + rng.uniform(0, 2.5), frames, exc, key=r < w.gpus_per_node or not sc.compact)
    sc.root_event(w.nodes[0], sc.rank_stream(0).path, exc[0])
    sc.culprit(w.nodes)
    sc.collateral("the same exception on every rank")
    finish_failed(sc, t + 3)


def _init_failure(
    sc: Scenario, affected: list[Node], exc_for: dict[int, list[str]], warn_for: dict[int, str], t: float
) -> float:
    """Ranks on `affected` nodes fail while creating the communicator; the rest wait in their first collective."""
    w, rng = sc.w, sc.rng
    frames = [
        *pytorch.train_frames(w, rng)[:2],
        (
            f"{w.python_site}/torch/distributed/distributed_c10d.py",
            4104 if w.stack.torch >= (2, 4) else 3696,
            "barrier",
            "work = default_pg.barrier(opts=opts)",
        ),
    ]
    first = None
    for node in affected:
        for r in w.ranks_of(node):
            tr = t + rng.uniform(0, 4)
            if r in warn_for and w.nccl_debug:
                sc.out(r, tr - 0.05, warn_for[r], key=True)
            sc.crash(r, tr, frames, exc_for[r], key=first is None or not sc.compact)
            if first is None:
                first = r
    rest = [r for r in range(w.world_size) if w.node_of(r) not in affected]
    if rest and not sc.kill_on_bad_exit and rng.random() < 0.5:
        return sc.timeouts(t, waiting=rest, seq=1, op="BARRIER" if rng.random() < 0.6 else "ALLREDUCE")
    return t + rng.uniform(1, 5)


def socket_ifname(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    one = rng.random() < 0.5 and len(w.nodes) > 1
    if w.stack.nccl < (2, 13, 0) and w.nccl_debug is None:
        w.nccl_debug = "WARN"
    sc.env["NCCL_SOCKET_IFNAME"] = rng.choice(("eth0", "ib0", "bond0", "enp0s1", "ens3f0"))
    sc.begin(startup=False)
    t = w.start + rng.uniform(40, 900)
    affected = [rng.choice(w.nodes)] if one else list(w.nodes)
    warn_line = "Bootstrap : no socket interface found"
    warn_for = {r: nccl.bootstrap_no_interface(w, n, r) for n in affected for r in w.ranks_of(n)}
    exc = pytorch.nccl_error_exc(w, 3, warn_line)
    t_detect = _init_failure(sc, affected, dict.fromkeys(warn_for, exc), warn_for, t)
    root_node = affected[0]
    if w.nccl_debug:
        sc.root_event(
            root_node,
            sc.rank_stream(w.rank(root_node, 0)).path,
            warn_for[w.rank(root_node, 0)].split("NCCL WARN ", 1)[1],
        )
    else:
        sc.root_event(root_node, sc.rank_stream(w.rank(root_node, 0)).path, exc[0])
    sc.culprit(affected)
    sc.collateral("no training step ran: the job failed while creating the NCCL communicator")
    finish_failed(sc, t_detect)


def duplicate_gpu(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    if w.stack.nccl < (2, 13, 0) and w.nccl_debug is None:
        w.nccl_debug = "WARN"
    sc.begin(startup=False)
    t = w.start + rng.uniform(30, 400)
    node = rng.choice(w.nodes)
    a = rng.randrange(w.gpus_per_node // 2)
    b = a + w.gpus_per_node // 2
    ra, rb = w.rank(node, a), w.rank(node, b)
    busid = node.gpus[a].nccl_busid
    line = nccl.duplicate_gpu(w, node, ra, rb, busid)
    exc = pytorch.nccl_error_exc(w, 5, line.split("NCCL WARN ", 1)[1])
    warn_for = {ra: line, rb: nccl.duplicate_gpu(w, node, rb, ra, busid)}
    t_detect = _init_failure(sc, [node], dict.fromkeys(w.ranks_of(node), exc), warn_for, t)
    sc.root_event(node, sc.rank_stream(ra).path, line.split("NCCL WARN ", 1)[1] if w.nccl_debug else exc[0])
    sc.culprit([node])
    sc.collateral("ranks on one node share a GPU (CUDA_VISIBLE_DEVICES misconfigured)")
    finish_failed(sc, t_detect)


def port_in_use(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin(startup=False)
    node = w.master
    port = w.master_port
    t = w.start + rng.uniform(3, 30)
    if w.stack.torch >= (2, 4):
        msg = (
            f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: {port}, "
            "useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"
        )
    else:
        msg = (
            f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. The server socket has "
            f"failed to bind to [::]:{port} (errno: 98 - Address already in use). The server socket has failed to bind to 0.0.0.0:{port} "
            "(errno: 98 - Address already in use)."
        )
    site = w.python_site
    frames: list[pytorch.Frame] = [
        (pytorch.script_path(w), rng.randint(30, 90), "<module>", 'dist.init_process_group(backend="nccl")'),
        (f"{site}/torch/distributed/c10d_logger.py", 79, "wrapper", "return func(*args, **kwargs)"),
        (
            f"{site}/torch/distributed/distributed_c10d.py",
            1520,
            "init_process_group",
            "store, rank, world_size = next(rendezvous_iterator)",
        ),
        (
            f"{site}/torch/distributed/rendezvous.py",
            269,
            "_env_rendezvous_handler",
            "store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout, use_libuv)",
        ),
        (f"{site}/torch/distributed/rendezvous.py", 189, "_create_c10d_store", "return TCPStore("),
    ]
    rank0 = 0
    text = (
        pytorch.py_exception(w, rank0, frames, [msg])
        if not w.uses_torchrun
        else "\n".join(pytorch.traceback_lines(frames[:1] + frames[3:], [msg]))
    )
    sc.node_out(node, t, text, key=True)
    sc.exit(rank0, t + 0.3, 1, pytorch.traceback_lines(frames, [msg]))
    for r in w.ranks_of(node):
        sc.exit(r, t + rng.uniform(0.3, 1), 1)
    sc.root_event(node, sc.node_stream(node).path, msg)
    sc.culprit([node])
    t_to = t + rng.uniform(300, 900)
    for other in w.nodes[1:4]:
        client = (
            f"torch.distributed.DistNetworkError: The client socket has timed out after {int(t_to - t)}s while trying to connect to "
            f"({w.hostname(node)}, {port})."
        )
        sc.node_out(other, t_to + rng.uniform(0, 3), "\n".join(pytorch.traceback_lines(frames[:1], [client])))
        for r in w.ranks_of(other):
            sc.exit(r, t_to + rng.uniform(1, 3), 1)
    sc.collateral("other nodes time out connecting to the rendezvous store")
    if w.scheduler == "slurm" and rng.random() < 0.15:
        sc.teardown(t_to)
        sc.finish_slurm(
            state="CANCELLED",
            reason="None",
            exit_code=0,
            signal=15,
            banner=None,
            kill_user=w.user,
            attempt_exit=None,
        )
        sc.collateral("the user cancelled the job after the error")
        return
    finish_failed(sc, t)


def s07_dataloader(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    rank = rng.randrange(w.world_size)
    node = w.node_of(rank)
    t = sc.fault_time()
    it = sc.train(t - rng.uniform(1, 30))
    evaluating = rng.random() < 0.5
    if evaluating:
        sc.out(
            0,
            t - 0.5,
            f"validation loss at iteration {it} | lm loss value: {sc.plan.loss(it, rng):.6E} |"
            if w.framework == "megatron"
            else (
                lambda d: (
                    f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} INFO train.py:301 -- running evaluation at step {it}"
                )
            ),
            err=False,
        )
    seq = sc.plan.seq_at(t) + 1
    t_first = sc.timeouts(t, lagging={rank: seq - 1}, seq=seq, op="BROADCAST" if evaluating else None)
    sc.root_event(
        node,
        sc.rank_stream(rank).path,
        f"Last enqueued NCCL work: {seq - 1}, last completed NCCL work: {seq - 1}.",
    )
    sc.culprit([node])
    if rng.random() < 0.4:
        site = w.python_site.split("/lib/")[-1] if "/lib/" in w.python_site else w.python_site
        dump = [
            f"Process {w.rank_pid(rank)}: python {pytorch.script_path(w)}",
            f"Python v{w.stack.python}.12 ({w.python_site.split('/lib')[0]}/bin/python)",
            "",
            f'Thread {w.rank_pid(rank)} (idle): "MainThread"',
            f"    wait (threading.py:{rng.choice((320, 324, 331))})",
            f"    get (multiprocessing/queues.py:{rng.choice((113, 122))})",
            f"    _try_get_data ({site}/torch/utils/data/dataloader.py:1133)",
            f"    _get_data ({site}/torch/utils/data/dataloader.py:1294)",
            f"    _next_data ({site}/torch/utils/data/dataloader.py:1332)",
            f"    __next__ ({site}/torch/utils/data/dataloader.py:631)",
            f"    {'evaluate' if evaluating else 'train_step'} ({pytorch.script_path(w)}:{rng.randint(100, 400)})",
        ]
        sc.bundle.put(f"logs/{node.name}/py-spy-rank{rank}.txt", "\n".join(dump) + "\n")
    sc.collateral(f"rank {rank} never enqueued SeqNum={seq} (stuck in DataLoader queue.get)")
    finish_failed(sc, t_first)


MODES = (
    Mode(
        "s06-single-rank-exception",
        "attributed",
        "software",
        "user_code",
        3.0,
        s06_single_rank,
        "one rank raises a Python exception; its peers log NCCL remote errors and watchdog timeouts",
    ),
    Mode(
        "s08-collective-mismatch",
        "attributed",
        "software",
        "user_code",
        1.0,
        s08_mismatch,
        "a rank issues a different collective at the same SeqNum (divergent control flow)",
    ),
    Mode(
        "app-xid31-13-illegal-memory-access",
        "attributed",
        "software",
        "user_code",
        1.5,
        app_illegal_access,
        "an application kernel faults: CUDA illegal memory access with Xid 31 or 13/43 on the faulting rank(s)' GPUs",
    ),
    Mode(
        "identical-exception-all-ranks",
        "attributed",
        "software",
        "user_code",
        1.5,
        identical_everywhere,
        "every rank raises the same exception (deterministic user bug)",
    ),
    Mode(
        "wrong-nccl-socket-ifname",
        "attributed",
        "software",
        "configuration",
        1.0,
        socket_ifname,
        "NCCL_SOCKET_IFNAME names an interface that does not exist: 'Bootstrap : no socket interface found'",
    ),
    Mode(
        "duplicate-gpu-detected",
        "attributed",
        "software",
        "configuration",
        0.5,
        duplicate_gpu,
        "two ranks on one node share a CUDA device: 'Duplicate GPU detected'",
    ),
    Mode(
        "rendezvous-port-in-use",
        "attributed",
        "software",
        "configuration",
        0.5,
        port_in_use,
        "the rendezvous/TCPStore port is already in use on the master node (errno 98)",
    ),
    Mode(
        "s07-dataloader-deadlock",
        "attributed",
        "software",
        "hang",
        1.0,
        s07_dataloader,
        "a DataLoader deadlock on one rank: it never enqueues the collective (lower last enqueued NCCL work)",
        min_torch=(2, 4),
    ),
)
