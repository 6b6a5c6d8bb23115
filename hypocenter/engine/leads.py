"""Leads: what an abstaining diagnosis points at when nothing else does.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hypocenter.engine.suspects import MAX_LINES, Suspect
from hypocenter.model import Event, RootCause, isoformat

MAX_LEADS = 3


@dataclass(frozen=True)
class _Lead:
    """One class of cause-like line: which events, the class they point at, and why they fall short."""

    name: str
    matches: Callable[[Event], bool]
    domain: str
    subdomain: str
    says: str  # what the lines suggest ({where} is filled in)
    short: str  # why they fall short of a cause


_STORAGE_TEXT = re.compile(
    r"cannot be opened|Read-only file system|Permission denied|No such file or directory"
)


# CUDA's cudaErrorDevicesUnavailable (46), as PyTorch, the runtime and the driver API name it.
_BUSY_TEXT = re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE")


def _kind(*kinds: str) -> Callable[[Event], bool]:
    wanted = frozenset(kinds)
    return lambda e: e.kind in wanted


LEADS: tuple[_Lead, ...] = (
    _Lead(
        "lead-ib-transport",
        _kind("nccl_ib_completion_error", "nccl_ib_async"),
        "network",
        "fabric",
        "NCCL's InfiniBand/RoCE transport failed on {where}: a link or switch fault, or RDMA addressing "
        "(on RoCE, NCCL_IB_GID_INDEX; `show_gids`)",
        "no link event, counter or peer pattern confirms a fabric fault",
    ),
    _Lead(
        "lead-ib-addressing",
        _kind("nccl_ib_completion_error"),
        "software",
        "configuration",
        "RDMA addressing on {where}: a completion error right from the start is what an unroutable RoCE GID "
        "index or subnet gives (compare NCCL_IB_GID_INDEX with `show_gids` on both ends)",
        "nothing shows whether the transport ever worked",
    ),
    _Lead(
        "lead-socket-transport",
        _kind("nccl_peer_closed", "tcpstore_error"),
        "network",
        "fabric",
        "connections between ranks failed on {where}: a peer process died, or the network between the nodes",
        "a closed connection is what every peer of a failed rank sees",
    ),
    _Lead(
        "lead-gpu-busy",
        lambda e: e.kind == "cuda_error" and bool(_BUSY_TEXT.search(e.text)),
        "resource",
        "gpu_oom",
        "the GPU on {where} was busy or unavailable: another process holds it (nvidia-smi's process table) "
        "or its compute mode is exclusive-process or prohibited (nvidia-smi -q -d COMPUTE)",
        "no process table or compute mode was available, and a GPU that is going away can say the same",
    ),
    _Lead(
        "lead-cuda-error",
        _kind("cuda_error"),
        "hardware",
        "gpu",
        "a CUDA error on {where}: a GPU fault (check nvidia-smi and the kernel log for an Xid) or the program's",
        "the error names no fault, and no kernel line was available",
    ),
    _Lead(
        "lead-file-open",
        lambda e: e.kind == "python_exception" and bool(_STORAGE_TEXT.search(e.text)),
        "storage",
        "filesystem",
        "a file could not be opened or written on {where}: a full or read-only filesystem, or a missing "
        "directory or permission",
        "the error does not say which",
    ),
    _Lead(
        "lead-collective-timeout",
        _kind("watchdog_timeout", "wait_timeout", "heartbeat_timeout"),
        "software",
        "hang",
        "ranks timed out waiting in collectives on {where}: one rank stalled or left, or the timeout is "
        "shorter than work one rank does alone",
        "the waiting ranks' timeouts do not say which rank they waited for",
    ),
    _Lead(
        "lead-pcie",
        _kind("pcie_aer", "xid"),
        "hardware",
        "gpu",
        "PCIe or GPU driver errors on {where}",
        "they are not fatal on their own or could not be placed in the attempt's window",
    ),
)


def _where(events: list[Event]) -> tuple[list[str], str]:
    nodes = sorted({e.node for e in events if e.node})
    ranks = sorted({e.rank for e in events if e.rank is not None})
    where = ", ".join(nodes[:3]) + (" …" if len(nodes) > 3 else "") if nodes else "the attempt"
    if ranks:
        where += f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks[:4])}"
        where += " …)" if len(ranks) > 4 else ")"
    return nodes, where


def leads(events: list[Event]) -> list[Suspect]:
    """Ranked candidates from cause-like lines of an attempt no cause was attributed for."""
    found: list[tuple[tuple[str, str, int], Suspect]] = []
    for order, lead in enumerate(LEADS):
        mine = sorted((e for e in events if lead.matches(e)), key=Event.stream_order)
        if not mine:
            continue
        nodes, where = _where(mine)
        first = min(mine, key=Event.stream_order)
        cause = RootCause(
            domain=lead.domain,
            subdomain=lead.subdomain,
            rule=lead.name,
            summary=f"{lead.says.format(where=where)} ({len(mine)} line(s); it falls short: {lead.short})",
            nodes=nodes,
            first_seen=isoformat(first.time),
            action="INVESTIGATE",
        )
        key = (isoformat(first.time) or "~", first.ref, order)
        found.append((key, Suspect(cause, mine[:MAX_LINES])))
    found.sort(key=lambda kv: kv[0])
    return [s for _, s in found[:MAX_LEADS]]
