"""Python rules: the analyses YAML cannot express, behind one small typed API.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise

from hypocenter.model import AttemptContext, Component, Event

ANALYZER_VERSION = "2"


@dataclass(frozen=True)
class Finding:
    """One culprit an analyzer found: where, when, and the events that show it."""

    nodes: tuple[str, ...]
    events: tuple[Event, ...]
    first_seen: datetime | None
    detail: str = ""
    components: tuple[Component, ...] = ()


@dataclass
class AttemptView:
    """What an analyzer may look at: the attempt's scope and its in-scope events, time-sorted."""

    context: AttemptContext
    events: list[Event]
    rank_nodes: dict[int, str] = field(default_factory=dict)

    def of_kind(self, *kinds: str) -> list[Event]:
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def node_of(self, e: Event) -> str | None:
        if e.node:
            return e.node
        if e.rank is not None:
            return self.rank_nodes.get(e.rank)
        return None


Analyzer = Callable[[AttemptView], list[Finding]]


def first_seen(events: Sequence[Event]) -> datetime | None:
    """When a cause began: its earliest stamped event. Without one, the earliest estimate from
    inherited times: a line without a stamp was written between the stamp before it and the stamp
    after it, and error bursts sit right before the next stamped line, so the upper bound is used."""
    exact = [e.time for e in events if e.time is not None and not e.inherited]
    if exact:
        return min(exact)
    return min(((e.time_max or e.time) for e in events if e.time is not None), default=None)


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def hang_laggard(view: AttemptView) -> list[Finding]:
    """Ranks that never enqueued the collective the others timed out on (per process group).

    The stuck collective is the SeqNum most ranks' watchdogs report; a rank whose last enqueued work
    is below it never issued it. Ranks may run ahead (async enqueue), so "behind the maximum" is not
    the test. Without a reported SeqNum, the laggards are a minority below everyone else.
    """
    per_rank: dict[tuple[str, int], tuple[int, Event]] = {}
    stuck_votes: dict[str, Counter[int]] = defaultdict(Counter)
    reporting: set[int] = set()
    for e in view.of_kind("watchdog_timeout", "watchdog_progress"):
        if e.rank is None:
            continue
        reporting.add(e.rank)
        pg = str(e.fields.get("pg") or "0")
        seq = _int(e.fields.get("seq"))
        if seq is not None:
            stuck_votes[pg][seq] += 1
        enq = _int(e.fields.get("last_enqueued"))
        if enq is None:
            continue
        key = (pg, e.rank)
        if key not in per_rank or enq > per_rank[key][0]:
            per_rank[key] = (enq, e)
    findings: list[Finding] = []
    by_pg: dict[str, list[tuple[int, int, Event]]] = defaultdict(list)
    for (pg, rank), (enq, e) in sorted(per_rank.items()):
        by_pg[pg].append((rank, enq, e))
    for pg in sorted(by_pg):
        rows = by_pg[pg]
        if len(rows) < 2:
            continue
        votes = stuck_votes.get(pg)
        if votes:
            stuck = min(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        else:
            stuck = max(enq for _, enq, _ in rows)
        behind = [(r, enq, e) for r, enq, e in rows if enq < stuck]
        ahead = len(rows) - len(behind)
        # The laggards must be the minority: if most ranks are "behind", nobody is the odd one out.
        if not behind or len(behind) >= ahead:
            continue
        nodes = sorted({n for _, _, e in behind if (n := view.node_of(e))})
        if not nodes:
            continue
        evs = tuple(e for _, _, e in behind)
        ranks = ", ".join(str(r) for r, _, _ in behind)
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=evs,
                first_seen=first_seen(evs),
                detail=(
                    f"rank(s) {ranks} last enqueued NCCL work {min(enq for _, enq, _ in behind)} and never "
                    f"issued work {stuck}, which {ahead} other rank(s) waited on"
                ),
            )
        )
    if not findings:
        findings = _silent_ranks(view, reporting)
    return findings


def _silent_ranks(view: AttemptView, reporting: set[int]) -> list[Finding]:
    """With a rank map: nearly every rank's watchdog fired, a few ranks that were logging said
    nothing about it, and each of them shares a node with ranks that did report (so that node's logs
    are there and its host was alive). Those ranks never reached the collective."""
    ranks = view.rank_nodes
    if not ranks or not reporting:
        return []
    missing = sorted(r for r in ranks if r not in reporting)
    if not missing or len(missing) * 8 > len(ranks) or len(reporting) * 4 < len(ranks) * 3:
        return []
    nodes_reporting = {ranks[r] for r in reporting if r in ranks}
    if any(ranks[r] not in nodes_reporting for r in missing):
        return []
    # Each silent rank must have left output of its own: silence in a truncated or missing log is
    # absence of data, not evidence.
    heard = {e.rank for e in view.events if e.rank is not None}
    if any(r not in heard for r in missing):
        return []
    nodes = sorted({ranks[r] for r in missing})
    if len(nodes) > 2:
        return []
    evs = [e for e in view.of_kind("watchdog_timeout") if e.rank is not None]
    first = first_seen(evs[:1])
    return [
        Finding(
            nodes=tuple(nodes),
            events=tuple(evs[:3]),
            first_seen=first,
            detail=(
                f"rank(s) {', '.join(map(str, missing))} never reported the collective timeout that "
                f"{len(reporting)} other rank(s) reported"
            ),
        )
    ]


