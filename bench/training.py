"""Healthy training output: progress lines, checkpoints and benign warnings, per framework.

What rank 0 of a Megatron-LM, torchtitan, Hugging Face Trainer, Lightning or plain-DDP job
prints while nothing is wrong. Scenario code decides when progress stops (or slows down); this
module only knows how each framework words its progress, and how fast iterations go.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from random import Random

from bench.timeline import LineFn
from bench.world import World


@dataclass
class Plan:
    """Iteration timing of one run; `slowdown(t)` stretches iteration time (stragglers)."""

    t_begin: float
    iter_s: float
    log_every: int
    first_iter: int
    total_iters: int
    colls_per_iter: int
    seq0: int
    ckpt_every: int
    global_batch: int
    loss0: float

    def iteration_at(self, t: float) -> int:
        return self.first_iter + max(0, int((t - self.t_begin) / self.iter_s))

    def time_of(self, iteration: int) -> float:
        return self.t_begin + (iteration - self.first_iter) * self.iter_s

    def seq_at(self, t: float) -> int:
        return self.seq0 + (self.iteration_at(t) - self.first_iter) * self.colls_per_iter

    def loss(self, it: int, rng: Random) -> float:
        return self.loss0 * (0.55 + 0.45 * math.exp(-it / 40000)) + rng.uniform(-0.03, 0.03)


def make_plan(world: World, rng: Random, t_begin: float) -> Plan:
    iter_s = rng.choice((0.8, 1.6, 2.4, 3.9, 5.3, 7.7, 11.2)) * rng.uniform(0.9, 1.1)
    log_every = max(1, int(rng.choice((20, 30, 45, 60, 90)) / iter_s))
    log_every = {1: 1, 2: 2, 3: 5}.get(log_every, 10 if log_every < 15 else 20 if log_every < 30 else 50)
    first = 0 if world.attempt == 0 else rng.randint(1, 40) * 1000
    return Plan(
        t_begin=t_begin,
        iter_s=round(iter_s, 3),
        log_every=log_every,
        first_iter=first,
        total_iters=rng.choice((100000, 250000, 500000, 1000000)),
        colls_per_iter=rng.choice((1, 2, 4, 6, 12, 24)),
        seq0=rng.randint(5, 60),
        ckpt_every=rng.choice((500, 1000, 2000, 5000)),
        global_batch=rng.choice((256, 512, 1024, 2048, 4096)),
        loss0=rng.uniform(5.5, 11.0),
    )


def progress_line(world: World, plan: Plan, it: int, rng: Random, slow: float = 1.0) -> LineFn:
    """Rank 0's progress report for iteration `it`, in the framework's own words."""
    loss = plan.loss(it, rng)
    ms = plan.iter_s * 1000 * slow * rng.uniform(0.97, 1.03)
    lr = 3e-4 * min(1.0, it / 2000 + 0.01)
    gn = rng.uniform(0.15, 0.9)
    fw = world.framework
    ws = world.world_size
    tflops = 400 / slow * rng.uniform(0.95, 1.05)

    def render(d: datetime) -> str:
        if fw == "megatron":
            return (
                f" [{d:%Y-%m-%d %H:%M:%S}] iteration {it:>8}/{plan.total_iters:>8} | consumed samples: {it * plan.global_batch:>12} | "
                f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: {lr:.6E} | "
                f"global batch size: {plan.global_batch:>5} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {gn:.3f} | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |"
            )
        if fw == "torchtitan":
            return (
                f"[titan] {d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} - root - INFO - step: {it:>5}  loss: {loss:7.4f}  "
                f"memory: {rng.uniform(50, 70):5.2f}GiB({rng.uniform(60, 88):.2f}%)  tps: {int(8192 / plan.iter_s / slow):,}  "
                f"tflops: {tflops:.2f}  mfu: {tflops / 9.89:.2f}%"
            )
        if fw == "hf":
            return (
                f"{d:%m/%d/%Y %H:%M:%S} - INFO - __main__ - step {it}: {{'loss': {loss:.4f}, 'grad_norm': {gn:.4f}, "
                f"'learning_rate': {lr:.3e}, 'epoch': {it / 12000:.2f}}}"
            )
        if fw == "lightning":
            return (
                f"[{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}][train][INFO] - Epoch {it // 5000}: global_step={it} "
                f"train/loss={loss:.4f} lr={lr:.2e} step_time={ms / 1000:.3f}s"
            )
        return (
            f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} INFO train.py:{212 + ws % 7} -- step {it} loss {loss:.4f} "
            f"lr {lr:.2e} throughput {plan.global_batch / (ms / 1000):.1f} samples/s"
        )

    return render


def checkpoint_lines(world: World, it: int, rng: Random, seconds: float) -> tuple[LineFn, LineFn]:
    path = (
        rng.choice(("/checkpoints", "/lustre/ckpt", "/mnt/nfs/ckpt", "/scratch/ckpts")) + f"/{world.job_name}"
    )

    def ms(d: datetime) -> str:
        return f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}"

    def start(d: datetime) -> str:
        if world.framework == "megatron":
            return f"saving checkpoint at iteration {it:>7} to {path} in torch_dist format"
        if world.framework == "lightning":  # ModelCheckpoint(verbose=True) announces the save it starts
            best = 0.5 + 1 / (1 + it / 1000)
            return (
                f"[{ms(d)}][lightning.pytorch.utilities.rank_zero][INFO] - Epoch {it // 5000}, global step {it}: "
                f"'val_loss' reached {best:0.5f} (best {best:0.5f}), saving model to '{path}/epoch={it // 5000}-step={it}.ckpt' as top 1"
            )
        return f"{ms(d)} INFO checkpoint.py:88 -- Saving checkpoint step_{it} to {path}/step_{it}"

    def done(d: datetime) -> str:
        # Each framework's own words once the save is durable (rules/workload/checkpoint.yaml); a plain
        # script's are its own, which no rule knows.
        if world.framework == "megatron":
            return f"  successfully saved checkpoint from iteration {it:>7} to {path} [ t 1/{max(1, world.world_size // 64)}, p 1/1 ]"
        if world.framework == "torchtitan":
            return (
                f"[titan] {ms(d)} - root - INFO - Finished saving the checkpoint (or staging if async is "
                f"enabled)in {seconds:.2f} seconds."
            )
        if world.framework == "hf":
            return f"[INFO|modeling_utils.py:3042] {ms(d)} >> Model weights saved in {path}/checkpoint-{it}/model.safetensors"
        return f"{ms(d)} INFO checkpoint.py:131 -- Saved checkpoint step_{it} in {seconds:.1f}s"

    return start, done


def startup_lines(world: World, rng: Random) -> list[Callable[[datetime], str]]:
    """What rank 0 prints between process start and the first iteration."""
    lines: list[Callable[[datetime], str]] = []

    def fixed(text: str) -> Callable[[datetime], str]:
        return lambda d: text

    if world.framework == "megatron":
        lines += [
            fixed(
                f"using world size: {world.world_size}, data-parallel size: {max(1, world.world_size // 8)}, context-parallel size: 1, tensor-model-parallel size: {8 if world.gpus_per_node == 8 else 4}, "
                f"pipeline-model-parallel size: {1}"
            ),
            fixed("> initializing torch distributed ..."),
            fixed(f"> initialized tensor model parallel with size {8 if world.gpus_per_node == 8 else 4}"),
            fixed("> compiling dataset index builder ..."),
            lambda d: f"[after dataloaders are built] datetime: {d:%Y-%m-%d %H:%M:%S} ",
            fixed("training ..."),
        ]
    elif world.framework == "hf":
        lines += [
            lambda d: (
                f"{d:%m/%d/%Y %H:%M:%S} - WARNING - __main__ - Process rank: 0, device: cuda:0, n_gpu: 1, distributed training: True"
            ),
            lambda d: f"{d:%m/%d/%Y %H:%M:%S} - INFO - __main__ - ***** Running training *****",
        ]
    elif world.framework == "torchtitan":
        lines += [
            lambda d: (
                f"[titan] {d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} - root - INFO - Starting job: {world.job_name}"
            ),
            lambda d: (
                f"[titan] {d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} - root - INFO - Training starts at step 1."
            ),
        ]
    elif world.framework == "lightning":
        lines += [
            fixed(f"Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/{world.world_size}"),
            fixed(
                "----------------------------------------------------------------------------------------------------"
            ),
            fixed(
                f"distributed_backend=nccl\nAll distributed processes registered. Starting with {world.world_size} processes"
            ),
            fixed("LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3,4,5,6,7]"),
        ]
    else:
        lines += [
            lambda d: (
                f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d} INFO train.py:64 -- world_size={world.world_size} backend=nccl"
            )
        ]
    return lines


BENIGN_WARNINGS: tuple[str, ...] = (
    "UserWarning: TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only storage class.",
    "FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', args...)` instead.",
    "UserWarning: To copy construct from a tensor, it is recommended to use sourceTensor.clone().detach()",
    "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
    "Warning: please use at least NVCC 11.4 for optimal performance",
    "UserWarning: The given NumPy array is not writable, and PyTorch does not support non-writable tensors.",
)


def benign_c10d_warning(world: World, rank: int, rng: Random) -> LineFn:
    """c10d chatter that looks alarming and is not: a retried rendezvous connect, record-stream advice."""
    from bench.pytorch import glog, prefixed

    kind = rng.random()
    master = world.hostname(world.master)

    def render(d: datetime) -> str:
        if kind < 0.5:
            line = (
                f"{glog(world, d, 'W', 'socket.cpp:' + ('697' if world.stack.torch >= (2, 2) else '426'))} [c10d] The client socket has failed to connect to "
                f"[{master}]:{world.master_port} (errno: 111 - Connection refused)."
            )
        else:
            line = (
                f"{glog(world, d, 'W', 'ProcessGroupNCCL.cpp:' + ('4561' if world.stack.torch >= (2, 4) else '2291'))} [PG 0 Rank {rank}] "
                "Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is thus deprecated."
            )
        return prefixed(world, rank, [line], c10d=True)

    return render
