"""Performance: every figure beside a reference measured in the same run, on the same bytes.

    python -m bench.perf [--quick] [--json PATH]

(a) OTLP ingest into one `hypocenter serve` process (gRPC and HTTP; 1 and 4 client threads; node-scoped
    kernel/NCCL/app lines; 5,000 records per request) in three record shapes: "numbered" (the filelog
    receiver with `log.file.record_number`, ~1 candidate in 20,000), "unnumbered" (filelog's default:
    `log.file.path` on each record, no record number) and "dense" (numbered, 10 % candidate lines: a
    flapping port's `NCCL WARN NET/IB : Got async event : port error`, repeated). The reference is
    protobuf decode of the same serialized requests plus reading each record's body, in this process
    (nothing less can ingest them); "of decode" is the older, slower reference that also turns every
    attribute into a Python object.
(b) `hypocenter analyze` of bundles from 8 to 1,024 nodes and 50 MB to 2 GB, against `rg -c -F -f
    <rule tokens>` on the same files; wall time and peak RSS of each (where rg takes under a second, the
    fastest of three runs of each). The 2 GB bundle is measured again with every log gzip'd (`rg -z` the
    reference): the memory must not follow the bytes.
(c) the time from the terminal-state record's acknowledgement to the stored diagnosis for a 1,024-node
    attempt, against `hypocenter analyze` of the same attempt written as a bundle.
(d) store bytes per ingested healthy line (SQLite, before any compaction pass) of each shape, against
    the line's own size.
(e) REST latency (p50 of keep-alive round trips: GET /readyz, and list pages asked twice — the second
    answer is the cached one) against a bare TCP echo server (asyncio, its own process) on the same
    loopback.

It prints a table and then one JSON document (the summary: figures, references, ratios, targets).
`--quick` is the smoke test's size: seconds, every figure printed, nothing to read into the numbers.
The machine is shared and noisy: compare the figures of one run only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import random
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from hypocenter.engine import default_engine
from hypocenter.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
WORKLOAD = "perf-1"
T0 = 1_793_613_600  # 2026-11-02T10:00:00Z
WINDOW = ("2026-11-02T10:00:00Z", "2026-11-02T11:02:00Z")
CANDIDATE_EVERY = 20_000

# ------------------------------------------------------------------------------------------ the lines


def _chatter(rnd: random.Random, node: str) -> str:
    """One healthy line of a node: NCCL INFO (unstamped), kernel noise (syslog) or training progress."""
    r = rnd.random()
    m, s = rnd.randrange(50), rnd.randrange(60)
    if r < 0.5:
        return (
            f"{node}:{rnd.randint(1000, 99999)}:{rnd.randint(1000, 99999)} [{rnd.randint(0, 7)}] NCCL INFO "
            f"Channel {rnd.randint(0, 31):02d}/0 : {rnd.randint(0, 511)}[{rnd.randint(0, 7)}] -> "
            f"{rnd.randint(0, 511)}[{rnd.randint(0, 7)}] [send] via NET/IB/{rnd.randint(0, 7)}/GDRDMA"
        )
    if r < 0.8:
        return (
            f"Nov  2 10:{m:02d}:{s:02d} {node} kernel: [{rnd.randint(1, 999999)}.{rnd.randint(0, 999999):06d}] "
            f'audit: type=1400 apparmor="STATUS" operation="profile_replace" profile="unconfined" '
            f'name="docker-default" pid={rnd.randint(1, 99999)}'
        )
    return (
        f"[2026-11-02 10:{m:02d}:{s:02d}] step {rnd.randint(1, 99999)} ppl {rnd.random() * 40:.3f} "
        f"lr 3.0e-4 tokens/s {rnd.randint(100000, 999999)} grad_norm {rnd.random():.4f}"
    )


def _candidate(rnd: random.Random, node: str) -> str:
    """A line the prefilter must pass to the parser that is not a fault: an application Xid, an NCCL WARN."""
    m, s = rnd.randrange(50), rnd.randrange(60)
    if rnd.random() < 0.5:
        return (
            f"Nov  2 10:{m:02d}:{s:02d} {node} kernel: [291779.330000] NVRM: Xid (PCI:0000:3b:00): 45, "
            f"pid={rnd.randint(1000, 99999)}, name=python3, Ch 00000001"
        )
    return (
        f"{node}:1234:5678 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
        f"10.10.0.3<43012> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
    )


def _port_flap(rnd: random.Random, node: str) -> str:
    """A flapping IB port as NCCL <= 2.19 reports it (misc/ibvwrap.cc, no device named): a WARN per event."""
    return f"{node}:1234:5678 [{rnd.randint(0, 7)}] misc/ibvwrap.cc:266 NCCL WARN NET/IB : Got async event : port error"


NODE_MARK = "NODEMARK"
DENSE_EVERY = 10  # the evidence-dense shape: one candidate line in ten


def template(lines: int, seed: int, dense: bool = False) -> list[str]:
    """`lines` lines of one node (named NODE_MARK): one candidate in CANDIDATE_EVERY, at the middle of
    each run of that many lines, none of the rest passes the rule tokens' prefilter — or, `dense`, a
    port-error WARN every DENSE_EVERY lines besides."""
    rnd = random.Random(seed)
    return [
        _candidate(rnd, NODE_MARK)
        if i % CANDIDATE_EVERY == CANDIDATE_EVERY // 2
        else _port_flap(rnd, NODE_MARK)
        if dense and i % DENSE_EVERY == DENSE_EVERY // 2
        else _chatter(rnd, NODE_MARK)
        for i in range(lines)
    ]


def node_name(i: int) -> str:
    return f"gpu{i:04d}"


FAULT = (
    "Nov  2 10:51:03 {node} kernel: [294950.412118] NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_EVT Fatal XC0 "
    "i0 Link 13 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
VICTIM = (
    "[rank{rank}]:[E1102 10:51:{s:02d}.000000 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) "
    "Rank {rank}] Process group watchdog thread terminated with exception: NCCL error: remote process "
    "exited or there was a network error, NCCL version 2.26.2"
)


# ------------------------------------------------------------------------------------------ processes


@dataclass(slots=True)
class Run:
    seconds: float
    max_rss_mb: float
    returncode: int
    stdout: bytes


# Linux carries a process's peak RSS across fork and exec, so a child forked from this (large)
# process would report at least this process's size: a small launcher runs each measured command
# and reports its own child's rusage (peak RSS of it and of the worker processes it waited for).
_LAUNCHER = """
import os, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=sys.stdout, stderr=subprocess.DEVNULL).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.write(f"{time.perf_counter() - t} {r.ru_maxrss} {rc}")
"""


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Wall time and peak RSS (largest process: the command or one of its workers) of one command."""
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *cmd], capture_output=True, env=env, cwd=REPO, check=False
    )
    seconds, rss_kb, rc = proc.stderr.decode().split()[-3:]
    return Run(float(seconds), int(rss_kb) / 1024, int(rc), proc.stdout)


