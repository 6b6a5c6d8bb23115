"""Background chatter and the cross-scenario distractor library (chatter healthy jobs print).

`background` fills every node's system log with what healthy nodes print (boot-time driver
lines, slurmd / kubelet / systemd / cron chatter, EDAC corrected errors). `distract` injects
independent, harmless-by-construction traps: Xid 13/31 from another job before the window, Xid
45 teardown bursts, correctable AER, link flaps outside the window or on nodes outside the job,
a link flap inside the window that the job trained through for minutes (with NCCL's port error /
port active lines),
recovered Lustre connections, sticky XID gauges, congestion counters, an unrelated maintenance
drain, clock skew, missing kernel logs (never the culprit's) and truncated files (never before the
root-cause line). Every injected trap is recorded in the truth's `distractors`.
"""

from __future__ import annotations

from bench import kube, metrics, nccl, nvidia, slurm
from bench.scenario import Scenario
from bench.scenarios.network import ranks_on_hca
from bench.world import Node


def background(sc: Scenario) -> None:
    """Benign system-log lines over [start - hours, end + minutes] on every node with a kernel log."""
    if not sc.kernel_logs:
        return
    w, rng = sc.w, sc.rng
    lo = w.start - rng.uniform(1800, 6 * 3600)
    hi = sc.end + rng.uniform(60, 900)
    per_node = 14 if len(w.nodes) <= 16 else 6 if len(w.nodes) <= 64 else 3
    for node in w.nodes:
        if node.kernel_format == "dmesg_raw" or rng.random() < 0.2:
            t_boot = node.boot_time + rng.uniform(8, 30)
            sc.kernel(
                node,
                t_boot,
                [
                    f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {w.stack.driver}  Wed Jul 30 18:01:23 UTC 2025",
                    "nvidia-nvlink: Nvlink Core is being initialized, major device number 234",
                    f"mlx5_core {node.hcas[0].bdf}: mlx5_pcie_event:301:(pid 1034): PCIe slot advertised sufficient power (75W).",
                ],
                level="info",
                gap=0.4,
            )
        for _ in range(per_node):
            t = rng.uniform(lo, hi)
            pick = rng.random()
            if pick < 0.25:
                sc.kernel(
                    node,
                    t,
                    rng.choice(
                        (
                            "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
                            f"EDAC MC{rng.randint(0, 1)}: 1 CE memory read error on CPU_SrcID#{rng.randint(0, 1)}_MC#0_Chan#{rng.randint(0, 7)}_DIMM#0 "
                            f"(channel:{rng.randint(0, 7)} slot:0 page:0x{rng.randint(0x10000, 0xFFFFF):x} offset:0x0 grain:32 syndrome:0x0)",
                            "TCP: request_sock_TCP: Possible SYN flooding on port 29500. Sending cookies.  Check SNMP counters.",
                            f'audit: type=1400 audit({int(t)}.{rng.randint(100, 999)}:{rng.randint(100, 9999)}): apparmor="DENIED" operation="open" '
                            'profile="snap-update-ns.lxd" name="/proc/1/mountinfo" pid=1821 comm="6" requested_mask="r" denied_mask="r" fsuid=0 ouid=0',
                            f"nvidia-peermem: nv_mem_get_pages_nc: mem_context={rng.randint(10**15, 10**16):x}",
                            "IPv4: martian source 255.255.255.255 from 172.16.0.1, on dev bond0",
                        )
                    ),
                    level="info",
                )
            elif pick < 0.45:
                sc.daemon(
                    node,
                    t,
                    "systemd",
                    rng.choice(
                        (
                            f"Started Session {rng.randint(100, 9999)} of User {w.user}.",
                            "Starting Cleanup of Temporary Directories...",
                            "Finished Cleanup of Temporary Directories.",
                            "Started Daily apt download activities.",
                        )
                    ),
                    pid=1,
                )
            elif pick < 0.6:
                sc.daemon(
                    node,
                    t,
                    "CRON",
                    "(root) CMD (/usr/local/sbin/node-exporter-textfile.sh > /dev/null 2>&1)",
                    pid=rng.randint(1000, 90000),
                )
            elif pick < 0.75:
                sc.daemon(
                    node,
                    t,
                    "sshd",
                    f"Accepted publickey for {rng.choice((w.user, 'root', 'ops'))} from 172.16.{rng.randint(0, 9)}.{rng.randint(2, 250)} "
                    f"port {rng.randint(40000, 60000)} ssh2: ED25519 SHA256:{w.hexid(43, node.name, t)}",
                    pid=rng.randint(1000, 90000),
                )
            elif w.scheduler == "kubernetes":
                sc.daemon(
                    node,
                    t,
                    "kubelet",
                    f"E{sc.local(t, node):%m%d %H:%M:%S}.{rng.randint(0, 999999):06d}    2345 cadvisor_stats_provider.go:525] "
                    '"Partial failure issuing cadvisor.ContainerInfoV2" err="partial failures: [\\"/kubepods.slice\\": RecentStats: unable to find data in memory cache]"',
                    pid=2345,
                )
            else:
                sc.daemon(node, t, "slurmd", "debug:  _rpc_acct_gather_update", pid=3121)
        if w.scheduler == "slurm":
            sc.daemon(
                node,
                w.start + rng.uniform(0.2, 2),
                "slurmd",
                f"launch task StepId={w.job_id}.0 request from UID:{w.uid} GID:{w.uid} HOST:{w.master.mgmt_ip} PORT:{rng.randint(30000, 60000)}",
                pid=3121,
            )
            sc.daemon(
                node,
                sc.end + rng.uniform(0.5, 20),
                "slurmstepd",
                f"[{w.job_id}.0] done with job",
                pid=rng.randint(100000, 200000),
            )
        else:
            sc.daemon(
                node,
                w.start - rng.uniform(5, 20),
                "kubelet",
                f'I{sc.local(w.start, node):%m%d %H:%M:%S}.{rng.randint(0, 999999):06d}    2345 kubelet.go:2421] "SyncLoop ADD" source="api" '
                f'pods=["{w.namespace}/{node.pod}"]',
                pid=2345,
            )


