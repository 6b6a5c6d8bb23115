"""TLS on every listener (OTLP/gRPC + gRPC API, OTLP/HTTP + REST, /metrics): the official OTel SDK
exporters connect over TLS with a token; a rotated certificate is served without a restart; client
certificates (mTLS) authenticate with the role their CN maps to; slow clients are dropped."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from pki_support import CA, served_serial
from prometheus_support import PrometheusProcess, needs_prometheus

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.cli.assembly import Server, serve_in_thread
from hypocenter.errors import InputError
from tests.api.test_auth import TOKENS, _otel_logs, bearer, settings, tokens_file

pytestmark = pytest.mark.slow


@pytest.fixture()
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    # requests (under the OTel HTTP exporter) lets these override the exporter's certificate_file
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    ca = CA("hypocenter test CA")
    cert, key = ca.issue("hypocenter.test", server=True).write(tmp_path, "server")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    return {"ca": ca, "cert": cert, "key": key, "ca_file": tmp_path / "ca.crt", "dir": tmp_path}


def _start(tmp: Path, **extra: Any) -> tuple[Server, Any]:
    return serve_in_thread(settings(tmp, auth_tokens_file=str(tokens_file(tmp)), tls_reload_s=0.1, **extra))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _export_grpc(
    address: str, ca_pem: bytes, role: str, client: tuple[bytes, bytes] | None = None, timeout: float = 10
) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    creds = grpc.ssl_channel_credentials(ca_pem, *(client or (None, None)))
    e = OTLPLogExporter(
        endpoint=address,
        credentials=creds,
        headers={"authorization": bearer(role)["Authorization"]} if role else None,
        timeout=timeout,
    )
    try:
        return e.export(_otel_logs("tls-grpc", 2))
    finally:
        e.shutdown()


def _export_http(address: str, ca_file: Path, role: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    e = OTLPLogExporter(
        endpoint=f"https://{address}/v1/logs",
        certificate_file=str(ca_file),
        headers={"authorization": bearer(role)["Authorization"]},
        timeout=10,
    )
    try:
        return e.export(_otel_logs("tls-http", 2))
    finally:
        e.shutdown()


def test_every_listener_serves_tls_and_reloads_a_rotated_certificate(pki: dict[str, Any]) -> None:
    from opentelemetry.sdk._logs.export import LogRecordExportResult as R

    tmp = pki["dir"]
    srv, thread = _start(tmp, tls_cert_file=str(pki["cert"]), tls_key_file=str(pki["key"]), metrics_auth=True)
    try:
        ca: CA = pki["ca"]
        listeners = [
            _host_port(srv.grpc_address),
            _host_port(srv.http_address),
            _host_port(srv.outputs.metrics_address),
        ]
        first = {served_serial(h, p, ca.pem) for h, p in listeners}
        assert len(first) == 1
        assert _export_grpc(srv.grpc_address, ca.pem, "ingest") == R.SUCCESS
        assert _export_grpc(srv.grpc_address, ca.pem, "read") == R.FAILURE  # TLS does not replace the token
        assert _export_http(srv.http_address, pki["ca_file"], "ingest") == R.SUCCESS
        r = httpx.get(
            f"https://{srv.http_address}/v1/diagnoses",
            headers=bearer("read"),
            verify=ssl.create_default_context(cafile=str(pki["ca_file"])),
            timeout=30,
        )
        assert r.status_code == 200
        with pytest.raises(httpx.HTTPError):  # plaintext is not answered
            httpx.get(f"http://{srv.http_address}/healthz", timeout=5)

        # Rotate: a certificate from a new CA, written in place as cert-manager or certbot would.
        ca2 = CA("hypocenter rotated CA")
        issued = ca2.issue("hypocenter.test", server=True)
        pki["key"].write_bytes(issued.key_pem)
        pki["cert"].write_bytes(issued.cert_pem)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and srv.tls is not None and srv.tls.version == 0:
            time.sleep(0.05)
        assert {served_serial(h, p, ca2.pem) for h, p in listeners} == {issued.serial}
        assert _export_grpc(srv.grpc_address, ca2.pem, "ingest") == R.SUCCESS  # OTel gRPC exporter, new cert
        (tmp / "ca2.crt").write_bytes(ca2.pem)
        assert _export_http(srv.http_address, tmp / "ca2.crt", "ingest") == R.SUCCESS
        metrics = httpx.get(
            f"https://{srv.outputs.metrics_address}/metrics",
            headers=bearer("read"),
            verify=ssl.create_default_context(cafile=str(tmp / "ca2.crt")),
            timeout=30,
        )
        assert metrics.status_code == 200 and "hypocenter_build_info" in metrics.text

        # A half-written pair (key of another certificate) is not served: the rotated one stays.
        pki["key"].write_bytes(ca2.issue("other", server=True).key_pem)
        time.sleep(0.5)
        assert served_serial(*listeners[1], ca2.pem) == issued.serial
    finally:
        srv.shutdown()
        thread.join(30)


def test_client_certificates_authenticate_with_their_cn_role(pki: dict[str, Any]) -> None:
    from opentelemetry.sdk._logs.export import LogRecordExportResult as R

    tmp = pki["dir"]
    clients = CA("collectors CA")
    (tmp / "clients.crt").write_bytes(clients.pem)
    collector = clients.issue("collector-eos", server=False)
    reader = clients.issue("dashboards", server=False)
    stranger = CA("someone else").issue("collector-eos", server=False)
    srv, thread = _start(
        tmp,
        tls_cert_file=str(pki["cert"]),
        tls_key_file=str(pki["key"]),
        tls_client_ca_file=str(tmp / "clients.crt"),
        tls_client_roles="dashboards=read",
    )
    ca: CA = pki["ca"]
    try:
        # gRPC: the certificate alone authenticates (CN not mapped: the default role, ingest)
        assert (
            _export_grpc(srv.grpc_address, ca.pem, "", (collector.key_pem, collector.cert_pem)) == R.SUCCESS
        )
        creds = grpc.ssl_channel_credentials(ca.pem, collector.key_pem, collector.cert_pem)
        with grpc.secure_channel(srv.grpc_address, creds) as ch:
            with pytest.raises(grpc.RpcError) as exc:
                pb_grpc.AttributionStub(ch).ListDiagnoses(pb.ListDiagnosesRequest(), timeout=10)
            assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
        creds = grpc.ssl_channel_credentials(ca.pem, reader.key_pem, reader.cert_pem)
        with grpc.secure_channel(srv.grpc_address, creds) as ch:
            pb_grpc.AttributionStub(ch).ListDiagnoses(pb.ListDiagnosesRequest(), timeout=10)
        # a certificate from another CA does not get through the handshake
        assert (
            _export_grpc(srv.grpc_address, ca.pem, "ingest", (stranger.key_pem, stranger.cert_pem), timeout=2)
            == R.FAILURE
        )  # (the exporter retries UNAVAILABLE until its timeout)

        # HTTP: the certificate is optional (token clients still connect), and maps the same way
        def get(cert: Any, role: str | None) -> int:
            ctx = ssl.create_default_context(cafile=str(pki["ca_file"]))
            if cert is not None:
                c, k = cert.write(tmp, "client")
                ctx.load_cert_chain(c, k)
            r = httpx.get(
                f"https://{srv.http_address}/v1/diagnoses", headers=bearer(role), verify=ctx, timeout=30
            )
            return r.status_code

        assert get(reader, None) == 200
        assert get(collector, None) == 403
        assert get(None, None) == 401
        assert get(None, "read") == 200
        assert get(collector, "read") == 200  # a token wins over the certificate
    finally:
        srv.shutdown()
        thread.join(30)


def test_tls_settings_are_checked_at_start(tmp_path: Path, pki: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="go together"):
        Server(settings(tmp_path, tls_cert_file=str(pki["cert"])))
    with pytest.raises(InputError, match="cannot load"):
        Server(settings(tmp_path, tls_cert_file=str(pki["cert"]), tls_key_file=str(pki["ca_file"])))


@pytest.fixture()
def plain_server(tmp_path: Path) -> Iterator[Server]:
    srv, thread = serve_in_thread(settings(tmp_path, http_request_timeout_s=0.5, http_keep_alive_s=0.5))
    yield srv
    srv.shutdown()
    thread.join(30)


@pytest.mark.parametrize("stall", ["nothing", "half a header", "half a body"])
def test_a_stalling_http_client_is_disconnected(plain_server: Server, stall: str) -> None:
    sent = {
        "nothing": b"",
        "half a header": b"GET /v1/diagnoses HTTP/1.1\r\nHost: x\r\n",
        "half a body": b"PUT /v1/attempts/x/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nworkload:",
    }[stall]
    with socket.create_connection(_host_port(plain_server.http_address), timeout=10) as s:
        s.sendall(sent)
        started = time.monotonic()
        assert s.recv(1024) == b""  # closed by the server, not answered
        assert time.monotonic() - started < 5


def test_a_slow_request_in_progress_is_not_cut(plain_server: Server) -> None:
    """The timeout is the client's silence, not the length of a request the server is working on."""
    with socket.create_connection(_host_port(plain_server.http_address), timeout=10) as s:
        s.sendall(b"GET /v1/diagnoses HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        s.sendall(b"Accept: */*\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200")


def test_the_documented_openssl_commands_make_a_certificate_the_server_serves(tmp_path: Path) -> None:
    """docs/security.md's private-CA commands, run as written (in a temporary directory)."""
    import re
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", doc, re.DOTALL) if "openssl x509 -req" in b)
    script = block.replace("/etc/hypocenter/tls", str(tmp_path))
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    srv, thread = serve_in_thread(
        settings(
            tmp_path, tls_cert_file=str(tmp_path / "server.crt"), tls_key_file=str(tmp_path / "server.key")
        )
    )
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        assert httpx.get(f"https://{srv.http_address}/healthz", verify=ctx, timeout=30).status_code == 200
        with grpc.secure_channel(
            srv.grpc_address, grpc.ssl_channel_credentials((tmp_path / "ca.crt").read_bytes())
        ) as ch:
            pb_grpc.AttributionStub(ch).ListDiagnoses(pb.ListDiagnosesRequest(), timeout=10)
    finally:
        srv.shutdown()
        thread.join(30)


def test_a_silent_grpc_client_is_disconnected(tmp_path: Path) -> None:
    """A client that connects to the gRPC port and never sends the HTTP/2 preface does not keep it."""
    srv, thread = serve_in_thread(settings(tmp_path, http_request_timeout_s=0.5))
    try:
        with socket.create_connection(_host_port(srv.grpc_address), timeout=10) as s:
            started = time.monotonic()
            received = b""
            while chunk := s.recv(4096):  # the server's SETTINGS, then GOAWAY, then the connection closes
                received += chunk
            assert time.monotonic() - started < 5
            assert b"handshake timeout" in received  # GOAWAY's debug data
    finally:
        srv.shutdown()
        thread.join(30)


@needs_prometheus
def test_prometheus_scrapes_protected_metrics_with_the_documented_config(pki: dict[str, Any]) -> None:
    """A real Prometheus with docs/security.md's scrape config (a read token, https, the CA) scrapes
    /metrics that answers 401 to anyone without the token."""
    import re

    import yaml

    tmp = pki["dir"]
    srv, thread = _start(tmp, tls_cert_file=str(pki["cert"]), tls_key_file=str(pki["key"]), metrics_auth=True)
    prom: PrometheusProcess | None = None
    try:
        doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
        block = next(b for b in re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL) if "scrape_configs" in b)
        (tmp / "read.token").write_text(TOKENS["read"] + "\n")
        text = (
            block.replace("/etc/prometheus/hypocenter-read.token", str(tmp / "read.token"))
            .replace("/etc/prometheus/hypocenter-ca.crt", str(pki["ca_file"]))
            .replace(
                "hypocenter.example.org:9464", srv.outputs.metrics_address.replace("127.0.0.1", "localhost")
            )
        )
        config = yaml.safe_load(text)
        config["global"] = {"scrape_interval": "1s"}
        prom = PrometheusProcess(tmp, [])
        prom.config.write_text(yaml.safe_dump(config))
        prom.start()
        up = prom.wait_for('up{job="hypocenter"} == 1')
        assert up and prom.wait_for("hypocenter_build_info")
    finally:
        if prom is not None:
            prom.stop()
        srv.shutdown()
        thread.join(30)
