"""NVIDIA driver, PCIe AER, mlx5 and DCGM lines, in the formats the real components print.

Formats follow NVIDIA's kernel driver and Xid Catalog (Xid line macro, per-Xid texts, NVLink5 units, GSP RPC
timeouts by driver era, Xid 154), the mlx5_core driver (port, module and firmware-command messages)
and the PCIe AER driver (AER chains). Functions return message text without any timestamp or syslog prefix;
`bench.timeline` adds those. Nothing here decides what happens in a scenario.
"""

from __future__ import annotations

from random import Random

from bench.world import GPU, HCA, World


def _proc(pid: int | None, name: str | None) -> str:
    if pid is None and name is None:
        return ""
    if pid is None:
        return "pid='<unknown>', name=<unknown>, "
    if name is None:
        return f"pid={pid}, "
    return f"pid={pid}, name={name}, "


def xid(
    gpu: GPU,
    code: int,
    detail: str,
    *,
    pid: int | None = None,
    name: str | None = None,
    legacy_tag: bool = False,
    unknown_proc: bool = False,
) -> str:
    """`NVRM: Xid (PCI:dddd:bb:dd): N, pid=…, name=…, detail` (the kernel_rc.c macro)."""
    tag = gpu.pci if legacy_tag else f"PCI:{gpu.pci}"
    proc = "pid='<unknown>', name=<unknown>, " if unknown_proc else _proc(pid, name)
    return f"NVRM: Xid ({tag}): {code}, {proc}{detail}"


def uuid_preamble(gpu: GPU, rng: Random) -> list[str]:
    """Logged once per GPU before its first Xid (``_krcLogUuidOnce``)."""
    return [
        f"NVRM: GPU at PCI:{gpu.pci}: {gpu.uuid}",
        f"NVRM: GPU Board Serial Number: 1{rng.randint(10**11, 10**12 - 1)}",
    ]


def channel(rng: Random) -> str:
    return f"Ch {rng.choice((1, 2, 8, 10, 12, 16, 24, 26, 32)):08x}"


# --- GPU lost / hang ---------------------------------------------------------------------------


