"""Peak memory of a server fed decompression bombs: `python -m bench.bombs [--parallel 6]`.

Starts `hypocenter serve` (the checkout on PYTHONPATH) on loopback ports, measures its resident
memory at rest, then sends OTLP log requests whose gzip body (~5 MiB) expands to just under the
64 MiB message limit as millions of tiny records: over OTLP/HTTP (Content-Encoding: gzip), over
OTLP/gRPC with grpc's own gzip compression, and as OTLP/JSON (`[{},{},…]`), `--parallel` at once. Prints the answers and the
server's peak resident memory (VmHWM) beside its memory at rest: the figure to compare between
versions. The server must stay up and answer /healthz afterwards.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--transport", choices=("http", "grpc", "json", "all"), default="all")
    args = ap.parse_args(argv)
    raw = bomb()
    body = gzip.compress(raw, 6)
    print(f"request: {len(body) / 2**20:.1f} MiB gzip -> {len(raw) / 2**20:.1f} MiB protobuf")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
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
                "",
                "--store",
                f"{tmp}/h.db",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ},
        )
        try:
            assert proc.stdout is not None
            addr = json.loads(proc.stdout.readline())
            time.sleep(1.0)
            rest = _rss_kib(proc.pid)
            print(f"server at rest: {rest / 1024:.0f} MiB resident")
            answers: list[str] = []

            def post(kind: str, content: bytes, media: str) -> None:
                try:
                    r = httpx.post(
                        f"http://{addr['http']}/v1/logs",
                        content=content,
                        timeout=300,
                        headers={"Content-Type": media, "Content-Encoding": "gzip"},
                    )
                    answers.append(f"{kind} {r.status_code}")
                except httpx.TimeoutException:
                    answers.append(f"{kind}: no answer within 300 s")

            def via_http(_: int) -> None:
                post("http", body, "application/x-protobuf")

            json_body = gzip.compress(
                b'{"resourceLogs":[{"resource":{"attributes":[{"key":"host.name","value":'
                b'{"stringValue":"n1"}}]},"scopeLogs":[{"logRecords":['
                + b",".join([b"{}"] * (len(raw) // 3))
                + b"]}]}]}",
                6,
            )

            def via_json(_: int) -> None:
                post("json", json_body, "application/json")

            def via_grpc(_: int) -> None:
                with grpc.insecure_channel(
                    addr["grpc"], options=[("grpc.max_send_message_length", 128 << 20)]
                ) as ch:
                    call = ch.unary_unary(LOGS)
                    try:
                        call(raw, timeout=300, compression=grpc.Compression.Gzip)
                        answers.append("grpc OK")
                    except grpc.RpcError as exc:
                        answers.append(f"grpc {exc.code().name}")  # type: ignore[attr-defined]

            for name, fn in (("http", via_http), ("grpc", via_grpc), ("json", via_json)):
                if args.transport not in (name, "all"):
                    continue
                with ThreadPoolExecutor(args.parallel) as pool:
                    list(pool.map(fn, range(args.parallel)))
                try:
                    alive = httpx.get(f"http://{addr['http']}/healthz", timeout=30).status_code == 200
                except httpx.HTTPError:
                    alive = False
                print(
                    f"{name} x{args.parallel}: answers {sorted(set(answers))}, server peak "
                    f"{_peak_kib(proc.pid) / 1024:.0f} MiB resident (at rest {rest / 1024:.0f} MiB), "
                    f"{'up' if alive else 'DOWN'}"
                )
                answers.clear()
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
