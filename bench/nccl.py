"""NCCL log lines by NCCL version (as NVIDIA/nccl's src/ prints them).

`host:pid:tid [dev] file:line NCCL WARN …` and `… NCCL INFO …` lines: init chatter, NET/IB
completion errors in the four format eras (<2.10, 2.10-2.19, 2.20-2.27, ≥2.28), socket and
proxy errors, async IB events, `-> N` breadcrumbs, and the bootstrap / duplicate-GPU errors of
misconfigured jobs. The host part is what NCCL sees: the pod name on Kubernetes.
"""

from __future__ import annotations

import hashlib
from random import Random

from bench.world import HCA, Node, World


def oob_interface(node: Node) -> str:
    """The interface NCCL bootstraps over: IPoIB, or a bond on RoCE clusters."""
    return "bond0" if node.hcas[0].netdev.startswith("enp") else "ib0"


def prefix(world: World, node: Node, pid: int, dev: int, tid: int | None = None) -> str:
    return f"{world.hostname(node)}:{pid}:{tid if tid is not None else pid + 700 + dev * 3} [{dev}]"


def warn(world: World, node: Node, pid: int, dev: int, where: str, msg: str, tid: int | None = None) -> str:
    return f"{prefix(world, node, pid, dev, tid)} {where} NCCL WARN {msg}"


def info(world: World, node: Node, pid: int, dev: int, msg: str, tid: int | None = None) -> str:
    return f"{prefix(world, node, pid, dev, tid)} NCCL INFO {msg}"


def _ib_file(world: World) -> str:
    v = world.stack.nccl
    if v < (2, 10, 0):
        return "transport/net_ib.cc:788"
    if v < (2, 20, 0):
        return "transport/net_ib.cc:1296"
    if v < (2, 23, 0):
        return "transport/net_ib.cc:1696"
    if v < (2, 28, 0):
        return "transport/net_ib.cc:2242"
    return "transport/net_ib/p2p.cc:512"


def init_lines(world: World, node: Node, rank: int, rng: Random, comm: str) -> list[str]:
    """What NCCL_DEBUG=INFO prints for one rank while its communicator comes up."""
    local = world.local_of(rank)
    pid = world.rank_pid(rank)
    v = world.stack.nccl
    oob = f"{oob_interface(node)}:{node.ib_ip}<0>"
    out: list[str] = []
    if rank == 0:
        out.append(
            info(world, node, pid, local, f"NCCL version {world.stack.nccl_text}+cuda{world.stack.cuda}")
        )
    out.append(info(world, node, pid, local, f"Bootstrap : Using {oob}"))
    if v >= (2, 12, 0):
        out.append(
            info(world, node, pid, local, f"cudaDriverVersion {int(float(world.stack.cuda) * 1000 + 40)}")
        )
    if v < (2, 19, 0):
        out.append(
            info(
                world,
                node,
                pid,
                local,
                "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
            )
        )
    else:
        out.append(
            info(
                world,
                node,
                pid,
                local,
                "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
            )
        )
    devs = " ".join(
        f"[{i}]{h.name}:{h.port}/{'RoCE' if h.netdev.startswith('enp') else 'IB'}"
        for i, h in enumerate(node.hcas)
    )
    out.append(info(world, node, pid, local, f"NET/IB : Using {devs} ; OOB {oob}"))
    out.append(info(world, node, pid, local, "Using network IB"))
    bus = node.gpus[local].nccl_busid
    if v >= (2, 13, 0):
        out.append(
            info(
                world,
                node,
                pid,
                local,
                f"comm {comm} rank {rank} nranks {world.world_size} cudaDev {local} "
                f"nvmlDev {local} busId {bus} commId 0x{world.hexid(16, 'commid')} - Init START",
            )
        )
    out.append(
        info(
            world,
            node,
            pid,
            local,
            f"Setting affinity for GPU {local} to "
            f"{rng.choice(('ffffffff,00000000', 'ff,ffff0000,00000000', '0fffff'))}",
        )
    )
    if v >= (2, 13, 0):
        out.append(
            info(
                world,
                node,
                pid,
                local,
                f"ncclCommInitRank comm {comm} rank {rank} nranks {world.world_size} cudaDev {local} "
                f"nvmlDev {local} busId {bus} commId 0x{world.hexid(16, 'commid')} - Init COMPLETE",
            )
        )
    else:
        out.append(
            info(
                world,
                node,
                pid,
                local,
                f"comm {comm} rank {rank} nranks {world.world_size} cudaDev {local} busId {bus} - Init COMPLETE",
            )
        )
    return out


