"""Attacks on the listeners, with the figures to compare between versions:
`python -m bench.listener_attacks [--mode MODE]...`.

Starts `hypocenter serve` (the checkout on PYTHONPATH) on loopback ports with a read, an ingest and an
admin token, runs each attack against it, and prints one line of figures per attack. Every attack is
bounded in count and time; nothing leaves loopback.

    grpc-stall   12 gRPC calls (no token) that never send their message, then a valid ingest Export
                 and a read ListDiagnoses (20 s deadline each): their answer and time
    trickle      one HTTP request sent a byte every 0.5 s: how long until the server closes it
                 (given up after 90 s), with http_request_timeout_s 5 (and http_request_deadline_s 10)
    crowd        1,100 connections trickling header bytes, server limited to 1,024 open files:
                 how many of 8 normal requests (from 127.0.0.2) succeed, bytes the server logged
    bodies       30 unfinished 60 MiB POST /v1/logs bodies in parallel: the server's RSS growth
    attributes   4 parallel OTLP/JSON requests of one record with 1 M attributes each (~43 MB):
                 answers, time, the server's peak RSS growth

Run it on two checkouts (PYTHONPATH=/path/to/checkout) to compare; settings a version does not
know are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx

TOKENS = {"ingest": "bench-ingest-token-0123456789", "read": "bench-read-token-0123456789"}
MODES = ("grpc-stall", "trickle", "crowd", "bodies", "attributes")
MIB = 1 << 20


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Server:
    def __init__(self, workdir: Path, *flags: str, nofile: int | None = None) -> None:
        tokens = workdir / "tokens.yaml"
        tokens.write_text("".join(f"{role}: [{token}]\n" for role, token in TOKENS.items()))
        known = subprocess.run(
            [sys.executable, "-m", "hypocenter.cli", "serve", "--help"], capture_output=True, text=True
        ).stdout
        wanted: list[str] = []
        for i in range(0, len(flags), 2):  # settings this version does not have are left out
            if flags[i] in known:
                wanted += flags[i : i + 2]
        self.log = workdir / "server.log"
        cmd = [
            sys.executable,
            *(
                "-m",
                "hypocenter.cli",
                "serve",
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ),
            *("--metrics-listen", "", "--store", str(workdir / "store.db"), "--log-level", "warning"),
            *("--auth-tokens-file", str(tokens), *wanted),
        ]

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, preexec_fn=limit)
        assert self.proc.stdout is not None
        addresses = json.loads(self.proc.stdout.readline())
        self.grpc, self.http = addresses["grpc"], addresses["http"]
        self.host, port = self.http.rsplit(":", 1)
        self.port = int(port)

    def rss_mib(self) -> float:
        return _status_kib(self.proc.pid, "VmRSS") / 1024

    def peak_mib(self) -> float:
        return _status_kib(self.proc.pid, "VmHWM") / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _bearer(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def grpc_stall(workdir: Path) -> str:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

    from hypocenter.api.v1 import attribution_pb2 as pb
    from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc

    srv = Server(workdir)
    release = threading.Event()

    def nothing() -> Any:
        release.wait(120)
        return
        yield b""

    channel = grpc.insecure_channel(srv.grpc)
    try:
        method = channel.stream_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
        stalled = [method.future(nothing()) for _ in range(12)]
        time.sleep(1.0)
        results = []
        with grpc.insecure_channel(srv.grpc) as good:
            export = good.unary_unary(
                "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            for name, call in (
                (
                    "Export",
                    lambda: export(
                        logs_service_pb2.ExportLogsServiceRequest(), metadata=_bearer("ingest"), timeout=20
                    ),
                ),
                (
                    "ListDiagnoses",
                    lambda: pb_grpc.AttributionStub(good).ListDiagnoses(
                        pb.ListDiagnosesRequest(), metadata=_bearer("read"), timeout=20
                    ),
                ),
            ):
                t0 = time.perf_counter()
                try:
                    call()
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                results.append(f"{name} {code} in {time.perf_counter() - t0:.2f} s")
        for f in stalled:
            f.cancel()
        return "12 stalled calls without a token; then " + ", ".join(results)
    finally:
        release.set()
        channel.close()
        srv.stop()


def trickle(workdir: Path) -> str:
    srv = Server(workdir, "--http-request-timeout-s", "5", "--http-request-deadline-s", "10")
    try:
        sock = socket.create_connection((srv.host, srv.port), timeout=5)
        head = b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
        t0 = time.perf_counter()
        closed = None
        for i in range(180):
            try:
                sock.sendall(head[i : i + 1] if i < len(head) else b"{")
                sock.settimeout(0.5)
                if sock.recv(4096) == b"":
                    closed = time.perf_counter() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = time.perf_counter() - t0
                break
        sock.close()
        return (
            f"one request trickled a byte every 0.5 s: closed after {closed:.1f} s"
            if closed is not None
            else "one request trickled a byte every 0.5 s: still open after 90 s"
        )
    finally:
        srv.stop()


def crowd(workdir: Path) -> str:
    srv = Server(workdir, nofile=1024)
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def attack() -> None:
        for _ in range(1100):
            try:
                s = socket.create_connection((srv.host, srv.port), timeout=2)
            except OSError:
                continue
            s.setblocking(False)
            sockets.append(s)
        while not stop.wait(0.5):
            for s in list(sockets):
                try:
                    s.send(b"G")
                except OSError:
                    sockets.remove(s)
                    s.close()

    thread = threading.Thread(target=attack, daemon=True)
    try:
        thread.start()
        time.sleep(5)
        ok = 0
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=5) as client:
            for _ in range(8):
                with contextlib.suppress(httpx.HTTPError):
                    ok += client.get(f"http://{srv.http}/healthz").status_code == 200
        time.sleep(10)
        logged = srv.log.stat().st_size
        return (
            f"1,100 trickling connections from 127.0.0.1 (1,024 open files allowed): {ok} of 8 normal "
            f"requests from 127.0.0.2 served; {logged:,} bytes logged in ~20 s"
        )
    finally:
        stop.set()
        thread.join(10)
        for s in sockets:
            s.close()
        srv.stop()


def bodies(workdir: Path, count: int = 30, size: int = 60 * MIB) -> str:
    srv = Server(workdir, "--http-request-timeout-s", "120")
    socks: list[socket.socket] = []
    try:
        with httpx.Client(timeout=30) as c:
            c.get(f"http://{srv.http}/healthz")
        before = srv.rss_mib()

        def send() -> int:
            s = socket.create_connection((srv.host, srv.port), timeout=30)
            socks.append(s)
            try:
                s.sendall(
                    b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                    + f"Authorization: Bearer {TOKENS['ingest']}\r\nContent-Length: {size + 1}\r\n\r\n".encode()
                )
                chunk = b"\x0a" * MIB
                for _ in range(size // MIB):
                    s.sendall(chunk)
            except OSError:
                pass
            s.settimeout(2)
            try:
                return 503 if s.recv(64).startswith(b"HTTP/1.1 503") else 0
            except OSError:
                return 0

        with ThreadPoolExecutor(count) as pool:
            answers = list(pool.map(lambda _: send(), range(count)))
        grown = srv.rss_mib() - before
        return (
            f"{count} unfinished {size // MIB} MiB bodies: RSS {before:.0f} -> {before + grown:.0f} MiB "
            f"(+{grown:.0f}); {answers.count(503)} answered 503"
        )
    finally:
        for s in socks:
            s.close()
        srv.stop()


def attributes(workdir: Path, parallel: int = 4, count: int = 1_000_000) -> str:
    srv = Server(workdir)
    try:
        attrs = ",".join(f'{{"key":"k{i}","value":{{"stringValue":"v"}}}}' for i in range(count))
        body = (
            '{"resourceLogs":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"n1"}}]},'
            f'"scopeLogs":[{{"logRecords":[{{"timeUnixNano":"1","body":{{"stringValue":"x"}},"attributes":[{attrs}]}}]}}]}}]}}'
        ).encode()
        with httpx.Client(timeout=300) as c:
            c.get(f"http://{srv.http}/healthz")
        before = srv.peak_mib()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKENS['ingest']}"}

        def post() -> int:
            with httpx.Client(timeout=300) as c:
                return c.post(f"http://{srv.http}/v1/logs", content=body, headers=headers).status_code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(parallel) as pool:
            codes = list(pool.map(lambda _: post(), range(parallel)))
        took = time.perf_counter() - t0
        return (
            f"{parallel} x {len(body) / 1e6:.0f} MB OTLP/JSON with {count:,} attributes: answers {codes} in "
            f"{took:.1f} s; peak RSS {before:.0f} -> {srv.peak_mib():.0f} MiB"
        )
    finally:
        srv.stop()


RUNS = {
    "grpc-stall": grpc_stall,
    "trickle": trickle,
    "crowd": crowd,
    "bodies": bodies,
    "attributes": attributes,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", action="append", choices=MODES, help="attack to run (default: all)")
    args = ap.parse_args()
    print(f"hypocenter from {os.environ.get('PYTHONPATH') or 'the installed package'}")
    for mode in args.mode or MODES:
        with tempfile.TemporaryDirectory(prefix="hypocenter-attack-") as tmp:
            print(f"{mode:11} {RUNS[mode](Path(tmp))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
