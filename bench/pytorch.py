"""PyTorch, torchrun and CUDA error output by PyTorch version (as pytorch/pytorch prints it).

ProcessGroupNCCL watchdog wording for ≤1.13, 2.0-2.1, 2.2-2.3 (`Timeout at NCCL work … last
enqueued NCCL work`) and 2.4+ (`[PG ID 0 PG GUID 0(default_pg) Rank N]`, flight-recorder dump
signals), the heartbeat monitor, DistBackendError tracebacks, user-code tracebacks, CUDA error
texts and OOM messages by era, and torchrun's agent lines and ChildFailedError block. Builders
return `LineFn`s because most of these lines carry the writing node's local time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime
from random import Random

from bench.timeline import LineFn
from bench.world import World


def _ns(d: datetime) -> str:
    us = d.microsecond
    return f"{us:06d}{(us * 7 + 131) % 1000:03d}"


def glog(world: World, d: datetime, level: str, where: str) -> str:
    """The c10d glog prefix: ``[E1102 10:43:35.903881913 ProcessGroupNCCL.cpp:616]`` (2.2+) or ``[E ProcessGroupNCCL.cpp:737]``."""
    if world.stack.torch >= (2, 2):
        return f"[{level}{d:%m%d} {d:%H:%M:%S}.{_ns(d)} {where}]"
    return f"[{level} {where}]"


def rank_tag(world: World, rank: int, *, c10d: bool) -> str:
    """The per-line prefix of a rank's output as it appears in a combined log."""
    out = f"{world.task_id(rank)}: " if world.srun_label else ""
    if world.torchrun_tee:
        out += f"[default{world.local_of(rank)}]:"
    if world.stack.torch >= (2, 2) and (c10d or world.uses_torchrun):
        out += f"[rank{rank}]:" if c10d else f"[rank{rank}]: "
    elif (
        world.uses_torchrun
        and world.stack.torch < (2, 2)
        and world.framework == "lightning"
        and not world.torchrun_tee
    ):
        out += f"[default{world.local_of(rank)}]:"
    return out


def prefixed(world: World, rank: int, lines: Sequence[str], *, c10d: bool) -> str:
    tag = rank_tag(world, rank, c10d=c10d)
    plain = f"{world.task_id(rank)}: " if world.srun_label else ""
    if world.torchrun_tee:
        plain += f"[default{world.local_of(rank)}]:"
    out = []
    for line in lines:
        is_c10d_line = line.startswith("[") and c10d
        out.append((tag if (is_c10d_line or not c10d) else plain) + line)
    return "\n".join(out)


def _pg(world: World, rank: int) -> str:
    if world.stack.torch >= (2, 4):
        return f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    if world.stack.torch >= (2, 2):
        return f"[PG 0 Rank {rank}]"
    return f"[Rank {rank}]"


def work_desc(world: World, seq: int, op: str, numel: int, timeout_ms: int) -> str:
    if world.stack.torch < (2, 0):
        return f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)={timeout_ms})"
    return f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms})"


def _frames(world: World, rng: Random) -> list[str]:
    lib = f"{world.python_site}/torch/lib"
    base = rng.randint(0x7F0000000000, 0x7FFFFFFFFFFF) & ~0xFFF
    return [
        f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x{base + 0x96:x} in {lib}/libc10.so)",
        f"frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x{base + 0x2451D2:x} in {lib}/libtorch_cuda.so)",
        f"frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x{base + 0x24C233:x} in {lib}/libtorch_cuda.so)",
        f"frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x{base + 0x24E14D:x} in {lib}/libtorch_cuda.so)",
        f"frame #4: <unknown function> + 0xdc253 (0x{base + 0xDC253:x} in /lib/x86_64-linux-gnu/libstdc++.so.6)",
        f"frame #5: <unknown function> + 0x94ac3 (0x{base - 0x100000 + 0x94AC3:x} in /lib/x86_64-linux-gnu/libc.so.6)",
        "",
    ]


