"""/metrics needs a read token when it listens off loopback (tokens configured), without
`metrics_auth`; on loopback it stays open. The off-loopback listener is an address on the loopback
device of a network namespace this test makes: nothing listens outside the machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import REPO, clean_env, terminate

from hypocenter.cli.assembly import serve_in_thread
from tests.api.test_auth import TOKENS, bearer, settings, tokens_file

pytestmark = pytest.mark.slow

ADDRESS = "10.200.0.1"  # not loopback to hypocenter; reachable only inside the namespace


@pytest.fixture()
def namespace() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"hyp-metrics-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{ADDRESS}/32", "dev", "lo"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _in(ns: str, code: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_metrics_off_loopback_needs_a_read_token(namespace: str, tmp_path: Path) -> None:
    cmd = [
        *("ip", "netns", "exec", namespace, sys.executable, "-m", "hypocenter.cli", "serve"),
        *("--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"),
        *("--metrics-listen", f"{ADDRESS}:0", "--store", str(tmp_path / "store.db")),
        *("--auth-tokens-file", str(tokens_file(tmp_path)), "--log-level", "warning"),
    ]
    with (tmp_path / "server.log").open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=clean_env(), cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, (tmp_path / "server.log").read_text()
        url = f"http://{json.loads(line)['metrics']}/metrics"
        codes = _in(
            namespace,
            "import httpx\n"
            f"for h in ({{}}, {bearer('ingest')!r}, {bearer('read')!r}):\n"
            f"    print(httpx.get({url!r}, headers=h, timeout=30).status_code)\n",
        ).split()
        assert codes == ["401", "403", "200"]
    finally:
        terminate(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def test_metrics_on_loopback_stay_open(tmp_path: Path) -> None:
    srv, thread = serve_in_thread(settings(tmp_path, auth_tokens_file=str(tokens_file(tmp_path))))
    try:
        r = httpx.get(f"http://{srv.outputs.metrics_address}/metrics", timeout=30)
        assert r.status_code == 200 and "hypocenter_" in r.text
        assert TOKENS["read"] not in r.text
    finally:
        srv.shutdown()
        thread.join(30)
