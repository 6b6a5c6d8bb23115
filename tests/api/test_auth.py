"""Who may talk to the server: bearer tokens per role on all four listeners (OTLP/gRPC, OTLP/HTTP, REST,
the gRPC API, and /metrics), refused with each protocol's own codes; the official OpenTelemetry SDK
exporters sending the token as the Collector's bearertokenauth does; the off-loopback start refusal."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from server_support import REPO, ServerProcess, clean_env

from hypocenter.api import auth
from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.cli.assembly import Server, serve_in_thread
from hypocenter.config import Settings
from hypocenter.errors import InputError

pytestmark = pytest.mark.slow

TOKENS = {
    "ingest": "ingest-token-0123456789abcdef",
    "read": "read-token-0123456789abcdef",
    "admin": "admin-token-0123456789abcdef",
}
BAD = "not-a-known-token-0123456789"


def tokens_file(directory: Path) -> Path:
    path = directory / "tokens.yaml"
    path.write_text("".join(f"{role}:\n  - {token}\n" for role, token in TOKENS.items()))
    return path


def bearer(role: str | None) -> dict[str, str]:
    if role is None:
        return {}
    return {"Authorization": f"Bearer {BAD if role == 'bad' else TOKENS[role]}"}


def settings(tmp: Path, **extra: Any) -> Settings:
    return Settings(
        grpc_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        store=str(tmp / "store.db"),
        settle_s=0.2,
        tick_s=0.05,
        log_level="warning",
        **extra,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("auth")
    srv, thread = serve_in_thread(settings(tmp, auth_tokens_file=str(tokens_file(tmp)), metrics_auth=True))
    yield srv
    srv.shutdown()
    thread.join(30)


# ----------------------------------------------------------------------------------------- REST

ATTEMPT_YAML = (
    "workload: {id: auth-job, attempt: 0, cluster: eos}\n"
    "window: {start: '2026-11-02T10:00:00Z', end: '2026-11-02T11:00:00Z'}\nnodes: [n1]\n"
)

CASES = [  # (method, path, role, status)
    ("GET", "/v1/diagnoses", None, 401),
    ("GET", "/v1/diagnoses", "bad", 401),
    ("GET", "/v1/diagnoses", "ingest", 403),
    ("GET", "/v1/diagnoses", "read", 200),
    ("GET", "/v1/diagnoses", "admin", 200),
    ("PUT", "/v1/attempts/auth-job/0", "read", 403),
    ("PUT", "/v1/attempts/auth-job/0", "ingest", 403),
    ("PUT", "/v1/attempts/auth-job/0", "admin", 200),
    ("POST", "/v1/attempts/auth-job/0/analyze", "read", 403),
    ("POST", "/v1/attempts/auth-job/0/analyze", "admin", 200),
    ("POST", "/v1/bundles", "read", 403),
    ("POST", "/v1/scopes", "read", 403),
    ("POST", "/v1/scopes", None, 401),
    ("POST", "/v1/logs", "read", 403),
    ("POST", "/v1/logs", None, 401),
    ("GET", "/healthz", None, 200),
    ("GET", "/readyz", None, 200),
    ("GET", "/openapi.json", None, 200),
]


@pytest.mark.parametrize(("method", "path", "role", "status"), CASES)
def test_rest_refuses_by_role(server: Server, method: str, path: str, role: str | None, status: int) -> None:
    body = ATTEMPT_YAML.encode() if method == "PUT" else b"{}"
    r = httpx.request(
        method,
        f"http://{server.http_address}{path}",
        content=body,
        timeout=30,
        headers={**bearer(role), "Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    if status not in (401, 403):
        return
    if path == "/v1/logs":  # OTLP/HTTP: a google.rpc.Status, here in the JSON the request declared
        assert r.json()["code"] == (16 if status == 401 else 7)  # UNAUTHENTICATED, PERMISSION_DENIED
    else:  # REST: RFC 9457 problem details
        assert r.headers["content-type"] == "application/problem+json" and r.json()["status"] == status
    if status == 401:
        challenge = r.headers["WWW-Authenticate"]
        assert challenge.startswith("Bearer ")
        assert ('error="invalid_token"' in challenge) == (role == "bad")
        assert "token" in r.text
    if status == 403:
        assert "role" in r.text


@pytest.mark.parametrize(("role", "status"), [(None, 401), ("ingest", 403), ("read", 200), ("bad", 401)])
def test_metrics_needs_read_when_asked(server: Server, role: str | None, status: int) -> None:
    r = httpx.get(f"http://{server.outputs.metrics_address}/metrics", headers=bearer(role), timeout=30)
    assert r.status_code == status
    if status == 200:
        assert "hypocenter_build_info" in r.text
    if status == 401:
        assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_refused_before_the_body_is_read(server: Server) -> None:
    """An unauthenticated client announcing a 1 GB body is answered 401 at once: nothing is read."""
    import socket

    host, _, port = server.http_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/scopes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n{"
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 401")


def test_a_new_route_is_covered_by_default(tmp_path: Path) -> None:
    """A route added to the app later (another engineer's) needs a role without doing anything."""
    import asyncio

    from hypocenter.api.http import build_app
    from hypocenter.server.service import Attribution
    from hypocenter.store.sqlite import SQLiteStore

    authenticator = auth.Authenticator(list(TOKENS.items()))
    store = SQLiteStore(":memory:")
    service = Attribution(settings(tmp_path), store)
    try:
        app = build_app(service, authenticator=authenticator)

        @app.get("/v1/something-new")
        @app.post("/v1/something-new")
        async def new() -> dict[str, str]:
            return {"ok": "yes"}

        async def calls() -> list[httpx.Response]:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://test"
            ) as client:
                return [
                    await client.get("/v1/something-new"),
                    await client.get("/v1/something-new", headers=bearer("read")),
                    await client.post("/v1/something-new", headers=bearer("read")),
                    await client.post("/v1/something-new", headers=bearer("admin")),
                ]

        anonymous, reader, read_post, admin_post = asyncio.run(calls())
        assert anonymous.status_code == 401
        assert reader.json() == {"ok": "yes"}
        assert read_post.status_code == 403
        assert admin_post.json() == {"ok": "yes"}
    finally:
        service.close()
        store.close()