def watchdog_timeout(
    world: World,
    rank: int,
    seq: int,
    op: str,
    numel: int,
    ran_ms: int,
    last_enqueued: int,
    last_completed: int,
    rng: Random,
    *,
    first_to_dump: bool = False,
) -> LineFn:
    """Everything a rank's watchdog prints when its collective times out, up to the abort."""
    v = world.stack.torch
    timeout_ms = world.timeout_ms
    wd = work_desc(world, seq, op, numel, timeout_ms)
    caught = f"[Rank {rank}] Watchdog caught collective operation timeout: {wd} ran for {ran_ms} milliseconds before timing out."
    pg = _pg(world, rank)
    frames = _frames(world, rng)

    def render(d: datetime) -> str:
        def E(where: str) -> str:  # the glog level letter
            return glog(world, d, "E", where)

        c10d: list[str]
        tail: list[str]
        if v < (2, 0):
            c10d = [
                f"{E('ProcessGroupNCCL.cpp:737')} {caught}",
                f"{E('ProcessGroupNCCL.cpp:414')} Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
                "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, "
                "we are taking the entire process down.",
            ]
            tail = [
                "terminate called after throwing an instance of 'std::runtime_error'",
                f"  what():  {caught}",
            ]
        elif v < (2, 2):
            exc = f"[Rank {rank}] NCCL watchdog thread terminated with exception: {caught}"
            c10d = [
                f"{E('ProcessGroupNCCL.cpp:475')} {caught}",
                f"{E('ProcessGroupNCCL.cpp:489')} Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
                "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
                f"{E('ProcessGroupNCCL.cpp:495')} To avoid data inconsistency, we are taking the entire process down.",
                f"{E('ProcessGroupNCCL.cpp:916')} {exc}",
            ]
            tail = [
                "terminate called after throwing an instance of 'std::runtime_error'",
                f"  what():  {exc}",
            ]
        else:
            exc = f"{pg} Process group watchdog thread terminated with exception: {caught}"
            c10d = [
                f"{E('ProcessGroupNCCL.cpp:616' if v >= (2, 4) else 'ProcessGroupNCCL.cpp:563')} {caught}"
            ]
            if v >= (2, 6):
                c10d.append(
                    f"{E('ProcessGroupNCCL.cpp:2251')} {pg}  failure detected by watchdog at work sequence id: {seq} "
                    f"PG status: last enqueued work: {last_enqueued}, last completed work: {last_completed}"
                )
            elif v >= (2, 4):
                c10d.append(
                    f"{E('ProcessGroupNCCL.cpp:1785')} {pg} Exception (either an error or timeout) detected by watchdog at work: "
                    f"{seq}, last enqueued NCCL work: {last_enqueued}, last completed NCCL work: {last_completed}."
                )
            else:
                c10d.append(
                    f"{E('ProcessGroupNCCL.cpp:1537')} {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: "
                    f"{last_enqueued}, last completed NCCL work: {last_completed}."
                )
            if v >= (2, 5):
                c10d.append(
                    f"{E('ProcessGroupNCCL.cpp:732')} Stack trace of the failed collective not found, potentially because "
                    "FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."
                )
                if first_to_dump:
                    c10d.append(
                        f"{E('ProcessGroupNCCL.cpp:2583')} {pg} First PG on this rank to signal dumping."
                    )
            c10d += [
                f"{E('ProcessGroupNCCL.cpp:630' if v >= (2, 4) else 'ProcessGroupNCCL.cpp:577')} [Rank {rank}] Some NCCL operations have "
                "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
                f"{E('ProcessGroupNCCL.cpp:636' if v >= (2, 4) else 'ProcessGroupNCCL.cpp:583')} [Rank {rank}] To avoid data inconsistency, "
                "we are taking the entire process down.",
                f"{E('ProcessGroupNCCL.cpp:1595' if v >= (2, 4) else 'ProcessGroupNCCL.cpp:1414')} {exc}",
            ]
            where = (
                "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618"
                if v >= (2, 4)
                else "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565"
            )
            tail = [
                "terminate called after throwing an instance of 'c10::DistBackendError'",
                f"  what():  {exc}",
                f"Exception raised from checkTimeout at {where} (most recent call first):",
                *frames,
            ]
        return prefixed(world, rank, c10d, c10d=True) + "\n" + prefixed(world, rank, tail, c10d=True)

    return render