def xid79_lines(
    gpu: GPU, rng: Random, *, multiline_only: bool = False, device_id: str = "10de:2330"
) -> list[str]:
    if multiline_only:
        return [
            f"NVRM: The NVIDIA GPU {gpu.bdf}",
            f"NVRM: (PCI ID: {device_id}) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ]
    variant = rng.random()
    if variant < 0.4:
        head = xid(gpu, 79, "GPU has fallen off the bus.", pid=0)
    elif variant < 0.7:
        head = xid(gpu, 79, "GPU has fallen off the bus.")
    else:
        head = xid(gpu, 79, "GPU has fallen off the bus.", unknown_proc=True)
    out = [head, f"NVRM: GPU {gpu.bdf}: GPU has fallen off the bus."]
    if rng.random() < 0.6:
        out += [
            "NVRM: A GPU crash dump has been created. If possible, please run",
            "NVRM: nvidia-bug-report.sh as root to collect this data before",
            "NVRM: the NVIDIA kernel module is unloaded.",
        ]
    return out


def aer_corrected(port: str, rng: Random, *, newer_kernel: bool) -> list[str]:
    sev = "Correctable" if newer_kernel else "Corrected"
    kind, bit = rng.choice(
        (
            ("Data Link Layer", "[12] Timeout"),
            ("Physical Layer", "[ 0] RxErr"),
            ("Data Link Layer", "[ 7] BadDLLP"),
            ("Data Link Layer", "[ 6] BadTLP"),
        )
    )
    status = {
        "[12] Timeout": "00001000",
        "[ 0] RxErr": "00000001",
        "[ 7] BadDLLP": "00000080",
        "[ 6] BadTLP": "00000040",
    }[bit]
    who = "(Transmitter ID)" if "Timeout" in bit else "(Receiver ID)"
    return [
        f"pcieport {port}: AER: {sev} error received: {port}",
        f"pcieport {port}: PCIe Bus Error: severity={sev}, type={kind}, {who}",
        f"pcieport {port}:   device [8086:{rng.choice(('352a', '347a', '2030', '6f08'))}] error status/mask={status}/00002000",
        f"pcieport {port}:    {bit}",
    ]


def aer_fatal(port: str, gpu: GPU, rng: Random) -> list[str]:
    multi = rng.random() < 0.4
    first = rng.choice(("[ 5] SDES", "[ 5] Surprise Down Error"))
    lines = [
        f"pcieport {port}: AER: {'Multiple ' if multi else ''}Uncorrected (Fatal) error received: {port}",
        f"pcieport {port}: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
        f"pcieport {port}:   device [8086:352a] error status/mask=00004020/00000000",
        f"pcieport {port}:    {first}                  (First)",
    ]
    if multi:
        lines.append(f"pcieport {port}:    [14] CmpltTO")
    lines.append(
        rng.choice(
            (
                f"nvidia {gpu.bdf}: AER: can't recover (no error_detected callback)",
                f"nvidia {gpu.bdf}: device has no AER-aware driver",
            )
        )
    )
    if rng.random() < 0.5:
        lines += [
            f"pcieport {port}: AER: Root Port link has been reset (0)",
            f"pcieport {port}: AER: device recovery failed",
        ]
    return lines


def gpu_hang_xid(gpu: GPU, code: int, rng: Random, pid: int, name: str) -> str:
    if code == 109:
        return xid(
            gpu,
            109,
            f"{channel(rng)}, errorString CTX SWITCH TIMEOUT, Info 0x{rng.randint(0x10000, 0xFFFFF):x}",
            pid=pid,
            name=name,
        )
    if code == 158:
        return xid(gpu, 158, f"{channel(rng)}, GPU fatal timeout, reset required", pid=pid, name=name)
    return xid(gpu, 46, f"{channel(rng)}, intr 00000000. GPU stopped processing", pid=pid, name=name)


# --- memory --------------------------------------------------------------------------------------


def xid48(gpu: GPU, rng: Random, *, dpr_era: bool = False) -> str:
    addr = f"0x{rng.randint(0x100000000, 0x13FFFFFFF):x}"
    if dpr_era:
        return xid(
            gpu,
            48,
            f"An uncorrectable double bit error (DBE) has been detected on GPU ({addr}).",
            unknown_proc=True,
        )
    return xid(
        gpu,
        48,
        f"An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr {addr} "
        f"partition {rng.randint(0, 11)}, subpartition {rng.randint(0, 1)}.",
        unknown_proc=True,
    )


def xid63(gpu: GPU, rng: Random, pid: int, *, dpr_era: bool = False) -> str:
    if dpr_era:
        return xid(
            gpu,
            63,
            f"Dynamic Page Retirement: New retired page, reload the driver to activate. (0x{rng.randint(0, 0xFFFFFFFF):016x})",
            pid=pid,
        )
    return xid(gpu, 63, "Row Remapper: New row marked for remapping, reset gpu to activate.", pid=pid)


def xid64(gpu: GPU, rng: Random, *, dpr_era: bool = False) -> str:
    if dpr_era:
        return xid(
            gpu,
            64,
            f"Dynamic Page Retirement: Fatal error, unable to retire page (0x{rng.randint(0, 0xFFFFFFFF):016x})",
            unknown_proc=True,
        )
    return xid(
        gpu,
        64,
        f"Row Remapper Error: (0x{rng.randint(0x200000000, 0x2FFFFFFFF):016x}) - All reserved rows for bank are remapped",
        unknown_proc=True,
    )


_CONTAINED_UNITS = ("CE User Channel (0x9)", "SM (0x1)", "GR Engine (0xd)", "FBHUB (0x3)", "LTC (0x2, 0x5)")


def xid94(gpu: GPU, rng: Random, pid: int, name: str, *, short: bool = False) -> str:
    if short:
        return xid(gpu, 94, "Contained ECC error", pid=pid, name=name)
    return xid(gpu, 94, f"Contained: {rng.choice(_CONTAINED_UNITS)}. RST: No, D-RST: No", pid=pid, name=name)


def xid95(gpu: GPU, rng: Random, pid: int) -> str:
    return xid(
        gpu,
        95,
        f"Uncontained: {rng.choice(('LTC TAG (0x2, 0x1)', 'FBPA (0x3, 0x0)', 'LTC DATA (0x2, 0x4)'))}. RST: Yes, D-RST: No",
        pid=pid,
    )


def xid140(gpu: GPU, rng: Random) -> str:
    return xid(
        gpu,
        140,
        f"Unrecovered ECC Error 0x{rng.randint(0x1000, 0xFFFF):x} (escaped containment, row remapping not recorded)",
        unknown_proc=True,
    )


def xid154(gpu: GPU, new: int) -> str:
    names = {
        0: "None",
        1: "GPU Reset Required",
        2: "Node Reboot Required",
        3: "Drain P2P",
        4: "Drain and Reset",
        5: "Recover IMEX Domain",
    }
    return xid(gpu, 154, f"GPU recovery action changed from 0x0 (None) to 0x{new:x} ({names[new]})")


# --- firmware --------------------------------------------------------------------------------------


def xid119(gpu: GPU, world: World, rng: Random, pid: int, name: str) -> list[str]:
    fn, fname = rng.choice(((76, "GSP_RM_CONTROL"), (103, "GSP_RM_ALLOC"), (10, "FREE")))
    if world.stack.driver_major < 550:
        return [
            xid(
                gpu,
                119,
                f"Timeout waiting for RPC from GPU{gpu.index} GSP! Expected function {fn} ({fname}) "
                f"(0x{rng.randint(0x20800000, 0x2080FFFF):x} 0x{rng.randint(4, 0x800):x}).",
                pid=pid,
                name=name,
            ),
            f"NVRM: GPU{gpu.index} GSP RPC buffer contains function {fn} ({fname}) and data 0x{rng.randint(0, 0xFFFFFFFF):016x} 0x{rng.randint(0, 0xFFFFFFFF):016x}.",
        ]
    wait = rng.choice((6, 6, 45))
    seq = rng.randint(1000, 99999)
    return [
        xid(
            gpu,
            119,
            f"Timeout after {wait}s of waiting for RPC response from GPU{gpu.index} GSP! Expected function {fn} ({fname}) "
            f"sequence {seq} (0x{rng.randint(0x2080, 0x20802A02):x} 0x{rng.randint(4, 0x800):x}).",
            pid=pid,
            name=name,
        ),
        f"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:{gpu.pci} (printing 1 of every 30).  The GPU likely needs to be reset.",
    ]


def xid120(gpu: GPU, rng: Random, pid: int, name: str) -> str:
    cause = rng.choice(
        (
            "load access fault",
            "store access fault",
            f"supervisor timer interrupt (cause:0x800000000000000{rng.randint(1, 7)})",
        )
    )
    return xid(gpu, 120, f"GSP task exception: {cause}", pid=pid, name=name)


def xid62(gpu: GPU, rng: Random) -> list[str]:
    regs = " ".join(f"{rng.randint(0, 0xFFFFFFFF):08x}" for _ in range(8))
    return [
        xid(gpu, 62, regs),
        f"NVRM: GPU{gpu.index} _kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted.",
    ]


# --- NVLink ---------------------------------------------------------------------------------------


def xid74(gpu: GPU, rng: Random, link: int) -> str:
    first = rng.choice((0x10, 0x20, 0x100, 0x1000, 0x10000, 0x200000))
    regs = f"0x{first:x}, 0x0, 0x{rng.choice((0, 0x1, 0x4, 0x10000)):x}, 0x0, 0x{rng.choice((0, 0x40000, 0x80000)):x}, 0x0, 0x0"
    return xid(
        gpu, 74, f"NVLink: fatal error detected on link {link}({regs})", unknown_proc=rng.random() < 0.6
    )


def nvlink5(gpu: GPU, code: int, unit: str, fatal: bool, link: int, status: int, rng: Random) -> str:
    intr = rng.randint(0x00400000, 0x0FFFFFFF)
    regs = " ".join(
        [
            f"0x{intr:08x}",
            f"0x{status:08x}",
            *(f"0x{rng.choice((0, 0, 1, 8, 0x100000)):08x}" for _ in range(4)),
        ]
    )
    return xid(gpu, code, f"{unit} {'Fatal' if fatal else 'Nonfatal'} XC0 i0 Link {link:02d} ({regs})")


def xid45(gpu: GPU, pid: int, name: str, rng: Random, cause: int | None = None) -> str:
    suffix = f" caused by previous Xid {cause}" if cause is not None else ""
    return xid(gpu, 45, f"{channel(rng)}{suffix}", pid=pid, name=name)


# --- application-caused ---------------------------------------------------------------------------


def xid13(gpu: GPU, rng: Random) -> list[str]:
    gpc, tpc, sm = rng.randint(0, 7), rng.randint(0, 8), rng.randint(0, 1)
    return [
        xid(
            gpu,
            13,
            f"Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): Out Of Range Address",
            unknown_proc=True,
        ),
        xid(
            gpu,
            13,
            f"Graphics SM Global Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): Multiple Warp Errors",
            unknown_proc=True,
        ),
        xid(
            gpu,
            13,
            f"Graphics Exception: ESR 0x{rng.randint(0x500000, 0x5FFFFF):x}=0x{rng.randint(0, 0xFFFFFFF):x} 0x{rng.randint(0x500000, 0x5FFFFF):x}=0x24",
            unknown_proc=True,
        ),
    ]


def xid31(gpu: GPU, rng: Random, pid: int, name: str, *, newer: bool = True) -> str:
    addr = f"0x{rng.randint(0x7F00, 0x7FFF):x}_{rng.randint(0, 0xFFFFFFFF):08x}"
    if newer:
        return xid(
            gpu,
            31,
            f"channel 0x{rng.randint(2, 0x30):08x}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC{rng.randint(0, 7)} "
            f"GPCCLIENT_T1_{rng.randint(0, 15)} faulted @ {addr}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
            pid=pid,
            name=name,
        )
    return xid(
        gpu,
        31,
        f"Ch {rng.randint(2, 0x30):08x}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_{rng.randint(0, 15)} "
        f"faulted @ {addr}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        pid=pid,
    )


def xid43(gpu: GPU, rng: Random, pid: int) -> str:
    return xid(gpu, 43, channel(rng), pid=pid)


# --- mlx5 / IB ----------------------------------------------------------------------------------------


def mlx5_link(hca: HCA, state: str) -> str:
    return f"mlx5_core {hca.bdf} {hca.name}: Port: {hca.port} Link {state}"


def mlx5_eth_link(hca: HCA, up: bool) -> str:
    return f"mlx5_core {hca.bdf} {hca.netdev}: Link {'up' if up else 'down'}"


def mlx5_module_error(hca: HCA, rng: Random, module: int | None = None) -> str:
    """mlx5_core's port module event (events.c: `module %u, %s, %s`): `module` is decimal; without it
    the bus digits of the HCA's address stand in (as the older modes always wrote)."""
    err = rng.choice(
        (
            "Bad or shorted cable/module",
            "High Temperature",
            "Bus stuck (I2C or data shorted)",
            "No EEPROM/retry timeout",
        )
    )
    number = str(module) if module is not None else hca.bdf[5:7].lstrip("0") or "0"
    return f"mlx5_core {hca.bdf}: Port module event[error]: module {number}, Cable error, {err}"


def mlx5_cmd_timeout(hca: HCA, rng: Random) -> str:
    cmd = rng.choice(
        (
            "QUERY_VPORT_COUNTER(0x770)",
            "DESTROY_EQ(0x302)",
            "ACCESS_REG(0x805)",
            "QUERY_Q_COUNTER(0x773)",
            "MODIFY_CQ(0x403)",
        )
    )
    return f"mlx5_core {hca.bdf}: wait_func_handle_exec_timeout:{rng.choice((1035, 1079, 1114))}:(pid {rng.randint(100, 99999)}): cmd[{rng.randint(0, 31)}]: {cmd} timeout. Will cause a leak of a command resource"


def mlx5_health(hca: HCA, rng: Random) -> list[str]:
    return [
        f"mlx5_core {hca.bdf}: poll_health:{rng.choice((800, 835))}:(pid 0): device's health compromised - reached miss count",
        f"mlx5_core {hca.bdf}: print_health_info:{rng.choice((420, 433))}:(pid 0): assert_var[0] 0x{rng.randint(0, 0xFFFFFFFF):08x}",
    ]
