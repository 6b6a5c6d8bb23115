"""hardware/gpu_memory: HBM uncorrectable errors — Xid 48/63/64/94/95/140, and its masquerade as a hang."""

from __future__ import annotations

from bench import metrics, nvidia
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed, gpu_death, kernel_gpu_teardown, pick_gpu, xid_gauge
from bench.world import GPU, Node

_ECC = "uncorrectable ECC error encountered"


def _remap_metrics(sc: Scenario, node: Node, gpu: GPU, t: float) -> None:
    w, rng = sc.w, sc.rng
    step = max(30.0, round((sc.end - w.start) / 120))
    series = []
    hist_gpu = rng.choice([g for g in node.gpus if g is not gpu])
    for g in node.gpus:
        base = 1.0 if g is hist_gpu and rng.random() < 0.5 else 0.0
        series.append(
            (
                metrics.dcgm_labels(w, node, g, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
                metrics.step_values(w.start, sc.end, step, t, base, base + (1.0 if g is gpu else 0.0)),
            )
        )
        series.append(
            (
                metrics.dcgm_labels(w, node, g, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
                metrics.constant(w.start, sc.end, step, 2.0 if g is hist_gpu else 0.0),
            )
        )
    sc.bundle.put(f"metrics/row_remap_{node.name}.json", metrics.query_range(series))
    sc.distractor(f"non-zero correctable remapped rows on {node.name} GPU {hist_gpu.index} (old history)")


def _ecc_run(sc: Scenario, lines_for: str) -> None:
    """Common flow: a memory Xid sequence on one GPU, the rank on it fails with the ECC CUDA error."""
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    pid = node.rank_pids[gpu.index]
    name = rng.choice(("python", "python3", "pt_main_thread"))
    dpr = w.platform == "a100" and w.stack.driver_major < 525 and rng.random() < 0.5
    new_driver = w.stack.driver_major >= 565
    lines: list[str] = []
    root = 0
    code = 48
    if rng.random() < 0.4:
        lines += nvidia.uuid_preamble(gpu, rng)
        root = len(lines)
    if lines_for == "s02":
        lines.append(nvidia.xid48(gpu, rng, dpr_era=dpr))
        if not dpr:
            lines.append(nvidia.xid94(gpu, rng, pid, name))
        lines.append(nvidia.xid63(gpu, rng, pid, dpr_era=dpr))
        if new_driver:
            lines.append(nvidia.xid154(gpu, 1))
        code = 63
    elif lines_for == "xid64":
        if rng.random() < 0.7:
            lines.append(nvidia.xid48(gpu, rng, dpr_era=dpr))
        lines.append(nvidia.xid64(gpu, rng, dpr_era=dpr))
        if new_driver:
            lines.append(nvidia.xid154(gpu, rng.choice((1, 4))))
        code = 64
    elif lines_for == "xid94":
        lines.append(nvidia.xid94(gpu, rng, pid, name, short=rng.random() < 0.3))
        if new_driver and rng.random() < 0.5:
            lines.append(nvidia.xid154(gpu, 1))
        code = 94
    elif lines_for == "xid95":
        lines.append(nvidia.xid95(gpu, rng, pid))
        lines += [
            nvidia.xid45(g, node.rank_pids[g.index], name, rng, 95)
            for g in rng.sample(node.gpus, k=rng.randint(1, 3))
        ]
        if new_driver:
            lines.append(nvidia.xid154(gpu, 1))
        code = 95
    elif lines_for == "xid140":
        lines.append(nvidia.xid140(gpu, rng))
        if new_driver:
            lines.append(nvidia.xid154(gpu, rng.choice((1, 2))))
        code = 140
    sc.root_kernel(node, t, lines, root_line=root)
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    t_detect = gpu_death(sc, node, gpu, t, cuda_msg=_ECC, crash_p=0.8)
    if rng.random() < 0.5:
        kernel_gpu_teardown(sc, node, gpu, t_detect + rng.uniform(1, 20), code if code in (48, 95) else None)
    finish_failed(sc, t_detect)
    if rng.random() < 0.5:
        xid_gauge(sc, node, gpu, code, t)
    if lines_for in ("s02", "xid64") and rng.random() < 0.6:
        _remap_metrics(sc, node, gpu, t)
    if lines_for in ("s02", "xid64") and rng.random() < 0.3:
        msg = (
            f"GPU {gpu.index} had memory errors and row remappings are pending"
            if lines_for == "s02"
            else f"GPU {gpu.index} had uncorrectable memory errors and row remapping failed."
        )
        sc.bundle.put(
            f"logs/{node.name}/dcgmi-health.txt",
            "\n".join(
                [
                    "+---------------------------+----------------------------------------------------------+",
                    "| Health Monitor Report                                                                |",
                    "+===========================+==========================================================+",
                    "| Overall Health            | Failure                                                  |",
                    f"| GPU List                  | {gpu.index}                                                        |",
                    "| -> Memory system          | Failure                                                  |",
                    f"|                           | {msg} |",
                    "+---------------------------+----------------------------------------------------------+",
                ]
            )
            + "\n",
        )


def s02_hbm(sc: Scenario) -> None:
    _ecc_run(sc, "s02")


def xid64(sc: Scenario) -> None:
    _ecc_run(sc, "xid64")


def xid94(sc: Scenario) -> None:
    _ecc_run(sc, "xid94")


def xid95(sc: Scenario) -> None:
    _ecc_run(sc, "xid95")


def xid140(sc: Scenario) -> None:
    _ecc_run(sc, "xid140")


def hbm_hang(sc: Scenario) -> None:
    """A failing HBM stack produces repeated DBE/containment Xids but the job only 'hangs'."""
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    pid = node.rank_pids[gpu.index]
    lines = [nvidia.xid48(gpu, rng)]
    sc.root_kernel(node, t, lines)
    n_rep = rng.randint(2, 6)
    for i in range(n_rep):
        tt = t + rng.uniform(5, 240) * (i + 1) / n_rep
        extra = [nvidia.xid48(gpu, rng)] if rng.random() < 0.5 else [nvidia.xid94(gpu, rng, pid, "python")]
        sc.kernel(node, tt, extra)
    if w.stack.driver_major >= 565:
        sc.kernel(node, t + rng.uniform(1, 3), nvidia.xid154(gpu, 4))
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    sc.unkillable.add(rank)
    t_detect = sc.timeouts(t, wedged=[rank])
    sc.collateral(f"rank {rank} stuck without an exception on {node.name}")
    finish_failed(sc, t_detect)
    if rng.random() < 0.5:
        xid_gauge(sc, node, gpu, 94 if rng.random() < 0.5 else 48, t)


MODES = (
    Mode(
        "s02-hbm-dbe-xid48-rowremap",
        "attributed",
        "hardware",
        "gpu_memory",
        5.0,
        s02_hbm,
        "HBM double-bit error: Xid 48 → 94 → 63 (row remap pending) → 154; rank dies with the ECC CUDA error",
    ),
    Mode(
        "xid64-row-remap-failure",
        "attributed",
        "hardware",
        "gpu_memory",
        2.0,
        xid64,
        "row remapping failure (Xid 64, usually after Xid 48)",
    ),
    Mode(
        "xid94-contained-ecc",
        "attributed",
        "hardware",
        "gpu_memory",
        3.0,
        xid94,
        "contained uncorrectable memory error (Xid 94)",
    ),
    Mode(
        "xid95-uncontained-ecc",
        "attributed",
        "hardware",
        "gpu_memory",
        2.0,
        xid95,
        "uncontained memory error (Xid 95) with Xid 45 on co-located processes",
    ),
    Mode(
        "xid140-unrecovered-ecc",
        "attributed",
        "hardware",
        "gpu_memory",
        1.0,
        xid140,
        "ECC error that escaped row remapping (Xid 140)",
    ),
    Mode(
        "c05-hbm-fault-looks-like-hang",
        "attributed",
        "hardware",
        "gpu_memory",
        2.0,
        hbm_hang,
        "repeated Xid 48/94 on one GPU while the job only hangs (no exception anywhere)",
    ),
)