def _gid(hca: HCA) -> str:
    """RoCE GIDs embed the interface IP; InfiniBand GIDs are link-local and built from the port GUID."""
    if hca.netdev.startswith("enp"):
        return f"::ffff:{hca.ip}"
    g = hca.guid
    return "fe80::" + ":".join(f"{int(g[i : i + 4], 16):x}" for i in range(0, 16, 4))


def ib_completion(
    world: World, node: Node, rank: int, peer: Node, *, status: int, direction: str, rng: Random
) -> str:
    """A `NET/IB : Got completion …` WARN in the format of the job's NCCL version.

    `from peer` is the peer's bootstrap (OOB) address; the GIDs name the HCAs of the rail."""
    v = world.stack.nccl
    local = world.local_of(rank)
    pid = world.rank_pid(rank)
    hca = node.hcas[local % len(node.hcas)]
    remote = peer.hcas[local % len(peer.hcas)]
    peer_ip = peer.ib_ip
    vendor = {12: 129, 5: 249, 4: 81}.get(status, 0)
    port = rng.randint(32768, 60999)
    opcode = 0 if status == 12 else rng.choice((1, 128, 32656))
    length = 0 if status == 12 else rng.randint(0, 65536)
    local_gid = _gid(hca)
    remote_gid = _gid(remote)
    if v < (2, 10, 0):
        msg = (
            f"NET/IB : Got completion with error {status}, opcode {opcode}, len {length}, vendor err {vendor}"
        )
    elif v < (2, 20, 0):
        msg = f"NET/IB : Got completion from peer {peer_ip}<{port}> with error {status}, opcode {opcode}, len {length}, vendor err {vendor}"
        if v >= (2, 14, 0):
            msg += f" ({direction})"
        if v >= (2, 18, 0):
            msg += f" localGid {local_gid} remoteGid {remote_gid}"
    elif v < (2, 28, 0):
        msg = (
            f"NET/IB : Got completion from peer {peer_ip}<{port}> with status={status} opcode={opcode} len={length} "
            f"vendor err {vendor} ({direction}) localGid {local_gid} remoteGids{remote_gid}"
        )
    else:
        sname = {12: "IBV_WC_RETRY_EXC_ERR", 5: "IBV_WC_WR_FLUSH_ERR", 4: "IBV_WC_LOC_PROT_ERR"}.get(
            status, "IBV_WC_GENERAL_ERR"
        )
        oname = "IBV_WC_SEND" if direction == "Send" else "IBV_WC_RECV"
        msg = (
            f"NET/IB: Got completion from peer {peer_ip}<{port}> with status={sname}({status}) opcode={oname}({opcode}) "
            f"vendor_err={vendor} ({direction}) localGid {local_gid} remoteGids {remote_gid} hca {hca.name}"
        )
    return warn(world, node, pid, local, _ib_file(world), msg, tid=pid + 1200 + local)


def ib_hint(world: World, node: Node, rank: int, status: int) -> str | None:
    if world.stack.nccl < (2, 24, 0):
        return None
    text = {
        12: "HINT: In many cases this error occurs when the NCCL_IB_TIMEOUT is set too short.",
        5: "HINT: In many cases this error occurs when NIC on the same instance cannot talk to each other.",
        4: "HINT: In many cases this error occurs when ACS is enabled which would break GPU Direct RDMA protocol.",
    }.get(status)
    if text is None:
        return None
    return warn(
        world,
        node,
        world.rank_pid(rank),
        world.local_of(rank),
        _ib_file(world),
        text,
        tid=world.rank_pid(rank) + 1200 + world.local_of(rank),
    )


def breadcrumbs(world: World, node: Node, rank: int, code: int) -> list[str]:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    tid = pid + 1200 + local
    return [
        info(
            world,
            node,
            pid,
            local,
            f"transport/net.cc:{1302 if world.stack.nccl < (2, 20, 0) else 1381} -> {code}",
            tid=tid,
        ),
        info(
            world,
            node,
            pid,
            local,
            f"proxy.cc:{698 if world.stack.nccl < (2, 20, 0) else 904} -> {code}",
            tid=tid,
        ),
        info(
            world,
            node,
            pid,
            local,
            f"proxy.cc:{878 if world.stack.nccl < (2, 20, 0) else 1071} -> {code} [Progress Thread]",
            tid=tid,
        ),
    ]