def collective_mismatch(view: AttemptView) -> list[Finding]:
    """Ranks that waited on a different collective (OpType) than the rest at the same SeqNum."""
    at: dict[tuple[str, int], dict[int, tuple[str, Event]]] = defaultdict(dict)
    for e in view.of_kind("watchdog_timeout"):
        seq = _int(e.fields.get("seq"))
        op = e.fields.get("op")
        if seq is None or not isinstance(op, str) or e.rank is None:
            continue
        at[(str(e.fields.get("pg") or "0"), seq)].setdefault(e.rank, (op, e))
    findings: list[Finding] = []
    for key in sorted(at):
        ranks = at[key]
        ops = Counter(op for op, _ in ranks.values())
        if len(ops) < 2:
            continue
        lowest_op = ranks[min(ranks)][0]
        # The majority is the program as written; on an even split the side with the lowest rank is
        # the deviant, since rank-0-only branches (`if rank == 0: …`) are the usual divergence.
        common = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0] == lowest_op, kv[0]))[0][0]
        odd = sorted((r, op, e) for r, (op, e) in ranks.items() if op != common)
        if len(odd) * 2 > len(ranks):
            continue
        nodes = sorted({n for _, _, e in odd if (n := view.node_of(e))})
        if not nodes:
            continue
        evs = tuple(e for _, _, e in odd)
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=evs,
                first_seen=first_seen(evs),
                detail=(
                    f"rank(s) {', '.join(str(r) for r, _, _ in odd)} issued {odd[0][1]} at SeqNum {key[1]} "
                    f"while the others issued {common}"
                ),
            )
        )
    return findings


def ib_peer(view: AttemptView) -> list[Finding]:
    """The node that NET/IB completion errors and closed connections on other nodes point at."""
    addr: dict[str, str] = {}
    for e in view.of_kind("net_addr"):
        ip, node = e.fields.get("ip"), view.node_of(e)
        if isinstance(ip, str) and node:
            addr.setdefault(ip, node)
    names = {n.lower(): n for n in view.context.nodes}
    blamed: dict[str, dict[str, Event]] = defaultdict(dict)
    for e in view.of_kind("nccl_ib_completion_error", "nccl_peer_closed"):
        peer = e.fields.get("peer") or e.fields.get("peer2")
        status = e.fields.get("status")
        reporter = view.node_of(e)
        if not isinstance(peer, str) or not reporter:
            continue
        if e.kind == "nccl_ib_completion_error" and status not in (12, "12", "IBV_WC_RETRY_EXC_ERR"):
            continue  # status 5 (flush) and others are collateral, not a pointer
        target = addr.get(peer) or names.get(peer.lower()) or names.get(peer.split(".", 1)[0].lower())
        if target and target != reporter:
            blamed[target].setdefault(reporter, e)
    findings: list[Finding] = []
    for target in sorted(blamed):
        reporters = blamed[target]
        if len(reporters) < 2 and len(view.context.nodes) > 2:
            continue
        evs = tuple(reporters[r] for r in sorted(reporters))
        findings.append(
            Finding(
                nodes=(target,),
                events=evs,
                first_seen=first_seen(evs),
                detail=f"{len(reporters)} node(s) lost their connection to {target}",
            )
        )
    return findings


_STALL_KINDS = (
    "watchdog_timeout",
    "watchdog_progress",
    "heartbeat_timeout",
    "hung_task",
    "fs_stall",
    "nccl_error",
    "nccl_ib_completion_error",
    "nccl_peer_closed",
    "tcpstore_error",
)


def time_limit(view: AttemptView) -> list[Finding]:
    """The job hit its wall-clock limit while still making progress (not a hang that ate the time)."""
    limits = view.of_kind("time_limit")
    if not limits:
        return []
    end = min((e.time for e in limits if e.time), default=view.context.window.end)
    progress = [
        e.time
        for e in view.of_kind("progress")
        if e.time and not e.inherited and not e.approx and e.time <= end + timedelta(seconds=60)
    ]
    if not progress:
        # Progress lines without stamps (tqdm, plain prints) cannot show the job was still progressing.
        # With no hang or stall evidenced either, the limit is the cause, on weaker evidence (its
        # precedence is below STRONG, so the quality says so); an evidenced hang or stall wins.
        unstamped = [e for e in view.of_kind("progress") if e.inherited or e.approx or e.time is None]
        if not unstamped or view.of_kind(*_STALL_KINDS):
            return []
        return [
            Finding(
                nodes=(),
                events=tuple(limits[:3]),
                first_seen=end,
                detail=f"{len(unstamped)} progress line(s) carry no time, so progress up to the limit is not "
                "shown; no hang or stall is evidenced",
            )
        ]
    progress.sort()
    gaps = [(b - a).total_seconds() for a, b in pairwise(progress)]
    typical = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    if (end - progress[-1]).total_seconds() > max(900.0, 4 * typical):
        return []  # progress stopped long before the limit: a hang, not the limit
    return [
        Finding(
            nodes=(),
            events=tuple(limits[:3]),
            first_seen=end,
            detail=f"training progress continued until {progress[-1].isoformat()}",
        )
    ]


# The analyzers over log events; engine/registry.py adds the hang forensics and is what rules name.
CORE_ANALYZERS: dict[str, Analyzer] = {
    "hang-laggard": hang_laggard,
    "collective-mismatch": collective_mismatch,
    "ib-peer": ib_peer,
    "time-limit": time_limit,
}
