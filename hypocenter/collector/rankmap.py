"""An attempt's rank map (global rank → node), rebuilt from what the scheduler says when nobody wrote one.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from hypocenter.model import AttemptContext
from hypocenter.sources import FileTextSource, Source, TextSource

_NPROC = re.compile(rb"--nproc[-_]per[-_]node[= ]+(\d{1,4})\b")
_NCCL_RANK = re.compile(
    rb"(?m)^(?:\S+ )?([A-Za-z0-9][\w.-]*):\d+:\d+ \[\d+\] NCCL INFO .*?\brank (\d{1,7}) nranks (\d{1,7})\b"
)
_RANK_PREFIX = re.compile(rb"\[rank(\d{1,7})\]:")


def task_layout(nodes: Sequence[str], tasks: int, distribution: str | None = None) -> dict[str, list[int]]:
    """Slurm's task numbers per node for `tasks` tasks over `nodes` (block: consecutive tasks per node,
    the first `tasks mod len(nodes)` nodes one more; cyclic: round robin)."""
    out: dict[str, list[int]] = {n: [] for n in nodes}
    if not nodes or tasks <= 0:
        return {}
    if (distribution or "block").split(":")[0].strip().lower() == "cyclic":
        for t in range(tasks):
            out[nodes[t % len(nodes)]].append(t)
        return out
    per, extra = divmod(tasks, len(nodes))
    t = 0
    for i, node in enumerate(nodes):
        count = per + (1 if i < extra else 0)
        out[node] = list(range(t, t + count))
        t += count
    return out


def _spans(ranks: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2,5"."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], -2]:
        if r != prev + 1:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = r
        prev = r
    return ",".join(parts)


def _pieces(src: TextSource) -> Iterable[bytes]:
    """A source's text as bytes: a file's in its line-aligned pieces (never whole: `--logs` folders can
    be large), which the patterns above, all within one line, see as they would the whole text."""
    if isinstance(src, FileTextSource):
        return src.chunks()
    return (src.text if isinstance(src.text, bytes) else src.text.encode("utf-8", "replace"),)


def rebuild(
    context: AttemptContext, layout: dict[str, list[int]], sources: Iterable[Source]
) -> tuple[AttemptContext, str | None]:
    """`context` with `ranks` filled from `layout` (node → task numbers) and the job's logs; a note on
    what was done or why not. A context that has a rank map already is returned as it is."""
    tasks = sum(len(v) for v in layout.values())
    if context.ranks or not tasks:
        return context, None
    widths: set[int] = set()
    inits: list[tuple[int, int, str]] = []  # (nranks, rank, host) from NCCL's own lines
    top = -1
    for src in sources:
        if not isinstance(src, TextSource):
            continue
        for data in _pieces(src):
            if src.node is None:
                widths.update(int(m.group(1)) for m in _NPROC.finditer(data))
                top = max([top, *(int(m.group(1)) for m in _RANK_PREFIX.finditer(data))])
            inits.extend(
                (int(m.group(3)), int(m.group(2)), m.group(1).decode("ascii", "replace"))
                for m in _NCCL_RANK.finditer(data)
            )
    world = max((n for n, _r, _h in inits), default=None)  # sub-communicators are smaller than the world
    placed = {r: h for n, r, h in sorted(inits, reverse=True) if n == world}
    width: int | None = None
    if len(widths) == 1:
        width = widths.pop()
    elif world is not None and world % tasks == 0:
        width = world // tasks
    elif top < tasks and world is None:
        width = 1
    why = None
    if width is None:
        why = (
            f"the job log names rank {top} but Slurm started {tasks} task(s) and the log says neither "
            "--nproc-per-node nor a NCCL world size"
            if not widths
            else f"the job log names several --nproc-per-node values ({', '.join(map(str, sorted(widths)))})"
        )
    elif top >= tasks * width:
        why = f"the job log names rank {top}, beyond {tasks} task(s) × {width} rank(s) per task"
    elif world is not None and world != tasks * width:
        why = f"NCCL's world size {world} is not {tasks} task(s) × {width} rank(s) per task"
    if why is None:
        assert width is not None
        ranks = {
            node: [r for t in ts for r in range(t * width, t * width + width)]
            for node, ts in layout.items()
            if ts
        }
        owner = {r: node for node, rs in ranks.items() for r in rs}
        wrong = sorted(
            r
            for r, host in placed.items()
            if owner.get(r) not in (None, host) and not host.startswith(f"{owner[r]}.")
        )
        if wrong:
            why = (
                f"NCCL places rank {wrong[0]} on {placed[wrong[0]]}, Slurm's task layout on {owner[wrong[0]]} "
                "(torchrun's node ranks do not follow the task order)"
            )
        else:
            mapped = {node: _spans(rs) for node, rs in ranks.items() if node in context.nodes}
            note = (
                f"rank map from Slurm's task layout ({tasks} task(s)"
                + (f" × {width} ranks" if width > 1 else "")
                + "): "
                + ", ".join(f"{n} {s}" for n, s in mapped.items())
            )
            return context.model_copy(update={"ranks": mapped}), note
    return context, f"no rank map: {why}; ranks in the job log stay without a node"
