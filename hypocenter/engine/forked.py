"""Work spread over forked processes, the calling process one of them.

    spread(work, sizes, workers) → [work(0), work(1), …] computed by `workers` processes

Batches of about equal bytes go to whichever process frees up first; only results are pickled back,
and a failed process's batches are recomputed by the caller, so results never depend on who computed
them. Not `multiprocessing.Pool`: it imports and starts threads for a fixed cost a small bundle feels.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

BATCHES_PER_WORKER = 8  # enough for a busy process to take fewer; few enough that each costs little
_TICKET = 4  # bytes of a batch number in the pipe (reads of at most PIPE_BUF bytes are atomic)


def cores() -> int:
    """The cores this process may run on, at most 4: how many processes `analyze` spreads work over."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


def batches(sizes: Sequence[int], workers: int) -> list[range]:
    """The items 0..len(sizes)-1 in consecutive runs of about equal total size, about
    BATCHES_PER_WORKER per worker."""
    target = max(1, sum(sizes) // (workers * BATCHES_PER_WORKER))
    out: list[range] = []
    start = 0
    held = 0
    for i, size in enumerate(sizes):
        held += max(size, 1)
        if held >= target:
            out.append(range(start, i + 1))
            start, held = i + 1, 0
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def spread(work: Callable[[int], T], sizes: Sequence[int], workers: int) -> list[T] | None:
    """[work(i) for i in range(len(sizes))], computed by this process and `workers` - 1 forked ones;
    None where fork is not available (the caller computes them itself)."""
    fork = getattr(os, "fork", None)
    if fork is None or workers < 2:
        return None
    runs = batches(sizes, workers)
    tickets_r, tickets_w = os.pipe()
    try:
        os.write(tickets_w, b"".join(n.to_bytes(_TICKET, "little") for n in range(len(runs))))
    finally:
        os.close(tickets_w)
    children: list[tuple[int, int]] = []  # (pid, read end of its answer)
    done: dict[int, list[T]] = {}
    freeze = gc.get_freeze_count() == 0  # (objects someone else froze stay frozen)
    try:
        if (
            freeze
        ):  # a collection in a worker would otherwise write to (copy) every page of the caller's objects
            gc.freeze()
        try:
            for _ in range(workers - 1):
                try:
                    answer_r, answer_w = os.pipe()
                except OSError:
                    break  # (no file descriptor left) the processes there are take every batch
                try:
                    pid = fork()
                except OSError:  # (no process left) likewise
                    os.close(answer_r)
                    os.close(answer_w)
                    break
                if pid == 0:  # the worker: its batches, pickled into the pipe, then gone
                    status = 1
                    try:
                        os.close(answer_r)
                        ours = _take(tickets_r, runs, work)
                        _write_all(answer_w, pickle.dumps(ours, pickle.HIGHEST_PROTOCOL))
                        status = 0
                    finally:
                        os._exit(status)
                os.close(answer_w)
                children.append((pid, answer_r))
        finally:
            if freeze:
                gc.unfreeze()
        done.update(_take(tickets_r, runs, work))
        while children:
            pid, answer_r = children.pop(0)
            raw = None
            with contextlib.suppress(OSError):
                raw = _read_all(answer_r)
            if _waited(pid) == 0 and raw is not None:
                with contextlib.suppress(
                    Exception
                ):  # an answer that cannot be read: its batches are computed below
                    done.update(pickle.loads(raw))
    finally:
        os.close(tickets_r)
        for pid, answer_r in children:  # the caller failed (or was interrupted): no worker outlives it
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.close(answer_r)
            _waited(pid)
    out: list[T] = []
    for n, run in enumerate(runs):
        out.extend(done[n] if n in done else [work(i) for i in run])
    return out


def _take(tickets: int, runs: list[range], work: Callable[[int], T]) -> dict[int, list[T]]:
    """The batches this process takes from the pipe `tickets`, each computed, until none is left."""
    ours: dict[int, list[T]] = {}
    while True:
        ticket = os.read(tickets, _TICKET)
        if len(ticket) < _TICKET:
            return ours
        n = int.from_bytes(ticket, "little")
        ours[n] = [work(i) for i in runs[n]]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    try:
        parts: list[bytes] = []
        while True:
            part = os.read(fd, 1 << 20)
            if not part:
                return b"".join(parts)
            parts.append(part)
    finally:
        os.close(fd)


def _waited(pid: int) -> int:
    """The exit status of the worker `pid`, once it has exited (-1 when it cannot be known)."""
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return -1
