"""hardware/nvlink: NVLink5 Xid 149 (S03) and 144-150 variants on Blackwell, Xid 74 on Ampere/Hopper."""

from __future__ import annotations

from bench import nvidia
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed, gpu_death, pick_gpu, xid_gauge

_NVLINK_CUDA = "uncorrectable NVLink error detected during the execution"

# (Xid, unit, error status) combinations the catalog marks fatal (NVIDIA Xid Catalog, Xid 144-150)
_FATAL5 = (
    (144, "SAW_MVB", 0x2),
    (144, "SAW_MVB", 0x10),
    (145, "RLW_REMAP", 0x40),
    (145, "RLW_REMAP", 0x80),
    (145, "RLW_SRC_TRACK", 0x1),
    (145, "RLW_TAGSTATE", 0x2),
    (145, "RLW_RSPCOL", 0x2),
    (146, "TLW_RX", 0x4),
    (146, "TLW_TX_PIPE0", 0x4),
    (150, "MSE_WATCHDOG", 0x1),
)


def _nvlink_run(sc: Scenario, kind: str) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    link = rng.randint(0, 17)
    lines: list[str]
    if kind == "149":
        unit = rng.choice(("NETIR_LINK_EVT", "NETIR_LINK_DOWN", "NETIR"))
        lines = [nvidia.nvlink5(gpu, 149, unit, True, link if unit != "NETIR" else -1, 0, rng)]
        code = 149
    elif kind == "5x":
        code, unit, status = rng.choice(_FATAL5)
        lines = [nvidia.nvlink5(gpu, code, unit, True, link, status, rng)]
    else:
        link = rng.randint(0, 17)
        lines = [nvidia.xid74(gpu, rng, link)]
        if rng.random() < 0.5:
            lines.append(f"NVRM: GPU {gpu.bdf}: NVLink link {link} disabled due to error")
        code = 74
    pid = node.rank_pids[gpu.index]
    lines.append(nvidia.xid45(gpu, pid, rng.choice(("python3", "python")), rng, code))
    if code != 74 and rng.random() < 0.6:
        sib = node.gpus[gpu.index ^ 1] if len(node.gpus) > 1 else gpu
        lines.append(nvidia.xid45(sib, node.rank_pids[sib.index], "python3", rng, code))
    if w.stack.driver_major >= 565 and rng.random() < 0.7:
        lines.append(nvidia.xid154(gpu, rng.choice((1, 3, 5) if code != 74 else (1,))))
    sc.root_kernel(node, t, lines)
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    if kind == "74" and rng.random() < 0.3:
        # the GPU at the other end of the link reports too; both are on this node
        peer = rng.choice([g for g in node.gpus if g is not gpu])
        sc.kernel(node, t + rng.uniform(0.001, 0.02), nvidia.xid74(peer, rng, rng.randint(0, 17)))
        sc.culprit([node], [(node, "gpu", peer.pci)])
    t_detect = gpu_death(sc, node, gpu, t, cuda_msg=_NVLINK_CUDA, crash_p=0.7)
    finish_failed(sc, t_detect)
    if rng.random() < 0.3:
        xid_gauge(sc, node, gpu, code, t)


def s03_xid149(sc: Scenario) -> None:
    _nvlink_run(sc, "149")


def nvlink5_other(sc: Scenario) -> None:
    _nvlink_run(sc, "5x")


def xid74(sc: Scenario) -> None:
    _nvlink_run(sc, "74")


MODES = (
    Mode(
        "s03-nvlink5-xid149",
        "attributed",
        "hardware",
        "nvlink",
        3.0,
        s03_xid149,
        "NVLink5 NETIR link fault (Xid 149) with Xid 45 'caused by previous Xid 149' and the NVLink CUDA error",
        platforms=("b200", "gb200"),
        min_torch=(2, 5),
    ),
    Mode(
        "nvlink5-xid144-150-fatal",
        "attributed",
        "hardware",
        "nvlink",
        2.0,
        nvlink5_other,
        "fatal NVLink5 unit errors: Xid 144 SAW_MVB, 145 RLW_*, 146 TLW_*, 150 MSE_WATCHDOG",
        platforms=("b200", "gb200"),
        min_torch=(2, 5),
    ),
    Mode(
        "xid74-nvlink-hopper",
        "attributed",
        "hardware",
        "nvlink",
        3.0,
        xid74,
        "NVLink fatal error on Ampere/Hopper (Xid 74, seven registers)",
        platforms=("a100", "h100", "h200"),
    ),
)
