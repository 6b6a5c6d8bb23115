"""hardware/gpu: a GPU that falls off the bus (S01), hangs (Xid 46/109/158), or throttles (S14)."""

from __future__ import annotations

from bench import metrics, nvidia, slurm
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed, gpu_death, kernel_gpu_teardown, pick_gpu, xid_gauge


def s01_xid79(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 40))
    port = node.gpu_root_port(gpu)
    newer = w.stack.kernel.startswith("6")
    if rng.random() < 0.6:
        sc.kernel(
            node,
            t - rng.uniform(60, 140),
            nvidia.aer_corrected(port, rng, newer_kernel=newer),
            level="warning",
        )
        sc.collateral(f"correctable AER precursor on {port} ({node.name})")
    lines: list[str] = []
    if rng.random() < 0.6:
        lines += nvidia.aer_fatal(port, gpu, rng)
    multiline = rng.random() < 0.15
    if not multiline and rng.random() < 0.5:
        lines += nvidia.uuid_preamble(gpu, rng)
    root_idx = len(lines)
    lines += nvidia.xid79_lines(gpu, rng, multiline_only=multiline)
    sc.root_kernel(node, t, lines, root_line=root_idx)
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    t_detect = gpu_death(
        sc, node, gpu, t, cuda_msg=rng.choice(("unspecified launch failure", "unknown error")), crash_p=0.45
    )
    kernel_gpu_teardown(sc, node, gpu, t_detect + rng.uniform(5, 30), 79 if rng.random() < 0.2 else None)
    finish_failed(sc, t_detect)
    if w.scheduler == "slurm" and rng.random() < 0.5:
        sc.bundle.put(
            "logs/_job/slurmctld.log",
            "\n".join(
                [
                    slurm.ctld_line(
                        sc.local(sc.end + 2),
                        f"error: slurmd error running StepId={w.job_id}.0 on Node(s)={node.name}: Kill task failed",
                    ),
                    slurm.ctld_line(
                        sc.local(sc.end + 3), f"update_node: node {node.name} reason set to: Kill task failed"
                    ),
                    slurm.ctld_line(
                        sc.local(sc.end + 610),
                        f"error: Setting node {node.name} state to INVALID_REG with reason:gres/gpu count reported lower than configured ({w.gpus_per_node - 1} < {w.gpus_per_node})",
                    ),
                ]
            )
            + "\n",
        )
    if rng.random() < 0.5:
        xid_gauge(sc, node, gpu, 79, t, vanish=True)