# ----------------------------------------------------------------------------------------- OTLP, official SDK exporters


def _otel_logs(workload: str, n: int) -> list[Any]:
    from opentelemetry._logs import LogRecord
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource(
        {"host.name": "n1", "hypocenter.workload.id": workload, "hypocenter.workload.attempt": 0}
    )
    now = time.time_ns()
    return [
        ReadableLogRecord(
            LogRecord(
                timestamp=now + i,
                observed_timestamp=now,
                body=f"line {i}",
                attributes={"log.file.path": "/var/log/app.log"},
            ),
            resource,
            InstrumentationScope("test"),
        )
        for i in range(n)
    ]


def _stored(server: Server, workload: str) -> int:
    r = httpx.get(
        f"http://{server.http_address}/v1/attempts/{workload}/0", headers=bearer("read"), timeout=30
    )
    return int(r.json()["log_records"]) if r.status_code == 200 else 0


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_official_otlp_exporters_send_the_token(server: Server, transport: str) -> None:
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    def exporter(role: str | None) -> Any:
        headers = {"authorization": bearer(role)["Authorization"]} if role else None
        if transport == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs

            return GrpcLogs(endpoint=server.grpc_address, insecure=True, headers=headers, timeout=10)
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs

        return HttpLogs(endpoint=f"http://{server.http_address}/v1/logs", headers=headers, timeout=10)

    workload = f"otel-{transport}"
    records = _otel_logs(workload, 3)
    for role in (None, "bad", "read"):
        e = exporter(role)
        try:
            assert e.export(records) == LogRecordExportResult.FAILURE
        finally:
            e.shutdown()
    assert _stored(server, workload) == 0
    for role in ("ingest", "admin"):
        e = exporter(role)
        try:
            assert e.export(records) == LogRecordExportResult.SUCCESS
        finally:
            e.shutdown()
    assert _stored(server, workload) == 3  # the admin's retry of the same records is stored once


