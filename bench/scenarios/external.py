"""external/preemption, external/cancellation, external/maintenance: terminations that are not
faults — Kueue eviction (S10), Slurm preemption, scancel, and an admin or platform taking a node away."""

from __future__ import annotations

from bench import kube, pytorch, slurm
from bench.scenario import Mode, Scenario
from bench.world import Node


def _sigterm_all(sc: Scenario, t: float, *, collateral_p: float = 0.6) -> None:
    """SIGTERM reaches every worker; a few of them complain on the way down."""
    w, rng = sc.w, sc.rng
    if w.uses_torchrun:
        for node in w.nodes:
            sc.agent_signalled(node, t + rng.uniform(0, 1.5))
            sc.node_out(
                node, t + rng.uniform(1.5, 2.5), pytorch.agent_sigterm(w, node.agent_pid, node.rank_pids)
            )
    if rng.random() < collateral_p:
        victims = rng.sample(range(w.world_size), k=min(w.world_size, rng.randint(1, 6)))
        for r in victims:
            master = w.hostname(w.master)
            sc.out(r, t + rng.uniform(1, 4), pytorch.tcpstore_reset(w, r, master, rng))
        sc.collateral(f"TCPStore / NCCL errors on {len(victims)} ranks while shutting down")
    for r in range(w.world_size):
        sc.exit(r, t + rng.uniform(1, 6), -15)