def gpu_hang(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    code = rng.choice((46, 109, 109, 158)) if w.stack.driver_major >= 570 else rng.choice((46, 109))
    lines = [
        nvidia.gpu_hang_xid(
            gpu, code, rng, node.rank_pids[gpu.index], rng.choice(("python", "pt_main_thread", "python3"))
        )
    ]
    if w.stack.driver_major >= 565 and rng.random() < 0.6:
        lines.append(nvidia.xid154(gpu, 1))
    sc.root_kernel(node, t, lines)
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    t_detect = gpu_death(
        sc,
        node,
        gpu,
        t,
        cuda_msg=rng.choice(("unspecified launch failure", "the launch timed out and was terminated")),
        crash_p=0.3,
    )
    kernel_gpu_teardown(sc, node, gpu, t_detect + rng.uniform(2, 20), code if rng.random() < 0.3 else None)
    finish_failed(sc, t_detect)
    if rng.random() < 0.4:
        xid_gauge(sc, node, gpu, code, t)


def s14_thermal(sc: Scenario) -> None:
    """One GPU throttles (HW_THERMAL); the whole job slows down and runs into its time limit."""
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    limit_s = rng.choice((4, 6, 8, 12, 24)) * 3600
    end = w.start + limit_s
    t_throttle = sc.plan.t_begin + rng.uniform(0.0, 0.3) * (end - sc.plan.t_begin)
    slow = rng.uniform(1.05, 1.18)
    sc.train(t_throttle)
    sc.train(end - rng.uniform(0.5, 3), slow=slow, from_t=t_throttle, key_last=True)
    sc.end = end + rng.uniform(1, 40)
    for r in range(w.world_size):
        sc.exit(r, end + rng.uniform(0.5, 5), -15)
    sc.srun(
        end + 0.3,
        f"srun: Job step aborted: Waiting up to {rng.choice((32, 62, 92))} seconds for job step to finish.",
    )
    sc.teardown(end)
    sc.finish_slurm(
        state="TIMEOUT",
        reason="TimeLimit",
        exit_code=0,
        signal=0,
        banner="TIME LIMIT",
        limit_min=limit_s // 60,
        attempt_exit=None,
    )
    # dcgm-exporter view: the throttled GPU runs hot with HW_THERMAL|HW_SLOWDOWN; everyone else is at most power-capped.
    name = rng.choice(("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
    step = max(30.0, round((sc.end - w.start) / 120))
    reasons, temps, clocks = [], [], []
    power_cap_everywhere = rng.random() < 0.5
    hot_mask = rng.choice((0x40, 0x48, 0x48, 0x4C if power_cap_everywhere else 0x48))
    nodes = w.nodes if len(w.nodes) <= 16 else [node, *rng.sample([n for n in w.nodes if n is not node], k=8)]
    for n in nodes:
        for g in n.gpus:
            hot = n is node and g is gpu
            base = 0x4 if power_cap_everywhere else 0

            def mask(t: float, hot: bool = hot, base: int = base) -> float:
                return float(hot_mask if hot and t >= t_throttle else base if t > sc.plan.t_begin else 0)

            def temp(t: float, hot: bool = hot, seed: float = rng.uniform(55, 68)) -> float:
                return round(
                    (rng.uniform(86, 91) if hot and t >= t_throttle else seed + rng.uniform(-1.5, 1.5)), 0
                )

            def clock(t: float, hot: bool = hot) -> float:
                return float(
                    rng.choice((1155, 1200, 1245, 1305))
                    if hot and t >= t_throttle
                    else rng.choice((1980, 1980, 1965))
                )

            reasons.append((metrics.dcgm_labels(w, n, g, name), metrics.sample(w.start, sc.end, step, mask)))
            temps.append(
                (
                    metrics.dcgm_labels(w, n, g, "DCGM_FI_DEV_GPU_TEMP"),
                    metrics.sample(w.start, sc.end, step, temp),
                )
            )
            clocks.append(
                (
                    metrics.dcgm_labels(w, n, g, "DCGM_FI_DEV_SM_CLOCK"),
                    metrics.sample(w.start, sc.end, step, clock),
                )
            )
    path = f"metrics/{name.lower()}.json"
    sc.bundle.put(path, metrics.query_range(reasons))
    sc.bundle.put("metrics/dcgm_gpu_temp.json", metrics.query_range(temps))
    if rng.random() < 0.6:
        sc.bundle.put("metrics/dcgm_sm_clock.json", metrics.query_range(clocks))
    host_label = "hostname" if w.stack.dcgm_exporter_lower_hostname else "Hostname"
    sc.root_event(node, path, f'{name}{{gpu="{gpu.index}",{host_label}="{node.name}"}} {hot_mask}')
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    sc.collateral(f"iteration time +{(slow - 1) * 100:.0f}% on all ranks from {sc.utc(t_throttle)}")
    sc.collateral("job ran into its time limit")
    if power_cap_everywhere:
        sc.distractor("SW_POWER_CAP set on all GPUs (normal under load)")
    sc.forbid.add("truncated")


MODES = (
    Mode(
        "s01-xid79-fallen-off-bus",
        "attributed",
        "hardware",
        "gpu",
        15.0,
        s01_xid79,
        "GPU falls off the bus (Xid 79, PCIe AER precursor); rank dies or wedges, everyone else times out",
    ),
    Mode(
        "gpu-hang-xid46-109-158",
        "attributed",
        "hardware",
        "gpu",
        6.0,
        gpu_hang,
        "GPU stops processing (Xid 46 / 109 CTX SWITCH TIMEOUT / 158); heartbeat or watchdog on the rest",
    ),
    Mode(
        "s14-thermal-straggler-timeout",
        "attributed",
        "hardware",
        "gpu",
        3.0,
        s14_thermal,
        "one GPU thermally throttled (HW_THERMAL) slows the job until its time limit",
        schedulers=("slurm",),
        max_nodes=256,
    ),
)
