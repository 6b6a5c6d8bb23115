"""A real collector in the path: the OpenTelemetry SDK exporters send a bundle to `rotel` (a Rust OTLP
collector shipped as a binary in its PyPI wheel), which forwards it over OTLP/gRPC to `hypocenter
serve`; the diagnosis equals `hypocenter analyze` on the same bundle, and rotel saw no failed export.

rotel's receivers take OTLP/gRPC and OTLP/HTTP; its exporter batches (200 ms), gzips and sends
without a gRPC deadline, unlike the SDK exporters.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from server_support import REPO, ServerProcess, analyze, essence

from hypocenter.cli.replay import plan
from hypocenter.cli.replay import replay as send

pytestmark = pytest.mark.slow

rotel = pytest.importorskip("rotel", reason="rotel (PyPI) is in the test extra: pip install -e '.[test]'")
AGENT = Path(rotel.__file__).parent / "rotel-agent"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def rotel_forwarding_to(target: str, workdir: Path) -> Iterator[tuple[str, str, Path]]:
    """rotel-agent on free loopback ports, exporting OTLP/gRPC to `target`; yields (grpc, http, log)."""
    log = workdir / "rotel.out"
    for _ in range(3):  # a free port can be taken between probing and rotel's bind: try again
        grpc_port, http_port = _free_port(), _free_port()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    str(AGENT),
                    "start",
                    "--otlp-grpc-endpoint",
                    f"127.0.0.1:{grpc_port}",
                    "--otlp-http-endpoint",
                    f"127.0.0.1:{http_port}",
                    "--exporter",
                    "otlp",
                    "--otlp-exporter-endpoint",
                    f"http://{target}",
                    "--otlp-exporter-protocol",
                    "grpc",
                    "--otlp-receiver-traces-disabled",
                    "--pid-file",
                    str(workdir / "rotel.pid"),
                    "--log-file",
                    str(workdir / "rotel.log"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
            )
        deadline = time.monotonic() + 15
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not (_listening(grpc_port) and _listening(http_port))
        ):
            time.sleep(0.05)
        if proc.poll() is None and _listening(grpc_port):
            break
        proc.kill()
        proc.wait(10)
    else:
        raise RuntimeError(f"rotel did not start: {log.read_text(errors='replace')[-2000:]}")
    try:
        yield f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize(
    ("bundle", "http"),
    [("nvlink-xid149", False), ("ib-link-flap", True)],
    ids=["sdk-grpc-rotel", "sdk-http-rotel"],
)
def test_rotel_forwards_to_the_server(tmp_path: Path, bundle: str, http: bool) -> None:
    path = REPO / "examples" / bundle
    expected = analyze(path)
    ctx, node_streams, app_streams, metric_groups = plan(path)
    want_logs = sum(len(s.lines) for s in (*node_streams, *app_streams)) + 1  # + the state record
    want_points = sum(len(s.samples) for _, group in metric_groups for s in group)
    srv = ServerProcess(tmp_path / "store.db").start()
    try:
        with rotel_forwarding_to(srv.grpc, tmp_path) as (grpc_in, http_in, rotel_log), srv.client() as client:
            send(path, http_in if http else grpc_in, http=http, timeout=10)
            # rotel batches: wait until everything it was given reached the store
            deadline = time.monotonic() + 60
            stats: dict[str, int] = {}
            while time.monotonic() < deadline:
                stats = client.get("/readyz").json()
                if (stats.get("log_entries"), stats.get("metric_points")) == (want_logs, want_points):
                    break
                time.sleep(0.1)
            assert (stats.get("log_entries"), stats.get("metric_points")) == (want_logs, want_points)
            r = client.post(f"/v1/attempts/{ctx.workload.id}/{ctx.workload.attempt}/analyze")
            assert r.status_code == 200, r.text
        got = r.json()
        assert essence(got) == essence(expected) and got["id"] == expected["id"]
        text = rotel_log.read_text(errors="replace")
        assert "Exporting failed" not in text and "ERROR" not in text, text[-2000:]
    finally:
        srv.stop()
