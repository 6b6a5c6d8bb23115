"""Causes seen only as configuration: the candidates an abstaining diagnosis offers for them.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from hypocenter.model import Event, Evidence, RootCause, isoformat

# NCCL's own last resorts (misc/socket.cc: "^docker,lo,virbr" first, then docker, then lo).
_UNROUTABLE_IF = re.compile(r"^(?:lo|docker\d*|virbr\d*)$")
_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for (?:recv|send)|Watchdog caught collective operation timeout"
)
_IB_KINDS = ("ib_port_state", "ib_link_state", "ib_counter", "nccl_ib_async", "nccl_ib_completion_error")
MAX_LINES = 5  # evidence lines shown per candidate


@dataclass
class Suspect:
    """A candidate cause and the lines it rests on."""

    cause: RootCause
    events: list[Event]


def _host(name: str) -> str:
    first = name.split(".", 1)[0]
    return first if any(ch.isalpha() for ch in first) else name  # short name, but never cut an IP


def job_hosts(events: list[Event], nodes: list[str]) -> set[str]:
    """The hosts the job spans: the attempt's node list when it names several, else the distinct
    hosts NCCL's own line prefixes name (`host:pid:tid [dev] NCCL INFO …`)."""
    if len(nodes) >= 2:
        return {_host(n) for n in nodes}
    named = {_host(e.node) for e in events if e.kind in ("net_addr", "nccl_transport") and e.node}
    return named if len(named) >= 2 else {_host(n) for n in nodes} | named


def _first_seen(events: list[Event]) -> str | None:
    times = [e.time for e in events if e.time is not None]
    return isoformat(min(times)) if times else None


def _interfaces(events: list[Event], hosts: set[str]) -> Suspect | None:
    addrs = [e for e in events if e.kind == "net_addr"]
    unroutable = [
        e
        for e in addrs
        if _UNROUTABLE_IF.match(str(e.fields.get("ifname") or ""))
        or str(e.fields.get("ip") or "").startswith("127.")
    ]
    by_ip: dict[str, set[str]] = defaultdict(set)
    for e in addrs:
        if e.node:
            by_ip[str(e.fields.get("ip"))].add(_host(e.node))
    shared = [e for e in addrs if len(by_ip.get(str(e.fields.get("ip")), ())) >= 2]
    lines = sorted({e.ref: e for e in unroutable + shared}.values(), key=Event.stream_order)
    if not lines:
        return None
    picked = sorted({f"{e.fields.get('ifname')} ({e.fields.get('ip')})" for e in lines})
    on = sorted({e.node for e in lines if e.node})
    why = (
        "the same address on several hosts"
        if shared and not unroutable
        else "a loopback or docker-bridge address, which other hosts cannot reach"
    )
    summary = (
        f"NCCL picked {', '.join(picked[:4])} on {', '.join(on[:4]) or 'the job'} for a job spanning "
        f"{len(hosts)} hosts: {why}; set NCCL_SOCKET_IFNAME to the interface that connects the hosts "
        "(it falls short: no error line names the interface)"
    )
    return Suspect(
        RootCause(
            domain="software",
            subdomain="configuration",
            rule="nccl-net-addr",
            summary=summary,
            nodes=on,
            first_seen=_first_seen(lines),
            action="INVESTIGATE",
        ),
        lines[:MAX_LINES],
    )


def _socket_fallback(events: list[Event]) -> Suspect | None:
    no_ib = [e for e in events if e.kind == "nccl_transport" and e.fields.get("no_ib")]
    if not no_ib:
        return None
    fallback = {e.node for e in no_ib}
    ib_hosts = {
        e.node
        for e in events
        if e.node not in fallback
        and (
            (
                e.kind == "net_addr" and e.fields.get("via") is None
            )  # the OOB part of a `NET/IB : Using …` line
            or (e.kind == "nccl_transport" and str(e.fields.get("network") or "").startswith("IB"))
        )
    }
    ib_here = {e.node for e in events if e.kind in _IB_KINDS and e.node in fallback}
    if not ib_hosts and not ib_here:
        return None  # a cluster without InfiniBand runs NCCL over sockets as designed
    lines = sorted(no_ib, key=Event.stream_order)
    on = sorted({n for n in fallback if n})
    seen = (
        f"{', '.join(sorted(n for n in ib_hosts if n)[:4]) or 'other hosts'} use InfiniBand"
        if ib_hosts
        else "its kernel or counters show InfiniBand ports"
    )
    summary = (
        f"NCCL found no InfiniBand device on {', '.join(on[:4]) or 'a host'} and fell back to TCP sockets while "
        f"{seen}: check the container's /dev/infiniband, the HCA driver and NCCL_IB_DISABLE / NCCL_IB_HCA "
        "(it falls short: no error line says the fallback failed the job)"
    )
    return Suspect(
        RootCause(
            domain="software",
            subdomain="configuration",
            rule="nccl-transport-choice",
            summary=summary,
            nodes=on,
            first_seen=_first_seen(lines),
            action="INVESTIGATE",
        ),
        lines[:MAX_LINES],
    )


