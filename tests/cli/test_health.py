"""`hypocenter health` against a real server with TLS: what a container HEALTHCHECK or probe runs.

The server's certificate names only its Service (`hypocenter.hypocenter.svc`), as a cluster issuer
would make it; the check runs on the server's own host with the server's settings and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pki_support import CA
from server_support import REPO, clean_env

from hypocenter.cli.assembly import serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

SERVICE = "hypocenter.hypocenter.svc"


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    ca = CA("hypocenter test CA")
    cert, key = ca.issue(SERVICE, server=True, dns=(SERVICE,), ip=False).write(tmp_path, "server")
    client_cert, client_key = ca.issue("prober", server=False).write(tmp_path, "client")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    server, thread = serve_in_thread(
        settings(
            tmp_path,
            tls_cert_file=str(cert),
            tls_key_file=str(key),
            tls_client_ca_file=str(tmp_path / "ca.crt"),
        )
    )
    env = {
        **clean_env(),
        "PYTHONPATH": str(REPO),
        "HYPOCENTER_TLS_CERT_FILE": str(cert),
        "HYPOCENTER_TLS_KEY_FILE": str(key),
        "HYPOCENTER_HTTP_LISTEN": server.http_address,
        "HYPOCENTER_GRPC_LISTEN": server.grpc_address,
    }
    try:
        yield {
            "server": server,
            "env": env,
            "ca_file": tmp_path / "ca.crt",
            "client": (client_cert, client_key),
            "dir": tmp_path,
        }
    finally:
        server.shutdown()
        thread.join(30)


def health(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "health", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_with_the_servers_settings_alone_it_is_healthy_over_https(tls_server: dict[str, Any]) -> None:
    r = health(tls_server["env"])
    assert (r.returncode, r.stderr) == (0, "")


def test_grpc_health_over_tls_with_a_client_certificate(tls_server: dict[str, Any]) -> None:
    cert, key = tls_server["client"]
    r = health(tls_server["env"], "--grpc", "--cert-file", str(cert), "--key-file", str(key))
    assert (r.returncode, r.stderr) == (0, "")
    refused = health(tls_server["env"], "--grpc", "--timeout", "3")  # the listener requires a client cert
    assert refused.returncode == 1 and refused.stderr.startswith("hypocenter health: grpc://")
    assert len(refused.stderr.strip().splitlines()) == 1


def test_a_ca_file_checks_the_name(tls_server: dict[str, Any]) -> None:
    ca = str(tls_server["ca_file"])
    ok = health(tls_server["env"], "--ca-file", ca, "--server-name", SERVICE)
    assert (ok.returncode, ok.stderr) == (0, "")
    wrong = health(tls_server["env"], "--ca-file", ca)  # 127.0.0.1 is not a name the certificate carries
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("hypocenter health: https://127.0.0.1:") and "TLS:" in wrong.stderr
    assert "Traceback" not in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1


def test_another_ca_is_refused_in_one_line(tls_server: dict[str, Any]) -> None:
    other = tls_server["dir"] / "other.crt"
    other.write_bytes(CA("someone else").pem)
    r = health(tls_server["env"], "--ca-file", str(other), "--server-name", SERVICE)
    assert r.returncode == 1 and "TLS: certificate verify failed" in r.stderr, r.stderr


def test_plain_http_against_tls_and_a_stopped_server_say_why(tls_server: dict[str, Any]) -> None:
    env = {k: v for k, v in tls_server["env"].items() if not k.startswith("HYPOCENTER_TLS")}
    r = health(env)
    assert r.returncode == 1 and r.stderr.startswith("hypocenter health: http://127.0.0.1:"), r.stderr
    tls_server["server"].shutdown()
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        down = health(tls_server["env"], "--timeout", "2")
        if down.returncode == 1 and "connection refused" in down.stderr:
            break
        time.sleep(0.2)
    assert down.returncode == 1 and "connection refused (is the server running?)" in down.stderr, down.stderr


def test_help_names_no_source_path() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "health", "--help"],
        env={**clean_env(), "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "/readyz" in r.stdout and ".py" not in r.stdout


def test_the_images_health_check_passes_with_tls_on(tls_server: dict[str, Any]) -> None:
    """The Dockerfile's HEALTHCHECK command, with the image's ENV and the TLS variables a deployment
    adds (docs/security.md): healthy, where a plain http:// check made the container unhealthy."""
    from tests.deploy.test_image import DOCKERFILE, env_of, exec_form, stages

    _, runtime = stages(DOCKERFILE.read_text())
    command = exec_form(runtime, "HEALTHCHECK")
    env = {**env_of(runtime), **tls_server["env"]}  # the listeners where this server bound them
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *command[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert command[0] == "hypocenter" and (r.returncode, r.stderr) == (0, "")
