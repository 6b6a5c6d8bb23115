"""What one failed attempt cost: GPUs in scope x the time they lost, each figure with how it was
obtained and how far off it may be.

    gpus             nodes x GPUs per node: the rank map (one rank per GPU), the DCGM series of the
                     attempt's nodes, or the `gpus_per_node` setting
    lost_work_s      the last durable progress → the first cause line: a checkpoint-saved line
                     (rules/workload/checkpoint.yaml), else the step a configured checkpoint interval
                     puts the last checkpoint at, timed from the step lines
    time_to_detect_s the first cause line → the terminal state (the watchdog / timeout tail)
    restart_overhead_s  the next attempt's start → its first progress: not known when an attempt is
                     analysed alone; fleet roll-ups join each attempt's `startup_s` to the one before
    startup_s        this attempt's start → its first progress line

A part that cannot be estimated is unknown (null, listed in `unknown`), never 0. Pure and
deterministic: events in, figures out; no clock, no store.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from hypocenter.model import AttemptContext, Cost, CostFigure, Event, isoformat
from hypocenter.modelbase import count_ranks
from hypocenter.names import NODE_LABELS
from hypocenter.sources import MetricSource, Source

STAMP_S = 1.0  # a stamped line is placed to within its stamp's resolution (most print seconds)
PROGRESS_KINDS = ("train_step", "progress")  # a step line first: a resume line is still startup


@dataclass(frozen=True, slots=True)
class CostSettings:
    """What the logs may not say: GPUs per node, and the checkpoint interval in steps."""

    gpus_per_node: int | None = None
    checkpoint_interval_steps: int | None = None


def gpu_inventory(sources: Iterable[Source]) -> dict[str, int]:
    """GPUs per node seen in DCGM series (distinct `gpu` / `UUID` labels of DCGM_FI_* series)."""
    seen: dict[str, set[str]] = {}
    for source in sources:
        if not isinstance(source, MetricSource):
            continue
        for series in source.series:
            if not series.name.startswith("DCGM_FI_"):
                continue
            gpu = series.labels.get("gpu") or series.labels.get("UUID")
            node = next((series.labels[k] for k in NODE_LABELS if series.labels.get(k)), None)
            if gpu and node:
                seen.setdefault(node, set()).add(gpu)
    return {node: len(gpus) for node, gpus in sorted(seen.items())}


def _s(x: float) -> float:
    return round(x, 3)


def _unknown(method: str) -> CostFigure:
    return CostFigure(value=None, uncertainty=None, method=method)


def _gpus(ctx: AttemptContext, inventory: dict[str, int], settings: CostSettings) -> CostFigure:
    nodes = list(ctx.nodes)
    if ctx.ranks and (not nodes or set(ctx.ranks) == set(nodes)):
        total = sum(count_ranks(spec) for spec in ctx.ranks.values())
        return CostFigure(
            value=float(total),
            uncertainty=0.0,
            method=f"rank map: {total} ranks on {len(ctx.ranks)} node(s), one GPU per rank",
        )
    if nodes and ctx.gpus_per_node:
        return CostFigure(
            value=float(len(nodes) * ctx.gpus_per_node),
            uncertainty=0.0,
            method=f"scope: {len(nodes)} node(s) × {ctx.gpus_per_node} GPUs per node",
        )
    in_scope = {n: k for n, k in inventory.items() if n in nodes}
    if nodes and set(in_scope) == set(nodes):  # every node's GPUs in its DCGM series
        per = max(in_scope.values())
        total = sum(in_scope.values())
        return CostFigure(
            value=float(len(nodes) * per),
            uncertainty=float(len(nodes) * per - total),
            method=f"DCGM series: {len(nodes)} node(s) × {per} GPUs (the most any node's series show)",
        )
    if nodes and settings.gpus_per_node:
        return CostFigure(
            value=float(len(nodes) * settings.gpus_per_node),
            uncertainty=0.0,
            method=f"{len(nodes)} node(s) × {settings.gpus_per_node} GPUs per node (setting gpus_per_node)",
        )
    return _unknown("no rank map, DCGM series or gpus_per_node setting for the attempt's nodes")


def _timed(events: Iterable[Event], kind: str) -> list[Event]:
    return sorted(
        (e for e in events if e.kind == kind and e.time is not None and not e.approx),
        key=Event.stream_order,
    )


def _spread(e: Event) -> float:
    """How far a line's time may be off: its stamp, or the gap its inherited time falls in."""
    if e.inherited and e.time is not None and e.time_max is not None:
        return max(STAMP_S, (e.time_max - e.time).total_seconds())
    return STAMP_S