def configuration_suspects(events: list[Event], nodes: list[str]) -> list[Suspect]:
    """Interface and transport choices that are wrong for a job spanning several hosts."""
    if len(job_hosts(events, nodes)) < 2:
        return []  # a docker bridge or loopback on one host is how single-node jobs talk
    hosts = job_hosts(events, nodes)
    return [s for s in (_interfaces(events, hosts), _socket_fallback(events)) if s is not None]


def timed_out(e: Event) -> bool:
    return e.kind == "watchdog_timeout" or (e.kind == "python_exception" and bool(_TIMEOUT.search(e.text)))


def solo_work(events: list[Event], rank: int, node: str | None) -> Suspect | None:
    """Rank `rank` kept working on its own while every other rank waited in a collective: its lines
    (a checkpoint save, an evaluation, its own progress) go on after the others' last step and
    before their timeout. Unranked checkpoint or evaluation lines count for rank 0 only, the rank
    such code paths run on."""
    timeouts = sorted(
        (e for e in events if e.rank is not None and e.rank != rank and timed_out(e)), key=Event.stream_order
    )
    if not timeouts:
        return None
    others_last = max(
        (e.stream_order() for e in events if e.kind == "progress" and e.rank is not None and e.rank != rank),
        default=None,
    )
    mine = [
        e
        for e in events
        if (e.kind in ("solo_work", "progress") and e.rank == rank)
        or (e.kind == "solo_work" and e.rank is None and rank == 0)
    ]
    alone = sorted(
        (
            e
            for e in mine
            if (others_last is None or e.stream_order() > others_last)
            and e.stream_order() < timeouts[-1].stream_order()
        ),
        key=Event.stream_order,
    )
    if not alone:
        return None
    work = [e for e in alone if e.kind == "solo_work"]
    what = str(work[-1].fields.get("what") or "working").lower() if work else "making progress on its own"
    where = f"rank {rank}" + (f" on {node}" if node else "")
    summary = (
        f"{where} was still {what} ({len(alone)} line(s) after the other ranks' last step) while every other "
        "rank waited in a collective until its timeout: the collective timeout is shorter than work only "
        f"rank {rank} does; raise the timeout or take that work out of the collective's way "
        "(it falls short: no error line says so)"
    )
    shown = [*alone[:2], *alone[2:][-(MAX_LINES - 2) :]] if len(alone) > MAX_LINES else alone
    return Suspect(
        RootCause(
            domain="software",
            subdomain="configuration",
            rule="solo-work",
            summary=summary,
            nodes=[node] if node else [],
            first_seen=_first_seen(alone),
            action="INVESTIGATE",
        ),
        shown,
    )


def as_evidence(suspects: list[Suspect], evidence: list[Evidence]) -> list[Evidence]:
    """The diagnosis' evidence with each candidate's lines added as context (a line already shown is not repeated)."""
    shown = {v.ref for v in evidence}
    out = list(evidence)
    for s in suspects:
        for e in s.events:
            if e.ref in shown:
                continue
            shown.add(e.ref)
            out.append(
                Evidence(
                    time=isoformat(e.time),
                    node=e.node,
                    source=e.source,
                    ref=e.ref,
                    text=e.text,
                    role="context",
                    rule=e.rule,
                    inherited=e.inherited,
                    time_max=isoformat(e.time_max) if e.inherited else None,
                )
            )
    return sorted(out, key=lambda v: (v.time or "~", v.node or "", v.ref, v.rule))