def socket_closed(world: World, node: Node, rank: int, peer: Node, rng: Random) -> str:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    port = rng.randint(32768, 60999)
    v = world.stack.nccl
    if v < (2, 12, 0):
        return warn(
            world,
            node,
            pid,
            local,
            "misc/socket.cc:503",
            f"Net : Call to recv from {peer.ib_ip}<{port}> failed : Connection reset by peer",
        )
    if v < (2, 19, 0):
        return warn(
            world,
            node,
            pid,
            local,
            "misc/socket.cc:538",
            f"Net : Connection closed by remote peer {world.hostname(peer)}<{port}>",
        )
    return warn(
        world,
        node,
        pid,
        local,
        "misc/socket.cc:" + str(rng.choice((47, 49, 50))),
        f"socketProgress: Connection closed by remote peer {world.hostname(peer)}<{port}>",
    )


def proxy_failed(world: World, node: Node, rank: int, peer_rank: int) -> str:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    return warn(
        world,
        node,
        pid,
        local,
        "proxy.cc:1119" if world.stack.nccl < (2, 20, 0) else "proxy.cc:1496",
        f"[Proxy Service {rank}] Failed to execute operation Connect from rank {peer_rank}, retcode 6",
    )


def service_thread_closed(world: World, node: Node, rank: int, local_rank_peer: int) -> str:
    return info(
        world,
        node,
        world.rank_pid(rank),
        world.local_of(rank),
        f"[Service thread] Connection closed by localRank {local_rank_peer}",
    )


# ibv_event_type_str() names and enum ibv_event_type values (rdma-core verbs.h) of the port events.
_PORT_EVENTS = {"port error": 10, "port active": 9}


def async_event(
    world: World, node: Node, rank: int, hca: HCA, *, fatal: bool, what: str = "port error"
) -> str:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    where = "misc/ibvwrap.cc:266" if world.stack.nccl < (2, 20, 0) else "transport/net_ib.cc:112"
    if fatal:
        return warn(
            world,
            node,
            pid,
            local,
            where,
            f"NET/IB : {hca.name}:{hca.port} async fatal event: local catastrophic error",
        )
    # net_ib.cc wording by NCCL version (read in NVIDIA/nccl's tags): ≤ 2.19 names no device,
    # 2.20–2.28.3 "<dev>:<port> Got async event : …", 2.28.7+ "Got non-fatal async event: …(10)".
    if world.stack.nccl < (2, 20, 0):
        return warn(world, node, pid, local, where, f"NET/IB : Got async event : {what}")
    if world.stack.nccl < (2, 28, 7):
        return warn(
            world, node, pid, local, where, f"NET/IB : {hca.name}:{hca.port} Got async event : {what}"
        )
    return warn(
        world,
        node,
        pid,
        local,
        where,
        f"NET/IB : {hca.name}:{hca.port} Got non-fatal async event: {what}({_PORT_EVENTS[what]})",
    )


def bootstrap_no_interface(world: World, node: Node, rank: int) -> str:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    # A missing NCCL_SOCKET_IFNAME interface fails in bootstrap, or (IB disabled) in the socket transport.
    if int(hashlib.sha256(f"{world.seed}|ifname".encode()).hexdigest()[:8], 16) % 3 == 0:
        return warn(
            world,
            node,
            pid,
            local,
            "transport/net_socket.cc:" + ("46" if world.stack.nccl < (2, 19, 0) else "61"),
            "NET/Socket : no interface found",
        )
    return warn(
        world,
        node,
        pid,
        local,
        "bootstrap.cc:" + ("42" if world.stack.nccl < (2, 19, 0) else "97"),
        "Bootstrap : no socket interface found",
    )


def duplicate_gpu(world: World, node: Node, rank: int, other: int, busid: str) -> str:
    pid, local = world.rank_pid(rank), world.local_of(rank)
    return warn(
        world,
        node,
        pid,
        local,
        "init.cc:" + ("593" if world.stack.nccl < (2, 18, 0) else "871"),
        f"Duplicate GPU detected : rank {rank} and rank {other} both on CUDA device {busid}",
    )