def dump_signal_received(
    world: World, rank: int, from_rank: int, last_enqueued: int, last_completed: int
) -> LineFn:
    """PyTorch ≥2.4: a rank that did not time out itself learns that `from_rank` did."""
    pg = _pg(world, rank)

    def render(d: datetime) -> str:
        line = (
            f"{glog(world, d, 'E', 'ProcessGroupNCCL.cpp:1987')} {pg} Received a dump signal due to a collective timeout from  rank "
            f"{from_rank} and we will try our best to dump the debug info. Last enqueued NCCL work: {last_enqueued}, last completed NCCL "
            f"work: {last_completed}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, "
            "the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, "
            "this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc."
        )
        return prefixed(world, rank, [line], c10d=True)

    return render


def heartbeat_stuck(world: World, rank: int) -> LineFn:
    pg = _pg(world, rank)
    hb = world.heartbeat_s

    def render(d: datetime) -> str:
        lines = [
            f"{glog(world, d, 'E', 'ProcessGroupNCCL.cpp:1411')} {pg} Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
            f"{glog(world, d, 'F', 'ProcessGroupNCCL.cpp:1224')} {pg} {pg} ProcessGroupNCCL's watchdog got stuck for {hb} seconds without making "
            "progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the "
            "watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other "
            "deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either "
            "increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor "
            "(TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout "
            "or false positive abort; otherwise, please attempt to debug the hang.",
        ]
        return prefixed(world, rank, lines, c10d=True)

    return render


def watchdog_cuda_error(world: World, rank: int, cuda_msg: str) -> LineFn:
    """The watchdog is merely where a sticky CUDA error is first observed."""
    pg = _pg(world, rank)

    def render(d: datetime) -> str:
        if world.stack.torch < (2, 2):
            body = [
                f"{glog(world, d, 'E', 'ProcessGroupNCCL.cpp:916')} [Rank {rank}] NCCL watchdog thread terminated with exception: CUDA error: {cuda_msg}"
            ]
            tail = [
                "terminate called after throwing an instance of 'std::runtime_error'",
                f"  what():  [Rank {rank}] NCCL watchdog thread terminated with exception: CUDA error: {cuda_msg}",
            ]
        else:
            body = [
                f"{glog(world, d, 'E', 'ProcessGroupNCCL.cpp:1595')} {pg} Process group watchdog thread terminated with exception: CUDA error: {cuda_msg}"
            ]
            tail = [
                "terminate called after throwing an instance of 'c10::DistBackendError'",
                f"  what():  {pg} Process group watchdog thread terminated with exception: CUDA error: {cuda_msg}",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            ]
        return prefixed(world, rank, body, c10d=True) + "\n" + prefixed(world, rank, tail, c10d=True)

    return render


def tcpstore_reset(world: World, rank: int, master: str, rng: Random) -> LineFn:
    pg = _pg(world, rank)
    port = world.master_port

    def render(d: datetime) -> str:
        fd = rng.randint(40, 120)
        if world.stack.torch >= (2, 7):
            line = (
                f"{glog(world, d, 'W', 'TCPStore.cpp:141')} [c10d] recvValueWithTimeout failed on SocketImpl(fd={fd}, addr=[{master}]:{rng.randint(33000, 60000)}, "
                f"remote=[{master}]:{port}): Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
            )
        elif world.stack.torch >= (2, 2):
            line = (
                f"{glog(world, d, 'W', 'TCPStore.cpp:125')} [c10d] recvValue failed on SocketImpl(fd={fd}, addr=[{master}]:{rng.randint(33000, 60000)}, "
                f"remote=[{master}]:{port}): Connection reset by peer"
            )
        else:
            line = f"{glog(world, d, 'W', 'socket.cpp:601')} [c10d] The client socket has failed to connect to [{master}]:{port} (errno: 104 - Connection reset by peer)."
        extra = []
        if world.stack.torch >= (2, 3):
            extra.append(
                f'{glog(world, d, "E", "ProcessGroupNCCL.cpp:1490")} {pg} Failed to check the "should dump" flag on TCPStore, '
                "(maybe TCPStore server has shut down too early), with error: failed to recv, got 0 bytes"
            )
        return prefixed(world, rank, [line, *extra], c10d=True)

    return render


# --- Python-level exceptions ------------------------------------------------------------------

Frame = tuple[str, int, str, str]


def traceback_lines(frames: Sequence[Frame], exc: Sequence[str]) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        out.append(f'  File "{file}", line {line}, in {func}')
        if code:
            out.append(f"    {code}")
    out.extend(exc)
    return out


