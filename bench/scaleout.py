"""Scale-out: what one record costs a replica and what it costs PostgreSQL, and where that puts the ceiling.

    python -m bench.scaleout [--quick] [--postgres-url URL] [--nodes 8] [--mb 4] [--evidence 2000]
                             [--json out.json]

Starts `hypocenter serve` replicas on one PostgreSQL (loopback; default $HYPOCENTER_TEST_POSTGRES_URL,
a fresh schema per run, dropped afterwards), each pinned to its own core with `taskset` when the
machine has one per replica, and sends the same input through 1 and then 2 replicas, over OTLP gRPC
with the OpenTelemetry SDK exporter, one sender per replica, each node's streams to one replica (as
the gateway routes by host.name):

- healthy lines: node logs as a GPU node writes them (bench.throughput's NCCL INFO, kernel audit and
  application lines: a rule token in ~20,000 lines), record-numbered as a filelog receiver sends them;
- evidence lines: lines every one of which a rule reads (NVIDIA Xid, NCCL WARN), kept whole.

For each phase it reads CPU time from /proc: the replica processes' (all threads), and PostgreSQL's
backends serving those replicas (found by their application_name in pg_stat_activity; PostgreSQL's
shared background processes — WAL writer, checkpointer — are not counted, they serve every client
of the cluster). Per record: replica µs, PostgreSQL µs, their ratio (the issue's goal: PostgreSQL
≤ 5 % of a replica for healthy lines), and the projected ceiling of one PostgreSQL: records/s per
PostgreSQL core = 1 / its µs per record, and how many replica cores that feeds. Figures are for this
machine and run; compare rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.perf import Server
from bench.throughput import _CANDIDATES, write_log
from hypocenter.cli.replay import LogLine, ReplayReport, Sender, Stream

TICK = os.sysconf("SC_CLK_TCK")
GOAL = 0.05  # PostgreSQL CPU per healthy record, as a share of a replica's
SMALL_BATCH = 512  # records per request: `hypocenter replay`'s
LARGE_BATCH = 8192  # the Collector batch processor's default send_batch_size


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# ------------------------------------------------------------------------------------------ input


def healthy_lines(mb: int, seed: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.log"
        write_log(path, mb, seed)
        return path.read_text(encoding="utf-8").splitlines()


def evidence_lines(count: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [rnd.choice(_CANDIDATES).format(m=rnd.randrange(60), s=rnd.randrange(60)) for _ in range(count)]


def node_stream(node: str, path: str, lines: list[str], t0_ns: int) -> Stream:
    return Stream(
        resource={"host.name": node},
        lines=[
            LogLine(line, t0_ns + i * 1_000_000, {"log.file.path": path, "log.file.record_number": i + 1})
            for i, line in enumerate(lines)
        ],
    )


# ------------------------------------------------------------------------------------------ replicas


def start_replica(url: str, name: str, core: int | None, log: Path) -> Server:
    """A replica on `url` whose PostgreSQL session is named `name` (application_name), pinned to `core`."""
    sep = "&" if "?" in url else "?"
    pin = ["taskset", "-c", str(core)] if core is not None else []
    # --compact-after-s -1: the ingest's cost alone, not a compaction pass landing in one phase
    return Server(f"{url}{sep}application_name={name}", "--compact-after-s", "-1", log=log, prefix=pin)


@contextlib.contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    import psycopg

    schema = f"scaleout_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def backend_pids(url: str, prefix: str) -> list[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (prefix + "%",)
        ).fetchall()
    return [int(r[0]) for r in rows]


# ------------------------------------------------------------------------------------------ a run


@dataclass
class Phase:
    replicas: int
    kind: str  # healthy | evidence
    batch: int  # records per OTLP request
    records: int
    requests: int
    wall_s: float
    replica_cpu_s: float
    postgres_cpu_s: float

    @property
    def replica_us(self) -> float:
        return self.replica_cpu_s / self.records * 1e6

    @property
    def postgres_us(self) -> float:
        return self.postgres_cpu_s / self.records * 1e6

    def row(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "records_per_s": self.records / self.wall_s,
            "replica_us_per_record": self.replica_us,
            "postgres_us_per_record": self.postgres_us,
            "postgres_us_per_request": self.postgres_cpu_s / self.requests * 1e6,
            "postgres_share": self.postgres_us / self.replica_us if self.replica_us else 0.0,
        }


def send_all(replicas: list[Server], streams: list[Stream], batch: int) -> ReplayReport:
    """Each stream to replica (its index mod the count), one sender thread per replica, `batch` records
    a request (the gateway's batch processor sends 8,192 by default); what was sent."""
    reports = [ReplayReport() for _ in replicas]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        sender = Sender(replicas[i].grpc, False, 60)
        try:
            for j, s in enumerate(streams):
                if j % len(replicas) == i:
                    sender.send_logs(s, reports[i], batch)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        finally:
            sender.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return ReplayReport(
        log_records=sum(r.log_records for r in reports), requests=sum(r.requests for r in reports)
    )


def run(
    url: str, count: int, inputs: list[tuple[str, int, list[Stream]]], workdir: Path, pin: bool
) -> list[Phase]:
    phases: list[Phase] = []
    tag = f"scaleout-{uuid.uuid4().hex[:6]}-"
    with fresh_schema(url) as store:
        replicas = [
            start_replica(
                store, f"{tag}{i}", i % (os.cpu_count() or 1) if pin else None, workdir / f"r{i}.log"
            )
            for i in range(count)
        ]
        try:
            backends = backend_pids(url, tag)
            for kind, batch, streams in inputs:
                r0 = sum(cpu_seconds(r.proc.pid) for r in replicas)
                p0 = sum(cpu_seconds(p) for p in backends)
                t0 = time.perf_counter()
                sent = send_all(replicas, streams, batch)  # acknowledged: committed in PostgreSQL
                wall = time.perf_counter() - t0
                r1 = sum(cpu_seconds(r.proc.pid) for r in replicas)
                p1 = sum(cpu_seconds(p) for p in backends)
                phases.append(
                    Phase(count, kind, batch, sent.log_records, sent.requests, wall, r1 - r0, p1 - p0)
                )
        finally:
            for r in replicas:
                r.stop()
    return phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--postgres-url", default=os.environ.get("HYPOCENTER_TEST_POSTGRES_URL", ""))
    ap.add_argument("--nodes", type=int, default=8, help="node streams per phase")
    ap.add_argument("--mb", type=int, default=4, help="healthy MB per node")
    ap.add_argument("--evidence", type=int, default=2000, help="evidence lines per node")
    ap.add_argument(
        "--quick", action="store_true", help="a small run (CI): 2 nodes, 1 MB, 300 evidence lines"
    )
    ap.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    if not args.postgres_url:
        print("no PostgreSQL: pass --postgres-url or set HYPOCENTER_TEST_POSTGRES_URL", file=sys.stderr)
        return 2
    if args.quick:
        args.nodes, args.mb, args.evidence = 2, 1, 300
    pin = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    t0_ns = time.time_ns() - 3600 * 10**9
    healthy = healthy_lines(args.mb, 1)
    evidence = evidence_lines(args.evidence, 2)
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="scaleout-") as tmp:
        for count in (1, 2):
            # the same input for both counts, in a schema of its own (nothing is a retry of the other)
            inputs = [
                (
                    kind,
                    batch,
                    [
                        node_stream(f"node{n:03d}", f"/var/log/{kind}-{batch}.log", lines, t0_ns)
                        for n in range(args.nodes)
                    ],
                )
                for kind, batch, lines in (
                    ("healthy", SMALL_BATCH, healthy),
                    ("healthy", LARGE_BATCH, healthy),
                    ("evidence", SMALL_BATCH, evidence),
                )
            ]
            phases += run(args.postgres_url, count, inputs, Path(tmp), pin)
    rows = [p.row() for p in phases]

    def one(kind: str, batch: int) -> Phase:
        return next(p for p in phases if (p.replicas, p.kind, p.batch) == (1, kind, batch))

    ceiling: dict[str, Any] = {"goal_share": GOAL}
    for kind, batch in (("healthy", SMALL_BATCH), ("healthy", LARGE_BATCH), ("evidence", SMALL_BATCH)):
        p = one(kind, batch)
        ceiling[f"{kind}_{batch}"] = {
            "records_per_s_per_postgres_core": 1e6 / p.postgres_us if p.postgres_us else None,
            "replica_cores_per_postgres_core": p.replica_us / p.postgres_us if p.postgres_us else None,
            "postgres_share": p.postgres_us / p.replica_us if p.replica_us else None,
        }
    best = min(
        (one("healthy", b) for b in (SMALL_BATCH, LARGE_BATCH)),
        key=lambda p: p.postgres_us / max(p.replica_us, 1e-9),
    )
    ceiling["goal_met"] = best.postgres_us <= GOAL * best.replica_us
    doc = {"pinned": pin, "cores": os.cpu_count(), "runs": rows, "ceiling": ceiling}
    print(
        "| replicas | lines | records/request | records | records/s | replica µs/record "
        "| PostgreSQL µs/record | PostgreSQL µs/request | PostgreSQL share |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['replicas']} | {r['kind']} | {r['batch']} | {r['records']} | {r['records_per_s']:,.0f} | "
            f"{r['replica_us_per_record']:.1f} | {r['postgres_us_per_record']:.2f} | "
            f"{r['postgres_us_per_request']:,.0f} | {r['postgres_share']:.1%} |"
        )
    print()
    for key in (f"healthy_{SMALL_BATCH}", f"healthy_{LARGE_BATCH}", f"evidence_{SMALL_BATCH}"):
        c = ceiling[key]
        print(
            f"one PostgreSQL core, {key.replace('_', ' lines, ')} per request: "
            f"{_n(c['records_per_s_per_postgres_core'])} records/s, "
            f"{_n(c['replica_cores_per_postgres_core'], '.1f')} replica cores' worth "
            f"(PostgreSQL share {_n(c['postgres_share'], '.1%')})"
        )
    print(
        f"goal: PostgreSQL ≤ {GOAL:.0%} of a replica per healthy record: {'met' if ceiling['goal_met'] else 'not met'}"
    )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _n(x: float | None, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


if __name__ == "__main__":
    raise SystemExit(main())