def _pick_node(sc: Scenario, exclude_culprits: bool = True) -> Node:
    pool = [n for n in sc.w.nodes if not (exclude_culprits and n.name in sc.truth.nodes)] or sc.w.nodes
    return sc.rng.choice(pool)


def _outsider(sc: Scenario) -> str:
    """A host name of the same style that is not part of the job."""
    names = {n.name for n in sc.w.nodes}
    base = sc.w.nodes[-1].name
    i = len(base)
    while i > 0 and base[i - 1].isdigit():
        i -= 1
    if i == len(base):
        return base + "-spare"
    width = len(base) - i
    num = int(base[i:]) + sc.rng.randint(3, 40)
    cand = f"{base[:i]}{num:0{width}d}"
    return cand if cand not in names else cand + "b"


def distract(sc: Scenario) -> None:
    """Inject 1-5 independent distractors the mode did not forbid."""
    w, rng = sc.w, sc.rng
    choices = [
        ("xid_other_job", 0.35),
        ("xid45_teardown", 0.5),
        ("aer_corrected", 0.35),
        ("flap_outside", 0.25),
        ("outsider_node", 0.12),
        ("lustre_recovered", 0.15),
        ("sticky_xid_gauge", 0.15),
        ("xmit_wait", 0.15),
        ("nvlink_nonfatal_before", 0.2),
        ("unrelated_drain", 0.12),
        ("missing_pod_logs", 0.12),
        ("missing_kernel_logs", 0.25),
        ("truncated", 0.15),
        ("flap_outlived", 0.15),
    ]
    kernel_needed = {
        "xid_other_job",
        "xid45_teardown",
        "aer_corrected",
        "flap_outside",
        "lustre_recovered",
        "nvlink_nonfatal_before",
        "missing_kernel_logs",
        "truncated",
        "flap_outlived",
    }
    for name, p in choices:
        if name in sc.forbid or (not sc.kernel_logs and name in kernel_needed) or rng.random() >= p:
            continue
        _DISTRACTORS[name](sc)
    skewed = [n for n in w.nodes if abs(n.skew) >= 1.0]
    for n in skewed[:3]:
        sc.distractor(f"clock skew {n.skew:+.1f}s on {n.name}")


def _xid_other_job(sc: Scenario) -> None:
    rng = sc.rng
    node = rng.choice(sc.w.nodes)
    gpu = rng.choice(node.gpus)
    t = sc.w.start - rng.uniform(1200, 5 * 3600)
    if t < node.boot_time + 60:
        return
    if rng.random() < 0.5:
        sc.kernel(node, t, nvidia.xid13(gpu, rng))
        sc.distractor(f"Xid 13 burst on {node.name} {gpu.pci} from another job before the window")
    else:
        sc.kernel(
            node,
            t,
            nvidia.xid31(
                gpu,
                rng,
                rng.randint(3000, 900000),
                rng.choice(("python3", "vllm", "pt_main_thread")),
                newer=sc.w.stack.driver_major >= 525,
            ),
        )
        sc.distractor(f"Xid 31 on {node.name} {gpu.pci} from another job before the window")


