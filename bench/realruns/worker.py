"""The training program that bench/realruns/record.py runs under torchrun (gloo, CPU).

Each mode makes one rank fail the way real jobs do; the other ranks are left to fail the way
PyTorch makes them fail (a broken gloo connection, a timeout, the agent's SIGTERM).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MODE = sys.argv[1]
CULPRIT = 2


class _Samples(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 5 and int(os.environ["RANK"]) == CULPRIT:
            os.kill(os.getpid(), signal.SIGKILL)  # the data-loader worker dies (host OOM looks like this)
        return torch.ones(4) * i


def main() -> None:
    timeout = timedelta(
        seconds=10 if MODE in ("collective-timeout", "rank0-checkpoint", "desync", "early-exit") else 60
    )
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    t = torch.ones(8)
    for step in range(1, 6):
        if step == 3 and rank == 0 and MODE == "rank0-checkpoint":
            # A code path only rank 0 runs (saving a checkpoint) outlasts the others' collective timeout:
            # rank 0 keeps working and printing while the other ranks wait in the all-reduce.
            for shard in range(1, 21):
                print(f"saving checkpoint shard {shard}/20 to /tmp/ckpt/step3", flush=True)
                time.sleep(1)
        if step == 3 and rank == CULPRIT:
            if MODE == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif MODE == "sigsegv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif MODE == "sigabrt":
                os.abort()
            elif MODE == "exception":
                batch: dict[str, torch.Tensor] = {"labels": t}
                print(batch["input_ids"])
            elif MODE == "collective-timeout":
                time.sleep(40)  # this rank never reaches the all-reduce in time
            elif MODE == "cpu-alloc":
                torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: the CPU allocator refuses it
            elif MODE == "memory-error":
                bytearray(2**62)  # CPython cannot allocate it: a bare MemoryError
            elif MODE == "desync":
                dist.broadcast(t, src=0)  # this rank takes another code path: the others all-reduce
                continue
            elif MODE == "early-exit":
                print(f"training finished after {step - 1} steps", flush=True)
                dist.destroy_process_group()
                return  # this rank believes it is done; the others wait for it in the next all-reduce
            elif MODE == "dataloader-killed":
                loader = torch.utils.data.DataLoader(_Samples(), batch_size=4, num_workers=2)
                for _ in loader:
                    pass
        dist.all_reduce(t)
        print(f"step {step} loss {float(t[0]) / 1e3:.4f}", flush=True)
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
