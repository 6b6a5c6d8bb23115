"""hardware/host: a node that is lost (kernel panic, PSU) — S11 on Kubernetes, NODE_FAIL on Slurm."""

from __future__ import annotations

from bench import kube, nccl, pytorch, slurm
from bench.scenario import Mode, Scenario
from bench.scenarios.common import node_stopped_k8s
from bench.world import Node

_PANICS: tuple[tuple[str, ...], ...] = (
    (
        "mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank 1: b200000000000135",
        "mce: [Hardware Error]: RIP !INEXACT! 10:<ffffffff9a2b1c4e> {{intel_idle+0x7e/0x120}}",
        "mce: [Hardware Error]: TSC 0 ADDR 7f3c1a240 MISC 86 ",
        "Kernel panic - not syncing: Fatal machine check",
    ),
    ("watchdog: Watchdog detected hard LOCKUP on cpu {cpu}", "Kernel panic - not syncing: Hard LOCKUP"),
    (
        "BUG: unable to handle page fault for address: ffffb8e1c0a3f000",
        "#PF: supervisor read access in kernel mode",
        "Oops: 0000 [#1] SMP NOPTI",
        "Kernel panic - not syncing: Fatal exception",
    ),
    (
        "{{EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#3_DIMM#0 (channel:3 slot:0 page:0x1a2b3c offset:0x0 grain:32)}}",
        "Kernel panic - not syncing: EDAC MC1: Uncorrected error",
    ),
)


