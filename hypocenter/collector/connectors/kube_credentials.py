"""Kubernetes API credentials: where the server, token, certificates and CA come from.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hypocenter import strict_yaml
from hypocenter.collector.connectors.base import ConnectorError
from hypocenter.collector.connectors.http_api import auth_headers
from hypocenter.config import is_http_url
from hypocenter.errors import InputError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(slots=True)
class Credentials:
    """Where the API server is and how to talk to it."""

    server: str
    headers: dict[str, str] = field(default_factory=dict)
    ca_data: bytes | None = None  # PEM
    insecure: bool = False
    client_cert: bytes | None = None  # PEM
    client_key: bytes | None = None  # PEM
    namespace: str | None = None
    origin: str = ""  # "in-cluster" or "kubeconfig <path> context <name>", for messages
    # finds them again, as first found (re-reads the token file, re-runs the exec plugin): on a 401
    renew: Callable[[], Credentials] | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings; a CA or client certificate that is no PEM is an `auth` ConnectorError."""
        ctx = ssl.create_default_context()
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data:
            try:
                ctx.load_verify_locations(cadata=self.ca_data.decode("ascii", errors="replace"))
            except ssl.SSLError as exc:
                raise ConnectorError(f"{self.origin}: certificate-authority: {exc}", kind="auth") from None
        if self.client_cert and self.client_key:
            # ssl loads a client certificate only from files: write them where only we can read, briefly.
            with tempfile.TemporaryDirectory(prefix="hypocenter-k8s-") as tmp:
                cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
                for path, data in ((cert, self.client_cert), (key, self.client_key)):
                    path.touch(mode=0o600)
                    path.write_bytes(data)
                try:
                    ctx.load_cert_chain(str(cert), str(key))
                except ssl.SSLError as exc:
                    raise ConnectorError(
                        f"{self.origin}: client certificate and key: {exc}", kind="auth"
                    ) from None
        return ctx


def _read(path: str | Path, base: Path | None, what: str) -> bytes:
    p = Path(path).expanduser()
    if base is not None and not p.is_absolute():
        p = base / p
    try:
        return p.read_bytes()
    except OSError as exc:
        raise ConnectorError(f"{what} {p}: {exc.strerror or exc}", kind="auth") from None


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=False)
    except (ValueError, TypeError):
        raise ConnectorError(f"{what} is not base64", kind="auth") from None


def in_cluster(env: Mapping[str, str], root: Path = SERVICE_ACCOUNT) -> Credentials | None:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    token_file = root / "token"
    if not host or not token_file.is_file():
        return None
    token = _read(token_file, None, "service account token").decode().strip()
    ca = root / "ca.crt"
    ns = root / "namespace"
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Credentials(
        server=server,
        headers={"Authorization": f"Bearer {token}"},
        ca_data=ca.read_bytes() if ca.is_file() else None,
        namespace=ns.read_text().strip() if ns.is_file() else None,
        origin="in-cluster",
    )