def _xid45_teardown(sc: Scenario) -> None:
    rng = sc.rng
    if sc.state == "COMPLETED" or sc.truth.outcome == "not_failed":
        return
    nodes = rng.sample(sc.w.nodes, k=min(len(sc.w.nodes), rng.randint(1, 3)))
    for node in nodes:
        if node.name in sc.lost_nodes:
            continue
        t = sc.end - rng.uniform(0.5, 8)
        lines = [
            nvidia.xid45(
                g, node.rank_pids[g.index], "python" if rng.random() < 0.5 else "pt_main_thread", rng
            )
            for g in rng.sample(node.gpus, k=rng.randint(2, len(node.gpus)))
        ]
        sc.kernel(node, t, lines, gap=0.0009)
    sc.distractor("Xid 45 teardown burst on " + ", ".join(n.name for n in nodes) + " when the job was killed")


def _aer_corrected(sc: Scenario) -> None:
    node = _pick_node(sc)
    t = sc.rng.uniform(sc.w.start, sc.end)
    sc.kernel(
        node,
        t,
        nvidia.aer_corrected(
            node.gpu_root_port(sc.rng.choice(node.gpus)),
            sc.rng,
            newer_kernel=sc.w.stack.kernel.startswith("6"),
        ),
        level="warning",
    )
    sc.distractor(f"correctable PCIe AER on {node.name}")


def _flap_outside(sc: Scenario) -> None:
    rng = sc.rng
    node = rng.choice(sc.w.nodes)
    hca = rng.choice(node.hcas)
    t = sc.w.start - rng.uniform(900, 4 * 3600) if rng.random() < 0.7 else sc.end + rng.uniform(120, 900)
    if t < node.boot_time + 60:
        return
    sc.kernel(node, t, nvidia.mlx5_link(hca, "DOWN"), level="warning")
    sc.kernel(
        node,
        t + rng.uniform(4, 12),
        [nvidia.mlx5_link(hca, "INIT"), nvidia.mlx5_link(hca, "ACTIVE")],
        level="info",
        gap=1.2,
    )
    sc.distractor(f"{hca.name} link flap on {node.name} outside the window")


def _flap_outlived(sc: Scenario) -> None:
    """A link that flapped inside the window and came back, the job training on for minutes after it:
    whatever ended the job later, the flap did not."""
    w, rng = sc.w, sc.rng
    if sc.truth.domain == "network":
        return  # a fabric or NIC scenario's own story stays single
    interval = sc.plan.iter_s * sc.plan.log_every
    lo, hi = sc.plan.t_begin + 60, sc.ran_until - max(3 * interval, 360.0)
    if hi <= lo:
        return  # not enough logged training after any point of the run
    node = rng.choice(w.nodes)
    hca = rng.choice(node.hcas)
    t = rng.uniform(lo, hi)
    if t < node.boot_time + 60:
        return
    t_back = t + rng.uniform(4, 12)
    roce = hca.netdev.startswith("enp")
    sc.kernel(
        node, t, nvidia.mlx5_eth_link(hca, False) if roce else nvidia.mlx5_link(hca, "DOWN"), level="warning"
    )
    sc.kernel(
        node,
        t_back,
        [nvidia.mlx5_eth_link(hca, True)]
        if roce
        else [nvidia.mlx5_link(hca, "INIT"), nvidia.mlx5_link(hca, "ACTIVE")],
        level="info",
        gap=1.2,
    )
    if w.nccl_debug:
        for r in ranks_on_hca(sc, node, hca)[:2]:
            sc.out(r, t + rng.uniform(0.01, 0.5), nccl.async_event(w, node, r, hca, fatal=False))
            sc.out(
                r,
                t_back + rng.uniform(0.01, 0.5),
                nccl.async_event(w, node, r, hca, fatal=False, what="port active"),
            )
    sc.distractor(
        f"{hca.name} link flap on {node.name} {(sc.ran_until - t) / 60:.0f} min before training stopped; the job trained on"
    )