def _lose(sc: Scenario) -> tuple[Node, float, bool]:
    """The node stops mid-step; sometimes its last words made it to the log. Returns (node, time, had panic)."""
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes[1:]) if rng.random() < 0.85 else w.nodes[0]
    t = sc.fault_time()
    sc.train(t - rng.uniform(0.5, 20))
    panic = rng.random() < 0.35
    if panic:
        lines = [
            ln.format(cpu=rng.randint(0, 223)).replace("{{", "").replace("}}", "")
            for ln in rng.choice(_PANICS)
        ]
        sc.root_kernel(node, t - 0.5, lines, root_line=len(lines) - 1, level="emerg")
    sc.lost_nodes[node.name] = t
    sc.culprit([node])
    if not panic and rng.random() < 0.25:
        # collected from the BMC after the fact: `ipmitool sel elist`
        d = sc.local(t + rng.uniform(-2, 1), node)
        sensor, event = rng.choice(
            (
                ("Power Supply PS2", "Failure detected"),
                ("Power Supply PS1", "Power Supply AC lost"),
                ("CPU_CATERR", "State Asserted"),
                ("Watchdog2 #0xca", "Hard reset"),
            )
        )
        sel = [
            f" {rng.randint(0x100, 0x1FF):x} | {d:%m/%d/%Y} | {d:%H:%M:%S} | {sensor} | {event} | Asserted",
            f" {rng.randint(0x200, 0x2FF):x} | {d:%m/%d/%Y} | {(sc.local(t + 190, node)):%H:%M:%S} | System Event #0x{rng.randint(0x80, 0xFF):x} | OEM System boot event | Asserted",
        ]
        sc.bundle.put(f"logs/{node.name}/ipmi-sel.txt", "\n".join(sel) + "\n")
        sc.collateral(f"BMC SEL on {node.name}: {sensor} {event}")
    sc.collateral(f"logs from {node.name} stop at {sc.utc(t)}")
    peers = sc.peers_of(node, 4)
    if (
        sc.ib_errors(t + rng.uniform(15, 32), node, peers, status=12)
        and rng.random() < 0.6
        and w.stack.torch >= (2, 0)
    ):
        last = nccl.ib_completion(
            w, w.node_of(peers[0]), peers[0], node, status=12, direction="Send", rng=rng
        ).split("NCCL WARN ", 1)[1]
        sc.remote_errors(t + rng.uniform(33, 45), peers, last)
    if node is w.nodes[0]:
        for r in sc.alive()[:: max(1, w.world_size // 16)]:
            sc.out(r, t + rng.uniform(35, 60), pytorch.tcpstore_reset(w, r, w.hostname(node), rng))
        sc.collateral("TCPStore connection resets (store host lost)")
    if w.uses_torchrun and rng.random() < 0.5:
        for other in rng.sample([n for n in w.nodes if n is not node], k=min(3, len(w.nodes) - 1)):
            host = w.hostname(node)
            sc.node_out(
                other, t + rng.uniform(30, 90), pytorch.agent_keepalive_failed(w, other.agent_pid, host)
            )
        sc.collateral("torchrun rendezvous keep-alive failures naming the lost node")
    return node, t, panic


def node_lost_k8s(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    node, t, panic = _lose(sc)
    t_first = sc.timeouts(t) if rng.random() < 0.7 else t + rng.uniform(40, 60)
    nodes_path = node_stopped_k8s(sc, node, t)
    t_nr = t + rng.uniform(38, 55)
    t_evict = t_nr + 300 + rng.uniform(0, 10)
    sc.end = max(t_first, t_evict) + rng.uniform(5, 30)
    sc.teardown(t_first)
    events = [
        kube.event(
            w,
            kind="Node",
            name=node.name,
            reason="NodeNotReady",
            message=f"Node {node.name} status is now: NodeNotReady",
            t=t_nr,
            etype="Normal",
            component="node-controller",
            namespace="default",
        ),
        kube.event(
            w,
            kind="Pod",
            name=node.pod,
            reason="NodeNotReady",
            message="Node is not ready",
            t=t_nr + 1,
            etype="Warning",
            component="node-controller",
        ),
        kube.event(
            w,
            kind="Pod",
            name=node.pod,
            reason="TaintManagerEviction",
            message=f"Marking for deletion Pod {w.namespace}/{node.pod}",
            t=t_evict,
            component="taint-eviction-controller",
        ),
    ]
    if not panic:
        sc.root_event(node, nodes_path, "Kubelet stopped posting node status.")
    if w.kueue and rng.random() < 0.3:
        from bench.kube import condition, kueue_workload

        sc.bundle.put(
            "events/workload.yaml",
            kueue_workload(
                w,
                [
                    condition("Admitted", "True", "Admitted", "The workload is admitted", w.start - 10),
                    condition(
                        "Evicted",
                        "True",
                        "NodeFailures",
                        f"Workload was evicted as there was not enough free capacity to replace failed node {node.name}",
                        t_evict + 2,
                    ),
                ],
                as_yaml=True,
            ),
        )
    pod_exit = {node.name: ("Error", 137, None)}
    conds = [
        dict(
            kube.disruption(
                "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", t_evict
            ),
            _node=node.name,
        )
    ]
    cond = (
        ("Failed", "PyTorchJobFailed", f"PyTorchJob {w.job_id} is failed because 1 Worker replica(s) failed.")
        if w.k8s_kind == "PyTorchJob"
        else ("Failed", "FailedJobs", "jobset failed due to one or more job failures")
    )
    sc.finish_k8s(
        state="FAILED", reason=None, pod_exit=pod_exit, conditions=conds, events=events, job_condition=cond
    )


def node_fail_slurm(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    node, t, panic = _lose(sc)
    slurmd_timeout = rng.choice((300, 300, 120, 600))
    t_fail = t + slurmd_timeout + rng.uniform(1, 30)
    if w.timeout_ms / 1000 < slurmd_timeout:
        sc.timeouts(t)
    sc.srun(t_fail, f"srun: error: Node failure on {node.name}", key=True)
    if not panic:
        sc.root_event(node, sc.job_stream().path, f"srun: error: Node failure on {node.name}")
    sc.srun(
        t_fail + 0.1,
        f"srun: Job step aborted: Waiting up to {rng.choice((32, 62, 92))} seconds for job step to finish.",
    )
    for r in sc.alive():
        sc.exit(r, t_fail + rng.uniform(1, 6), -9 if rng.random() < 0.3 else -15)
    sc.teardown(t_fail)
    banner_node = w.master if w.master is not node else w.nodes[1]
    sc.finish_slurm(
        state="NODE_FAIL",
        reason="NodeDown",
        exit_code=0,
        banner="NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS",
        banner_node=banner_node,
        attempt_exit=None,
    )
    rec = slurm.node_record(
        w, node.name, ["DOWN", "NOT_RESPONDING"], "Not responding", "slurm", t + slurmd_timeout
    )
    sc.bundle.put("events/scontrol-nodes.json", slurm.scontrol_nodes(w, [rec]))
    if rng.random() < 0.5:
        sc.bundle.put(
            "logs/_job/slurmctld.log",
            "\n".join(
                [
                    slurm.ctld_line(
                        sc.local(t + slurmd_timeout - 0.5), f"error: Nodes {node.name} not responding"
                    ),
                    slurm.ctld_line(
                        sc.local(t + slurmd_timeout), f"error: Nodes {node.name} not responding, setting DOWN"
                    ),
                    slurm.ctld_line(sc.local(t_fail), f"Killing JobId={w.job_id} on failed node {node.name}"),
                ]
            )
            + "\n",
        )


MODES = (
    Mode(
        "s11-node-lost-k8s",
        "attributed",
        "hardware",
        "host",
        2.0,
        node_lost_k8s,
        "a node disappears (panic/PSU): logs stop, peers see IB timeouts toward it, NodeStatusUnknown, taint eviction",
        schedulers=("kubernetes",),
    ),
    Mode(
        "node-fail-slurm",
        "attributed",
        "hardware",
        "host",
        2.0,
        node_fail_slurm,
        "a node disappears under Slurm: 'srun: error: Node failure on X', NODE_FAIL, node DOWN not responding",
        schedulers=("slurm",),
    ),
)