def _step(e: Event) -> int | None:
    for key in ("step", "n"):
        v = e.fields.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


# Lines printed as a save starts (Lightning's ModelCheckpoint): durable only if training went on after.
SAVE_STARTS = frozenset({"lightning"})


def _lost_work(events: Sequence[Event], until: datetime, settings: CostSettings) -> CostFigure:
    steps_at = [e.time for e in _timed(events, "train_step") if e.time is not None and e.time <= until]

    def went_on(e: Event) -> bool:  # a step line after it, before the failure: the save did not fail it
        return e.time is not None and any(e.time < t for t in steps_at)

    saved = [
        e
        for e in _timed(events, "checkpoint_saved")
        if e.time is not None
        and e.time <= until
        and (e.fields.get("framework") not in SAVE_STARTS or went_on(e))
    ]
    # A save worded in a way no checkpoint-saved rule knows: it began there, its end is unseen; it counts
    # when training went on after it (a save that failed is what many failures are).
    started = [
        e
        for e in _timed(events, "solo_work")
        if e.time is not None
        and e.time <= until
        and "heckpoint" in str(e.fields.get("what", "")).lower()
        and went_on(e)
    ]
    last = max((*saved, *started), key=Event.stream_order, default=None)
    if last is not None and last.time is not None:
        if last.kind == "checkpoint_saved":
            step = _step(last)
            at = f", step {step}" if step is not None else ""
            method = (
                f"since the last checkpoint saved ({last.fields.get('framework', 'checkpoint')}{at}) "
                f"at {isoformat(last.time)}"
            )
        else:
            method = (
                f"since the last checkpoint save begun at {isoformat(last.time)} that training went on "
                "after (its completion is not logged in words a rule knows)"
            )
        return CostFigure(
            value=_s((until - last.time).total_seconds()),
            uncertainty=_s(_spread(last)),
            method=method,
            ref=last.ref,
        )
    interval = settings.checkpoint_interval_steps
    steps = [
        (e, s)
        for e in _timed(events, "train_step")
        if e.time is not None and e.time <= until and (s := _step(e)) is not None
    ]
    if not steps:
        return _unknown("no checkpoint line and no stamped step line before the failure")
    if not interval:
        return _since_training_start(steps, until)
    last_e, last_step = steps[-1]
    ckpt = last_step // interval * interval
    assert last_e.time is not None
    exact = [e for e, s in steps if s == ckpt]
    gaps = [
        (b.time - a.time).total_seconds() / (sb - sa)
        for (a, sa), (b, sb) in pairwise(steps)
        if a.time is not None and b.time is not None and sb > sa
    ]
    if exact:
        when = exact[-1].time
        assert when is not None
        per_step = statistics.median(gaps) if gaps else 0.0
        return CostFigure(
            value=_s((until - when).total_seconds()),
            uncertainty=_s(max(STAMP_S, per_step)),
            method=f"since step {ckpt}, the last multiple of the checkpoint interval ({interval} steps), "
            f"reported at {isoformat(when)}",
            ref=exact[-1].ref,
        )
    if not gaps:
        return _unknown(
            f"the last checkpoint (step {ckpt}, every {interval} steps) has no step line and the step rate is unknown"
        )
    per_step = statistics.median(gaps)
    line_gap = statistics.median(
        (b.time - a.time).total_seconds()
        for (a, _), (b, _) in pairwise(steps)
        if a.time is not None and b.time is not None
    )
    value = (until - last_e.time).total_seconds() + (last_step - ckpt) * per_step
    return CostFigure(
        value=_s(value),
        uncertainty=_s(max(STAMP_S, line_gap)),
        method=f"since step {ckpt}, the last multiple of the checkpoint interval ({interval} steps), timed "
        f"back from step {last_step} at {per_step:.3f} s per step",
        ref=last_e.ref,
    )