def kueue_preemption(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    w.kueue = True
    sc.begin()
    t = sc.fault_time(300, 6 * 3600)
    sc.train(t - rng.uniform(1, 30))
    _sigterm_all(sc, t)
    sc.end = t + rng.uniform(15, 40)
    reason = rng.choice(
        ("InCohortReclamation", "InClusterQueue", "InCohortFairSharing", "InCohortReclaimWhileBorrowing")
    )
    why = {
        "InCohortReclamation": "reclamation within the cohort",
        "InClusterQueue": "prioritization in the ClusterQueue",
        "InCohortFairSharing": "Fair Sharing within the cohort",
        "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
    }[reason]
    msg = f"Preempted to accommodate a workload (UID: {w.uuid('preemptor')}, JobUID: {w.uuid('preemptor-job')}) due to {why}"
    if rng.random() < 0.6:
        msg += "; preemptor path: /org/team-a; preemptee path: /org/team-b"
    conds = [
        kube.condition("QuotaReserved", "False", "Preempted", msg, t),
        kube.condition("Admitted", "False", "NoReservation", "The workload has no reservation", t),
        kube.condition("Evicted", "True", "Preempted", msg, t),
        kube.condition("Preempted", "True", reason, msg, t),
        kube.condition("Requeued", "True", "Preempted", msg, t + 1),
    ]
    path = rng.choice(("events/workload.yaml", "events/kueue-workload.json"))
    sc.bundle.put(path, kube.kueue_workload(w, conds, as_yaml=path.endswith(".yaml")))
    events = [
        kube.event(
            w,
            kind="Workload",
            name=f"{w.k8s_kind.lower()}-{w.job_id}",
            reason="Preempted",
            message=msg,
            t=t,
            component="kueue-admission",
        )
    ]
    events += [
        kube.event(
            w,
            kind="Pod",
            name=n.pod,
            reason="Killing",
            message=f"Stopping container {'pytorch' if w.k8s_kind == 'PyTorchJob' else 'trainer'}",
            t=t + 0.2,
            host=n.name,
        )
        for n in w.nodes
    ]
    sc.root_event(None, path, msg)
    sc.collateral("all pods terminated with SIGTERM (exit 143)")
    sc.teardown(t)
    sc.finish_k8s(
        state="PREEMPTED",
        reason="Preempted",
        pod_exit={n.name: ("Error", 143, None) for n in w.nodes},
        events=events,
        job_condition=("Suspended", "Suspended", f"{w.k8s_kind} {w.job_id} is suspended."),
    )


def slurm_preemption(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time(300, 6 * 3600)
    sc.train(t - rng.uniform(1, 30))
    sc.srun(
        t + 0.5,
        f"srun: Force Terminated StepId={w.job_id}.0"
        if w.stack.slurm >= (21, 8)
        else f"srun: Force Terminated job {w.job_id}",
    )
    _sigterm_all(sc, t)
    sc.end = t + rng.uniform(10, 40)
    sc.teardown(t)
    sc.finish_slurm(
        state="PREEMPTED", reason="None", exit_code=0, signal=15, banner="PREEMPTION", attempt_exit=None
    )
    sc.root_event(None, sc.job_stream().path, "DUE TO PREEMPTION")
    sc.collateral("every task terminated (SIGTERM)")


def user_cancel(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    t = sc.fault_time(120, 8 * 3600)
    sc.train(t - rng.uniform(1, 60))
    who = w.user if rng.random() < 0.8 else "root"
    sc.srun(t + 0.2, "srun: forcing job termination")
    _sigterm_all(sc, t, collateral_p=0.3)
    sc.end = t + rng.uniform(5, 30)
    sc.teardown(t)
    sc.finish_slurm(
        state="CANCELLED",
        reason="None",
        exit_code=0,
        signal=15,
        banner=None,
        kill_user=who,
        attempt_exit=None,
    )
    sc.root_event(None, sc.job_stream().path, "CANCELLED AT")
    sc.collateral("every task terminated (SIGTERM)")


def _shutdown_lines(sc: Scenario, node: Node, t: float) -> None:
    rng = sc.rng
    sc.daemon(
        node,
        t,
        "systemd-logind",
        "The system will reboot now!" if rng.random() < 0.5 else "System is rebooting.",
        pid=1412,
    )
    sc.daemon(
        node,
        t + 0.3,
        "systemd",
        "Stopping Slurm node daemon..."
        if sc.w.scheduler == "slurm"
        else "Stopping kubelet: The Kubernetes Node Agent...",
        pid=1,
    )
    sc.daemon(node, t + 2.0, "systemd", "Stopped target Multi-User System.", pid=1)
    sc.kernel(
        node,
        t + 6,
        ["systemd-shutdown[1]: Syncing filesystems and block devices.", "reboot: Restarting system"],
        level="notice",
        gap=0.8,
    )


def maintenance(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes)
    t = sc.fault_time(300, 6 * 3600)
    sc.train(t - rng.uniform(1, 30))
    sc.culprit([node])
    why = rng.choice(
        (
            "maintenance: BMC firmware update",
            "maint: PSU swap ticket INC-{n}",
            "rack {n} power work",
            "kernel upgrade rollout",
            "hw maintenance (GPU baseboard RMA)",
        )
    ).format(n=rng.randint(1000, 99999))
    if w.scheduler == "slurm":
        t_down = t
        sc.srun(t_down + rng.uniform(0.5, 2), f"srun: error: Node failure on {node.name}")
        sc.srun(
            t_down + 2.2,
            f"srun: Job step aborted: Waiting up to {rng.choice((32, 62))} seconds for job step to finish.",
        )
        for r in range(w.world_size):
            if w.node_of(r) is not node:
                sc.exit(r, t_down + rng.uniform(2, 8), -15)
        _shutdown_lines(sc, node, t_down + rng.uniform(5, 40))
        sc.lost_nodes[node.name] = t_down + 60
        sc.end = t_down + rng.uniform(10, 70)
        sc.teardown(t_down)
        sc.finish_slurm(
            state="NODE_FAIL",
            reason="NodeDown",
            exit_code=0,
            banner="NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS",
            banner_node=w.master if w.master is not node else w.nodes[-1],
            attempt_exit=None,
        )
        rec = slurm.node_record(w, node.name, ["DOWN", "DRAIN"], why, "root", t_down)
        path = rng.choice(("events/scontrol-nodes.json", "events/scontrol-show-node.json"))
        sc.bundle.put(path, slurm.scontrol_nodes(w, [rec]))
        sc.root_event(node, path, why)
        if rng.random() < 0.6:
            sc.bundle.put(
                "logs/_job/slurmctld.log",
                "\n".join(
                    [
                        slurm.ctld_line(
                            sc.local(t_down - 0.2), f"update_node: node {node.name} reason set to: {why}"
                        ),
                        slurm.ctld_line(
                            sc.local(t_down), f"update_node: node {node.name} state set to: DOWN"
                        ),
                        slurm.ctld_line(
                            sc.local(t_down + 0.1), f"Killing JobId={w.job_id} on failed node {node.name}"
                        ),
                    ]
                )
                + "\n",
            )
        sc.collateral(f"the job was killed when root set {node.name} DOWN")
        return
    graceful = rng.random() < 0.5
    events = [
        kube.event(
            w,
            kind="Node",
            name=node.name,
            reason="NodeNotSchedulable",
            message=f"Node {node.name} status is now: NodeNotSchedulable",
            t=t - rng.uniform(1, 30),
            component="kubelet",
            host=node.name,
            namespace="default",
        )
    ]
    if graceful:
        cond = kube.disruption(
            "TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.", t
        )
        pod_exit = ("Terminated", 137, "Pod was terminated in response to imminent node shutdown.")
        events.append(
            kube.event(
                w,
                kind="Node",
                name=node.name,
                reason="Shutdown",
                message="Shutdown manager detected shutdown event",
                t=t - 0.5,
                etype="Normal",
                component="kubelet",
                host=node.name,
                namespace="default",
            )
        )
        _shutdown_lines(sc, node, t + rng.uniform(10, 60))
    else:
        cond = kube.disruption("EvictionByEvictionAPI", "Eviction API: evicting", t)
        pod_exit = ("Error", 143, "")
        events.append(
            kube.event(
                w,
                kind="Pod",
                name=node.pod,
                reason="Killing",
                message="Stopping container pytorch",
                t=t + 0.1,
                host=node.name,
            )
        )
        events.append(
            kube.event(
                w,
                kind="Pod",
                name=node.pod,
                reason="Evicted",
                message=f"Evicted pod: {why}",
                t=t,
                etype="Normal",
                component="eviction-api",
            )
        )
    for r in w.ranks_of(node):
        sc.exit(r, t + rng.uniform(1, 5), -15)
    if w.uses_torchrun:
        sc.agent_signalled(node, t + 0.5)
    t_detect = sc.after_crash(t + 3, list(w.ranks_of(node)), hang_p=0.5)
    sc.teardown(t_detect)
    nobj = kube.node_obj(
        w,
        node,
        ready="True" if not graceful else "False",
        reason="KubeletReady" if not graceful else "KubeletNotReady",
        message=why,
        t=t,
        unschedulable=True,
        taints=[
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": kube.ts(t - 20)}
        ],
    )
    nobj["metadata"]["annotations"] = {"maintenance.example.com/reason": why}
    sc.bundle.put("events/nodes.json", kube.as_list([nobj]))
    job_cond = (
        ("Failed", "PyTorchJobFailed", f"PyTorchJob {w.job_id} is failed because 1 Worker replica(s) failed.")
        if w.k8s_kind == "PyTorchJob"
        else ("Failed", "FailedJobs", "jobset failed due to one or more job failures")
    )
    pods_path = sc.finish_k8s(
        state="FAILED",
        reason=None,
        pod_exit={node.name: pod_exit},
        conditions=[dict(cond, _node=node.name)],
        events=events,
        job_condition=job_cond,
    )
    sc.root_event(node, pods_path, str(cond["message"]))
    sc.collateral(f"workers on other nodes fail after {node.name}'s pod was terminated")


MODES = (
    Mode(
        "s10-kueue-preemption",
        "attributed",
        "external",
        "preemption",
        1.5,
        kueue_preemption,
        "Kueue evicts the workload (Evicted/Preempted); all pods get SIGTERM",
        schedulers=("kubernetes",),
    ),
    Mode(
        "slurm-preemption",
        "attributed",
        "external",
        "preemption",
        1.5,
        slurm_preemption,
        "Slurm preempts the job (DUE TO PREEMPTION, state PREEMPTED)",
        schedulers=("slurm",),
    ),
    Mode(
        "user-cancel",
        "attributed",
        "external",
        "cancellation",
        1.5,
        user_cancel,
        "the user (or an admin) runs scancel on a healthy job",
        schedulers=("slurm",),
    ),
    Mode(
        "maintenance-drain",
        "attributed",
        "external",
        "maintenance",
        2.5,
        maintenance,
        "an admin or the platform takes a node away for maintenance (Slurm DOWN with reason, kubectl drain, node shutdown)",
    ),
)
