"""Run a real `hypocenter serve` in a subprocess on ephemeral loopback ports, for the server tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if (p / "attempt.yaml").is_file())


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return env


def terminate(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a test's subprocess, give it 15 s to exit cleanly, then SIGKILL it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class ServerProcess:
    """`hypocenter serve` on 127.0.0.1 port 0; `grpc` / `http` are the bound addresses."""

    def __init__(
        self,
        store: Path | str,
        *extra: str,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        wrap: tuple[str, ...] = (),
    ) -> None:
        """`store` is a SQLite file, or a store URL (then `log` is required). `wrap`: a command the
        server runs under (e.g. `ip netns exec NAME`)."""
        self.store = store
        self.extra = extra
        self.wrap = wrap
        if log is None and not isinstance(store, Path):
            raise TypeError("a store URL needs an explicit log path")
        self.log_path = log or Path(store).with_suffix(".log")
        self.env = {**clean_env(), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc = ""
        self.http = ""
        self.metrics = ""

    def start(self, timeout: float = 30.0) -> ServerProcess:
        cmd = [
            *self.wrap,
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
            str(self.store),
            "--settle-s",
            "0.3",
            "--tick-s",
            "0.05",
            "--log-level",
            "warning",
            *self.extra,
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=self.env, cwd=REPO)
        log.close()
        line: list[bytes] = []
        assert self.proc.stdout is not None
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not line or not line[0]:
            self.stop()
            raise RuntimeError(f"server did not start: {self.log_path.read_text(errors='replace')[-2000:]}")
        addrs = json.loads(line[0])
        self.grpc, self.http, self.metrics = addrs["grpc"], addrs["http"], addrs.get("metrics", "")
        return self

    @property
    def base(self) -> str:
        return f"http://{self.http}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60.0)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        terminate(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def replay(
    bundle: Path, endpoint: str, *flags: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "replay",
            str(bundle),
            "--endpoint",
            endpoint,
            "--timeout",
            "10",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )


def analyze(bundle: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=REPO,
        check=True,
    )
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def wait_for_diagnosis(client: httpx.Client, workload: str, timeout: float = 30.0) -> dict[str, Any]:
    """Poll until the server holds a final (not provisional) diagnosis for the workload."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = client.get("/v1/diagnoses", params={"workload": workload}).json()["diagnoses"]
        final = [r for r in rows if not r["provisional"]]
        if final:
            attempt = client.get(f"/v1/attempts/{workload}/{final[0]['attempt']}").json()
            if not attempt["dirty"]:
                doc: dict[str, Any] = client.get(final[0]["url"]).json()
                return doc
        time.sleep(0.05)
    raise AssertionError(f"no diagnosis for workload {workload} within {timeout} s")


def essence(d: dict[str, Any]) -> dict[str, Any]:
    """What must match between `analyze` and the server: everything but coverage, quality wording and ids."""

    def cause(rc: dict[str, Any] | None) -> Any:
        if rc is None:
            return None
        return {
            k: rc[k] for k in ("domain", "subdomain", "rule", "nodes", "components", "first_seen", "action")
        }

    return {
        "outcome": d["outcome"],
        "terminal_state": d["terminal_state"],
        "root_cause": cause(d["root_cause"]),
        "candidates": [cause(c) for c in d["candidates"]],
        "affected_nodes": d["affected_nodes"],
        "symptoms": sorted((s["kind"], s["count"], tuple(s["nodes"])) for s in d["symptoms"]),
        "evidence": sorted(
            (e["ref"], e["role"], e["rule"], e["node"] or "", e["time"] or "") for e in d["evidence"]
        ),
        "attempt": d["attempt"],
    }
