"""Analyzers for ranks and nodes that went their own way, read from plain program output.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from hypocenter.engine.analyzers import Analyzer, AttemptView, Finding, first_seen
from hypocenter.model import Event

# The collective entry points of torch.distributed (distributed_c10d.py) a traceback can stop in.
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "batch_isend_irecv",
    }
)
# Exceptions a rank raises because a collective or its peers failed (it waited for someone else).
_COLLECTIVE_FAILURE = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistBackendError",
    "Watchdog caught collective operation timeout",
    "NCCL error",
    "remote process exited",
)


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (", …" if len(ranks) > 8 else "")


def _call_sites(view: AttemptView) -> dict[int, tuple[str, str, Event]]:
    """Each rank's last collective frame: (collective, the program's line that called it, the event)."""
    per_rank: dict[int, list[Event]] = defaultdict(list)
    for e in sorted(view.of_kind("traceback_frame"), key=Event.stream_order):
        if e.rank is not None:
            per_rank[e.rank].append(e)
    out: dict[int, tuple[str, str, Event]] = {}
    for rank, frames in sorted(per_rank.items()):
        for i in range(len(frames) - 1, -1, -1):
            f = frames[i]
            func = str(f.fields.get("func") or "")
            if func in COLLECTIVES and "distributed" in str(f.fields.get("file") or ""):
                caller = next(
                    (
                        c
                        for c in reversed(frames[:i])
                        if "torch/distributed" not in str(c.fields.get("file") or "")
                    ),
                    None,
                )
                site = (
                    f"{caller.fields.get('file')}:{caller.fields.get('line')}" if caller is not None else ""
                )
                out[rank] = (func, site, f)
                break
    return out


def traceback_desync(view: AttemptView) -> list[Finding]:
    """The one rank (of three or more) whose traceback stops in another collective or call site."""
    sites = _call_sites(view)
    if len(sites) < 3:
        return []
    keys = Counter((func, site) for func, site, _ in sites.values())
    if len(keys) != 2:
        return []
    (common, n_common), (odd, n_odd) = keys.most_common()
    if n_odd != 1 or n_common < 2:
        return []
    rank = next(r for r, (func, site, _) in sorted(sites.items()) if (func, site) == odd)
    func, site, event = sites[rank]
    node = view.node_of(event)
    others = sorted(r for r in sites if r != rank)
    what = f"{func}" + (f" (called at {site.rsplit('/', 1)[-1]})" if site else "")
    usual = f"{common[0]}" + (f" (called at {common[1].rsplit('/', 1)[-1]})" if common[1] else "")
    detail = f"rank {rank}'s traceback stops in {what} while ranks {_ranks_text(others)} stop in {usual}"
    return [
        Finding(
            nodes=(node,) if node else (),
            events=(event,),
            first_seen=first_seen([event]),
            detail=detail,
        )
    ]


def early_finish(view: AttemptView) -> list[Finding]:
    """A rank that reported the end of its training before the other ranks failed in collectives."""
    done = sorted(
        (e for e in view.of_kind("training_finished") if e.rank is not None), key=Event.stream_order
    )
    if not done:
        return []
    failed = [
        e
        for e in view.events
        if e.rank is not None
        and e.kind in ("python_exception", "watchdog_timeout")
        and any(s in e.text for s in _COLLECTIVE_FAILURE)
    ]
    finished_ranks = {e.rank for e in done}
    out: list[Finding] = []
    for e in done:
        later = sorted(
            {
                f.rank
                for f in failed
                if f.rank is not None
                and f.rank not in finished_ranks
                and f.stream_order()[0] >= e.stream_order()[0]
            }
        )
        if len(later) < 1 or e.rank in {f.rank for f in failed}:
            continue
        node = view.node_of(e)
        out.append(
            Finding(
                nodes=(node,) if node else (),
                events=(e,),
                first_seen=first_seen([e]),
                detail=(
                    f"rank {e.rank} finished on its own ({e.text.strip()[:80]}) while ranks {_ranks_text(later)} "
                    "then failed waiting for it in a collective"
                ),
            )
        )
        break  # the first rank to leave is the one the others waited for
    return out


def rendezvous_endpoint(view: AttemptView) -> list[Finding]:
    """The node whose launcher could not reach the rendezvous store the other nodes used."""
    nodes = sorted(view.context.nodes)
    if len(nodes) < 2:
        return []
    tries: dict[str, list[Event]] = defaultdict(list)
    for e in sorted(view.of_kind("rdzv_connect_failed"), key=Event.stream_order):
        node = view.node_of(e)
        if node:
            tries[node].append(e)
    endpoints = {n: {_endpoint(e) for e in evs} - {""} for n, evs in tries.items()}
    if len(tries) == 1:
        # Only one node failed to reach the store, and gave up: the others reached it (or host it). A
        # retry that later succeeded is common noise (an IPv6 address tried first), so it takes a
        # final failure.
        [(node, evs)] = tries.items()
        if node not in nodes or not any(e.fields.get("state") == "timed out" for e in evs):
            return []
        odd_nodes, usual = [node], ""
    else:
        votes = Counter(ep for eps in endpoints.values() for ep in eps)
        if len(votes) < 2:
            return []  # every node retried the same endpoint: the store itself is gone
        usual = votes.most_common(1)[0][0]
        odd_nodes = sorted(n for n, eps in endpoints.items() if usual not in eps)
        if not odd_nodes or len(odd_nodes) * 2 >= len(tries):
            return []
    out = []
    for node in odd_nodes:
        evs = tries[node]
        others = [n for n in nodes if n != node]
        where = ", ".join(sorted(endpoints[node])) or "its endpoint"
        if usual:
            but = f"while the other nodes used {usual}"
        else:
            but = f"while {', '.join(others[:4])}{' …' if len(others) > 4 else ''} never failed to connect"
        detail = f"{node}'s launcher could not reach the rendezvous store at {where} {but}"
        out.append(Finding(nodes=(node,), events=tuple(evs[:3]), first_seen=first_seen(evs), detail=detail))
    return out


def _endpoint(e: Event) -> str:
    ep = e.fields.get("endpoint")
    if isinstance(ep, str) and ep:
        return ep
    host, port = e.fields.get("host"), e.fields.get("port")
    return f"{host}:{port}" if host and port is not None else ""


def _seconds(clock: str) -> int | None:
    """tqdm's elapsed time (`MM:SS` or `H:MM:SS`, tqdm.format_interval) in seconds."""
    parts = clock.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return total