def _code(call: Any, request: Any, role: str | None) -> grpc.StatusCode:
    """The status of one unary call with the role's token (none when `role` is None)."""
    metadata = (("authorization", bearer(role)["Authorization"]),) if role else None
    try:
        call(request, metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _export(channel: grpc.Channel, role: str | None) -> grpc.StatusCode:
    return _code(
        logs_service_pb2_grpc.LogsServiceStub(channel).Export,
        logs_service_pb2.ExportLogsServiceRequest(),
        role,
    )


def _list(channel: grpc.Channel, role: str | None) -> grpc.StatusCode:
    return _code(pb_grpc.AttributionStub(channel).ListDiagnoses, pb.ListDiagnosesRequest(), role)


def _analyze(channel: grpc.Channel, role: str | None) -> grpc.StatusCode:
    return _code(
        pb_grpc.AttributionStub(channel).Analyze, pb.AnalyzeRequest(workload="nobody", attempt=0), role
    )


def test_grpc_status_codes_per_role(server: Server) -> None:
    S = grpc.StatusCode
    with grpc.insecure_channel(server.grpc_address) as ch:
        assert [_export(ch, r) for r in (None, "bad", "read", "ingest", "admin")] == [
            S.UNAUTHENTICATED,
            S.UNAUTHENTICATED,
            S.PERMISSION_DENIED,
            S.OK,
            S.OK,
        ]
        assert [_list(ch, r) for r in (None, "ingest", "read", "admin")] == [
            S.UNAUTHENTICATED,
            S.PERMISSION_DENIED,
            S.OK,
            S.OK,
        ]
        # admin passes the guard and reaches the handler, which knows no such attempt
        assert [_analyze(ch, r) for r in (None, "read", "admin")] == [
            S.UNAUTHENTICATED,
            S.PERMISSION_DENIED,
            S.NOT_FOUND,
        ]
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes stay open


def test_watch_streams_are_limited_per_client(server: Server) -> None:
    stub_ch = grpc.insecure_channel(server.grpc_address)
    stub = pb_grpc.AttributionStub(stub_ch)
    meta = (("authorization", bearer("read")["Authorization"]),)
    other = (("authorization", bearer("admin")["Authorization"]),)
    open_: list[Any] = []
    try:
        for _ in range(server.settings.watch_max_per_client):
            call = stub.WatchDiagnoses(pb.WatchDiagnosesRequest(), metadata=meta)
            assert dict(call.initial_metadata())["hypocenter-watch"] == "subscribed"
            open_.append(call)
        refused = stub.WatchDiagnoses(pb.WatchDiagnosesRequest(), metadata=meta)
        with pytest.raises(grpc.RpcError) as exc:
            next(refused)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "per client" in exc.value.details()
        another = stub.WatchDiagnoses(
            pb.WatchDiagnosesRequest(), metadata=other
        )  # another client still gets one
        assert dict(another.initial_metadata())["hypocenter-watch"] == "subscribed"
        open_.append(another)
    finally:
        for call in open_:
            call.cancel()
        stub_ch.close()


# ----------------------------------------------------------------------------------------- tokens


def test_tokens_come_from_the_environment_and_compare_exactly(tmp_path: Path) -> None:
    a = auth.Authenticator.from_settings(
        settings(tmp_path),
        environ={"HYPOCENTER_AUTH_TOKEN_READ": "env-read-token-0123456789, second-read-token-0123456789"},
    )
    assert a.enabled
    assert a.authenticate("Bearer second-read-token-0123456789").role == "read"
    assert a.authenticate("bearer env-read-token-0123456789").name.startswith("token:read:")
    for wrong in (
        "Bearer env-read-token-012345678",
        "Bearer env-read-token-0123456789x",
        "Basic abc",
        "env-read-token-0123456789",
    ):
        with pytest.raises(auth.Unauthenticated):
            a.authenticate(wrong)
    assert (
        "0123456789" not in a.authenticate("Bearer env-read-token-0123456789").name
    )  # never the token itself


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("viewer: [abcdefabcdefabcdef]\n", "unknown role 'viewer'"),
        ("read: [short]\n", "shorter than 16"),
        ("read: {a: b}\n", "expected a list of tokens"),
    ],
)
def test_a_bad_tokens_file_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        auth.load_tokens(str(path), {})


# ----------------------------------------------------------------------------------------- exposure


def _serve(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "serve",
            "--store",
            str(tmp / "s.db"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env(), **(env or {})},
        cwd=REPO,
        check=False,
    )