def from_kubeconfig(
    path: Path, context: str | None = None, run: Callable[[list[str], Mapping[str, str]], str] | None = None
) -> Credentials:
    try:
        doc = strict_yaml.load_file(path, display=str(path))
    except InputError as exc:
        raise ConnectorError(f"kubeconfig: {exc}", kind="auth") from None
    if not isinstance(doc, dict):
        raise ConnectorError(f"kubeconfig {path}: not a kubeconfig (expected a mapping)", kind="auth")

    def named(section: str, name: str) -> dict[str, Any]:
        for item in doc.get(section) or []:
            if isinstance(item, dict) and item.get("name") == name:
                inner = item.get(section[:-1])
                return inner if isinstance(inner, dict) else {}
        raise ConnectorError(f"kubeconfig {path}: no {section[:-1]} named {name!r}", kind="auth")

    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise ConnectorError(f"kubeconfig {path}: no current-context (name one with --context)", kind="auth")
    ctx = named("contexts", str(ctx_name))
    cluster = named("clusters", str(ctx.get("cluster")))
    user = named("users", str(ctx.get("user"))) if ctx.get("user") else {}
    base = path.parent
    if not cluster.get("server"):
        raise ConnectorError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server", kind="auth")
    if not is_http_url(str(cluster["server"])):
        raise ConnectorError(
            f"kubeconfig {path}: cluster {ctx.get('cluster')!r}: server {cluster['server']!r} is "
            "not an https:// URL",
            kind="auth",
        )
    creds = Credentials(
        server=str(cluster["server"]).rstrip("/"),
        namespace=ctx.get("namespace"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        origin=f"kubeconfig {path} context {ctx_name}",
    )
    if cluster.get("certificate-authority-data"):
        creds.ca_data = _b64(str(cluster["certificate-authority-data"]), "certificate-authority-data")
    elif cluster.get("certificate-authority"):
        creds.ca_data = _read(str(cluster["certificate-authority"]), base, "certificate-authority")
    if user.get("client-certificate-data"):
        creds.client_cert = _b64(str(user["client-certificate-data"]), "client-certificate-data")
    elif user.get("client-certificate"):
        creds.client_cert = _read(str(user["client-certificate"]), base, "client-certificate")
    if user.get("client-key-data"):
        creds.client_key = _b64(str(user["client-key-data"]), "client-key-data")
    elif user.get("client-key"):
        creds.client_key = _read(str(user["client-key"]), base, "client-key")
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _read(str(user["tokenFile"]), base, "tokenFile").decode().strip()
    if not token and isinstance(user.get("exec"), dict):
        token = _exec_token(user["exec"], run or _run_plugin)
    basic = (
        (str(user["username"]), str(user["password"]))
        if user.get("username") and user.get("password")
        else None
    )
    creds.headers.update(auth_headers(token=str(token) if token else None, basic_auth=basic))
    return creds


def _run_plugin(argv: list[str], env: Mapping[str, str]) -> str:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise ConnectorError(f"kubeconfig exec plugin {argv[0]} not found on PATH", kind="auth") from None
    except subprocess.TimeoutExpired:
        raise ConnectorError(
            f"kubeconfig exec plugin {argv[0]} did not answer in 60 s", kind="transient"
        ) from None
    if proc.returncode != 0:
        said = proc.stderr.strip()[:300] or f"exit status {proc.returncode}"
        raise ConnectorError(f"kubeconfig exec plugin {argv[0]}: {said}", kind="auth")
    return proc.stdout


def _exec_token(spec: dict[str, Any], run: Callable[[list[str], Mapping[str, str]], str]) -> str:
    argv = [str(spec.get("command", ""))] + [str(a) for a in spec.get("args") or []]
    env = {
        str(e["name"]): str(e["value"]) for e in spec.get("env") or [] if isinstance(e, dict) and "name" in e
    }
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": spec.get("apiVersion"), "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    try:
        cred = json.loads(run(argv, env))
        token = cred["status"]["token"]
    except (ValueError, KeyError, TypeError):
        raise ConnectorError(
            f"kubeconfig exec plugin {argv[0]}: no ExecCredential status.token in its output", kind="auth"
        ) from None
    return str(token)


def credentials(
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Credentials:
    """The module docstring's order: explicit kubeconfig, in-cluster, $KUBECONFIG, ~/.kube/config."""
    found = _credentials(kubeconfig, context, os.environ if env is None else env, service_account)
    found.renew = partial(
        _credentials, kubeconfig, context, os.environ if env is None else env, service_account
    )
    return found


def _credentials(
    kubeconfig: str | Path | None, context: str | None, env: Mapping[str, str], service_account: Path
) -> Credentials:
    if kubeconfig is not None:
        return from_kubeconfig(Path(kubeconfig).expanduser(), context)
    if context is None:
        found = in_cluster(env, service_account)
        if found is not None:
            return found
    paths = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths.append(str(Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"))
    for p in paths:
        if Path(p).is_file():
            return from_kubeconfig(Path(p), context)
    raise ConnectorError(
        "no Kubernetes credentials: not in a cluster (no KUBERNETES_SERVICE_HOST and service "
        "account token) and no kubeconfig ($KUBECONFIG, ~/.kube/config or --kubeconfig)",
        kind="auth",
    )
