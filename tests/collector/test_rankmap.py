"""The rank map a pull rebuilds from Slurm's task layout and the job log (hypocenter/collector/rankmap.py)."""

from __future__ import annotations

from datetime import datetime, timezone

from hypocenter.collector.rankmap import rebuild, task_layout
from hypocenter.model import AttemptContext, Window, Workload
from hypocenter.sources import FileTextSource, TextSource

NODES = ["n1", "n2", "n3"]
CTX = AttemptContext(
    workload=Workload(id="7", scheduler="slurm"),
    nodes=NODES,
    window=Window(
        start=datetime(2026, 1, 1, tzinfo=timezone.utc), end=datetime(2026, 1, 1, 1, tzinfo=timezone.utc)
    ),
)


def test_block_and_cyclic_layouts() -> None:
    assert task_layout(NODES, 7) == {"n1": [0, 1, 2], "n2": [3, 4], "n3": [5, 6]}
    assert task_layout(NODES, 7, "Cyclic") == {"n1": [0, 3, 6], "n2": [1, 4], "n3": [2, 5]}
    assert task_layout(NODES, 6, "block:cyclic") == {"n1": [0, 1], "n2": [2, 3], "n3": [4, 5]}


def test_srun_started_ranks_are_the_tasks() -> None:
    log = TextSource("logs/_job/out", "[rank5]: RuntimeError: boom\n")
    ctx, note = rebuild(CTX, task_layout(NODES, 6), [log])
    assert ctx.ranks == {"n1": "0-1", "n2": "2-3", "n3": "4-5"} and ctx.rank_nodes()[5] == "n3"
    assert note and "6 task(s)" in note


def test_a_launcher_per_task_multiplies_the_ranks() -> None:
    log = TextSource(
        "logs/_job/out", "+ srun torchrun --nnodes=3 --nproc_per_node 4 train.py\n[rank9]: boom\n"
    )
    ctx, _ = rebuild(CTX, task_layout(NODES, 3), [log])
    assert ctx.ranks == {"n1": "0-3", "n2": "4-7", "n3": "8-11"}


def test_the_nccl_world_size_gives_the_width_and_sub_communicators_do_not_confuse_it() -> None:
    log = TextSource(
        "logs/_job/out",
        "n2:11:12 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 2 nranks 6 - Init\n"
        "n3:11:12 [0] NCCL INFO ncclCommInitRank comm 0x2 rank 0 nranks 2 - Init\n",
    )
    ctx, _ = rebuild(CTX, task_layout(NODES, 3), [log])
    assert ctx.ranks == {"n1": "0-1", "n2": "2-3", "n3": "4-5"}


def test_no_guess_when_the_log_contradicts_or_cannot_say() -> None:
    beyond = TextSource("logs/_job/out", "[rank9]: boom\n")
    ctx, note = rebuild(CTX, task_layout(NODES, 3), [beyond])
    assert ctx.ranks == {} and note and "rank 9" in note
    elsewhere = TextSource(
        "logs/_job/out", "n3:1:2 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 3 - Init\n"
    )
    ctx, note = rebuild(CTX, task_layout(NODES, 3), [elsewhere])
    assert ctx.ranks == {} and note and "NCCL places rank 0 on n3" in note


def test_a_written_rank_map_is_kept() -> None:
    ctx = CTX.model_copy(update={"ranks": {"n1": "0"}})
    assert rebuild(ctx, task_layout(NODES, 3), [])[0] is ctx


def test_a_log_file_is_read_in_its_pieces_never_whole() -> None:
    """A `--logs` file: its line-aligned pieces give the map the whole text gives."""
    lines = [
        b"+ srun torchrun --nnodes=3 --nproc_per_node 4 train.py\n",
        b"chatter\n" * 1000,
        b"n2:11:12 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 4 nranks 12 - Init\n",
        b"[rank9]: boom\n",
    ]

    def whole() -> bytes:
        raise AssertionError("the whole file was read")

    log = FileTextSource("logs/_job/out", whole, chunks=lambda: iter(lines))
    ctx, _ = rebuild(CTX, task_layout(NODES, 3), [log])
    assert ctx.ranks == {"n1": "0-3", "n2": "4-7", "n3": "8-11"}
    assert ctx == rebuild(CTX, task_layout(NODES, 3), [TextSource("logs/_job/out", b"".join(lines))])[0]
