"""What authentication and TLS cost an OTLP client: exports per second against one in-process server
in three configurations, measured in the same run:

    python -m bench.auth_overhead [--requests 200] [--records 100] [--rounds 3]

- plaintext, no tokens (the loopback default: the reference);
- plaintext with a bearer token (the constant-time comparison and the role check on every request);
- TLS with a bearer token (a certificate made for the run).

The store is SQLite in memory, so that disk syncs do not drown what is measured.

and the cost of the token check alone (every known token is compared, in constant time). Each
configuration sends the same `--requests` OTLP log exports of `--records` records with the
official OpenTelemetry SDK exporter, over gRPC and over HTTP, one after another on one connection.
Figures are for this machine and run only; compare rows of one run.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from pathlib import Path
from typing import Any

from hypocenter.cli.assembly import serve_in_thread
from hypocenter.config import Settings

TOKEN = "bench-ingest-token-0123456789abcdef"


def _certificate(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def _records(n: int, request: int) -> list[Any]:
    from opentelemetry._logs import LogRecord
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource({"host.name": "n1"})
    scope = InstrumentationScope("bench")
    t0 = 1_793_000_000_000_000_000 + request * n * 1000
    return [
        ReadableLogRecord(
            LogRecord(
                timestamp=t0 + i * 1000,
                observed_timestamp=t0,
                body=f"line {request} {i}",
                attributes={"log.file.path": "/var/log/bench.log"},
            ),
            resource,
            scope,
        )
        for i in range(n)
    ]


def _exporter(transport: str, address: str, token: str | None, ca: Path | None) -> Any:
    headers = {"authorization": f"Bearer {token}"} if token else None
    if transport == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs

        creds = grpc.ssl_channel_credentials(ca.read_bytes()) if ca else None
        return GrpcLogs(endpoint=address, insecure=ca is None, credentials=creds, headers=headers, timeout=30)
    import requests
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs

    session = requests.Session()
    session.trust_env = False  # $REQUESTS_CA_BUNDLE would override certificate_file
    return HttpLogs(
        endpoint=f"{'https' if ca else 'http'}://{address}/v1/logs",
        headers=headers,
        timeout=30,
        certificate_file=str(ca) if ca else None,
        session=session,
    )


def run(requests_n: int, records: int, rounds: int) -> dict[tuple[str, str], float]:
    """Best exports/s per (configuration, transport) over `rounds` interleaved rounds (the machine's
    other load only ever slows a round down)."""
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    best: dict[tuple[str, str], float] = {}
    sent = 0
    with tempfile.TemporaryDirectory(prefix="hypocenter-bench-auth-") as tmp:
        directory = Path(tmp)
        cert, key = _certificate(directory)
        (directory / "tokens.yaml").write_text(f"ingest: [{TOKEN}]\n")
        configs: list[tuple[str, dict[str, Any], str | None, Path | None]] = [
            ("plaintext, no auth", {}, None, None),
            ("plaintext + token", {"auth_tokens_file": str(directory / "tokens.yaml")}, TOKEN, None),
            (
                "TLS + token",
                {
                    "auth_tokens_file": str(directory / "tokens.yaml"),
                    "tls_cert_file": str(cert),
                    "tls_key_file": str(key),
                },
                TOKEN,
                cert,
            ),
        ]
        for _ in range(rounds):
            for label, extra, token, ca in configs:
                settings = Settings(
                    grpc_listen="127.0.0.1:0",
                    http_listen="127.0.0.1:0",
                    metrics_listen="",
                    store=":memory:",
                    settle_s=3600,
                    idle_timeout_s=86400,
                    log_level="error",
                    **extra,
                )
                server, thread = serve_in_thread(settings)
                try:
                    for transport, address in (("grpc", server.grpc_address), ("http", server.http_address)):
                        batches = [
                            _records(records, sent + i) for i in range(requests_n)
                        ]  # never deduplicated
                        sent += requests_n
                        exporter = _exporter(transport, address, token, ca)
                        try:
                            assert (
                                exporter.export(_records(1, -1)) == LogRecordExportResult.SUCCESS
                            )  # connect
                            started = time.perf_counter()
                            for batch in batches:
                                if exporter.export(batch) != LogRecordExportResult.SUCCESS:
                                    raise SystemExit(f"{label} {transport}: an export failed")
                            rate = requests_n / (time.perf_counter() - started)
                        finally:
                            exporter.shutdown()
                        best[(label, transport)] = max(rate, best.get((label, transport), 0.0))
                finally:
                    server.shutdown()
                    thread.join(30)
    return best


def authorize_cost(tokens: int, calls: int = 20000) -> float:
    """Seconds per `Authenticator.authorize` of a valid token among `tokens` known ones."""
    from hypocenter.api.auth import Authenticator

    known = [("ingest", f"bench-token-{i:06d}-0123456789abcdef") for i in range(tokens)]
    auth = Authenticator(known)
    header = f"Bearer {known[-1][1]}"
    started = time.perf_counter()
    for _ in range(calls):
        auth.authorize(header, None, "ingest")
    return (time.perf_counter() - started) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--records", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    best = run(args.requests, args.records, args.rounds)
    print(
        f"{args.requests} OTLP log exports of {args.records} records each, one client, best of {args.rounds} "
        "interleaved rounds, this machine:"
    )
    for (label, transport), per_s in sorted(
        best.items(), key=lambda kv: kv[0][1]
    ):  # stable: configs in order
        reference = best[("plaintext, no auth", transport)]
        print(f"  {transport:4}  {label:20}  {per_s:8.1f} exports/s  ({per_s / reference:.0%} of plaintext)")
    for n in (3, 100):
        print(f"  the token check itself, {n:3} tokens known: {authorize_cost(n) * 1e6:6.1f} µs per request")


if __name__ == "__main__":
    main()
