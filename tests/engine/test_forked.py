"""engine/forked.py: work spread over this process and forked ones gives what one process computes."""

from __future__ import annotations

import os
import time

import pytest

from hypocenter.engine.forked import batches, spread


def test_batches_cover_every_item_once_in_order_and_about_evenly() -> None:
    sizes = [120_000] * 2049 + [9_000_000] + [5] * 40
    runs = batches(sizes, 2)
    assert [i for run in runs for i in run] == list(range(len(sizes)))
    big = sum(sizes) // 16
    assert all(sum(sizes[i] for i in run) < big + 9_000_000 for run in runs)
    assert 12 <= len(runs) <= 20
    assert batches([], 2) == [] and [list(r) for r in batches([0, 0, 0], 4)] == [[0], [1], [2]]


def test_spread_gives_what_one_process_computes() -> None:
    sizes = [i % 7 * 1000 for i in range(200)]

    def work(i: int) -> tuple[int, int]:
        time.sleep(0.004)  # long enough for every process to take batches
        return i * i, os.getpid()

    got = spread(work, sizes, 3)
    assert got is not None and [v for v, _ in got] == [i * i for i in range(200)]
    assert len({pid for _, pid in got}) >= 2


def test_a_worker_that_dies_leaves_its_batches_to_the_caller() -> None:
    caller = os.getpid()

    def work(i: int) -> int:
        if os.getpid() != caller:
            os._exit(3)  # a worker killed mid-way (OOM killer, a crash in a C extension)
        return i + 1

    assert spread(work, [1] * 100, 2) == list(range(1, 101))


def test_a_failure_in_the_caller_leaves_no_worker_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    caller = os.getpid()
    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)

    def work(i: int) -> int:
        if os.getpid() == caller:
            raise ValueError("the caller's own batch failed")
        time.sleep(0.01)  # the workers are still at work when the caller fails
        return i

    with pytest.raises(ValueError):
        spread(work, [1] * 100, 3)
    assert len(forked) == 2
    for (
        pid
    ) in forked:  # every worker was waited for (other tests' servers may still be this process's children)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_when_no_process_can_be_forked_the_caller_computes_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused() -> int:
        raise BlockingIOError(
            11, "Resource temporarily unavailable"
        )  # fork's EAGAIN: a process limit reached

    monkeypatch.setattr(os, "fork", refused)
    assert spread(lambda i: i * 2, [1] * 50, 4) == [i * 2 for i in range(50)]
