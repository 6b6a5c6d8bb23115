"""The simulated cluster and job one scenario runs in: nodes, GPUs, HCAs, software stack, layout.

A `World` is drawn from a seeded `random.Random` and fixes everything that real clusters vary
and that a rule must not depend on: hostname style, node count, GPU platform and PCI addresses,
InfiniBand devices and IPs, clock skew per node, timezone, NCCL / PyTorch / driver / Slurm
versions, how the job was launched and where its output ended up. Scenario modules ask the world
for names and addresses; they never invent them. Nothing here writes files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from random import Random
from typing import Literal

Scheduler = Literal["slurm", "kubernetes"]
Platform = Literal["a100", "h100", "h200", "b200", "gb200"]
Launcher = Literal["srun_tasks", "srun_torchrun", "torchrun_pod"]
OutputLayout = Literal["merged", "split", "per_node", "pods"]
KernelFormat = Literal[
    "kernlog",
    "kernlog_uptime",
    "syslog",
    "syslog_uptime",
    "rsyslog_iso",
    "rfc5424",
    "dmesg_T",
    "dmesg_raw",
    "dmesg_iso",
    "journal_iso",
    "journal_precise",
    "journal_json",
]
PodLogStyle = Literal["plain", "cri", "timestamps"]
Framework = Literal["megatron", "torchtitan", "hf", "lightning", "ddp"]

# PCI bus numbers of the 8 GPUs on common baseboards (domain 0000, device 00).
_GPU_BUSES: dict[str, tuple[int, ...]] = {
    "a100": (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
    "h100": (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF),
    "h100_hgx": (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
    "h200": (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB),
    "b200": (0x17, 0x3D, 0x60, 0x70, 0x97, 0xBA, 0xDA, 0xEA),
}
_MODEL_NAME: dict[str, str] = {
    "a100": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
}
_TORCH_NCCL: dict[tuple[int, int], tuple[int, int, int]] = {
    (1, 9): (2, 7, 8),
    (1, 10): (2, 10, 3),
    (1, 12): (2, 10, 3),
    (1, 13): (2, 14, 3),
    (2, 0): (2, 14, 3),
    (2, 1): (2, 18, 1),
    (2, 2): (2, 19, 3),
    (2, 3): (2, 20, 5),
    (2, 4): (2, 20, 5),
    (2, 5): (2, 21, 5),
    (2, 6): (2, 21, 5),
    (2, 7): (2, 26, 2),
    (2, 8): (2, 27, 3),
    (2, 9): (2, 27, 5),
}
_TORCH_PATCH: dict[tuple[int, int], int] = {
    (1, 9): 1,
    (1, 10): 2,
    (1, 12): 1,
    (1, 13): 1,
    (2, 0): 1,
    (2, 1): 2,
    (2, 2): 2,
    (2, 3): 1,
    (2, 4): 1,
    (2, 5): 1,
    (2, 6): 0,
    (2, 7): 1,
    (2, 8): 0,
    (2, 9): 1,
}
_NEWER_NCCL: tuple[tuple[int, int, int], ...] = (
    (2, 19, 3),
    (2, 21, 5),
    (2, 23, 4),
    (2, 25, 1),
    (2, 26, 5),
    (2, 27, 7),
    (2, 28, 3),
    (2, 28, 9),
    (2, 29, 2),
)
_DRIVERS: dict[str, tuple[str, ...]] = {
    "a100": ("470.182.03", "525.147.05", "535.161.08", "550.90.07", "560.35.03", "570.124.06"),
    "h100": ("525.147.05", "535.183.01", "550.127.05", "560.35.03", "570.133.20", "575.57.08", "580.65.06"),
    "h200": ("550.127.05", "560.35.03", "570.133.20", "575.57.08", "580.65.06"),
    "b200": ("570.133.20", "575.57.08", "580.65.06", "590.44.01"),
    "gb200": ("570.148.08", "575.57.08", "580.82.07", "590.44.01"),
}
_SLURM_VERSIONS: tuple[tuple[int, int], ...] = (
    (22, 5),
    (23, 2),
    (23, 11),
    (24, 5),
    (24, 11),
    (25, 5),
    (25, 11),
)
_TIMEZONES: tuple[str, ...] = (
    "UTC",
    "UTC",
    "UTC",
    "UTC",
    "UTC",
    "America/Chicago",
    "America/Los_Angeles",
    "Europe/Paris",
    "Asia/Seoul",
    "America/New_York",
)
_CLUSTERS: tuple[str, ...] = (
    "eos",
    "helios",
    "orion",
    "kepler",
    "atlas",
    "selene-2",
    "polaris-ai",
    "nimbus",
    "gb-pod2",
    "titan-x",
)
_JOB_NAMES: tuple[str, ...] = (
    "llama-pretrain",
    "llama3-70b-sft",
    "gpt-moe-8x22b",
    "mixtral-ft",
    "vit-huge-jft",
    "dit-xl-512",
    "bert-large-mlm",
    "t5-xxl",
    "code-13b-pt",
    "rlhf-ppo-70b",
    "mamba-7b",
    "whisper-large-ft",
    "nemotron-340b",
    "deepseek-v3-repro",
    "olmo-32b",
    "qwen-72b-dpo",
)


def version(text: str) -> tuple[int, ...]:
    """Parse a dotted version such as ``"2.21.5"`` into a comparable tuple."""
    return tuple(int(p) for p in text.split("+", 1)[0].split(".") if p.isdigit())


@dataclass
class GPU:
    index: int
    pci: str  # "0000:9b:00": domain:bus:device as the driver prints it, lower case
    uuid: str

    @property
    def bdf(self) -> str:
        return f"{self.pci}.0"

    @property
    def bus_id(self) -> str:
        """The nvidia-smi / dcgm-exporter form, e.g. ``00000000:9B:00.0``."""
        dom, bus, dev = self.pci.split(":")
        return f"0000{dom}:{bus.upper()}:{dev}.0"

    @property
    def nccl_busid(self) -> str:
        dom, bus, _dev = self.pci.split(":")
        return f"{int(bus, 16):x}000" if dom == "0000" else f"{dom.lstrip('0')}{bus}000"


@dataclass
class HCA:
    name: str  # mlx5_3
    port: int
    bdf: str  # 0000:5c:00.0
    netdev: str  # ibp92s0 / ib3 / enp92s0np0
    ip: str
    guid: str


@dataclass
class Node:
    name: str
    index: int
    gpus: list[GPU]
    hcas: list[HCA]
    mgmt_ip: str
    boot_time: float
    skew: float
    kernel_format: KernelFormat
    pod: str = ""
    agent_pid: int = 0
    rank_pids: list[int] = field(default_factory=list)
    root_port: str = ""  # PCIe root port above GPU 0, "0000:98:01.0"

    @property
    def ib_ip(self) -> str:
        return self.hcas[0].ip

    def gpu_root_port(self, gpu: GPU) -> str:
        dom, bus, _ = gpu.pci.split(":")
        return f"{dom}:{max(int(bus, 16) - 3, 1):02x}:01.0"


@dataclass
class Stack:
    torch: tuple[int, int]
    torch_text: str
    nccl: tuple[int, int, int]
    driver: str
    cuda: str
    slurm: tuple[int, int]
    kernel: str
    python: str
    dcgm_exporter_lower_hostname: bool

    @property
    def nccl_text(self) -> str:
        return ".".join(str(p) for p in self.nccl)

    @property
    def driver_major(self) -> int:
        return int(self.driver.split(".")[0])


@dataclass
class World:
    """Everything about the cluster and job that stays fixed during one scenario."""

    seed: int
    rng: Random
    scheduler: Scheduler
    platform: Platform
    cluster: str
    job_id: str
    job_name: str
    user: str
    uid: int
    attempt: int
    nodes: list[Node]
    gpus_per_node: int
    tz: str
    stack: Stack
    launcher: Launcher
    output: OutputLayout
    srun_label: bool
    pod_log_style: PodLogStyle
    framework: Framework
    nccl_debug: str | None  # None (unset), "WARN", "INFO"
    timeout_ms: int
    heartbeat_s: int
    start: float
    master_port: int
    namespace: str
    k8s_kind: Literal["PyTorchJob", "JobSet"]
    kueue: bool
    python_site: str
    script: str
    ib_subnet: str
    # torchrun --tee 3: every worker line is prefixed "[default<local_rank>]:" (drawn from the seed's
    # hash, not the rng, so the rest of the world stays what it was)
    torchrun_tee: bool = False

    # ----------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def rank(self, node: Node, local: int) -> int:
        return node.index * self.gpus_per_node + local

    def node_of(self, rank: int) -> Node:
        return self.nodes[rank // self.gpus_per_node]

    def local_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def ranks_of(self, node: Node) -> range:
        return range(node.index * self.gpus_per_node, (node.index + 1) * self.gpus_per_node)

    def rank_map(self) -> dict[str, str]:
        return {
            n.name: f"{n.index * self.gpus_per_node}-{(n.index + 1) * self.gpus_per_node - 1}"
            for n in self.nodes
        }

    def rank_pid(self, rank: int) -> int:
        return self.node_of(rank).rank_pids[self.local_of(rank)]

    def task_id(self, rank: int) -> int:
        """The Slurm task id that printed this rank's output."""
        return rank if self.launcher == "srun_tasks" else rank // self.gpus_per_node

    @property
    def uses_torchrun(self) -> bool:
        return self.launcher != "srun_tasks"

    @property
    def master(self) -> Node:
        return self.nodes[0]

    def hostname(self, node: Node) -> str:
        """The name a node goes by inside the job, as NCCL, TCPStore and torchrun print it: its pod on Kubernetes."""
        return node.pod if self.scheduler == "kubernetes" else node.name

    def hostlist(self, names: list[str] | None = None) -> str:
        """Slurm's compressed hostlist expression, e.g. ``gpu-a[03-05,07]``."""
        return compress_hostlist(names if names is not None else [n.name for n in self.nodes])

    def uuid(self, *parts: object) -> str:
        h = hashlib.sha256(("|".join(str(p) for p in (self.seed, *parts))).encode()).hexdigest()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def hexid(self, n: int, *parts: object) -> str:
        return hashlib.sha256(("|".join(str(p) for p in (self.seed, *parts))).encode()).hexdigest()[:n]

    def model_name(self) -> str:
        return _MODEL_NAME[self.platform]