_PYCACHE: Path | None = None  # this run's compiled bytecode (see warm_up)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if _PYCACHE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE)
    return env


def warm_up(tmp: Path) -> float:
    """Measure what an installed hypocenter runs: its modules compiled to bytecode (pip compiles them
    at install; an environment with PYTHONDONTWRITEBYTECODE would otherwise compile every module on
    every run) and the rule catalog cache filled, by one `analyze` of an example. Returns the time of
    that first, cold run."""
    global _PYCACHE
    _PYCACHE = tmp / "pycache"
    return run_measured(
        [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "analyze",
            str(REPO / "examples" / "nvlink-xid149"),
            "--format",
            "json",
        ],
        _env(),
    ).seconds


class Server:
    """`hypocenter serve` in a subprocess on loopback port 0, SQLite store in `store` (or a store URL,
    with `log` then), run under `prefix` (e.g. `taskset -c 1`)."""

    def __init__(
        self, store: Path | str, *extra: str, log: Path | None = None, prefix: Sequence[str] = ()
    ) -> None:
        cmd = [
            *prefix,
            sys.executable,
            "-m",
            "hypocenter.cli",
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--store",
            str(store),
            "--log-level",
            "warning",
            *extra,
        ]
        self.log = log or Path(store).with_suffix(".log")
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=REPO)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError(f"server did not start: {self.log.read_text(errors='replace')[-2000:]}")
        addrs = json.loads(first)
        self.grpc, self.http = addrs["grpc"], addrs["http"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ------------------------------------------------------------------------------------------ OTLP


def _kv(key: str, value: str | int) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value
    return kv


def request(
    resource_attrs: dict[str, str],
    lines: list[str],
    first_record: int,
    time_ns: list[int] | None = None,
    record_attrs: dict[str, str] | None = None,
    numbered: bool = True,
) -> bytes:
    """One serialized ExportLogsServiceRequest: one resource, one scope, a record per line (as the
    filelog receiver sends them: `log.file.record_number` on each record, unless not `numbered`)."""
    rl = ResourceLogs()
    rl.resource.attributes.extend(_kv(k, v) for k, v in resource_attrs.items())
    sl = ScopeLogs()
    sl.scope.name = "filelog"
    recs = []
    for i, line in enumerate(lines):
        rec = LogRecord(
            time_unix_nano=time_ns[i] if time_ns else (T0 + first_record + i) * 1_000_000_000 // 1000,
            observed_time_unix_nano=(T0 + 3600) * 1_000_000_000,
        )
        rec.body.string_value = line
        if numbered:
            rec.attributes.append(_kv("log.file.record_number", first_record + i))
        if record_attrs:
            rec.attributes.extend(_kv(k, v) for k, v in record_attrs.items())
        recs.append(rec)
    sl.log_records.extend(recs)
    rl.scope_logs.append(sl)
    return ExportLogsServiceRequest(resource_logs=[rl]).SerializeToString()


def decode_rate(requests: list[bytes], records: int, repeat: int = 3, attributes: bool = True) -> float:
    """Records/s of protobuf decode + reading every record's body — and, with `attributes`, turning each
    of its attributes into a Python object (the older reference) — best of `repeat`."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        n = 0
        for raw in requests:
            msg = ExportLogsServiceRequest.FromString(raw)
            for rl in msg.resource_logs:
                n += 0 * len(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for lr in sl.log_records:
                        _ = lr.body.string_value
                        if attributes:
                            _ = [a.value for a in lr.attributes]
                        n += 1
        best = min(best, time.perf_counter() - t)
        assert n == records
    return records / best


Sender = Callable[[bytes], None]


def grpc_sender(addr: str) -> tuple[Sender, Callable[[], None]]:
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(EXPORT)

    def send(raw: bytes) -> None:
        while True:
            try:
                call(raw, timeout=120)
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:  # backpressure: the server asks for a retry
                    raise
                time.sleep(0.05)

    return send, channel.close


def http_sender(addr: str) -> tuple[Sender, Callable[[], None]]:
    client = httpx.Client(base_url=f"http://{addr}", timeout=120)

    def send(raw: bytes) -> None:
        while True:
            r = client.post("/v1/logs", content=raw, headers={"Content-Type": "application/x-protobuf"})
            if r.status_code == 503:
                time.sleep(0.05)
                continue
            r.raise_for_status()
            return

    return send, client.close


def send_all(
    requests: list[bytes], threads: int, make: Callable[[], tuple[Sender, Callable[[], None]]]
) -> float:
    """Seconds from the first request out to the last acknowledgement, `threads` clients in parallel."""
    work: queue.Queue[bytes] = queue.Queue()
    for raw in requests:
        work.put(raw)
    errors: list[BaseException] = []
    clients = [make() for _ in range(threads)]

    def worker(send: Sender) -> None:
        try:
            while True:
                try:
                    raw = work.get_nowait()
                except queue.Empty:
                    return
                send(raw)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    t = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(send,)) for send, _ in clients]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    seconds = time.perf_counter() - t
    for _, close in clients:
        close()
    if errors:
        raise errors[0]
    return seconds


def store_bytes(path: Path) -> int:
    """The SQLite store's size once its WAL is checkpointed into the main file."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


# ------------------------------------------------------------------------------------------ the parts


@dataclass
class Figures:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # what, figure, reference, ratio
    summary: dict[str, Any] = field(default_factory=dict)

    def add(self, what: str, figure: str, reference: str, ratio: str) -> None:
        self.rows.append((what, figure, reference, ratio))
        print(f"  {what:<44} {figure:>22}   {reference:>30}   {ratio}", flush=True)


SHAPES = ("numbered", "unnumbered", "dense")  # see (a) in the module docstring


def _ingest_requests(
    prefix: str, nodes: int, per_request: int, requests_per_node: int, shape: str = "numbered"
) -> tuple[list[bytes], int, int, int]:
    """(requests, lines, bytes of text, candidate lines) of `nodes` node-scoped syslog streams."""
    base = template(per_request * requests_per_node, seed=1, dense=shape == "dense")
    requests: list[bytes] = []
    lines = line_bytes = candidates = 0
    numbered = shape != "unnumbered"
    for n in range(nodes):
        node = f"{prefix}{node_name(n)}"
        body = [x.replace(NODE_MARK, node) for x in base]
        candidates += sum(1 for x in body if "NVRM" in x or "WARN" in x)
        line_bytes += sum(len(x) + 1 for x in body)
        lines += len(body)
        for r in range(requests_per_node):
            chunk = body[r * per_request : (r + 1) * per_request]
            if numbered:
                raw = request(
                    {"host.name": node, "log.file.path": "/var/log/syslog"}, chunk, r * per_request + 1
                )
            else:  # filelog's default: the path on each record, no record number
                raw = request(
                    {"host.name": node},
                    chunk,
                    r * per_request + 1,
                    record_attrs={"log.file.path": "/var/log/syslog"},
                    numbered=False,
                )
            requests.append(raw)
    return requests, lines, line_bytes, candidates


def ingest_part(fig: Figures, tmp: Path, quick: bool) -> None:
    """Each configuration sends its own nodes' streams; the full run gives each a fresh server, the
    quick one gives each shape one server (starting servers is most of its time). Store bytes are
    measured once per shape, on the server of its first configuration."""
    per_request = 1_000 if quick else 5_000
    nodes = 2 if quick else 16
    requests_per_node = 1 if quick else 3
    configs = (
        ("numbered", "grpc", 1),
        ("numbered", "grpc", 4),
        ("numbered", "http", 1),
        ("numbered", "http", 4),
        ("unnumbered", "grpc", 4),
        ("dense", "grpc", 4),
    )
    empty = tmp / "empty.db"
    SQLiteStore(empty).close()
    server: Server | None = None
    fig.summary["store_by_shape"] = {}
    sizes = {"lines": 0, "bytes": 0, "healthy": 0}
    measured = False
    for i, (shape, protocol, threads) in enumerate(configs):
        requests, lines, line_bytes, candidates = _ingest_requests(
            f"c{i}-", nodes, per_request, requests_per_node, shape
        )
        # beside each configuration: a shared machine's load drifts
        ref = decode_rate(requests, lines, attributes=False)
        old_ref = decode_rate(requests, lines)
        if i == 0:
            fig.summary["ingest"] = {
                "records": lines,
                "records_per_request": per_request,
                "candidates": candidates,
                "decode_body_records_per_s": round(ref),
                "decode_records_per_s": round(old_ref),
                "runs": [],
            }
            print(
                f"(a) OTLP ingest: {lines:,} node-scoped records a configuration, in {len(requests)} requests "
                f"of {per_request:,}; reference: protobuf decode + each body, {ref:,.0f} records/s",
                flush=True,
            )
        last_of_shape = i == len(configs) - 1 or configs[i + 1][0] != shape
        first_of_shape = i == 0 or configs[i - 1][0] != shape
        db = tmp / f"ingest-{shape}.db" if quick else tmp / f"ingest-{shape}-{protocol}-{threads}.db"
        if server is None:
            server = Server(db, "--settle-s", "3600", "--idle-timeout-s", "36000")
        try:
            make = (
                partial(grpc_sender, server.grpc) if protocol == "grpc" else partial(http_sender, server.http)
            )
            seconds = send_all(requests, threads, make)
        finally:
            if not quick or last_of_shape:
                server.stop()
                server = None
        rate = lines / seconds
        fig.summary["ingest"]["runs"].append(
            {
                "shape": shape,
                "candidates": candidates,
                "protocol": protocol,
                "threads": threads,
                "records_per_s": round(rate),
                "decode_body_records_per_s": round(ref),
                "decode_records_per_s": round(old_ref),
                "ratio_to_decode_body": round(rate / ref, 4),
                "ratio_to_decode": round(rate / old_ref, 4),
            }
        )
        target = {"numbered": "50%", "unnumbered": "25%", "dense": "10%"}[shape]
        fig.add(
            f"ingest {shape}, OTLP/{protocol}, {threads} thread(s)",
            f"{rate:,.0f} rec/s",
            f"decode + body {ref:,.0f} rec/s",
            f"{rate / ref:.1%} of decode + body (target >= {target}); {rate / old_ref:.1%} of decode",
        )
        if first_of_shape:
            sizes = {"lines": 0, "bytes": 0, "healthy": 0}
            measured = False
        sizes["lines"] += lines
        sizes["bytes"] += line_bytes
        sizes["healthy"] += lines - candidates
        if server is None and not measured:  # the shape's first store is closed: what did its lines cost?
            measured = True
            grown = store_bytes(db) - store_bytes(empty)
            entry = {
                "bytes_per_healthy_line": round(grown / sizes["healthy"], 2),
                "line_bytes": round(sizes["bytes"] / sizes["lines"], 1),
                "lines": sizes["lines"],
            }
            fig.summary["store_by_shape"][shape] = entry
            if shape == "numbered":
                fig.summary["store"] = entry
            fig.add(
                f"(d) store bytes per healthy line, {shape}",
                f"{grown / sizes['healthy']:,.1f} B/line",
                f"the line itself {sizes['bytes'] / sizes['lines']:.0f} B",
                f"{grown / sizes['bytes']:.2%} of the text (target < 5 B)",
            )


def write_bundle(root: Path, nodes: int, megabytes: float, seed: int = 2) -> tuple[int, int]:
    """An attempt bundle: `nodes` nodes of healthy chatter (kern.log + rank log each), one NVLink Xid 149
    on the second node and NCCL watchdog errors in the job's output. Returns (bytes, lines)."""
    (root / "logs" / "_job").mkdir(parents=True)
    names = [node_name(i) for i in range(nodes)]
    ctx = {
        "workload": {"id": WORKLOAD, "attempt": 0, "scheduler": "slurm", "cluster": "perf"},
        "window": {"start": WINDOW[0], "end": WINDOW[1]},
        "state": "FAILED",
        "exit_code": 1,
        "nodes": names,
        "timezone": "UTC",
    }
    (root / "attempt.yaml").write_text(json.dumps(ctx), encoding="utf-8")
    per_node = int(megabytes * 1e6 / nodes)
    base = template(max(200, min(40_000, per_node // 110 + 1)), seed)
    block = "\n".join(base) + "\n"
    total = 0
    lines = 0
    for i, node in enumerate(names):
        d = root / "logs" / node
        d.mkdir()
        text = block.replace(NODE_MARK, node)
        for name, share in (("kern.log", 0.3), ("rank.log", 0.7)):
            want = int(per_node * share)
            with (d / name).open("w", encoding="utf-8") as f:
                written = 0
                while written < want:
                    piece = text[: want - written]
                    piece = piece[: piece.rfind("\n") + 1] or text[: text.find("\n") + 1]
                    if i == 1 and name == "kern.log" and written == 0:
                        piece = FAULT.format(node=node) + "\n" + piece
                    f.write(piece)
                    written += len(piece)
                    lines += piece.count("\n")
                total += written
    job = "\n".join(VICTIM.format(rank=r, s=5 + r % 50) for r in range(0, min(nodes, 64) * 8, 8)) + "\n"
    (root / "logs" / "_job" / "slurm.out").write_text(job, encoding="utf-8")
    return total + len(job), lines + job.count("\n")


def _gzip_file(path: Path) -> None:
    """`path` replaced by `path`.gz (level 1: the benchmark's time goes to reading, not to making it)."""
    with path.open("rb") as src, gzip.open(path.with_name(path.name + ".gz"), "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
    path.unlink()


def gzip_logs(root: Path) -> int:
    """Every log file of a bundle gzip'd in place, by one forked process per core; its bytes on disk."""
    import multiprocessing

    from hypocenter.engine.forked import cores

    files = sorted(p for p in (root / "logs").rglob("*") if p.is_file())
    with multiprocessing.get_context("fork").Pool(cores()) as pool:
        pool.map(_gzip_file, files)
    return sum(p.stat().st_size for p in (root / "logs").rglob("*.gz"))


def analyze_part(fig: Figures, tmp: Path, quick: bool, tokens: Path) -> None:
    rg = shutil.which("rg")
    sizes = (
        [(8, 2.0), (64, 4.0)]
        if quick
        else [(8, 50.0), (64, 250.0), (1024, 250.0), (1024, 1100.0), (8, 2000.0)]
    )
    print("(b) hypocenter analyze vs rg -c -F -f <rule tokens> on the same files", flush=True)
    # The floor under any Python command: the interpreter starting with this environment's site
    # packages and doing nothing (what bounds the ratio where rg itself takes a tenth of a second).
    floor = min(
        (run_measured([sys.executable, "-c", "pass"], _env()) for _ in range(3)), key=lambda r: r.seconds
    )
    fig.summary["interpreter_start_s"] = round(floor.seconds, 3)
    print(f"  (the interpreter alone, `python -c pass`: {floor.seconds:.2f} s)", flush=True)
    fig.summary["analyze"] = []
    for nodes, mb in sizes:
        root = tmp / f"bundle-{nodes}-{int(mb)}"
        nbytes, nlines = write_bundle(root, nodes, mb)
        gzipped = 0
        for last in (False, True):
            cmd = [sys.executable, "-m", "hypocenter.cli", "analyze", str(root), "--format", "json"]
            hyp = run_measured(cmd, _env())
            outcome = _outcome(hyp.stdout)
            entry: dict[str, Any] = {"nodes": nodes, "bytes": nbytes, "lines": nlines, "outcome": outcome}
            what = f"analyze {nodes} nodes, {nbytes / 1e6:,.0f} MB, {nlines / 1e6:.2f} M lines"
            if gzipped:
                entry["gzip_bytes"] = gzipped
                what += f", gzip'd ({gzipped / 1e6:,.0f} MB)"
            if rg is None:
                fig.add(what, f"{hyp.seconds:.2f} s {hyp.max_rss_mb:.0f} MB", "rg not installed", outcome)
            else:
                rg_cmd = [rg, *(["-z"] if gzipped else []), "-c", "-F", "-f", str(tokens), str(root / "logs")]
                ref = run_measured(rg_cmd)
                # A reference under a second swings with a shared machine's load: the fastest of three, both sides alike.
                for _ in range(2 if ref.seconds < 1.0 else 0):
                    hyp = min(hyp, run_measured(cmd, _env()), key=lambda r: r.seconds)
                    ref = min(ref, run_measured(rg_cmd), key=lambda r: r.seconds)
                entry.update(
                    rg_seconds=round(ref.seconds, 3),
                    rg_max_rss_mb=round(ref.max_rss_mb, 1),
                    ratio_to_rg=round(hyp.seconds / ref.seconds, 2),
                )
                fig.add(
                    what,
                    f"{hyp.seconds:.2f} s {hyp.max_rss_mb:,.0f} MB RSS",
                    f"rg{' -z' if gzipped else ''} {ref.seconds:.2f} s {ref.max_rss_mb:,.0f} MB RSS",
                    f"{hyp.seconds / ref.seconds:.1f}x rg (target <= 3x); {outcome}",
                )
            entry.update(seconds=round(hyp.seconds, 3), max_rss_mb=round(hyp.max_rss_mb, 1))
            fig.summary["analyze"].append(entry)
            if last or (nodes, mb) != sizes[-1]:
                break
            gzipped = gzip_logs(root)  # the largest bundle once more, every log gzip'd
        shutil.rmtree(root)


def _outcome(stdout: bytes) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return "no diagnosis"
    rc = doc.get("root_cause") or {}
    return f"{doc.get('outcome')} {rc.get('domain', '')}/{rc.get('subdomain', '')}".strip()


def _attempt_streams(nodes: int, per_node: int) -> Iterator[tuple[dict[str, str], list[str], list[int]]]:
    """(resource, lines, times) of each stream of the 1,024-node attempt, in the order collectors send."""
    names = [node_name(i) for i in range(nodes)]
    wl = {
        "hypocenter.workload.id": WORKLOAD,
        "hypocenter.workload.attempt": "0",
        "hypocenter.workload.scheduler": "slurm",
        "hypocenter.attempt.window.start": WINDOW[0],
        "hypocenter.attempt.nodes": ",".join(names),
        "hypocenter.attempt.timezone": "UTC",
    }
    base = template(per_node, seed=3)
    times = [(T0 + 60 * 50 * i // per_node) * 1_000_000_000 for i in range(per_node)]
    for i, node in enumerate(names):
        kern = [x.replace(NODE_MARK, node) for x in base[: per_node // 2]]
        if i == 1:
            kern.append(FAULT.format(node=node))
        yield {"host.name": node, "log.file.path": f"logs/{node}/kern.log"}, kern, times[: len(kern)]
        yield (
            {**wl, "host.name": node, "log.file.path": f"logs/{node}/rank.log"},
            [x.replace(NODE_MARK, node) for x in base[per_node // 2 :]],
            times[per_node // 2 :],
        )
    job = [VICTIM.format(rank=r, s=5 + r % 50) for r in range(0, min(nodes, 64) * 8, 8)]
    yield {**wl, "log.file.path": "logs/_job/slurm.out"}, job, [(T0 + 3065) * 1_000_000_000] * len(job)


_ECHO = """
import asyncio

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _p50(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def echo_p50(rounds: int) -> float:
    """p50 seconds of a 100-byte round trip to a bare asyncio TCP echo server in its own process."""
    proc = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, env=_env())
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        samples = []
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(rounds + 5):
                t = time.perf_counter()
                sock.sendall(b"x" * 100)
                got = 0
                while got < 100:
                    got += len(sock.recv(4096))
                samples.append(time.perf_counter() - t)
        return _p50(samples[5:])
    finally:
        proc.kill()
        proc.wait(10)


def http_p50(addr: str, path: str, rounds: int) -> float:
    """p50 seconds of GET `path` on one keep-alive connection (raw HTTP/1.1; each answer read whole)."""
    host, port = addr.rsplit(":", 1)
    raw = f"GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n".encode()
    samples = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds + 5):
            t = time.perf_counter()
            sock.sendall(raw)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, body = buf.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            length = next(
                int(h.split(b":", 1)[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += sock.recv(65536)
            samples.append(time.perf_counter() - t)
    return _p50(samples[5:])


def rest_part(fig: Figures, http: str, quick: bool) -> None:
    """(e) on a server holding a diagnosed attempt: REST round trips beside a bare TCP echo."""
    rounds = 20 if quick else 200
    echo = echo_p50(rounds)
    rows = []
    for what, path, bound in (
        ("GET /readyz", "/readyz", "<= 3x echo"),
        ("GET /v1/diagnoses (list page)", f"/v1/diagnoses?workload={WORKLOAD}", "<= 10 ms"),
        ("GET /v1/failures (list page)", "/v1/failures", "<= 10 ms"),
    ):
        p50 = http_p50(http, path, rounds)
        rows.append({"what": what, "p50_ms": round(p50 * 1000, 3), "ratio_to_echo": round(p50 / echo, 1)})
        fig.add(
            f"(e) REST {what}, p50",
            f"{p50 * 1000:.2f} ms",
            f"TCP echo {echo * 1000:.3f} ms",
            f"{p50 / echo:.1f}x echo (target {bound})",
        )
    fig.summary["rest"] = {"echo_p50_ms": round(echo * 1000, 4), "rounds": rounds, "requests": rows}


def trigger_part(fig: Figures, tmp: Path, quick: bool) -> None:
    nodes = 16 if quick else 1024
    per_node = 50 if quick else 200
    where = tmp / "trigger"
    where.mkdir()
    requests = [request(res, lines, 1, times) for res, lines, times in _attempt_streams(nodes, per_node)]
    records = sum(len(x) for _, x, _ in _attempt_streams(nodes, per_node))
    state = request(
        {
            "hypocenter.workload.id": WORKLOAD,
            "hypocenter.workload.attempt": "0",
            "log.file.path": "hypocenter/attempt-state",
        },
        ["attempt ended: FAILED"],
        1,
        [(T0 + 3720) * 1_000_000_000],
        {
            "hypocenter.attempt.state": "FAILED",
            "hypocenter.attempt.window.end": WINDOW[1],
            "hypocenter.attempt.exit_code": "1",
        },
    )
    server = Server(where / "store.db", "--settle-s", "0", "--tick-s", "0.02", "--idle-timeout-s", "36000")
    try:
        t_ingest = send_all(requests, 4, partial(grpc_sender, server.grpc))
        send, close = grpc_sender(server.grpc)
        client = httpx.Client(base_url=f"http://{server.http}", timeout=60)
        t = time.perf_counter()
        send(state)
        acked = time.perf_counter()
        doc: dict[str, Any] | None = None
        while time.perf_counter() - acked < 300:
            r = client.get("/v1/diagnoses", params={"workload": WORKLOAD})
            items = r.json().get("diagnoses", []) if r.status_code == 200 else []
            final = [x for x in items if not x.get("provisional")]
            if final:
                doc = client.get(f"/v1/diagnoses/{final[0]['id']}").json()
                break
            time.sleep(0.01)
        latency = time.perf_counter() - acked
        close()
        client.close()
        rest_part(fig, server.http, quick)
    finally:
        server.stop()
    # The same attempt as a bundle, analysed by `hypocenter analyze`.
    bundle = where / "bundle"
    (bundle / "logs").mkdir(parents=True)
    names = [node_name(i) for i in range(nodes)]
    (bundle / "attempt.yaml").write_text(
        json.dumps(
            {
                "workload": {"id": WORKLOAD, "attempt": 0, "scheduler": "slurm"},
                "window": {"start": WINDOW[0], "end": WINDOW[1]},
                "state": "FAILED",
                "exit_code": 1,
                "nodes": names,
                "timezone": "UTC",
            }
        ),
        encoding="utf-8",
    )
    for res, lines, _ in _attempt_streams(nodes, per_node):
        path = bundle / res["log.file.path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref = run_measured(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle), "--format", "json"], _env()
    )
    got = "no diagnosis" if doc is None else _outcome(json.dumps(doc).encode())
    fig.summary["trigger"] = {
        "nodes": nodes,
        "records": records,
        "ingest_s": round(t_ingest, 3),
        "state_ack_s": round(acked - t, 4),
        "diagnosis_after_ack_s": round(latency, 3),
        "analyze_bundle_s": round(ref.seconds, 3),
        "outcome": got,
        "analyze_outcome": _outcome(ref.stdout),
    }
    print(
        f"(c) terminal state to stored diagnosis: {nodes} nodes, {records:,} records ingested in {t_ingest:.1f} s",
        flush=True,
    )
    fig.add(
        f"(c) diagnosis after the state record, {nodes} nodes",
        f"{latency:.2f} s",
        f"analyze of the bundle {ref.seconds:.2f} s",
        f"target < 1 s; {got} (analyze: {_outcome(ref.stdout)})",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke-test sizes (seconds): every figure, no meaning"
    )
    ap.add_argument("--json", type=Path, help="also write the JSON summary to this file")
    ap.add_argument(
        "--only",
        choices=("ingest", "analyze", "trigger"),
        action="append",
        help="run only these parts (repeatable; default all)",
    )
    args = ap.parse_args(argv)
    parts = set(args.only or ("ingest", "analyze", "trigger"))
    fig = Figures()
    fig.summary["quick"] = args.quick
    engine = default_engine()
    with tempfile.TemporaryDirectory(prefix="hypocenter-perf-") as name:
        tmp = Path(name)
        tokens = tmp / "tokens.txt"
        tokens.write_text("\n".join(engine.extractor.tokens) + "\n", encoding="utf-8")
        fig.summary["rule_tokens"] = len(engine.extractor.tokens)
        fig.summary["cold_first_run_s"] = round(warm_up(tmp), 3)
        if "ingest" in parts:
            ingest_part(fig, tmp, args.quick)
        if "analyze" in parts:
            analyze_part(fig, tmp, args.quick, tokens)
        if "trigger" in parts:
            trigger_part(fig, tmp, args.quick)
    fig.summary["bench_max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print()
    print("| what | figure | reference (same run) | ratio |\n|---|---|---|---|")
    for row in fig.rows:
        print("| " + " | ".join(row) + " |")
    text = json.dumps(fig.summary, indent=1, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
