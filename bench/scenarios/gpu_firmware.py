"""hardware/gpu_firmware: GSP RPC timeout (Xid 119, S12), GSP error (Xid 120), PMU halt (Xid 62)."""

from __future__ import annotations

import json

from bench import nvidia
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed, gpu_death, pick_gpu, xid_gauge


def s12_gsp119(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    first = rng.choice(("python", "python", "nvidia-smi", "nv-hostengine", "gpud"))
    pid = node.rank_pids[gpu.index] if first == "python" else rng.randint(1000, 900000)
    lines = nvidia.xid119(gpu, w, rng, pid, first)
    sc.root_kernel(node, t, lines)
    for k in range(rng.randint(1, 4)):
        who = rng.choice(("nvidia-smi", "nv-hostengine", "dcgm-exporter", "gpud", "python"))
        sc.kernel(
            node,
            t + 30 * (k + 1) * rng.uniform(1, 4),
            nvidia.xid119(gpu, w, rng, rng.randint(1000, 900000), who)[:1],
        )
    if w.stack.driver_major >= 565 and rng.random() < 0.5:
        sc.kernel(node, t + rng.uniform(5, 60), nvidia.xid154(gpu, 1))
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    if first != "python":
        sc.distractor(f"first Xid 119 names the monitoring process {first}, not the cause")
    t_detect = gpu_death(sc, node, gpu, t, cuda_msg="unspecified launch failure", crash_p=0.15)
    finish_failed(sc, t_detect)
    if rng.random() < 0.5:
        sc.bundle.put(
            f"logs/{node.name}/dcgmi-health.json",
            json.dumps(
                {"body": {"Overall Health": {"value": "Healthy"}}, "header": ["Health Monitor Report"]},
                indent=4,
            )
            + "\n",
        )
        sc.distractor(f"dcgmi health reports Healthy on {node.name} (false negative)")
    if rng.random() < 0.4:
        xid_gauge(sc, node, gpu, 119, t)


def gsp_other(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node, gpu, _rank = pick_gpu(sc)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 30))
    if rng.random() < 0.5:
        lines = [nvidia.xid120(gpu, rng, node.rank_pids[gpu.index], rng.choice(("python", "pt_main_thread")))]
        code = 120
    else:
        lines = nvidia.xid62(gpu, rng)
        code = 62
    if w.stack.driver_major >= 565 and rng.random() < 0.7:
        lines.append(nvidia.xid154(gpu, 1))
    sc.root_kernel(node, t, lines)
    sc.culprit([node], [(node, "gpu", gpu.pci)])
    t_detect = gpu_death(sc, node, gpu, t, cuda_msg="unspecified launch failure", crash_p=0.35)
    finish_failed(sc, t_detect)
    if rng.random() < 0.4:
        xid_gauge(sc, node, gpu, code, t)


MODES = (
    Mode(
        "s12-gsp-xid119-rpc-timeout",
        "attributed",
        "hardware",
        "gpu_firmware",
        6.0,
        s12_gsp119,
        "GSP RPC timeout (Xid 119) wedges one GPU; monitoring processes also time out; DCGM still Healthy",
    ),
    Mode(
        "gsp-xid120-xid62",
        "attributed",
        "hardware",
        "gpu_firmware",
        3.0,
        gsp_other,
        "GSP task exception (Xid 120) or PMU halt (Xid 62)",
    ),
)