def script_path(world: World) -> str:
    return (
        "/workspace/trainer/main.py"
        if world.script.startswith("-m")
        else world.script
        if world.script.startswith("/")
        else f"/workspace/{world.script}"
    )


def train_frames(world: World, rng: Random, *, depth: str = "step") -> list[Frame]:
    """A plausible call stack from the entry point down into the training loop."""
    main = script_path(world)
    frames: list[Frame] = [
        (main, rng.randint(300, 700), "<module>", "main()"),
        (main, rng.randint(200, 299), "main", "train(args, model, optimizer, train_loader)"),
    ]
    if world.framework == "megatron":
        frames = [
            (main, rng.randint(150, 260), "<module>", "pretrain("),
            (
                "/workspace/megatron-lm/megatron/training/training.py",
                rng.randint(300, 400),
                "pretrain",
                "iteration, num_floating_point_operations_so_far = train(",
            ),
            (
                "/workspace/megatron-lm/megatron/training/training.py",
                rng.randint(1200, 1500),
                "train",
                "train_step(forward_step_func,",
            ),
        ]
    elif world.framework == "hf":
        frames += [
            (
                f"{world.python_site}/transformers/trainer.py",
                rng.randint(1900, 2300),
                "train",
                "return inner_training_loop(",
            ),
            (
                f"{world.python_site}/transformers/trainer.py",
                rng.randint(2300, 2600),
                "_inner_training_loop",
                "tr_loss_step = self.training_step(model, inputs)",
            ),
        ]
    elif world.framework == "lightning":
        frames += [
            (
                f"{world.python_site}/lightning/pytorch/trainer/trainer.py",
                rng.randint(500, 600),
                "fit",
                "call._call_and_handle_interrupt(",
            ),
            (
                f"{world.python_site}/lightning/pytorch/loops/fit_loop.py",
                rng.randint(200, 400),
                "run",
                "self.advance()",
            ),
        ]
    elif world.framework == "torchtitan":
        frames = [
            (
                f"{world.python_site}/torchtitan/train.py",
                rng.randint(500, 700),
                "<module>",
                "trainer.train()",
            ),
            (
                f"{world.python_site}/torchtitan/train.py",
                rng.randint(400, 499),
                "train",
                "self.train_step(inputs, labels)",
            ),
        ]
    if depth == "data":
        frames += [
            (
                f"{world.python_site}/torch/utils/data/dataloader.py",
                631,
                "__next__",
                "data = self._next_data()",
            ),
            (
                f"{world.python_site}/torch/utils/data/dataloader.py",
                1346,
                "_next_data",
                "return self._process_data(data)",
            ),
            (f"{world.python_site}/torch/utils/data/dataloader.py", 1372, "_process_data", "data.reraise()"),
            (f"{world.python_site}/torch/_utils.py", 705, "reraise", "raise exception"),
        ]
    return frames


def collective_frames(world: World, op: str) -> list[Frame]:
    fn = {
        "ALLREDUCE": "all_reduce",
        "BROADCAST": "broadcast",
        "_ALLGATHER_BASE": "all_gather_into_tensor",
        "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
        "ALLGATHER": "all_gather",
        "BARRIER": "barrier",
    }.get(op, "all_reduce")
    site = world.python_site
    frames: list[Frame] = []
    if world.stack.torch >= (2, 1):
        frames.append(
            (
                f"{site}/torch/distributed/c10d_logger.py",
                83 if world.stack.torch >= (2, 4) else 47,
                "wrapper",
                "return func(*args, **kwargs)",
            )
        )
    frames.append(
        (
            f"{site}/torch/distributed/distributed_c10d.py",
            {"all_reduce": 2501, "broadcast": 2417}.get(fn, 3201),
            fn,
            "work.wait()",
        )
    )
    return frames


_NCCL_RESULT = {
    6: (
        "remote process exited or there was a network error",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    ),
    2: (
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
    ),
    3: (
        "internal error - please report this issue to the NCCL developers",
        "ncclInternalError: Internal check failed.",
    ),
    5: (
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    ),
    1: (
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
    ),
}


