"""The real Prometheus and promtool (Debian packages `prometheus`, installed by .ci/run) for the tests.

`PrometheusProcess` runs `prometheus` as a subprocess on a loopback ephemeral port with a temporary
config and TSDB directory, and stops it (SIGTERM, then SIGKILL) however the test ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from server_support import terminate

from hypocenter.sources import Series

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")

# The `prometheus` marker: tests/conftest.py skips such a test when either program is missing.
needs_promtool = pytest.mark.prometheus
needs_prometheus = pytest.mark.prometheus


def promtool(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrometheusProcess:
    """`prometheus` scraping `targets` every second (none: it only serves its TSDB), on 127.0.0.1:<ephemeral>."""

    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        *,
        job: str = "hypocenter",
        rule_files: list[Path] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.config = workdir / "prometheus.yml"
        self.extra_args = list(extra_args or [])
        doc: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}]
            if targets
            else [],
        }
        if rule_files:
            doc["rule_files"] = [str(p) for p in rule_files]
        self.config.write_text(yaml.safe_dump(doc))
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusProcess:
        assert PROMETHEUS is not None
        log = (self.workdir / "prometheus.log").open("ab")
        for _ in range(3):  # the port may be taken between choosing and binding it
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",
                    "--log.level=warn",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=log,
                cwd=self.workdir,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                        log.close()
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            self.stop()
        log.close()
        raise RuntimeError(
            f"prometheus did not start: {(self.workdir / 'prometheus.log').read_text()[-2000:]}"
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10.0)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.25)
        raise AssertionError(f"{expr} returned nothing within {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        terminate(self.proc)
        self.proc = None


def openmetrics(series: Iterable[Series]) -> str:
    """Series as OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`: one family's
    samples together, each series in time order, seconds since the epoch, `# EOF` at the end."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    families: dict[str, list[str]] = {}
    for s in series:
        labels = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(s.labels.items()))
        lines = families.setdefault(s.name, [])
        for when, value in sorted(s.samples):
            lines.append(f"{s.name}{{{labels}}} {value!r} {when.timestamp():.3f}")
    return (
        "".join(
            f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n" for name, lines in sorted(families.items())
        )
        + "# EOF\n"
    )


def backfilled_prometheus(workdir: Path, series: Iterable[Series]) -> PrometheusProcess:
    """A started Prometheus serving exactly `series`, written as TSDB blocks by promtool (the
    documented backfill path), with no scrape targets. Retention is counted back from the newest
    block, so a long one keeps every recorded sample whatever its age."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "series.om"
    source.write_text(openmetrics(series))
    made = promtool("tsdb", "create-blocks-from", "openmetrics", str(source), str(workdir / "tsdb"))
    if made.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from failed: {made.stdout[-2000:]}{made.stderr[-2000:]}")
    return PrometheusProcess(workdir, [], extra_args=["--storage.tsdb.retention.time=100y"]).start()
