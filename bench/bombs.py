"""A server fed hostile input, each attack beside a benign reference in the same run:
`python -m bench.bombs [--attack all|decompression|pickle|pax|poison|labels|rules|fairness] [--quick]`.

Starts `hypocenter serve` (the checkout on PYTHONPATH) on loopback ports and, per attack, prints
the time and the server's peak resident memory (VmHWM, reset before each phase) beside the same
figures for a benign request of the same kind, and whether the server still answers /healthz:

    decompression  OTLP log requests whose gzip body (~5 MiB) expands to just under the 64 MiB
                   limit as millions of tiny records, over HTTP, gRPC (grpc's gzip) and OTLP/JSON,
                   `--parallel` at once (reference: the server at rest)
    pickle         Flight Recorder "dumps" uploaded as artifacts: a 29-byte memo-index bomb, a
                   shared-reference bomb (2^60 lists if walked), 1 MiB of nested lists (reference:
                   a real torch dump)
    pax            a bundle whose pax header makes CPython's parser backtrack (CVE-2024-6232), and
                   one over the pax size bound (reference: the same bundle without it)
    poison         out-of-range attempt / time values interleaved with a benign tenant's requests:
                   how many benign requests fail (reference: the benign requests alone)
    labels         diagnoses whose cluster value is 100,000 characters: the /metrics scrape's size
                   (reference: short cluster names)
    rules          `analyze --rules` with `(?=a)(a|aa)+$` on a 45-character line (reference:
                   `analyze` without it)
    fairness       a flood of one-line finished attempts from one cluster, then one from another:
                   where the other's verdict comes in the order of analysis (reference: 1st)
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
REPO = Path(__file__).resolve().parent.parent


def bomb(target_bytes: int = 60 << 20) -> bytes:
    """A valid ExportLogsServiceRequest of about `target_bytes`: one resource, tiny records."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="n1")))
    sl = rl.scope_logs.add()
    one = sl.log_records.add()
    one.body.string_value = "x"
    one.time_unix_nano = 1
    size = len(one.SerializeToString()) + 2
    for _ in range(target_bytes // size - 1):
        sl.log_records.add().CopyFrom(one)
    return req.SerializeToString()


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _reset_peak(pid: int) -> None:
    """Start VmHWM again from the current resident size (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


class Server:
    """`hypocenter serve` on loopback with a fresh store, for one attack."""

    def __init__(self, tmp: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
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
                f"{tmp}/h.db",
                "--settle-s",
                "0.3",
                "--tick-s",
                "0.05",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ},
        )
        assert self.proc.stdout is not None
        self.addr = json.loads(self.proc.stdout.readline())
        self.http = f"http://{self.addr['http']}"
        time.sleep(1.0)
        self.rest = _rss_kib(self.proc.pid)

    def alive(self) -> bool:
        try:
            return httpx.get(f"{self.http}/healthz", timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def phase(self, name: str, fn: Any) -> Any:
        """Run `fn()`, print its time and the server's peak memory in that time; its answer back."""
        _reset_peak(self.proc.pid)
        t = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t
        print(
            f"  {name:<52} {took:7.2f} s  peak {_peak_kib(self.proc.pid) / 1024:6.0f} MiB  "
            f"-> {out}  {'up' if self.alive() else 'DOWN'}"
        )
        return out

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:  # stuck in an attack it did not survive
            self.proc.kill()
            self.proc.wait(30)


def _upload(srv: Server, path: str, content: bytes, **params: str) -> str:
    try:
        r = httpx.post(f"{srv.http}{path}", content=content, params=params, timeout=600)
        return str(r.status_code)
    except httpx.TimeoutException:
        return "no answer in 600 s"


def attack_pickle(srv: Server, quick: bool) -> None:
    real = (REPO / "tests/fixtures/flight_recorder/torch-2.13.0-gloo/pickle/nccl_trace_rank_2").read_bytes()

    def string(s: str) -> bytes:
        return b"X" + len(s).to_bytes(4, "little") + s.encode()

    def doc(value: bytes) -> bytes:
        return b"\x80\x02}(" + string("version") + value + b"u."

    memo = doc(b"]r" + (1 << 26).to_bytes(4, "little"))
    shared = b"]q\x000" + b"".join(
        b"](h" + bytes([k]) + b"h" + bytes([k]) + b"eq" + bytes([k + 1]) + b"0" for k in range(60)
    )
    nested = doc(b"]" * (1 << (17 if quick else 20)) + b"a" * ((1 << (17 if quick else 20)) - 1))
    for name, raw in (
        (f"reference: a real torch dump ({len(real):,} B)", real),
        (f"memo index 2^26 ({len(memo)} B)", memo),
        (f"shared references, 2^60 lists ({len(doc(shared + b'h<'))} B)", doc(shared + b"h<")),
        (f"nested lists ({len(nested) >> 10:,} KiB)", nested),
    ):
        srv.phase(
            name,
            lambda raw=raw: _upload(srv, "/v1/attempts/bomb/0/artifacts", raw, name="nccl_trace_rank_0"),
        )


def attack_pax(srv: Server, quick: bool) -> None:
    yaml = (REPO / "examples/nvlink-xid149/attempt.yaml").read_bytes()

    def block(info: tarfile.TarInfo, data: bytes) -> bytes:
        info.size = len(data)
        return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)

    def bundle(pax: bytes | None) -> bytes:
        out = b""
        if pax is not None:
            hdr = tarfile.TarInfo("././@PaxHeader")
            hdr.type = tarfile.XHDTYPE
            out += block(hdr, pax)
        return out + block(tarfile.TarInfo("b/attempt.yaml"), yaml) + b"\0" * 1024

    size = 16 << 10 if quick else 64 << 10
    for name, raw in (
        ("reference: the bundle without a pax header", bundle(None)),
        (f"pax header of {size >> 10} KiB of digits", bundle(b"1" * size)),
        ("pax header of 2 MiB (over the bound)", bundle(b"1 " * (1 << 20))),
    ):

        def probe(stop: threading.Event, health: list[float]) -> None:
            while not stop.is_set():
                t = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    httpx.get(f"{srv.http}/healthz", timeout=600)
                health.append(time.perf_counter() - t)
                time.sleep(0.05)

        def run(raw: bytes = raw) -> str:
            stop = threading.Event()
            health: list[float] = []
            t = threading.Thread(target=probe, args=(stop, health))
            t.start()
            code = _upload(srv, "/v1/bundles", raw)
            stop.set()
            t.join()
            return f"{code}, slowest /healthz meanwhile {max(health or [0]):.2f} s"

        srv.phase(name, run)