def test_off_loopback_without_auth_refuses_to_start(tmp_path: Path) -> None:
    r = _serve(tmp_path, "--grpc-listen", "0.0.0.0:0")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1, r.stderr
    assert "grpc_listen=0.0.0.0:0" in r.stderr and "--allow-unauthenticated" in r.stderr
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened


@pytest.mark.parametrize("how", ["allow", "tokens"])
def test_off_loopback_starts_with_tokens_or_the_flag(tmp_path: Path, how: str) -> None:
    flags: tuple[str, ...] = ("--grpc-listen", "0.0.0.0:0")
    env = {}
    if how == "allow":
        flags += ("--allow-unauthenticated",)
    else:
        env["HYPOCENTER_AUTH_TOKEN_ADMIN"] = TOKENS["admin"]
    srv = ServerProcess(tmp_path / "s.db", *flags, env=env).start()
    try:
        port = srv.grpc.rpartition(":")[2]
        assert srv.grpc.startswith("0.0.0.0:")
        r = httpx.get(f"{srv.base}/v1/diagnoses", headers=bearer("admin"), timeout=30)
        assert r.status_code == 200
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert _list(ch, None) == (
                grpc.StatusCode.OK if how == "allow" else grpc.StatusCode.UNAUTHENTICATED
            )
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    assert ("WITHOUT AUTHENTICATION" in log) == (how == "allow")


# ----------------------------------------------------------------------------------------- the repository's clients


@pytest.mark.parametrize(("role", "answer"), [(None, "401"), ("read", "403"), ("admin", None)])
def test_the_slurm_epilog_sends_a_token_from_a_file(
    server: Server, tmp_path: Path, role: str | None, answer: str | None
) -> None:
    env = {
        **clean_env(),
        "HYPOCENTER_URL": f"http://{server.http_address}",
        "SLURM_JOB_ID": "999999991",
        "HYPOCENTER_TIMEOUT": "30",
        "PATH": "/usr/bin:/bin",
    }  # no Slurm commands: the server cannot scope it
    if role is not None:
        (tmp_path / "token").write_text(TOKENS[role] + "\n")
        env["HYPOCENTER_TOKEN_FILE"] = str(tmp_path / "token")
    r = subprocess.run(
        ["sh", str(REPO / "deploy" / "slurm" / "hypocenter-epilog.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert r.returncode == 0
    if answer is not None:
        assert f"answered {answer}" in r.stderr
    else:  # past authentication: the server itself says why it could not scope the job
        assert "answered 401" not in r.stderr and "answered 403" not in r.stderr and "answered" in r.stderr


def test_replay_sends_a_token_from_a_file_or_the_environment(server: Server, tmp_path: Path) -> None:
    bundle = REPO / "examples" / "nvlink-xid149"
    cmd = [
        sys.executable,
        "-m",
        "hypocenter.cli",
        "replay",
        str(bundle),
        "--http",
        "--endpoint",
        server.http_address,
        "--timeout",
        "10",
    ]
    refused = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=REPO, check=False
    )
    assert refused.returncode == 1 and "did not accept" in refused.stderr
    (tmp_path / "token").write_text(TOKENS["admin"])
    ok = subprocess.run(
        [*cmd, "--token-file", str(tmp_path / "token")],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["outcome"] == "attributed"
    env = {**clean_env(), "HYPOCENTER_TOKEN": TOKENS["ingest"]}  # ingest may send, not trigger the analysis
    partial = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO, check=False)
    assert partial.returncode == 1 and "HTTP 403" in partial.stderr


def test_a_changed_tokens_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"read: [{TOKENS['read']}]\n")
    a = auth.Authenticator.from_settings(settings(tmp_path, auth_tokens_file=str(path)), environ={})
    assert a.authenticate(bearer("read")["Authorization"]).role == "read"
    path.write_text(f"admin: [{TOKENS['admin']}]\n")  # rotated: the read token is gone
    time.sleep(1.1)
    with pytest.raises(auth.Unauthenticated):
        a.authenticate(bearer("read")["Authorization"])
    assert a.authenticate(bearer("admin")["Authorization"]).role == "admin"
    path.write_text("admin: [short]\n")  # a broken file keeps the tokens it replaced
    time.sleep(1.1)
    assert a.authenticate(bearer("admin")["Authorization"]).role == "admin"