def _outsider_node(sc: Scenario) -> None:
    rng, w = sc.rng, sc.w
    name = _outsider(sc)
    ref = w.nodes[0]
    fake = Node(
        name=name,
        index=-1,
        gpus=ref.gpus,
        hcas=ref.hcas,
        mgmt_ip="172.31.9.9",
        boot_time=ref.boot_time - 86400,
        skew=0.0,
        kernel_format=ref.kernel_format,
    )
    t = rng.uniform(w.start + 60, sc.end)
    s = sc.bundle.stream(f"logs/{name}/kern.log", "system", node=fake, fmt="kernlog")
    if rng.random() < 0.5:
        hca = rng.choice(fake.hcas)
        sc.bundle.add(s, t, nvidia.mlx5_link(hca, "DOWN"), level="warning")
        sc.bundle.add(s, t + 9, nvidia.mlx5_link(hca, "ACTIVE"), level="info")
        sc.distractor(f"IB link flap on {name}, a node outside the job")
    else:
        gpu = rng.choice(fake.gpus)
        for i, line in enumerate(nvidia.xid79_lines(gpu, rng)):
            sc.bundle.add(s, t + i * 1e-5, line, level="err")
        sc.distractor(f"Xid 79 on {name}, a node outside the job")


def _lustre_recovered(sc: Scenario) -> None:
    rng = sc.rng
    fs = rng.choice(("scratch", "lustre1", "work"))
    ost = f"{fs}-OST{rng.randint(0, 40):04x}"
    nid = f"172.16.{rng.randint(1, 9)}.{rng.randint(2, 60)}@o2ib"
    t = sc.w.start - rng.uniform(3600, 3 * 3600)
    nodes = rng.sample(sc.w.nodes, k=min(len(sc.w.nodes), rng.randint(2, 6)))
    for node in nodes:
        if t < node.boot_time + 60:
            continue
        tt = t + rng.uniform(0, 3)
        sc.kernel(
            node,
            tt,
            f"Lustre: {ost}-osc-ffff{rng.randint(0x8F00, 0x9FFF):x}{rng.randint(0, 0xFFFFFFFF):08x}: Connection to {ost} (at {nid}) "
            "was lost; in progress operations using this service will wait for recovery to complete",
            level="warning",
        )
        sc.kernel(
            node,
            tt + rng.uniform(20, 90),
            f"Lustre: {ost}-osc-ffff{rng.randint(0x8F00, 0x9FFF):x}{rng.randint(0, 0xFFFFFFFF):08x}: "
            f"Connection restored to {ost} (at {nid})",
            level="info",
        )
    sc.distractor(f"recovered Lustre connection to {ost} on {len(nodes)} nodes before the window")


def _sticky_xid_gauge(sc: Scenario) -> None:
    rng, w = sc.rng, sc.w
    node = _pick_node(sc)
    gpu = rng.choice(node.gpus)
    old = rng.choice((43, 13, 31, 45))
    step = max(60.0, (sc.end - w.start) / 100)
    series = []
    for n in ([node, *rng.sample(w.nodes, k=min(3, len(w.nodes)))])[:4]:
        for g in n.gpus[:2] if n is not node else [gpu]:
            val = float(old) if (n is node and g is gpu) else 0.0
            labels = metrics.dcgm_labels(w, n, g, "DCGM_FI_DEV_XID_ERRORS")
            if val:
                labels["err_code"] = str(old)
                labels["err_msg"] = {
                    43: "GPU stopped processing",
                    13: "Graphics Engine Exception",
                    31: "GPU memory page fault",
                    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications and hitting a DBE",
                }[old]
            series.append((labels, metrics.constant(w.start, sc.end, step, val)))
    sc.bundle.put("metrics/dcgm_xid_errors_history.json", metrics.query_range(series))
    sc.distractor(f"DCGM_FI_DEV_XID_ERRORS stuck at {old} on {node.name} GPU {gpu.index} (sticky gauge)")


def _xmit_wait(sc: Scenario) -> None:
    rng, w = sc.rng, sc.w
    step = max(30.0, (sc.end - w.start) / 120)
    series = []
    for n in w.nodes[:16]:
        for h in n.hcas[:2]:
            series.append(
                (
                    metrics.ib_labels(n, h, "node_infiniband_port_transmit_wait_total"),
                    metrics.counter(w.start, sc.end, step, rng.uniform(1e9, 5e10), rng.uniform(1e5, 5e6)),
                )
            )
    sc.bundle.put("metrics/ib_xmit_wait.json", metrics.query_range(series))
    sc.distractor("PortXmitWait growing on all HCAs (congestion, not an error)")