def _logs(jobs: list[tuple[str, str, str, int]]) -> bytes:
    """An OTLP log request: one record per (job, attempt, cluster, time)."""
    req = ExportLogsServiceRequest()
    for job, attempt, cluster, t in jobs:
        rl = req.resource_logs.add()
        for k, v in {
            "host.name": "n1",
            "slurm.job.id": job,
            "hypocenter.workload.attempt": attempt,
            "hypocenter.workload.cluster": cluster,
            "hypocenter.attempt.state": "FAILED",
        }.items():
            rl.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
        rec = rl.scope_logs.add().log_records.add()
        rec.time_unix_nano = t
        rec.body.string_value = "job ended"
    return req.SerializeToString()


T0 = 1_796_282_000_000_000_000


def _post_logs(srv: Server, body: bytes) -> int:
    r = httpx.post(
        f"{srv.http}/v1/logs", content=body, headers={"Content-Type": "application/x-protobuf"}, timeout=120
    )
    return r.status_code


def attack_poison(srv: Server, quick: bool) -> None:
    n = 60 if quick else 300
    benign = [_logs([(f"b{i}", "0", "benign", T0 + i)]) for i in range(n)]
    poison = [
        _logs([("p", str(2**63 - 1), "evil", T0)]),
        _logs([("p", "1e30", "evil", T0)]),
        _logs([("p", "inf", "evil", T0)]),
        _logs([("p", "0", "evil", 2**63 + 1)]),
    ]

    def send(with_poison: bool) -> str:
        jobs = [("benign", b) for b in benign]
        if with_poison:
            jobs = [j for i, b in enumerate(benign) for j in [("benign", b), ("poison", poison[i % 4])]]
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda j: (j[0], _post_logs(srv, j[1])), jobs))
        bad = sum(1 for kind, code in codes if kind == "benign" and code != 200)
        evil = sorted({code for kind, code in codes if kind == "poison"})
        return f"benign failed {bad} of {n}" + (f", poison answered {evil}" if with_poison else "")

    srv.phase(f"reference: {n} benign requests alone", lambda: send(False))
    srv.phase(f"{n} benign requests, {n} poison ones between", lambda: send(True))


def _wait_diagnoses(srv: Server, count: int, timeout: float = 900) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            body = httpx.get(f"{srv.http}/v1/diagnoses", params=params, timeout=60).json()
            found.extend(body["diagnoses"])
            cursor = body.get("next_cursor")
            if not cursor:
                break
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def attack_labels(srv: Server, quick: bool) -> None:
    def scrape() -> int:
        return len(httpx.get(f"http://{srv.addr['metrics']}/metrics", timeout=120).content)

    _post_logs(srv, _logs([(f"short-{i}", "0", f"c{i}", T0 + i) for i in range(10)]))
    _wait_diagnoses(srv, 10)
    srv.phase("reference: /metrics with 10 short clusters", lambda: f"{scrape():,} bytes")
    _post_logs(srv, _logs([(f"long-{i}", "0", f"c{i}-" + "x" * 100_000, T0 + i) for i in range(10)]))
    _wait_diagnoses(srv, 20)
    srv.phase("/metrics with 10 more of 100,000 characters", lambda: f"{scrape():,} bytes")


