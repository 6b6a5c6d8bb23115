"""One scenario being written: routing of output to files, the cascade that follows a fault, and truth.

A `Scenario` owns the `World`, the in-memory `Bundle` and the ground truth. Failure-mode modules
(`bench.scenarios.*`) script the root fault and call the helpers here for what every failure has
in common: the healthy run before it, NCCL errors on peers, watchdog timeouts, torchrun / srun /
Kubernetes teardown, and the scheduler's final record. The helpers write collateral as real
stacks do, so they add collateral descriptions to the truth; they never decide the label.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from random import Random
from typing import Any

import yaml

from bench import kube, nccl, pytorch, slurm
from bench.timeline import Bundle, Clock, Entry, LineFn, Stream, Text
from bench.training import (
    Plan,
    benign_c10d_warning,
    checkpoint_lines,
    make_plan,
    progress_line,
    startup_lines,
)
from bench.world import HCA, Node, Platform, Scheduler, World
from hypocenter.model import COMPONENT_KINDS

OUTCOMES = ("attributed", "ambiguous", "unattributed", "not_failed")
DOMAINS = ("hardware", "network", "storage", "software", "resource", "external", "ambiguous")
SUBDOMAINS = (
    "gpu",
    "gpu_memory",
    "gpu_firmware",
    "nvlink",
    "host",
    "fabric",
    "nic",
    "filesystem",
    "user_code",
    "configuration",
    "hang",
    "gpu_oom",
    "host_oom",
    "time_limit",
    "preemption",
    "cancellation",
    "maintenance",
    "ambiguous",
)
_KERNEL_FILE = {
    "kernlog": "kern.log",
    "kernlog_uptime": "kern.log",
    "syslog": "syslog",
    "syslog_uptime": "messages",
    "rsyslog_iso": "syslog",
    "rfc5424": "syslog.log",
    "dmesg_T": "dmesg-T.txt",
    "dmesg_raw": "dmesg",
    "dmesg_iso": "dmesg.log",
    "journal_iso": "journal.txt",
    "journal_precise": "journalctl.log",
    "journal_json": "journal.json",
}


@dataclass(frozen=True)
class Mode:
    """A failure mode: its label, its share under the real-world prior, and the constraints on its world."""

    id: str
    outcome: str
    domain: str | None
    subdomain: str | None
    weight: float
    build: Callable[[Scenario], None]
    summary: str
    schedulers: tuple[Scheduler, ...] = ("slurm", "kubernetes")
    platforms: tuple[Platform, ...] = ("a100", "h100", "h200", "b200", "gb200")
    min_torch: tuple[int, int] = (1, 9)
    max_nodes: int = 4096


@dataclass
class Truth:
    mode: str
    seed: int
    outcome: str
    domain: str | None
    subdomain: str | None
    nodes: list[str] = field(default_factory=list)
    components: list[dict[str, str]] = field(default_factory=list)
    root_event: dict[str, str] | None = None
    collateral: list[str] = field(default_factory=list)
    distractors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "seed": self.seed,
            "outcome": self.outcome,
            "domain": self.domain,
            "subdomain": self.subdomain,
            "nodes": sorted(set(self.nodes)),
            "components": sorted(self.components, key=lambda c: (c["node"], c["kind"], c["id"])),
            "root_event": self.root_event,
            "collateral": list(dict.fromkeys(self.collateral)),
            "distractors": list(dict.fromkeys(self.distractors)),
        }


@dataclass
class Exit:
    t: float
    code: int  # torchrun convention: 1 exception, -6 SIGABRT, -9 SIGKILL, -15 SIGTERM
    traceback: list[str] | None = None


class Scenario:
    """The bundle under construction for one failure mode, plus its ground truth."""

    def __init__(
        self, mode: str, outcome: str, domain: str | None, subdomain: str | None, world: World, seed: int
    ) -> None:
        self.w = world
        self.rng: Random = world.rng
        self.clock = Clock(world.tz)
        self.bundle = Bundle(self.clock, world.stack.kernel, world.platform)
        self.truth = Truth(mode=mode, seed=seed, outcome=outcome, domain=domain, subdomain=subdomain)
        self.exits: dict[int, Exit] = {}
        self.lost_nodes: dict[str, float] = {}
        self.unkillable: set[int] = set()
        self.kernel_logs = True
        self.forbid: set[str] = set()
        self.state = "FAILED"
        self.exit_code: int | None = 1
        self.reason: str | None = None
        self.end: float = world.start
        self.kill_on_bad_exit = self.rng.random() < 0.55
        self.plan: Plan = make_plan(world, self.rng, world.start + self.rng.uniform(40, 240))
        self.ran_until: float = self.plan.t_begin
        self.op = self.rng.choice(
            ("ALLREDUCE", "ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "BROADCAST", "ALLGATHER")
        )
        self.numel = self.rng.choice((1, 112, 9801523, 131334144, 262668288, 33554432))
        self.compact = world.world_size > 256
        self.oom_tasks: set[int] = set()
        # How srun reports an OOM-killed task: "Out Of Memory" when slurmstepd saw the cgroup's oom_kill
        # (launch.c, SIG_OOM), plain "Killed" (strsignal(SIGKILL)) when it did not (the kernel's global
        # OOM killer, older Slurm); the scheduler's oom_kill line and OUT_OF_MEMORY state tell which.
        self.oom_word = "Out Of Memory"
        self.env: dict[str, str] = {}
        self.signalled_agents: set[str] = set()
        # The true timeline the cost of the failure is scored against (bench/cost.py): when the fault
        # began (the first fault_time drawn), and each checkpoint saved (iteration, when it was durable).
        self.fault_at: float | None = None
        self.checkpoints: list[tuple[int, float]] = []

    # ---------------------------------------------------------------------------------------------
    # Streams

    def kstream(self, node: Node) -> Stream:
        fmt = node.kernel_format
        s = self.bundle.stream(f"logs/{node.name}/{_KERNEL_FILE[fmt]}", "system", node=node, fmt=fmt)
        if fmt == "dmesg_raw":
            s.anchor_boot = True
        return s

    @property
    def protected(self) -> set[str]:
        """Paths of the streams holding root-cause evidence (a `key` entry): distractors never drop them."""
        return {path for path, s in self.bundle.streams.items() if s.has_key()}

    def job_stream(self, err: bool = True) -> Stream:
        w = self.w
        if w.scheduler != "slurm":
            raise ValueError("job stream only exists on Slurm")
        name = f"slurm-{w.job_id}.{'err' if err and w.output == 'split' else 'out'}"
        return self.bundle.stream(f"logs/_job/{name}", "app")

    def node_stream(self, node: Node, err: bool = True) -> Stream:
        """Where the output of processes on `node` (ranks, torchrun agent) lands."""
        w = self.w
        if w.output == "pods":
            return self.bundle.stream(
                f"logs/{node.name}/{node.pod}.log", "app", node=node, pod_style=w.pod_log_style
            )
        if w.output == "per_node":
            return self.bundle.stream(
                f"logs/{node.name}/{w.job_name}-{w.job_id}-{node.name}.out", "app", node=node
            )
        return self.job_stream(err)

    def rank_stream(self, rank: int, err: bool = True) -> Stream:
        return self.node_stream(self.w.node_of(rank), err)

    # ---------------------------------------------------------------------------------------------
    # Emitting

    def _add(self, stream: Stream, t: float, text: Text, **kw: Any) -> Entry:
        if stream.node is None and stream.kind == "app":
            # merged job logs: the line carries the clock of the node that wrote it
            node = kw.pop("writer", None)
            if node is not None and callable(text):
                fn = text
                skew = node.skew
                text = lambda d, fn=fn, skew=skew: fn(datetime.fromtimestamp(d.timestamp() + skew, d.tzinfo))  # noqa: E731
        else:
            kw.pop("writer", None)
        return self.bundle.add(stream, t, text, **kw)

    def kernel(
        self,
        node: Node,
        t: float,
        lines: str | Sequence[str],
        *,
        key: bool = False,
        level: str = "err",
        ident: str = "kernel",
        pid: int | None = None,
        gap: float = 0.000013,
    ) -> float:
        if isinstance(lines, str):
            lines = [lines]
        lost = self.lost_nodes.get(node.name)
        if lost is not None and t > lost + 1.0:
            return t  # a dead node writes nothing
        s = self.kstream(node)
        for i, line in enumerate(lines):
            self.bundle.add(s, t + i * gap, line, ident=ident, pid=pid, level=level, key=key)
        return t + len(lines) * gap

    def daemon(
        self,
        node: Node,
        t: float,
        ident: str,
        text: str,
        *,
        pid: int | None = None,
        level: str = "info",
        key: bool = False,
    ) -> None:
        lost = self.lost_nodes.get(node.name)
        if lost is not None and t > lost:
            return
        self.bundle.add(
            self.kstream(node),
            t,
            text,
            ident=ident,
            pid=pid if pid is not None else 1000 + zlib.crc32(ident.encode()) % 7 * 311,
            level=level,
            key=key,
        )

    def out(self, rank: int, t: float, text: Text, *, err: bool = True, key: bool = False) -> None:
        self.node_out(self.w.node_of(rank), t, text, err=err, key=key)

    def node_out(self, node: Node, t: float, text: Text, *, err: bool = True, key: bool = False) -> None:
        lost = self.lost_nodes.get(node.name)
        if lost is not None and t > lost:
            return
        self._add(self.node_stream(node, err), t, text, writer=node, level="err" if err else "info", key=key)

    def srun(self, t: float, text: str, *, err: bool = True, key: bool = False) -> None:
        self.bundle.add(self.job_stream(err), t, text, level="err", key=key)

    def local(self, t: float, node: Node | None = None) -> datetime:
        return self.clock.local(t, node)

    @staticmethod
    def utc(t: float) -> str:
        """A true time for truth descriptions (never skewed, always UTC)."""
        return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%SZ")

    # ---------------------------------------------------------------------------------------------
    # Truth

    def culprit(
        self,
        nodes: Iterable[Node | str],
        components: Iterable[tuple[Node, str, str] | tuple[Node, str, str, list[str]]] = (),
    ) -> None:
        """The culprit nodes and components. Component kinds are the engine's (COMPONENT_KINDS); a
        component's other names (a NIC's PCI address and netdev) go in `aliases`: any of them is a hit."""
        self.truth.nodes = sorted(
            {n if isinstance(n, str) else n.name for n in nodes} | set(self.truth.nodes)
        )
        for node, kind, cid, *more in components:
            assert kind in COMPONENT_KINDS, f"component kind {kind!r} is not one of {COMPONENT_KINDS}"
            comp: dict[str, Any] = {"node": node.name, "kind": kind, "id": cid}
            if more and more[0]:
                comp["aliases"] = sorted(more[0])
            if comp not in self.truth.components:
                self.truth.components.append(comp)

    @staticmethod
    def hca_component(node: Node, hca: HCA, kind: str) -> tuple[Node, str, str, list[str]]:
        """An HCA as a culprit `port` (mlx5_N/P) or `nic` (mlx5_N), with the names logs may give it instead."""
        bdf = hca.bdf.rsplit(".", 1)[0].lower()
        if kind == "port":
            return (node, "port", f"{hca.name}/{hca.port}", [hca.netdev, f"{hca.netdev}/{hca.port}"])
        return (node, "nic", hca.name, [bdf, hca.netdev])

    def root_event(self, node: Node | None, path: str, text: str) -> None:
        if self.truth.root_event is None:
            self.truth.root_event = {"node": node.name if node else "", "file": path, "text": text}

    def root_kernel(
        self, node: Node, t: float, lines: str | Sequence[str], *, root_line: int = 0, level: str = "err"
    ) -> float:
        lst = [lines] if isinstance(lines, str) else list(lines)
        end = self.kernel(node, t, lst, key=True, level=level)
        self.root_event(node, self.kstream(node).path, lst[root_line])
        return end

    def collateral(self, text: str) -> None:
        self.truth.collateral.append(text)

    def distractor(self, text: str) -> None:
        self.truth.distractors.append(text)

    # ---------------------------------------------------------------------------------------------
    # The healthy part of the run

    def begin(self, *, startup: bool = True) -> None:
        """Launch lines, communicator init and startup output, up to the first iteration."""
        w, rng = self.w, self.rng
        t0 = w.start
        if w.scheduler == "slurm":
            echo = [
                f"Starting job {w.job_id} ({w.job_name}) on {w.hostlist()} at {self.local(t0 + 1):%a %b %d %H:%M:%S %Z %Y}",
                f"MASTER_ADDR={w.master.name} MASTER_PORT={w.master_port} WORLD_SIZE={w.world_size}",
            ]
            env = [
                f"NCCL_IB_TIMEOUT={rng.choice((20, 22, 23))}",
                f"NCCL_SOCKET_IFNAME={self.env.get('NCCL_SOCKET_IFNAME', nccl.oob_interface(w.master))}",
            ]
            if w.nccl_debug:
                env.append(f"NCCL_DEBUG={w.nccl_debug}")
            if rng.random() < 0.6 or self.env:
                echo.append(" ".join(env))
            for i, line in enumerate(echo):
                self.srun(t0 + 1 + i * 0.01, line, err=False)
            if w.uses_torchrun:
                for node in w.nodes[: min(len(w.nodes), 64)]:
                    self.node_out(node, t0 + rng.uniform(2, 8), self._torchrun_start(node))
        else:
            for node in w.nodes:
                self.node_out(node, t0 + rng.uniform(1, 10), self._torchrun_start(node))
        if not startup:
            return
        t_init = t0 + rng.uniform(15, 35)
        if rng.random() < 0.3:
            r = rng.randrange(w.world_size)
            self.out(r, t_init - rng.uniform(2, 8), benign_c10d_warning(w, r, rng))
        if w.nccl_debug == "INFO":
            ranks = (
                list(range(w.world_size))
                if w.world_size <= 64
                else sorted({0, *rng.sample(range(w.world_size), 32)})
            )
            comm = f"0x{w.hexid(12, 'comm')}"
            for r in ranks:
                node = w.node_of(r)
                tr = t_init + rng.uniform(0, 6)
                for j, line in enumerate(nccl.init_lines(w, node, r, rng, comm)):
                    self.out(r, tr + j * 0.002, line)
        for j, fn in enumerate(startup_lines(w, rng)):
            self.out(0, self.plan.t_begin - 10 + j * 0.3, fn, err=False)
        if rng.random() < 0.4:
            r = rng.randrange(w.world_size)
            from bench.training import BENIGN_WARNINGS

            self.out(
                r,
                self.plan.t_begin - 3,
                f"{pytorch.script_path(w)}:{rng.randint(40, 400)}: {rng.choice(BENIGN_WARNINGS)}",
            )

    def _torchrun_start(self, node: Node) -> LineFn:
        w = self.w

        def render(d: datetime) -> str:
            if w.stack.torch >= (2, 3):
                return (
                    f"W{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {node.agent_pid} torch/distributed/run.py:793] \n"
                    f"W{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {node.agent_pid} torch/distributed/run.py:793] *****************************************\n"
                    f"W{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {node.agent_pid} torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable "
                    "for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance "
                    "in your application as needed. \n"
                    f"W{d:%m%d} {d:%H:%M:%S}.{d.microsecond:06d} {node.agent_pid} torch/distributed/run.py:793] *****************************************"
                )
            return (
                "*****************************************\nSetting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
                "to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. \n"
                "*****************************************"
            )

        return render

    def train(
        self, until: float, *, slow: float = 1.0, from_t: float | None = None, key_last: bool = False
    ) -> int:
        """Rank 0's progress lines from the last reported point up to `until`; returns the last iteration.

        `key_last` marks the final progress line as evidence (progress right up to the end)."""
        w, rng, plan = self.w, self.rng, self.plan
        t = from_t if from_t is not None else self.ran_until
        it = plan.iteration_at(t)
        it = (it // plan.log_every + 1) * plan.log_every
        last = plan.iteration_at(t)
        last_entry: Entry | None = None
        while True:
            tt = plan.time_of(it)
            if slow != 1.0 and from_t is not None:
                tt = from_t + (tt - from_t) * slow
            if tt > until:
                break
            s = self.rank_stream(0, err=False)
            last_entry = self._add(
                s, tt, progress_line(w, plan, it, rng, slow), writer=w.node_of(0), level="info"
            )
            secs = rng.uniform(15, 90)
            if it % plan.ckpt_every == 0 and it > 0 and tt + secs < until:
                a, b = checkpoint_lines(w, it, rng, secs)
                self.out(0, tt + 0.5, a, err=False)
                self.out(0, tt + 0.5 + secs, b, err=False)
                self.checkpoints.append((it, tt + 0.5 + secs))
            last = it
            it += plan.log_every
        if key_last and last_entry is not None:
            last_entry.key = True
        self.ran_until = max(self.ran_until, until)
        return last

    def fault_time(self, lo: float = 600.0, hi: float = 5 * 3600.0) -> float:
        t = self.plan.t_begin + self.rng.uniform(lo, hi)
        if self.fault_at is None:
            self.fault_at = t
        return t

    def cost_truth(self) -> dict[str, Any]:
        """The true cost of the failure: GPUs, lost work (the last checkpoint saved before the fault, or the
        training start it resumed from), time to detect (fault → end) and startup (start → training).
        Lost work and time to detect are null for a mode that draws no fault time."""
        w = self.w
        startup = self.plan.t_begin - w.start
        out: dict[str, Any] = {
            "gpus": w.world_size,
            "checkpoint_interval_steps": self.plan.ckpt_every,
            "startup_s": round(startup, 3),
            "lost_work_s": None,
            "time_to_detect_s": None,
            "gpu_hours_lost": None,
        }
        if self.fault_at is None or self.state in ("COMPLETED", "SUCCEEDED"):
            return out
        saved = [t for _, t in self.checkpoints if t <= self.fault_at]
        durable = saved[-1] if saved else self.plan.t_begin
        lost = self.fault_at - durable
        detect = max(0.0, self.end - self.fault_at)
        out.update(
            lost_work_s=round(lost, 3),
            time_to_detect_s=round(detect, 3),
            gpu_hours_lost=round(w.world_size * (lost + detect) / 3600.0, 4),
        )
        return out

    # ---------------------------------------------------------------------------------------------
    # Collateral that follows a fault

    def alive(self, ranks: Iterable[int] | None = None) -> list[int]:
        pool = range(self.w.world_size) if ranks is None else ranks
        return [r for r in pool if r not in self.exits and self.w.node_of(r).name not in self.lost_nodes]

    def exit(self, rank: int, t: float, code: int, traceback: list[str] | None = None) -> None:
        if rank not in self.exits:
            self.exits[rank] = Exit(t, code, traceback)

    def crash(
        self,
        rank: int,
        t: float,
        exc_frames: Sequence[pytorch.Frame],
        exc: Sequence[str],
        *,
        key: bool = True,
        code: int = 1,
    ) -> str:
        """A Python exception on one rank; returns the exception's last line (for the truth)."""
        text = pytorch.py_exception(self.w, rank, exc_frames, exc)
        self.out(rank, t, text, key=key)
        self.exit(rank, t + self.rng.uniform(0.05, 0.6), code, pytorch.traceback_lines(exc_frames, exc))
        return exc[0]

    def timeouts(
        self,
        t_stall: float,
        *,
        waiting: Iterable[int] | None = None,
        lagging: dict[int, int] | None = None,
        wedged: Iterable[int] = (),
        seq: int | None = None,
        op: str | None = None,
        ops: dict[int, str] | None = None,
        key_ranks: Iterable[int] = (),
    ) -> float:
        """Watchdog timeouts on every rank that enqueued the stuck collective; returns the first one's time."""
        w, rng = self.w, self.rng
        seq = seq if seq is not None else self.plan.seq_at(t_stall)
        op = op or self.op
        lagging = lagging or {}
        wedged_set = set(wedged)
        keys = set(key_ranks)
        pool = self.alive(waiting)
        t_first = t_stall + w.timeout_ms / 1000 + 30.0
        first_rank = None
        base = t_stall + w.timeout_ms / 1000
        for r in pool:
            if r in lagging:
                continue
            if r in wedged_set:
                if w.stack.torch >= (2, 3) and w.heartbeat_s < w.timeout_ms / 1000:
                    th = t_stall + w.heartbeat_s + rng.uniform(0.5, 5)
                    self.out(r, th, pytorch.heartbeat_stuck(w, r))
                    self.exit(r, th + rng.uniform(1, 4), -6)
                continue
            tr = base + rng.uniform(0.001, 2.5)
            if tr < t_first:
                t_first, first_rank = tr, r
        for r in pool:
            if r in lagging or r in wedged_set:
                continue
            tr = base + rng.uniform(0.001, 2.5) if r != first_rank else t_first
            ran = w.timeout_ms + int((tr - base) * 1000) + rng.randint(3, 60)
            enq = seq + rng.choice((0, 0, 0, 1, 2))
            fn = pytorch.watchdog_timeout(
                w,
                r,
                seq,
                (ops or {}).get(r, op),
                self.numel,
                ran,
                enq,
                seq - 1,
                rng,
                first_to_dump=r == first_rank,
            )
            if self.compact:
                fn = _first_lines(fn, 2)
            self.out(r, tr, fn, key=r in keys)
            self.exit(r, tr + rng.uniform(0.2, 1.5), -6)
        if w.stack.torch >= (2, 4) and first_rank is not None:
            for r, enq in lagging.items():
                if r in self.exits:
                    continue
                self.out(
                    r,
                    t_first + rng.uniform(0.3, 3),
                    pytorch.dump_signal_received(w, r, first_rank, enq, enq),
                    key=True,
                )
        n = len([r for r in pool if r not in lagging and r not in wedged_set])
        if n:
            self.collateral(f"NCCL watchdog timeouts on {n} ranks (SeqNum={seq}, OpType={op})")
        return t_first

    def ib_errors(
        self,
        t: float,
        target: Node,
        reporters: Iterable[int],
        *,
        status: int = 12,
        spread: float = 25.0,
        target_hca: HCA | None = None,
    ) -> int:
        """Peers whose QPs to `target` time out: `NET/IB : Got completion from peer <target ip> … status=12`.

        Rail-optimised fabrics connect HCA i only to HCA i of other nodes, so a reporter names the
        target's HCA on its own rail; with `target_hca` only the ranks on that rail report."""
        w, rng = self.w, self.rng
        if w.nccl_debug is None:
            return 0
        pool = self.alive(reporters)
        if target_hca is not None:
            rail = target.hcas.index(target_hca)
            pool = [r for r in pool if w.local_of(r) % len(target.hcas) == rail] or [
                w.rank(w.node_of(r), rail % w.gpus_per_node) for r in pool[:2]
            ]
        count = 0
        for r in self.alive(sorted(set(pool))):
            node = w.node_of(r)
            tr = t + rng.uniform(0, spread)
            lines = [
                nccl.ib_completion(
                    w, node, r, target, status=status, direction=rng.choice(("Send", "Recv")), rng=rng
                )
            ]
            hint = nccl.ib_hint(w, node, r, status)
            if hint:
                lines.append(hint)
            if w.nccl_debug == "INFO":
                lines += nccl.breadcrumbs(w, node, r, 6)
            self.out(r, tr, "\n".join(lines))
            count += 1
        if count:
            self.collateral(
                f"NET/IB completion errors status={status} on {count} ranks toward {target.name} ({target.ib_ip})"
            )
        return count

    def socket_errors(self, t: float, dead: Node, reporters: Iterable[int]) -> int:
        w, rng = self.w, self.rng
        if w.nccl_debug is None:
            return 0
        count = 0
        dead_local = [w.local_of(r) for r in w.ranks_of(dead) if r in self.exits]
        reporters = list(reporters) + [r for r in w.ranks_of(dead) if r not in self.exits][:3]
        for r in self.alive(reporters):
            node = w.node_of(r)
            if node is dead:
                if w.nccl_debug != "INFO" or not dead_local:
                    continue
                lines = [nccl.service_thread_closed(w, node, r, dead_local[0])]
            else:
                lines = [nccl.socket_closed(w, node, r, dead, rng)]
                if rng.random() < 0.3:
                    lines.append(
                        nccl.proxy_failed(w, node, r, w.rank(dead, dead_local[0] if dead_local else 0))
                    )
            if w.nccl_debug == "INFO":
                lines += nccl.breadcrumbs(w, node, r, 6)[:1]
            self.out(r, t + rng.uniform(0.2, 4.0), "\n".join(lines))
            count += 1
        if count:
            self.collateral(f"NCCL 'Connection closed by remote peer' on {count} ranks")
        return count

    def remote_errors(
        self, t: float, ranks: Iterable[int], last_error: str | None, *, code: int = 6, spread: float = 8.0
    ) -> int:
        """DistBackendError raised in Python on peers whose communicator failed (exit 1)."""
        w, rng = self.w, self.rng
        n = 0
        for r in self.alive(ranks):
            tr = t + rng.uniform(0.1, spread)
            exc = pytorch.nccl_error_exc(w, code, last_error)
            frames = pytorch.train_frames(w, rng) + pytorch.collective_frames(w, self.op)
            self.out(r, tr, pytorch.py_exception(w, r, frames, exc))
            self.exit(r, tr + rng.uniform(0.05, 0.5), 1, None)
            n += 1
        if n:
            self.collateral(f"DistBackendError (NCCL error {code}) on {n} ranks")
        return n

    def peers_of(self, node: Node, count: int | None = None) -> list[int]:
        """Ranks on other nodes that talk to `node` directly (ring neighbours, tree parents)."""
        w = self.w
        others = [n for n in w.nodes if n.name != node.name]
        if not others:
            return []
        k = len(others) if count is None else min(len(others), count)
        i = node.index
        near = sorted(others, key=lambda n: min((n.index - i) % len(w.nodes), (i - n.index) % len(w.nodes)))[
            :k
        ]
        ranks: list[int] = []
        for n in near:
            ranks += self.rng.sample(list(w.ranks_of(n)), k=self.rng.randint(1, min(4, w.gpus_per_node)))
        return sorted(ranks)

    def after_crash(self, t: float, dead_ranks: Sequence[int], *, hang_p: float = 0.3) -> float:
        """What the rest of the job does after some ranks died: fast remote errors, or a hang until the watchdog."""
        w, rng = self.w, self.rng
        dead_node = w.node_of(dead_ranks[0])
        if self.kill_on_bad_exit and w.scheduler == "slurm":
            return t
        if rng.random() < hang_p:
            self.socket_errors(t, dead_node, self.peers_of(dead_node, 2))
            return self.timeouts(t)
        peers = self.peers_of(dead_node, 3)
        self.socket_errors(t, dead_node, peers)
        if w.stack.torch >= (2, 0):
            self.remote_errors(
                t + 1,
                peers,
                f"socketProgress: Connection closed by remote peer {w.hostname(dead_node)}<{rng.randint(32768, 60999)}>"
                if w.stack.nccl >= (2, 19, 0)
                else None,
            )
        return self.timeouts(t, seq=self.plan.seq_at(t)) if rng.random() < 0.5 else t + rng.uniform(5, 30)

    # ---------------------------------------------------------------------------------------------
    # Teardown and the scheduler's record

    def teardown(self, t: float, *, signal_all: int = -15) -> float:
        """Launchers stop what is left after the first failure; returns the job's end time."""
        w, rng = self.w, self.rng
        failed = sorted((e.t, r) for r, e in self.exits.items() if e.code != 0)
        t_first = failed[0][0] if failed else t
        t_kill = max(t, t_first) + rng.uniform(1, 8)
        for r in self.alive():
            if r in self.unkillable:
                continue
            self.exit(r, t_kill + rng.uniform(0, 1.5), signal_all)
        if w.uses_torchrun:
            for node in w.nodes:
                if node.name in self.lost_nodes:
                    continue
                self._torchrun_teardown(node)
        t_end = max([e.t for e in self.exits.values()] + [t_kill]) + rng.uniform(2, 20)
        if w.scheduler == "slurm":
            t_end = self._srun_teardown(t_end)
        self.end = max(self.end, t_end)
        return self.end

    def _torchrun_teardown(self, node: Node) -> None:
        w, rng = self.w, self.rng
        local = [(self.exits[r].t, r) for r in w.ranks_of(node) if r in self.exits]
        if not local:
            return
        local.sort()
        own = [(tt, r) for tt, r in local if self.exits[r].code != -15]
        if not own:
            self.agent_signalled(node, local[0][0] - 0.2)
            return
        t0, r0 = own[0]
        t_detect = t0 + rng.uniform(0.5, 5.0)
        survivors = [w.rank_pid(r) for tt, r in local if tt > t_detect or self.exits[r].code == -15]
        if survivors:
            self.node_out(node, t_detect, pytorch.agent_sigterm(w, node.agent_pid, survivors))
        e0 = self.exits[r0]
        self.node_out(
            node,
            t_detect + rng.uniform(1, 4),
            pytorch.agent_failed(w, node.agent_pid, w.local_of(r0), e0.code, w.rank_pid(r0)),
        )
        failures = [
            (
                r,
                w.local_of(r),
                self.exits[r].code,
                w.rank_pid(r),
                self.exits[r].t,
                self.exits[r].traceback if self.rng.random() < 0.5 else None,
            )
            for tt, r in own
            if tt <= t_detect + 0.5
        ]
        host = w.hostname(node)

        def local_time(tt: float) -> datetime:
            return self.clock.local(tt, node)

        self.node_out(
            node, t_detect + rng.uniform(4, 6), pytorch.child_failed_error(w, host, failures, local_time)
        )

    def agent_signalled(self, node: Node, t: float) -> None:
        """torchrun on `node` receives SIGTERM from the scheduler (printed once per agent)."""
        if node.name not in self.signalled_agents:
            self.signalled_agents.add(node.name)
            self.node_out(node, t, pytorch.agent_signal(self.w, node.agent_pid, "SIGTERM"))

    def _srun_teardown(self, t_end: float) -> float:
        w, rng = self.w, self.rng
        sig = {
            1: "Exited with exit code 1",
            -6: "Aborted (core dumped)",
            -9: "Killed",
            -15: "Terminated",
            -11: "Segmentation fault",
        }
        if w.launcher == "srun_tasks":
            groups: dict[tuple[str, int], list[int]] = {}
            first_t: dict[tuple[str, int], float] = {}
            for r, e in self.exits.items():
                node = w.node_of(r)
                if node.name in self.lost_nodes:
                    continue
                k = (node.name, e.code)
                groups.setdefault(k, []).append(r)
                first_t[k] = min(first_t.get(k, e.t), e.t)
            for (name, code), ranks in sorted(groups.items(), key=lambda kv: first_t[kv[0]]):
                what = (
                    self.oom_word
                    if code == -9 and set(ranks) & self.oom_tasks
                    else sig.get(code, f"Exited with exit code {code}")
                )
                self.srun(
                    first_t[(name, code)] + rng.uniform(0.2, 1.0),
                    slurm.task_exit(name, ranks, what),
                    key=code not in (-15, -6),
                )
        else:
            for node in w.nodes:
                if node.name in self.lost_nodes:
                    continue
                local = [self.exits[r] for r in w.ranks_of(node) if r in self.exits]
                if not local:
                    continue
                own = [e for e in local if e.code != -15]
                tt = min(e.t for e in (own or local)) + rng.uniform(5, 9)
                oom = bool(set(w.ranks_of(node)) & self.oom_tasks)
                self.srun(
                    tt,
                    slurm.task_exit(
                        node.name, [node.index], self.oom_word if oom else sig[1 if own else -15]
                    ),
                )
        return t_end

    def finish_slurm(
        self,
        *,
        state: str,
        reason: str,
        exit_code: int,
        signal: int = 0,
        banner: str | None = "",
        banner_node: Node | None = None,
        limit_min: int | None = None,
        kill_user: str | None = None,
        attempt_exit: int | None = -1,
    ) -> None:
        """Scheduler banners in job output, sacct JSON, and the attempt's terminal state."""
        w, rng = self.w, self.rng
        end = self.end
        node = banner_node or w.master
        if banner != "":
            self.srun(
                end - rng.uniform(0.5, 3),
                slurm.banner(w, f"STEP {w.job_id}.0", node.name, self.local(end - 2, node), banner),
                key=True,
            )
            if banner in ("TIME LIMIT", "PREEMPTION", None) or rng.random() < 0.5:
                self.srun(
                    end - rng.uniform(0.1, 0.5),
                    slurm.banner(w, f"JOB {w.job_id}", node.name, self.local(end - 1, node), banner),
                    key=True,
                )
        lim = limit_min if limit_min is not None else int((end - w.start) / 60) + rng.choice((60, 240, 1440))
        steps = [
            slurm.step(
                w,
                f"{w.job_id}.batch",
                "batch",
                "CANCELLED" if state in ("TIMEOUT", "CANCELLED", "PREEMPTED") else state,
                exit_code if state not in ("TIMEOUT", "CANCELLED", "PREEMPTED") else 0,
                signal or (15 if state != "FAILED" else 0),
                w.start,
                end,
                [w.master.name],
            ),
            slurm.step(
                w,
                f"{w.job_id}.0",
                "python" if w.launcher == "srun_tasks" else "torchrun",
                "CANCELLED" if state in ("TIMEOUT", "PREEMPTED", "CANCELLED") else state,
                exit_code,
                signal,
                w.start + 5,
                end,
            ),
        ]
        if rng.random() < 0.25:
            text = slurm.scontrol_job_json(
                w,
                state=state,
                reason=reason,
                exit_code=exit_code,
                signal=signal,
                start=w.start,
                end=end,
                limit_min=lim,
            )
            self.bundle.put(
                rng.choice(("events/scontrol-job.json", f"events/scontrol-show-job-{w.job_id}.json")), text
            )
        else:
            text = slurm.sacct_json(
                w,
                state=state,
                reason=reason,
                exit_code=exit_code,
                signal=signal,
                start=w.start,
                end=end,
                limit_min=lim,
                steps=steps,
                kill_user=kill_user,
            )
            self.bundle.put(
                rng.choice(("events/sacct.json", "events/sacct-job.json", f"events/sacct-{w.job_id}.json")),
                text,
            )
        self.state = state
        self.exit_code = exit_code if attempt_exit == -1 else attempt_exit
        self.reason = None if reason in ("None", "") else reason

    def finish_k8s(
        self,
        *,
        state: str,
        reason: str | None,
        pod_exit: Mapping[str, tuple[str, int, str | None]] | None = None,
        conditions: list[dict[str, Any]] | None = None,
        events: list[dict[str, Any]] | None = None,
        job_condition: tuple[str, str, str] | None = None,
    ) -> str:
        """pods.json, events.json and the job object; `pod_exit` maps node → (reason, exit code, message).

        Returns the path of the pod list."""
        w, rng = self.w, self.rng
        end = self.end
        pods = []
        for node in w.nodes:
            reason_code = (pod_exit or {}).get(node.name)
            if reason_code is None:
                local = [self.exits[r] for r in w.ranks_of(node) if r in self.exits]
                own = [e for e in local if e.code not in (-15,)]
                if not local:
                    reason_code = ("Error", 137, None)
                elif own:
                    reason_code = ("Error", 1, None)
                else:
                    reason_code = ("Error", 143, None)
            reason_txt, code, msg = reason_code
            t_end = end - rng.uniform(0, 5) if code != 0 else end - rng.uniform(0, 2)
            phase = "Succeeded" if code == 0 else "Failed"
            conds = [c for c in (conditions or []) if c.get("_node", node.name) == node.name]
            conds = [{k: v for k, v in c.items() if k != "_node"} for c in conds]
            pods.append(
                kube.pod(
                    w,
                    node,
                    start=w.start + rng.uniform(0, 5),
                    end=t_end,
                    phase=phase,
                    reason=reason_txt,
                    exit_code=code,
                    message=msg,
                    restarts=0,
                    conditions=conds,
                )
            )
        pods_path = rng.choice(("events/pods.json", "events/kubectl-get-pods.json"))
        self.bundle.put(pods_path, kube.as_list(pods))
        evs = list(events or [])
        for node in w.nodes:
            evs.append(
                kube.event(
                    w,
                    kind="Pod",
                    name=node.pod,
                    reason="Started",
                    message=f"Started container {'pytorch' if w.k8s_kind == 'PyTorchJob' else 'trainer'}",
                    t=w.start + rng.uniform(0, 4),
                    host=node.name,
                )
            )
        if job_condition is not None:
            ctype, creason, cmsg = job_condition
            evs.append(
                kube.event(
                    w,
                    kind=w.k8s_kind,
                    name=w.job_id,
                    reason=creason,
                    message=cmsg,
                    t=end,
                    etype="Warning" if ctype == "Failed" else "Normal",
                    component="pytorchjob-controller" if w.k8s_kind == "PyTorchJob" else "jobset-controller",
                )
            )
            self.bundle.put(
                f"events/{w.k8s_kind.lower()}.json",
                kube.job_status(
                    w,
                    [
                        kube.condition(
                            "Created", "True", "Created", f"{w.k8s_kind} {w.job_id} is created.", w.start - 30
                        ),
                        kube.condition(ctype, "True", creason, cmsg, end),
                    ],
                    restarts=w.attempt,
                ),
            )
        evs.sort(key=lambda e: (e["lastTimestamp"], e["metadata"]["name"]))
        self.bundle.put(rng.choice(("events/events.json", "events/kubectl-events.json")), kube.as_list(evs))
        self.state = state
        self.reason = reason
        self.exit_code = None if state in ("PREEMPTED",) else (0 if state == "SUCCEEDED" else 1)
        return pods_path

    # ---------------------------------------------------------------------------------------------
    # Writing

    def attempt_yaml(self) -> dict[str, Any]:
        w = self.w
        d: dict[str, Any] = {
            "workload": {
                "id": w.job_id,
                "attempt": w.attempt,
                "name": w.job_name,
                "scheduler": w.scheduler,
                "cluster": w.cluster,
            },
            "window": {"start": _iso(w.start), "end": _iso(self.end)},
            "state": self.state,
            "nodes": [n.name for n in w.nodes],
            "timezone": w.tz,
        }
        if self.exit_code is not None:
            d["exit_code"] = self.exit_code
        if self.reason is not None:
            d["reason"] = self.reason
        if w.output != "pods" or self.rng.random() < 0.8:
            d["ranks"] = w.rank_map()
        else:  # the pods' nvidia.com/gpu limits, as a Kubernetes scope knows them
            d["gpus_per_node"] = w.gpus_per_node
        return d

    def files(self) -> dict[str, str | bytes]:
        out = self.bundle.files()
        out["attempt.yaml"] = yaml.safe_dump(self.attempt_yaml(), sort_keys=True)
        truth = self.truth.as_dict()
        truth["cost"] = self.cost_truth()
        assert truth["outcome"] in OUTCOMES
        out["truth.yaml"] = yaml.safe_dump(truth, sort_keys=True, width=1000)
        return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(round(t), tz=Clock("UTC").zone).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first_lines(fn: LineFn, n: int) -> LineFn:
    """Large jobs: keep the first lines of a multi-line message (their full dumps would be gigabytes)."""

    def render(d: datetime) -> str:
        text = fn(d)
        lines = text.split("\n")
        keep = lines[:n] + [ln for ln in lines[n:] if "what():" in ln][:1]
        return "\n".join(keep)

    return render