def _nvlink_nonfatal_before(sc: Scenario) -> None:
    rng, w = sc.rng, sc.w
    node = _pick_node(sc)
    gpu = rng.choice(node.gpus)
    t = w.start - rng.uniform(2 * 3600, 8 * 3600)
    if t < node.boot_time + 60:
        return
    if w.platform in ("b200", "gb200"):
        sc.kernel(
            node,
            t,
            nvidia.nvlink5(gpu, 145, "RLW_RXPIPE", False, rng.randint(0, 17), 0x8, rng),
            level="warning",
        )
        sc.distractor(f"Xid 145 RLW_RXPIPE Nonfatal on {node.name} hours before the window")
    else:
        sc.kernel(
            node,
            t,
            f"nvidia-nvswitch{rng.randint(0, 3)}: SXid (PCI:0000:{rng.choice(('05', '06', '07', '08'))}:00.0): 12028, Non-fatal, "
            f"Link {rng.randint(0, 63)} egress non-posted PRIV error (First)",
            level="warning",
        )
        sc.distractor(f"non-fatal NVSwitch SXid on {node.name} hours before the window")


def _unrelated_drain(sc: Scenario) -> None:
    rng, w = sc.rng, sc.w
    name = _outsider(sc)
    t = rng.uniform(w.start, sc.end)
    if w.scheduler == "slurm":
        rec = slurm.node_record(w, name, ["IDLE", "DRAIN"], "maintenance: BIOS update", "root", t)
        sc.bundle.put("events/scontrol-nodes-other.json", slurm.scontrol_nodes(w, [rec]))
    else:
        ev = kube.event(
            w,
            kind="Node",
            name=name,
            reason="NodeNotSchedulable",
            message=f"Node {name} status is now: NodeNotSchedulable",
            t=t,
            component="kubelet",
            host=name,
            namespace="default",
        )
        sc.bundle.put("events/node-events.json", kube.as_list([ev]))
    sc.distractor(f"maintenance drain of {name}, a node outside the job")


def _missing_kernel_logs(sc: Scenario) -> None:
    rng = sc.rng
    protected = sc.protected
    candidates = [
        n for n in sc.w.nodes if n.name not in sc.truth.nodes and sc.kstream(n).path not in protected
    ]
    if not candidates:
        return
    drop = rng.sample(candidates, k=min(len(candidates), max(1, len(candidates) // rng.choice((2, 3, 5, 8)))))
    for n in drop:
        sc.bundle.drop(sc.kstream(n).path)
    names = ", ".join(n.name for n in drop[:4]) + (" …" if len(drop) > 4 else "")
    sc.distractor(f"no kernel log for {len(drop)} node(s): {names}")


def _missing_pod_logs(sc: Scenario) -> None:
    """Pods deleted before anyone ran `kubectl logs`: their output is simply not in the bundle."""
    if sc.w.output != "pods" or len(sc.w.nodes) < 3:
        return
    protected = sc.protected
    paths = [
        p
        for n in sc.w.nodes
        if n.name not in sc.truth.nodes
        for p in [sc.node_stream(n).path]
        if p not in protected and p in sc.bundle.streams
    ]
    if not paths:
        return
    drop = sc.rng.sample(paths, k=min(len(paths), max(1, len(paths) // 3)))
    for p in drop:
        sc.bundle.drop(p)
    sc.distractor(f"no container log for {len(drop)} pod(s) (deleted before collection)")


def _truncated(sc: Scenario) -> None:
    rng = sc.rng
    paths = [p for p, s in sorted(sc.bundle.streams.items()) if s.entries and p.startswith("logs/")]
    if not paths:
        return
    path = rng.choice(paths)
    stream = sc.bundle.streams[path]
    stream.truncate_at = rng.uniform(0.3, 0.95) if stream.has_key() else rng.uniform(0.5, 0.97)
    sc.distractor(f"{path} truncated")


_DISTRACTORS = {
    "xid_other_job": _xid_other_job,
    "xid45_teardown": _xid45_teardown,
    "aer_corrected": _aer_corrected,
    "flap_outside": _flap_outside,
    "flap_outlived": _flap_outlived,
    "outsider_node": _outsider_node,
    "lustre_recovered": _lustre_recovered,
    "sticky_xid_gauge": _sticky_xid_gauge,
    "xmit_wait": _xmit_wait,
    "nvlink_nonfatal_before": _nvlink_nonfatal_before,
    "unrelated_drain": _unrelated_drain,
    "missing_pod_logs": _missing_pod_logs,
    "missing_kernel_logs": _missing_kernel_logs,
    "truncated": _truncated,
}