def attack_fairness(srv: Server, quick: bool) -> None:
    n = 500 if quick else 5000

    def run(flood: int) -> str:
        tag = f"f{flood}"
        if flood:
            for start in range(0, flood, 1000):
                jobs = [(f"{tag}-{i}", "0", tag, T0 + i) for i in range(start, min(flood, start + 1000))]
                _post_logs(srv, _logs(jobs))
        t = time.perf_counter()
        _post_logs(srv, _logs([(f"{tag}-normal", "0", f"{tag}-other", T0)]))
        while not any(d["workload"] == f"{tag}-normal" for d in _wait_diagnoses(srv, 0, 0)):
            time.sleep(0.2)
        waited = time.perf_counter() - t
        found = [d for d in _wait_diagnoses(srv, 0, 0) if d["workload"].startswith(tag)]
        done = sum(1 for d in found if d["workload"] != f"{tag}-normal")
        return f"verdict after {waited:.1f} s, with {done} of {flood} flood attempts analysed"

    srv.phase("reference: one attempt, idle server", lambda: run(0))
    srv.phase(f"one attempt after {n} finished from another cluster", lambda: run(n))


def attack_rules(quick: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "b"
        shutil.copytree(REPO / "examples/nvlink-xid149", bundle)
        node = sorted(p for p in (bundle / "logs").iterdir() if p.name != "_job")[0]
        (node / "app.log").write_text("2026-11-02T10:30:00Z " + "a" * 45 + "b\n")
        rules = Path(tmp) / "mine.yaml"
        rules.write_text(
            "rules:\n  - id: my-rule\n    title: mine\n    status: experimental\n    extract:\n"
            "      tokens: [\"aaaa\"]\n      pattern: '(?=a)(a|aa)+$'\n      event: my_event\n"
        )
        for name, extra in (
            ("reference: analyze", []),
            ("analyze --rules '(?=a)(a|aa)+$'", ["--rules", str(rules)]),
        ):
            t = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle), *extra],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                out = f"exit {proc.returncode}" + (f": {proc.stderr.strip()[:90]}" if proc.returncode else "")
            except subprocess.TimeoutExpired:
                out = "killed at 120 s"
            print(f"  {name:<52} {time.perf_counter() - t:7.2f} s  -> {out}")


def attack_decompression(srv: Server, parallel: int, transport: str) -> None:
    raw = bomb()
    body = gzip.compress(raw, 6)
    print(f"  request: {len(body) / 2**20:.1f} MiB gzip -> {len(raw) / 2**20:.1f} MiB protobuf")
    print(f"  reference: server at rest {srv.rest / 1024:.0f} MiB resident")
    answers: list[str] = []

    def post(kind: str, content: bytes, media: str) -> None:
        try:
            r = httpx.post(
                f"{srv.http}/v1/logs",
                content=content,
                timeout=300,
                headers={"Content-Type": media, "Content-Encoding": "gzip"},
            )
            answers.append(f"{kind} {r.status_code}")
        except httpx.TimeoutException:
            answers.append(f"{kind}: no answer within 300 s")

    json_body = gzip.compress(
        b'{"resourceLogs":[{"resource":{"attributes":[{"key":"host.name","value":'
        b'{"stringValue":"n1"}}]},"scopeLogs":[{"logRecords":['
        + b",".join([b"{}"] * (len(raw) // 3))
        + b"]}]}]}",
        6,
    )

    def via_grpc(_: int) -> None:
        with grpc.insecure_channel(
            srv.addr["grpc"], options=[("grpc.max_send_message_length", 128 << 20)]
        ) as ch:
            call = ch.unary_unary(LOGS)
            try:
                call(raw, timeout=300, compression=grpc.Compression.Gzip)
                answers.append("grpc OK")
            except grpc.RpcError as exc:
                answers.append(f"grpc {exc.code().name}")  # type: ignore[attr-defined]

    senders = {
        "http": lambda _: post("http", body, "application/x-protobuf"),
        "grpc": via_grpc,
        "json": lambda _: post("json", json_body, "application/json"),
    }
    for name, fn in senders.items():
        if transport not in (name, "all"):
            continue

        def run(fn: Any = fn) -> str:
            with ThreadPoolExecutor(parallel) as pool:
                list(pool.map(fn, range(parallel)))
            out = str(sorted(set(answers)))
            answers.clear()
            return out

        srv.phase(f"{name} x{parallel}", run)


ATTACKS = ("decompression", "pickle", "pax", "poison", "labels", "rules", "fairness")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attack", choices=(*ATTACKS, "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="smaller attacks, for a development loop")
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--transport", choices=("http", "grpc", "json", "all"), default="all")
    args = ap.parse_args(argv)
    for attack in ATTACKS if args.attack == "all" else (args.attack,):
        print(f"{attack}:")
        if attack == "rules":
            attack_rules(args.quick)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            srv = Server(tmp)
            try:
                if attack == "decompression":
                    attack_decompression(srv, args.parallel, args.transport)
                else:
                    globals()[f"attack_{attack}"](srv, args.quick)
            finally:
                srv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
