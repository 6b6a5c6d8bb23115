"""`hypocenter health`: is the server ready? Exit 0 if so, 1 with one line saying why not.

    hypocenter health [--config FILE] [--grpc] [--address HOST:PORT] [--ca-file PEM]
                      [--server-name NAME] [--token-file FILE] [--cert-file PEM --key-file PEM]

For a container's HEALTHCHECK, a systemd `ExecStartPost=`, a probe script. It reads the server's own
settings (the same file and `HYPOCENTER_*` environment as `serve`), so in the server's container or
unit it needs no flag: it asks `http_listen` (`GET /readyz`), or with `--grpc` `grpc_listen`
(`grpc.health.v1.Health/Check`), over TLS when the server has a certificate (`tls_cert_file`).

Whom it trusts: `--ca-file` when given (then the certificate's name is checked against
`--server-name`, default the address's host); otherwise the server's own certificate file, pinned —
on the server's own host the exact certificate it serves is the proof, whatever names it carries
(`127.0.0.1` rarely is one). `--token-file` sends `Authorization: Bearer …` (the probes are open, but a
proxy in front may want one); `--cert-file`/`--key-file` present a client certificate, which a gRPC
listener with `tls_client_ca_file` requires.
"""

from __future__ import annotations

import argparse
import contextlib
import ssl
import sys
from pathlib import Path
from typing import Any

from hypocenter.cli.console import EXIT_OK, one_line
from hypocenter.config import Settings, listen_address, load_settings
from hypocenter.errors import InputError

EXIT_UNHEALTHY = 1
_ANY = ("0.0.0.0", "::", "")


def _target(settings: Settings, args: argparse.Namespace) -> tuple[str, int]:
    if args.address:
        host, port = listen_address(args.address, "--address")
    else:
        listen = settings.grpc_listen if args.grpc else settings.http_listen
        host, port = listen_address(listen, "grpc_listen" if args.grpc else "http_listen")
        if host in _ANY:  # a wildcard listener answers on loopback
            host = "127.0.0.1" if host != "::" else "::1"
    return host, port


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{what} {path}: {exc.strerror}") from None


def _trust(settings: Settings, args: argparse.Namespace) -> tuple[bytes, bool] | None:
    """(PEM of what is trusted, whether the name is checked); None for plain text."""
    if args.ca_file:
        return _read(args.ca_file, "--ca-file"), True
    if settings.tls_cert_file:
        return _read(settings.tls_cert_file, "tls_cert_file"), False
    return None


def _ssl_context(trust: tuple[bytes, bool], args: argparse.Namespace) -> ssl.SSLContext:
    pem, check_name = trust
    ctx = ssl.create_default_context(cadata=pem.decode("ascii", "replace"))
    if not check_name:
        # the server's own certificate is the anchor: accepted as it is, not as an issuer of others
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        ctx.check_hostname = False
    if args.cert_file:
        ctx.load_cert_chain(args.cert_file, args.key_file or None)
    return ctx


def _token(args: argparse.Namespace) -> str | None:
    return _read(args.token_file, "--token-file").decode().strip() if args.token_file else None


def _http(host: str, port: int, trust: tuple[bytes, bool] | None, args: argparse.Namespace) -> str | None:
    import httpx

    scheme = "https" if trust is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}/readyz"
    headers = {"Authorization": f"Bearer {token}"} if (token := _token(args)) else {}
    verify: Any = _ssl_context(trust, args) if trust is not None else False
    # the name the certificate is checked against (and sent as SNI), when it is not the address's host
    extensions = {"sni_hostname": args.server_name} if trust is not None and args.server_name else {}
    try:
        with httpx.Client(verify=verify, timeout=args.timeout, trust_env=False) as client:
            r = client.get(url, headers=headers, extensions=extensions)
    except httpx.HTTPError as exc:
        return f"{url}: {_reason(exc)}"
    if r.status_code != 200:
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(r.json().get("detail") or "")
        return f"{url}: not ready ({r.status_code}{': ' + detail if detail else ''})"
    return None


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failed request, in one line (a certificate error, a refused connection)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    return str(exc) or type(exc).__name__


def _grpc(host: str, port: int, trust: tuple[bytes, bool] | None, args: argparse.Namespace) -> str | None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    options: list[tuple[str, Any]] = []
    if trust is None:
        channel = grpc.insecure_channel(target)
    else:
        pem, check_name = trust
        cert = _read(args.cert_file, "--cert-file") if args.cert_file else None
        key = _read(args.key_file, "--key-file") if args.key_file else None
        creds = grpc.ssl_channel_credentials(root_certificates=pem, private_key=key, certificate_chain=cert)
        name = args.server_name or (None if check_name else _certificate_name(pem))
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        channel = grpc.secure_channel(target, creds, options=options)
    metadata = [("authorization", f"Bearer {token}")] if (token := _token(args)) else None
    try:
        with channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout, metadata=metadata
            )
    except grpc.RpcError as exc:
        return f"grpc://{target}: {exc.code().name}: {one_line(exc.details() or '')}"
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        return f"grpc://{target}: not serving ({health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)})"
    return None


def _certificate_name(pem: bytes) -> str | None:
    """A DNS name the pinned certificate carries, for gRPC's name check (it cannot be turned off)."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    dns = names.get_values_for_type(x509.DNSName)
    return dns[0] if dns else None


def _cmd_health(args: argparse.Namespace) -> int:
    if args.key_file and not args.cert_file:
        raise InputError("--key-file needs --cert-file")
    settings, _ = load_settings({}, config=args.config)
    host, port = _target(settings, args)
    trust = _trust(settings, args)
    try:
        problem = (_grpc if args.grpc else _http)(host, port, trust, args)
    except ssl.SSLError as exc:  # a certificate or key that cannot be loaded
        raise InputError(f"TLS: {one_line(str(exc))}") from None
    if problem is not None:
        print(f"hypocenter health: {one_line(problem)}", file=sys.stderr)
        return EXIT_UNHEALTHY
    return EXIT_OK


def add_parser(sub: Any) -> None:
    h = sub.add_parser(
        "health",
        help="exit 0 if the server is ready (HTTP /readyz or gRPC health), 1 with the reason if not",
        description="Ask a running server whether it is ready: GET /readyz on http_listen, or gRPC health "
        "on grpc_listen with --grpc, over TLS when the server has a certificate. Reads the server's "
        "settings (file and HYPOCENTER_* environment), so in its container or unit it needs no flag.",
    )
    h.add_argument(
        "--config", metavar="FILE", help="the server's YAML settings file (default: $HYPOCENTER_CONFIG)"
    )
    h.add_argument("--grpc", action="store_true", help="ask grpc.health.v1.Health on grpc_listen instead")
    h.add_argument(
        "--address", metavar="HOST:PORT", help="ask this address (default: the listener's, loopback)"
    )
    h.add_argument(
        "--ca-file",
        metavar="PEM",
        help="trust this CA and check the certificate's name (default: pin the server's own tls_cert_file)",
    )
    h.add_argument(
        "--server-name", metavar="NAME", help="the name the certificate must carry (with --ca-file)"
    )
    h.add_argument("--token-file", metavar="FILE", help="send its bearer token")
    h.add_argument("--cert-file", metavar="PEM", help="client certificate (gRPC with tls_client_ca_file)")
    h.add_argument("--key-file", metavar="PEM", help="the client certificate's key")
    h.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds to wait (default 5)")
    h.set_defaults(func=_cmd_health)