def compress_hostlist(names: list[str]) -> str:
    """Compress host names that share a prefix and a numeric suffix into Slurm's bracket form."""
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    order: list[tuple[str, str]] = []
    loose: list[str] = []
    for name in names:
        i = len(name)
        while i > 0 and name[i - 1].isdigit():
            i -= 1
        if i == len(name):
            loose.append(name)
            continue
        key = (name[:i], "")
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(name[i:]), len(name) - i))
    parts: list[str] = []
    for key in order:
        nums = sorted(set(groups[key]))
        if len(nums) == 1:
            num, width = nums[0]
            parts.append(f"{key[0]}{num:0{width}d}")
            continue
        ranges: list[str] = []
        run_start = prev = nums[0]
        for cur in [*nums[1:], (-2, 0)]:
            if cur[0] == prev[0] + 1 and cur[1] == prev[1]:
                prev = cur
                continue
            a = f"{run_start[0]:0{run_start[1]}d}"
            b = f"{prev[0]:0{prev[1]}d}"
            ranges.append(a if run_start == prev else f"{a}-{b}")
            run_start = prev = cur
        parts.append(f"{key[0]}[{','.join(ranges)}]")
    return ",".join(parts + loose)


# --------------------------------------------------------------------------------------------
# Drawing a world


def _hostnames(rng: Random, style: str, count: int, platform: str) -> list[str]:
    """`count` distinct host names of one style, allocated with realistic gaps."""
    names: list[str] = []
    if style == "ip":
        a, b = rng.randint(0, 31), rng.randint(0, 15)
        used: set[tuple[int, int]] = set()
        while len(names) < count:
            c, d = rng.randint(0, 63), rng.randint(2, 250)
            if (c, d) in used:
                continue
            used.add((c, d))
            names.append(f"ip-10-{a}-{b * 4 + c // 16}-{d}" if rng.random() < 0.5 else f"ip-10-{a}-{c}-{d}")
        return names
    width = 3 if count > 99 else 2
    start = rng.randint(1, 40)
    num = start
    nums: list[int] = []
    while len(nums) < count:
        nums.append(num)
        num += 1 if rng.random() < 0.85 else rng.randint(2, 4)
    letter = rng.choice("abcdefgh")
    pool = rng.choice(("a3mega", "a3ultra", "gpu"))
    for i, n in enumerate(nums):
        if style == "gpu":
            names.append(f"gpu-{letter}{n:0{width}d}")
        elif style == "node":
            names.append(f"node{n:03d}" if n < 1000 else f"node{n}")
        elif style == "worker":
            names.append(f"train-worker-{i}")
        elif style == "dgx":
            rack = 1 + (n - 1) // 8
            names.append(f"dgx-{platform}-r{rack:02d}-n{(n - 1) % 8 + 1:02d}")
        elif style == "gke":
            names.append(f"gke-{letter}3-pool-{pool}-{n:04d}")
        else:
            raise ValueError(style)
    if style == "gke":
        suffix = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(4))
        names = [f"{nm}-{suffix}" for nm in names]
    return names