def nccl_error_exc(world: World, code: int, last_error: str | None) -> list[str]:
    """The exception text PyTorch raises for a failed NCCL call (DistBackendError from 2.0 on)."""
    text, interp = _NCCL_RESULT[code]
    v = world.stack.torch
    if code == 2 and world.stack.nccl < (2, 13, 0):
        interp += "It can be also caused by unexpected exit of a remote peer, you can check NCCL warnings for failure reason and see if there is connection closure by a peer."
    if v < (2, 0):
        where = "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191"
        head = f"RuntimeError: NCCL error in: {where}, {text}, NCCL version {world.stack.nccl_text}"
    else:
        where = (
            "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317"
            if v >= (2, 2)
            else "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275"
        )
        head = f"torch.distributed.DistBackendError: NCCL error in: {where}, {text}, NCCL version {world.stack.nccl_text}"
    out = [head, interp.rstrip()]
    if last_error is not None and world.stack.nccl >= (2, 13, 0):
        out += ["Last error:", last_error]
    return out


def py_exception(world: World, rank: int, frames: Sequence[Frame], exc: Sequence[str]) -> str:
    return prefixed(world, rank, traceback_lines(frames, exc), c10d=False)


def cuda_error(world: World, msg: str) -> list[str]:
    cls = "torch.AcceleratorError" if world.stack.torch >= (2, 8) else "RuntimeError"
    out = [
        f"{cls}: CUDA error: {msg}",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
        + ("." if world.stack.torch >= (2, 0) else ""),
    ]
    if world.stack.torch >= (2, 1):
        out.append("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    return out


def gpu_oom(world: World, gpu: int, rng: Random) -> list[str]:
    if int(hashlib.sha256(f"{world.seed}|cuda-oom".encode()).hexdigest()[:8], 16) % 5 == 0:
        return cuda_error(world, "out of memory")  # C10_CUDA_CHECK outside the caching allocator
    want = rng.choice(("2.00 GiB", "1.17 GiB", "22.78 GiB", "896.00 MiB", "4.50 GiB", "15.62 GiB"))
    total = {"a100": 79.15, "h100": 79.10, "h200": 139.81, "b200": 178.35, "gb200": 184.0}[world.platform]
    free = round(rng.uniform(0.2, 2.5), 2)
    used = round(total - free - 0.5, 2)
    alloc = round(used * rng.uniform(0.7, 0.95), 2)
    v = world.stack.torch
    if v < (2, 1):
        return [
            f"RuntimeError: CUDA out of memory. Tried to allocate {want} (GPU {gpu}; {total:.2f} GiB total capacity; {alloc:.2f} GiB already "
            f"allocated; {free:.2f} GiB free; {used:.2f} GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
            "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
        ]
    if v < (2, 2):
        return [
            f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {want}. GPU {gpu} has a total capacty of {total:.2f} GiB of which "
            f"{free:.2f} GiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. Of the allocated memory "
            f"{alloc:.2f} GiB is allocated by PyTorch, and {used - alloc:.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
        ]
    return [
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want}. GPU {gpu} has a total capacity of {total:.2f} GiB of which "
        f"{free:.2f} GiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. Of the allocated memory "
        f"{alloc:.2f} GiB is allocated by PyTorch, and {used - alloc:.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    ]


# --- torchrun (torch.distributed.elastic) ---------------------------------------------------------


def _agent_log(world: World, d: datetime, level: str, where: str, msg: str, agent_pid: int) -> str:
    if world.stack.torch >= (2, 3):
        return f"{level[0]}{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {agent_pid} {where}] {msg}"
    mod = where.split(".py")[0].replace("/", ".")
    return f"{level}:{mod}:{msg}"


def agent_sigterm(world: World, agent_pid: int, pids: Sequence[int]) -> LineFn:
    def render(d: datetime) -> str:
        return "\n".join(
            _agent_log(
                world,
                d,
                "WARNING",
                "torch/distributed/elastic/multiprocessing/api.py:900",
                f"Sending process {p} closing signal SIGTERM",
                agent_pid,
            )
            for p in pids
        )

    return render


def agent_failed(world: World, agent_pid: int, local: int, exitcode: int, pid: int) -> LineFn:
    binary = (
        f"/usr/bin/python{world.stack.python}"
        if world.python_site.startswith("/usr")
        else "/opt/conda/bin/python"
    )

    def render(d: datetime) -> str:
        return _agent_log(
            world,
            d,
            "ERROR",
            "torch/distributed/elastic/multiprocessing/api.py:874",
            f"failed (exitcode: {exitcode}) local_rank: {local} (pid: {pid}) of binary: {binary}",
            agent_pid,
        )

    return render


def agent_signal(world: World, agent_pid: int, signame: str) -> LineFn:
    def render(d: datetime) -> str:
        msg = (
            f"Received {signame} death signal, shutting down workers"
            if world.stack.torch >= (2, 1)
            else "Received 15 death signal, shutting down workers"
        )
        return _agent_log(
            world, d, "WARNING", "torch/distributed/elastic/agent/server/api.py:719", msg, agent_pid
        )

    return render


def agent_keepalive_failed(world: World, agent_pid: int, node_name: str) -> LineFn:
    def render(d: datetime) -> str:
        return _agent_log(
            world,
            d,
            "ERROR",
            "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1126",
            f"The node '{node_name}_{agent_pid}_0' has failed to send a keep-alive heartbeat to the rendezvous "
            f"'{world.job_name}' due to an error of type RendezvousConnectionError.",
            agent_pid,
        )

    return render


_SIGNAMES = {
    -6: "Signal 6 (SIGABRT)",
    -9: "Signal 9 (SIGKILL)",
    -15: "Signal 15 (SIGTERM)",
    -11: "Signal 11 (SIGSEGV)",
    -7: "Signal 7 (SIGBUS)",
}


Failure = tuple[int, int, int, int, float, list[str] | None]  # rank, local, exitcode, pid, time, traceback


def child_failed_error(
    world: World, host: str, failures: Sequence[Failure], local_time: Callable[[float], datetime]
) -> LineFn:
    """torchrun's ChildFailedError summary for one node; the first failure is that node's Root Cause."""
    site = world.python_site
    script = world.script.split("/")[-1] if not world.script.startswith("-m") else world.script.split()[-1]

    def block(entry: Failure, idx: int) -> list[str]:
        rank, local, code, pid, t, tb = entry
        ld = local_time(t)
        if tb is not None:
            err_file = f"/tmp/torchelastic_{world.hexid(8, host, 'te')}/{world.job_name}_{world.hexid(6, 'rdzv')}/attempt_0/{local}/error.json"
            tb_text = (
                "\n".join(["Traceback (most recent call last):", *[f"    {x}" for x in tb[1:]]])
                if tb
                else "<N/A>"
            )
            tb_field = f"  traceback : {tb_text}"
        else:
            err_file = "<N/A>"
            tb_field = "  traceback : " + (
                f"{_SIGNAMES[code]} received by PID {pid}"
                if code in _SIGNAMES
                else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
            )
        return [
            f"[{idx}]:",
            f"  time      : {ld:%Y-%m-%d_%H:%M:%S}",
            f"  host      : {host}",
            f"  rank      : {rank} (local_rank: {local})",
            f"  exitcode  : {code} (pid: {pid})",
            f"  error_file: {err_file}",
            tb_field,
        ]

    def render(d: datetime) -> str:
        root, others = failures[0], failures[1:]
        lines = [
            "Traceback (most recent call last):",
            f'  File "{"/usr/local/bin/torchrun" if site.startswith("/usr") else "/opt/conda/bin/torchrun"}", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{site}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
            "    return f(*args, **kwargs)",
            f'  File "{site}/torch/distributed/run.py", line 919, in main',
            "    run(args)",
            f'  File "{site}/torch/distributed/run.py", line 910, in run',
            "    elastic_launch(",
            f'  File "{site}/torch/distributed/launcher/api.py", line 138, in __call__',
            "    return launch_agent(self._config, self._entrypoint, list(args))",
            f'  File "{site}/torch/distributed/launcher/api.py", line 269, in launch_agent',
            "    raise ChildFailedError(",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "=" * 60,
            f"{script} FAILED",
            "-" * 60,
            "Failures:",
        ]
        if others:
            for i, f in enumerate(others, start=1):
                lines += block(f, i)
        else:
            lines.append("  <NO_OTHER_FAILURES>")
        lines += ["-" * 60, "Root Cause (first observed failure):", *block(root, 0), "=" * 60]
        return "\n".join(lines)

    return render