def _since_training_start(steps: list[tuple[Event, int]], until: datetime) -> CostFigure:
    """No checkpoint of this attempt before the failure: all it trained since it resumed is lost, from
    its first step line (the work before that line is at most one logging interval more)."""
    first = steps[0][0]
    assert first.time is not None
    gaps = [
        (b.time - a.time).total_seconds()
        for (a, _), (b, _) in pairwise(steps)
        if a.time is not None and b.time is not None
    ]
    return CostFigure(
        value=_s((until - first.time).total_seconds()),
        uncertainty=_s(max(STAMP_S, statistics.median(gaps) if gaps else STAMP_S)),
        method=f"no checkpoint saved or begun in this attempt before the failure: all it trained since its "
        f"first step line at {isoformat(first.time)} (step {steps[0][1]}) is lost",
        ref=first.ref,
    )


def _startup(ctx: AttemptContext, events: Sequence[Event]) -> CostFigure:
    first: Event | None = None
    for kind in PROGRESS_KINDS:
        timed = _timed(events, kind)
        if timed:
            first = timed[0]
            break
    if first is None or first.time is None:
        return _unknown("no stamped progress line in the attempt")
    return CostFigure(
        value=_s(max(0.0, (first.time - ctx.window.start).total_seconds())),
        uncertainty=_s(_spread(first)),
        method=f"attempt start {isoformat(ctx.window.start)} → first progress line at {isoformat(first.time)}",
        ref=first.ref,
    )


def attempt_cost(
    ctx: AttemptContext,
    events: Sequence[Event],
    cause_time: datetime | None,
    cause_ref: str | None,
    *,
    settings: CostSettings,
    inventory: dict[str, int],
    completed: bool = False,
) -> Cost:
    """The cost of a failed attempt whose failure began at `cause_time` (its first cause line, or the
    first process seen to fail; None when neither is known). A `completed` attempt lost nothing: its
    cost still says its GPUs and startup, which is the restart overhead of a failed attempt before it."""
    end = ctx.window.end
    gpus = _gpus(ctx, inventory, settings)
    if completed:
        nothing = CostFigure(value=0.0, uncertainty=0.0, method="the attempt completed: nothing lost")
        return Cost(
            gpus=gpus,
            lost_work_s=nothing,
            time_to_detect_s=nothing,
            restart_overhead_s=nothing,
            startup_s=_startup(ctx, events),
            gpu_hours_lost=0.0 if gpus.value is not None else None,
            gpu_hours_uncertainty=0.0 if gpus.value is not None else None,
            unknown=[] if gpus.value is not None else ["gpus"],
        )
    if cause_time is not None and cause_time <= end:
        detect = CostFigure(
            value=_s((end - cause_time).total_seconds()),
            uncertainty=STAMP_S,
            method=f"first cause line at {isoformat(cause_time)} → terminal state at {isoformat(end)}",
            ref=cause_ref,
        )
        lost = _lost_work(events, cause_time, settings)
    else:
        detect = _unknown("no time for the first cause line: counted in lost work, up to the terminal state")
        lost = _lost_work(events, end, settings)
    restart = _unknown("the next attempt of the workload is not known when this one is analysed")
    parts = {"lost_work_s": lost, "time_to_detect_s": detect, "restart_overhead_s": restart}
    unknown = [name for name, f in parts.items() if f.value is None]
    if cause_time is None and lost.value is not None:
        unknown.remove("time_to_detect_s")  # inside lost work: nothing is left out
    seconds = sum(f.value for f in parts.values() if f.value is not None)
    spread = sum(f.uncertainty or 0.0 for f in parts.values() if f.value is not None)
    hours = hours_spread = None
    if gpus.value is not None:
        hours = round(gpus.value * seconds / 3600.0, 4)
        hours_spread = round(
            (gpus.value * spread + (gpus.uncertainty or 0.0) * seconds) / 3600.0,
            4,
        )
    else:
        unknown.insert(0, "gpus")
    return Cost(
        gpus=gpus,
        lost_work_s=lost,
        time_to_detect_s=detect,
        restart_overhead_s=restart,
        startup_s=_startup(ctx, events),
        gpu_hours_lost=hours,
        gpu_hours_uncertainty=hours_spread,
        unknown=unknown,
    )


__all__ = ["CostSettings", "attempt_cost", "gpu_inventory"]