def _node_count(rng: Random, nodes_max: int) -> int:
    options = [(2, 16), (4, 18), (8, 16), (16, 14), (32, 10), (64, 8), (128, 5), (256, 3), (512, 2)]
    allowed = [(n, w) for n, w in options if n <= nodes_max] or [(max(2, nodes_max), 1)]
    total = sum(w for _, w in allowed)
    pick = rng.uniform(0, total)
    n = allowed[-1][0]
    for size, w in allowed:
        pick -= w
        if pick <= 0:
            n = size
            break
    if n >= 4 and rng.random() < 0.35:  # odd allocations happen
        n = rng.randint(max(2, n // 2 + 1), n)
    return min(n, nodes_max)


def draw_world(
    rng: Random,
    seed: int,
    *,
    nodes_max: int,
    schedulers: tuple[Scheduler, ...] = ("slurm", "kubernetes"),
    platforms: tuple[Platform, ...] = ("a100", "h100", "h200", "b200", "gb200"),
    min_torch: tuple[int, int] = (1, 9),
    max_torch: tuple[int, int] = (2, 9),
    min_nodes: int = 2,
    max_nodes: int = 4096,
) -> World:
    scheduler: Scheduler = rng.choice(schedulers)
    platform: Platform = rng.choice(platforms)
    n_nodes = max(min_nodes, min(_node_count(rng, max(min_nodes, nodes_max)), max_nodes))
    gpn = 4 if platform == "gb200" else 8

    if scheduler == "slurm":
        style = rng.choice(("gpu", "gpu", "node", "node", "dgx", "ip"))
    else:
        style = rng.choice(("worker", "worker", "ip", "dgx", "gke"))
    if platform in ("b200", "gb200") and rng.random() < 0.6:
        style = "dgx"
    names = _hostnames(rng, style, n_nodes, platform)

    torch_choices = [v for v in _TORCH_NCCL if min_torch <= v <= max_torch]
    weights = [1 if v < (2, 0) else 3 for v in torch_choices]
    torch_v = rng.choices(torch_choices, weights=weights)[0]
    if platform in ("b200", "gb200") and torch_v < (2, 5):
        torch_v = max((v for v in torch_choices), default=torch_v)
    nccl_v = _TORCH_NCCL[torch_v]
    if rng.random() < 0.35:  # NGC containers ship a newer NCCL than the wheel
        newer = [v for v in _NEWER_NCCL if v > nccl_v]
        if newer:
            nccl_v = rng.choice(newer)
    if torch_v == (1, 9) and rng.random() < 0.5:
        nccl_v = (2, 8, 4)
    cuda = (
        "11.3"
        if torch_v < (1, 13)
        else "11.7"
        if torch_v < (2, 1)
        else "12.1"
        if torch_v < (2, 3)
        else "12.4"
        if torch_v < (2, 7)
        else "12.8"
    )
    torch_text = f"{torch_v[0]}.{torch_v[1]}.{_TORCH_PATCH[torch_v]}+cu{cuda.replace('.', '')}"
    driver = rng.choice(_DRIVERS[platform])
    stack = Stack(
        torch=torch_v,
        torch_text=torch_text,
        nccl=nccl_v,
        driver=driver,
        cuda=cuda,
        slurm=rng.choice(_SLURM_VERSIONS),
        kernel=rng.choice(
            (
                "5.15.0-119-generic",
                "5.15.0-1063-nvidia",
                "6.8.0-52-generic",
                "5.14.0-427.el9.x86_64",
                "4.18.0-513.24.1.el8_9.x86_64",
                "6.5.0-1024-oem",
                "6.8.0-1017-aws",
            )
        ),
        python=rng.choice(("3.10", "3.10", "3.11", "3.12")),
        dcgm_exporter_lower_hostname=rng.random() < 0.25,
    )

    # Start between 2024-02 and 2026-11, never across a new year (year-less syslog stays sane).
    while True:
        start = rng.uniform(1706745600, 1796083200)
        d = datetime.fromtimestamp(start, UTC)
        if not ((d.month == 12 and d.day > 18) or (d.month == 1 and d.day < 8)):
            break
    start = float(int(start))

    formats: tuple[KernelFormat, ...] = (
        "kernlog",
        "kernlog_uptime",
        "syslog",
        "syslog_uptime",
        "rsyslog_iso",
        "rfc5424",
        "dmesg_T",
        "dmesg_raw",
        "dmesg_iso",
        "journal_iso",
        "journal_precise",
        "journal_json",
    )
    main_fmt: KernelFormat = rng.choice(formats)
    mixed = rng.random() < 0.15
    subnet = f"10.{rng.choice((10, 12, 20, 33, 100, 224))}"
    hca_count = 8 if platform != "gb200" else 4
    hca_buses = (0x0C, 0x1A, 0x2B, 0x3C, 0x5C, 0x8D, 0xA4, 0xBE, 0xCC, 0xE1)
    buses = _GPU_BUSES[
        "h100_hgx"
        if platform == "h100" and rng.random() < 0.5
        else ("h200" if platform == "h200" else platform if platform in _GPU_BUSES else "b200")
    ]
    nodes: list[Node] = []
    skew_nodes = set(rng.sample(range(n_nodes), k=min(n_nodes, rng.choice((0, 1, 1, 2, 3)))))
    netdev_style = rng.choice(("ibp", "ib", "roce"))
    for i, name in enumerate(names):
        if platform == "gb200":
            gpus = [GPU(g, f"{('0008', '0009', '0018', '0019')[g]}:01:00", "") for g in range(4)]
        else:
            gpus = [GPU(g, f"0000:{buses[g]:02x}:00", "") for g in range(gpn)]
        for g in gpus:
            h = hashlib.sha256(f"{seed}|{name}|{g.index}".encode()).hexdigest()
            g.uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        hcas: list[HCA] = []
        for h_i in range(hca_count):
            bus = hca_buses[h_i]
            if netdev_style == "ibp":
                nd = f"ibp{bus}s0"
            elif netdev_style == "ib":
                nd = f"ib{h_i}"
            else:
                nd = f"enp{bus}s0np0"
            ip = (
                f"{subnet}.{h_i * 16 + i // 250}.{i % 250 + 2}"
                if n_nodes > 250
                else f"{subnet}.{h_i}.{i + 2}"
            )
            guid = hashlib.sha256(f"{seed}|{name}|hca{h_i}".encode()).hexdigest()[:16]
            hcas.append(HCA(f"mlx5_{h_i}", 1, f"0000:{bus:02x}:00.0", nd, ip, guid))
        skew = 0.0
        if i in skew_nodes:
            skew = rng.choice((-1, 1)) * rng.uniform(1.2, 6.0)
        elif rng.random() < 0.3:
            skew = rng.uniform(-0.4, 0.4)
        fmt = rng.choice(formats) if mixed else main_fmt
        mgmt = (
            name[3:].replace("-", ".")
            if name.startswith("ip-")
            else f"172.{16 + i // 250}.{rng.randint(0, 9)}.{i % 250 + 2}"
        )
        node = Node(
            name=name,
            index=i,
            gpus=gpus,
            hcas=hcas,
            mgmt_ip=mgmt,
            boot_time=start - rng.uniform(3600 * 5, 86400 * 60),
            skew=round(skew, 3),
            kernel_format=fmt,
        )
        node.agent_pid = rng.randint(2000, 400000)
        node.rank_pids = [node.agent_pid + 30 + k * rng.randint(1, 3) for k in range(gpn)]
        node.root_port = node.gpu_root_port(gpus[0])
        nodes.append(node)

    if scheduler == "slurm":
        launcher: Launcher = rng.choice(("srun_tasks", "srun_torchrun", "srun_torchrun"))
        output: OutputLayout = rng.choice(("merged", "merged", "split", "per_node"))
        if n_nodes > 32:
            output = rng.choice(("merged", "split"))
    else:
        launcher = "torchrun_pod"
        output = "pods"
    job_id = str(rng.randint(100000, 9999999)) if scheduler == "slurm" else ""
    job_name = rng.choice(_JOB_NAMES)
    if scheduler == "kubernetes":
        job_id = f"{job_name}-{rng.choice(('', 'run', 'exp'))}{rng.randint(1, 999)}".replace("--", "-")
    k8s_kind: Literal["PyTorchJob", "JobSet"] = rng.choice(("PyTorchJob", "JobSet"))
    for node in nodes:
        if scheduler == "kubernetes":
            if k8s_kind == "PyTorchJob":
                node.pod = f"{job_id}-master-0" if node.index == 0 else f"{job_id}-worker-{node.index - 1}"
            else:
                sfx = hashlib.sha256(f"{seed}|{node.name}|pod".encode()).hexdigest()[:5]
                node.pod = f"{job_id}-workers-0-{node.index}-{sfx}"
    world = World(
        seed=seed,
        rng=rng,
        scheduler=scheduler,
        platform=platform,
        cluster=rng.choice(_CLUSTERS),
        job_id=job_id,
        job_name=job_name,
        user=rng.choice(("alice", "bchen", "mlops", "rkumar", "svc-train", "jdoe", "tmueller", "yuki")),
        uid=rng.randint(1001, 65000),
        attempt=rng.choice((0, 0, 0, 0, 1, 2)),
        nodes=nodes,
        gpus_per_node=gpn,
        tz=rng.choice(_TIMEZONES),
        stack=stack,
        launcher=launcher,
        output=output,
        srun_label=scheduler == "slurm" and rng.random() < 0.3,
        pod_log_style=rng.choice(("plain", "cri", "timestamps")),
        framework=rng.choice(("megatron", "megatron", "torchtitan", "hf", "lightning", "ddp")),
        nccl_debug=rng.choice((None, "WARN", "INFO", "INFO")),
        timeout_ms=rng.choice((600000, 600000, 600000, 1800000, 1200000, 300000)),
        heartbeat_s=rng.choice((480, 480, 600)),
        start=start,
        master_port=rng.choice((29500, 29500, 29400, 6000, 12355)),
        namespace=rng.choice(("training", "ml-research", "default", "team-llm", "kubeflow")),
        k8s_kind=k8s_kind,
        kueue=scheduler == "kubernetes" and rng.random() < 0.6,
        python_site=rng.choice(
            ("/usr/local/lib/python{py}/dist-packages", "/opt/conda/lib/python{py}/site-packages")
        ),
        script=rng.choice(
            ("/workspace/train.py", "pretrain_gpt.py", "/opt/src/train_llm.py", "train.py", "-m trainer.main")
        ),
        ib_subnet=subnet,
    )
    world.python_site = world.python_site.format(py=stack.python)
    world.torchrun_tee = (
        world.uses_torchrun and int(hashlib.sha256(f"{seed}|tee".encode()).hexdigest()[:8], 16) % 4 == 0
    )
    if world.stack.torch < (2, 2) and world.framework == "torchtitan":
        world.framework = "megatron"
    return world