def _timeout_ms(e: Event) -> int | None:
    for key in ("timeout_ms", "ms", "after_ms", "waited_ms"):
        v = e.fields.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, str) and v.isdigit():
            return int(v)
    return None


def preprocess_timeout(view: AttemptView) -> list[Finding]:
    """A preprocessing bar that ran about as long as the timeout the waiting ranks hit."""
    timeouts = [(ms, e) for e in view.of_kind("watchdog_timeout", "wait_timeout") if (ms := _timeout_ms(e))]
    if not timeouts:
        return []
    limit_ms = min(ms for ms, _ in timeouts)
    best: tuple[int, Event] | None = None
    for e in sorted(view.of_kind("preprocess_progress"), key=Event.stream_order):
        secs = _seconds(str(e.fields.get("elapsed") or ""))
        pct = e.fields.get("pct")
        if secs is None or (isinstance(pct, str) and pct.isdigit() and int(pct) >= 100):
            continue
        if secs * 1000 >= 0.8 * limit_ms and (best is None or secs > best[0]):
            best = (secs, e)
    if best is None:
        return []
    secs, bar = best
    node = view.node_of(bar)
    waited = sorted({r for _, e in timeouts if (r := e.rank) is not None and r != bar.rank})
    who = f"ranks {_ranks_text(waited)}" if waited else "the other ranks"
    where = f"rank {bar.rank}" if bar.rank is not None else (node or "one rank")
    detail = (
        f"{where} was still in '{str(bar.fields.get('desc') or '').strip()}' ({bar.fields.get('pct')}% after "
        f"{bar.fields.get('elapsed')}) when {who} gave up waiting after {limit_ms} ms: raise the timeout "
        "(init_process_group(timeout=…), ddp_timeout) or preprocess before launching"
    )
    events = (bar, *(e for _, e in timeouts[:2]))
    return [
        Finding(nodes=(node,) if node else (), events=events, first_seen=first_seen([bar]), detail=detail)
    ]


HELD_MIB = 1024  # a compute process holding less is no reason for the job's OOM (display servers, probes)
_BUSY = re.compile(r"busy or unavailable|DevicesUnavailable|DEVICE_UNAVAILABLE")


def gpu_held_by_process(view: AttemptView) -> list[Finding]:
    """A foreign compute process holding GPU memory on the node where the job's GPU allocation failed."""
    only = view.context.nodes[0] if len(view.context.nodes) == 1 else None
    failed: dict[str, Event] = {}
    for e in sorted(view.events, key=Event.stream_order):
        if e.kind == "gpu_oom" or (e.kind == "cuda_error" and _BUSY.search(e.text)):
            node = view.node_of(e) or only
            if node and node not in failed:
                failed[node] = e
    if not failed:
        return []
    own = {v for e in view.events if e.kind != "gpu_process" for k, v in e.fields.items() if k == "pid"}
    own_pids = {int(v) for v in own if isinstance(v, int) or (isinstance(v, str) and v.isdigit())}
    held: dict[str, list[Event]] = defaultdict(list)
    for e in sorted(view.of_kind("gpu_process"), key=Event.stream_order):
        node = view.node_of(e) or only
        pid, mib = str(e.fields.get("pid") or ""), str(e.fields.get("mib") or "")
        if (
            node in failed
            and e.fields.get("type") in ("C", "C+G")
            and mib.isdigit()
            and int(mib) >= HELD_MIB
            and pid.isdigit()
            and int(pid) not in own_pids
        ):
            held[node].append(e)
    out = []
    for node in sorted(held):
        procs = sorted(held[node], key=lambda e: -int(str(e.fields.get("mib"))))
        top = procs[0]
        what = (
            "ran out of GPU memory" if failed[node].kind == "gpu_oom" else "found its GPU busy or unavailable"
        )
        detail = (
            f"the job {what} on {node} while nvidia-smi shows PID {top.fields.get('pid')} "
            f"({str(top.fields.get('name') or '?').strip()}) holding {top.fields.get('mib')} MiB on GPU "
            f"{top.fields.get('gpu')}"
            + (f" and {len(procs) - 1} more process(es)" if len(procs) > 1 else "")
            + ": a process outside the job (a stale or stopped run) holds the GPU; stop it or run elsewhere"
        )
        events = (failed[node], *procs[:3])
        out.append(
            Finding(nodes=(node,), events=events, first_seen=first_seen([failed[node]]), detail=detail)
        )
    return out


PROGRAM_ANALYZERS: dict[str, Analyzer] = {
    "gpu-held-by-process": gpu_held_by_process,
    "preprocess-timeout": preprocess_timeout,
    "traceback-desync": traceback_desync,
    "early-finish": early_finish,
    "rendezvous-endpoint": rendezvous_endpoint,
}
