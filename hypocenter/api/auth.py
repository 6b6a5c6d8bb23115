"""Who may talk to the server: bearer tokens and client certificates, mapped to roles.

Roles (docs/security.md has the table):

    ingest   OTLP export (collectors)
    read     REST and gRPC reads: diagnoses, attempts, WatchDiagnoses; /metrics off loopback, or when
             metrics_auth is on
    admin    everything that changes or triggers: bundle uploads, PUT attempts, analyze, POST /v1/scopes;
             admin implies read and ingest

Credentials, in order: `Authorization: Bearer <token>` (HTTP header, or gRPC metadata `authorization`
as the OpenTelemetry Collector's bearertokenauth extension sends it), then a verified client
certificate (`tls_client_ca_file`), its role taken from its subject CN (`tls_client_roles`, else
`tls_client_default_role`). A request with a bad token is refused even when a certificate would do:
a wrong token is a misconfiguration to see, not to paper over.

Tokens come from `auth_tokens_file` (YAML: role -> list of tokens; read again when it changes, so
tokens rotate without a restart) and from the environment (HYPOCENTER_AUTH_TOKEN_INGEST, _READ,
_ADMIN: one token each, or several separated by commas).
Each is compared in constant time against every known token; a client's identity as recorded in
provenance is `token:<role>:<first 8 hex of its SHA-256>`, never the token.

With neither tokens nor a client CA, authentication is off: every caller is `anonymous` with every
role. That is the zero-configuration default on loopback; `check_exposure` refuses it elsewhere
unless `allow_unauthenticated` is set.

This module decides, and holds each listener's guard: gRPC UNAUTHENTICATED / PERMISSION_DENIED
(`GrpcAuth`, a server interceptor), HTTP 401 with `WWW-Authenticate: Bearer` / 403 (`AuthGuard`,
ASGI middleware in front of REST and OTLP/HTTP); /metrics uses `Authenticator.authorize` through
tls.guard_wsgi.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.rpc import code_pb2
from starlette.types import ASGIApp, Receive, Scope, Send

from hypocenter import strict_yaml
from hypocenter.api.listener_limits import ReceiveDeadlines
from hypocenter.api.problems import OTLP_PATHS, refusal
from hypocenter.config import Settings, listen_address
from hypocenter.errors import InputError, RefusedCaller

log = logging.getLogger("hypocenter.server")

ROLES = ("ingest", "read", "admin")
TOKEN_ENV = {role: f"HYPOCENTER_AUTH_TOKEN_{role.upper()}" for role in ROLES}
_IMPLIED = {
    "ingest": frozenset({"ingest"}),
    "read": frozenset({"read"}),
    "admin": frozenset({"ingest", "read", "admin"}),
}


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: a name safe to log and store, and the roles it holds."""

    name: str
    role: str  # the role it was given (admin, read, ingest) or "anonymous"
    roles: frozenset[str]

    def may(self, role: str) -> bool:
        return role in self.roles

    def provenance(self) -> dict[str, str]:
        return {"client": self.name, "role": self.role}


ANONYMOUS = Identity("anonymous", "anonymous", frozenset(ROLES))
SERVER = Identity("hypocenter", "server", frozenset(ROLES))  # the server's own triggers and pollers

# The caller of the request being handled, for provenance (set by the listeners' guards).
current: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("hypocenter_identity", default=None)


class Unauthenticated(RefusedCaller):
    """No usable credentials: HTTP 401 / gRPC UNAUTHENTICATED."""

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        super().__init__(message)
        self.invalid_token = invalid_token


class Forbidden(RefusedCaller):
    """Authenticated, but without the role: HTTP 403 / gRPC PERMISSION_DENIED."""


def _fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:8]


def load_tokens(path: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(role, token) pairs from the tokens file and the environment."""
    pairs: list[tuple[str, str]] = []
    if path:
        file = Path(path)
        if not file.is_file():
            raise InputError(f"auth_tokens_file: {path}: no such file")
        doc = strict_yaml.load_file(file, display=path)
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise InputError(f"{path}: expected a mapping of role (ingest, read, admin) to a list of tokens")
        for role, tokens in doc.items():
            if role not in ROLES:
                raise InputError(f"{path}: unknown role {role!r} (roles: {', '.join(ROLES)})")
            if isinstance(tokens, str):
                tokens = [tokens]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise InputError(f"{path}: {role}: expected a list of tokens (strings)")
            pairs.extend((str(role), t) for t in tokens)
    for role, var in TOKEN_ENV.items():
        pairs.extend((role, t.strip()) for t in environ.get(var, "").split(",") if t.strip())
    for role, token in pairs:
        if len(token) < 16 or any(c.isspace() for c in token):
            raise InputError(
                f"a {role} token (sha256 {_fingerprint(token)}…) is shorter than 16 characters or holds "
                "whitespace: make one with `openssl rand -hex 32`"
            )
    return pairs


def _stamp(path: str) -> tuple[float, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1.0, -1, -1)
    return (st.st_mtime, st.st_size, st.st_ino)


def parse_cert_roles(text: str) -> dict[str, str]:
    """`tls_client_roles` ("CN=role,CN=role") as a mapping."""
    roles: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        cn, sep, role = item.rpartition("=")
        if not sep or not cn.strip() or role.strip() not in ROLES:
            raise InputError(f"tls_client_roles: {item!r} is not CN=ROLE with ROLE one of {', '.join(ROLES)}")
        roles[cn.strip()] = role.strip()
    return roles


class Authenticator:
    """Credentials in, an `Identity` out (or `Unauthenticated` / `Forbidden`)."""

    def __init__(
        self,
        tokens: Sequence[tuple[str, str]] = (),
        *,
        cert_roles: Mapping[str, str] | None = None,
        cert_default_role: str = "none",
        client_certs: bool = False,
    ) -> None:
        self._tokens = [(role, token.encode("utf-8")) for role, token in tokens]
        self._cert_roles = dict(cert_roles or {})
        self._cert_default = cert_default_role
        self.client_certs = client_certs
        self._enabled = bool(self._tokens) or client_certs  # fixed at start: a reload never turns auth off
        self._reload: Callable[[], None] = lambda: None

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> Authenticator:
        env = dict(os.environ if environ is None else environ)
        tokens = load_tokens(settings.auth_tokens_file, env)
        made = cls(
            tokens,
            cert_roles=parse_cert_roles(settings.tls_client_roles),
            cert_default_role=settings.tls_client_default_role,
            client_certs=bool(settings.tls_client_ca_file),
        )
        if settings.auth_tokens_file:
            made._watch(settings.auth_tokens_file, env)
        return made

    def _watch(self, path: str, environ: Mapping[str, str]) -> None:
        """Read the tokens file again when it changes (checked at most once a second, on a request):
        tokens are rotated without a restart. A file that no longer loads keeps the old tokens."""
        state: dict[str, Any] = {"checked": time.monotonic(), "stamp": _stamp(path)}
        lock = threading.Lock()

        def reload() -> None:
            now = time.monotonic()
            if now - state["checked"] < 1.0 or not lock.acquire(blocking=False):
                return
            try:
                state["checked"] = now
                stamp = _stamp(path)
                if stamp == state["stamp"]:
                    return
                state["stamp"] = stamp
                try:
                    tokens = load_tokens(path, environ)
                except InputError as exc:
                    log.error("auth_tokens_file not reloaded, the previous tokens stay: %s", exc)
                    return
                if not tokens:
                    log.error("auth_tokens_file %s now holds no token: the previous tokens stay", path)
                    return
                self._tokens = [(role, token.encode("utf-8")) for role, token in tokens]
                log.info("auth_tokens_file reloaded: %d tokens", len(tokens))
            finally:
                lock.release()

        self._reload = reload

    @property
    def enabled(self) -> bool:
        return self._enabled

    def authenticate(self, authorization: str | None, cert_cn: str | None = None) -> Identity:
        """The caller of a request with this Authorization value and verified client certificate CN."""
        if not self.enabled:
            return ANONYMOUS
        self._reload()
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the Authorization header is not `Bearer <token>`", invalid_token=True)
            return self._by_token(token.strip())
        if cert_cn is not None and self.client_certs:
            role = self._cert_roles.get(cert_cn, self._cert_default)
            if role in _IMPLIED:
                return Identity(f"cert:{cert_cn}", role, _IMPLIED[role])
            raise Forbidden(f"client certificate CN={cert_cn!r} has no role (tls_client_roles)")
        raise Unauthenticated("authentication required: send `Authorization: Bearer <token>`")

    def _by_token(self, token: str) -> Identity:
        given = token.encode("utf-8")
        found: str | None = None
        for role, known in self._tokens:  # every token compared, each in constant time
            if hmac.compare_digest(given, known) and found is None:
                found = role
        if found is None:
            raise Unauthenticated("unknown bearer token", invalid_token=True)
        return Identity(f"token:{found}:{_fingerprint(token)}", found, _IMPLIED[found])

    def authorize(self, authorization: str | None, cert_cn: str | None, role: str) -> Identity:
        identity = self.authenticate(authorization, cert_cn)
        if not identity.may(role):
            raise Forbidden(f"this needs the {role} role; the caller ({identity.name}) has {identity.role}")
        return identity


def is_loopback(address: str, setting: str) -> bool:
    host, _ = listen_address(address, setting)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_exposure(settings: Settings, auth: Authenticator) -> None:
    """Refuse to listen off loopback with nobody authenticated, unless told to; then warn."""
    listeners = [("grpc_listen", settings.grpc_listen), ("http_listen", settings.http_listen)]
    if settings.metrics_listen:
        listeners.append(("metrics_listen", settings.metrics_listen))
    exposed = [f"{name}={value}" for name, value in listeners if not is_loopback(value, name)]
    if not exposed or auth.enabled:
        return
    if not settings.allow_unauthenticated:
        raise InputError(
            f"refusing to listen on {', '.join(exposed)} without authentication: set auth_tokens_file "
            "(or HYPOCENTER_AUTH_TOKEN_*, or tls_client_ca_file), or pass --allow-unauthenticated"
        )
    log.warning(
        "listening on %s WITHOUT AUTHENTICATION (--allow-unauthenticated): anyone who reaches these ports "
        "can send telemetry, upload bundles, read and re-analyse every diagnosis",
        ", ".join(exposed),
    )


# ----------------------------------------------------------------------------------------- gRPC

# The role each gRPC method needs; a method missing here is refused (a new RPC must be placed).
GRPC_ROLES: dict[str, str | None] = {
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export": "ingest",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export": "ingest",
    "/hypocenter.v1.Attribution/GetDiagnosis": "read",
    "/hypocenter.v1.Attribution/ListDiagnoses": "read",
    "/hypocenter.v1.Attribution/ListRevisions": "read",
    "/hypocenter.v1.Attribution/WatchDiagnoses": "read",
    "/hypocenter.v1.Attribution/ListFleetSuspects": "read",
    "/hypocenter.v1.Attribution/GetFleetCost": "read",
    "/hypocenter.v1.Attribution/Analyze": "admin",
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "read",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": "read",
}


def grpc_cert_cn(context: grpc.ServicerContext) -> str | None:
    """The subject CN of the peer's verified certificate (gRPC verified it against the client CA)."""
    names: Any = context.auth_context().get("x509_common_name") or []
    first = names[0] if isinstance(names, list) and names else None
    return first.decode("utf-8", "replace") if isinstance(first, bytes) else None


class GrpcAuth(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Checks every RPC's credentials before its handler runs, and before its request message is read;
    the handler sees `current` set.

    grpcio's own unary handlers hold a worker thread while they wait for the request message, before
    anything could look at the caller: a client that opens calls and never sends a message would hold
    every worker. So every method taking one request message is served here as a request-streaming
    one: the credentials (metadata, and the peer certificate, which only the call's context knows) are
    checked first, and a refused call is answered at once without its message ever being read; then
    the message is awaited for at most `receive_timeout_s` (the call is cancelled after that), and
    handed to the method's own handler. Methods open to everyone (health) get the same bounded wait."""

    def __init__(
        self,
        auth: Authenticator,
        receive_timeout_s: float = 30.0,
        deadlines: ReceiveDeadlines | None = None,
    ) -> None:
        self.auth = auth
        self.receive_timeout_s = receive_timeout_s
        self.deadlines = deadlines or ReceiveDeadlines()

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method: str = details.method
        role = GRPC_ROLES.get(method, "admin")  # None: open to everyone (health)
        metadata = dict(details.invocation_metadata or ())
        authorization = metadata.get("authorization")
        auth = self.auth
        timeout, deadlines = self.receive_timeout_s, self.deadlines

        def check(context: grpc.ServicerContext) -> Identity | None:
            if role is None:
                return None
            try:
                return auth.authorize(
                    authorization if isinstance(authorization, str) else None, grpc_cert_cn(context), role
                )
            except Unauthenticated as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            except Forbidden as exc:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            raise AssertionError("unreachable")  # abort raises

        def receive(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            """The call's one request message, within the receive deadline."""
            key = deadlines.arm(timeout, context.cancel)
            try:
                request = next(requests, None)
            except grpc.RpcError:  # cancelled: by the client, or by the deadline above
                request = None
            finally:
                deadlines.disarm(key)
            if request is None and not context.is_active():  # nobody is left to hear the status
                context.abort(
                    grpc.StatusCode.CANCELLED,
                    f"no request message within {timeout:g} s (grpc_receive_timeout_s)",
                )
            if request is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} requires exactly one request message")
            return request

        # `current` is set around the handler and reset after: worker threads serve other callers next.
        def unary_response(behavior: Callable[..., Any], one: bool) -> Callable[..., Any]:
            def guarded(requests: Any, context: grpc.ServicerContext) -> Any:
                identity = check(context)
                request = receive(requests, context) if one else requests
                token = current.set(identity)
                try:
                    return behavior(request, context)
                finally:
                    current.reset(token)

            return guarded

        def stream_response(behavior: Callable[..., Any], one: bool) -> Callable[..., Any]:
            def guarded(requests: Any, context: grpc.ServicerContext) -> Any:
                identity = check(context)
                request = receive(requests, context) if one else requests
                token = current.set(identity)
                try:
                    yield from behavior(request, context)
                finally:
                    current.reset(token)

            return guarded

        # Every handler becomes request-streaming (see the class docstring).
        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                unary_response(handler.unary_unary, True), deserialize, serialize
            )
        if handler.unary_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                stream_response(handler.unary_stream, True), deserialize, serialize
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                unary_response(handler.stream_unary, False), deserialize, serialize
            )
        return grpc.stream_stream_rpc_method_handler(
            stream_response(handler.stream_stream, False), deserialize, serialize
        )


# ----------------------------------------------------------------------------------------- HTTP

# Paths anyone may reach (probes, and the API's shape: no data); everything else needs a role.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


# The web UI's page and its scripts, and the offline Swagger UI's assets: code, no data (a browser
# cannot attach a bearer token to a navigation or a module load; the page's own reads carry one).
OPEN_PREFIXES = ("/ui/static/", "/static-offline-docs/")
OPEN_PAGES = frozenset({"/ui", "/ui/"})


def http_role(method: str, path: str) -> str | None:
    """The role an HTTP request needs: None for the probes, ingest for OTLP, read for GETs, else admin."""
    if path in OPEN_PATHS or (
        method in ("GET", "HEAD") and (path in OPEN_PAGES or path.startswith(OPEN_PREFIXES))
    ):
        return None
    if method == "POST" and path in OTLP_PATHS:
        return "ingest"
    if method in ("GET", "HEAD", "OPTIONS"):
        return "read"
    return "admin"


def challenge(exc: Unauthenticated) -> str:
    """The WWW-Authenticate value of a 401 (RFC 6750 §3)."""
    if exc.invalid_token:
        return 'Bearer realm="hypocenter", error="invalid_token"'
    return 'Bearer realm="hypocenter"'


class AuthGuard:
    """The one guard in front of the whole ASGI app (routes and mounts added later included): the
    role a request needs (`http_role`) from its bearer token or verified client certificate
    (`peer_name(scope["client"])`), checked before anything reads the request body. The caller is
    left in `request.state.identity`; a refusal is the REST API's problem JSON."""

    def __init__(
        self, app: ASGIApp, authenticator: Authenticator, peer_name: Callable[[Any], str | None]
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.peer_name = peer_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        role = http_role(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if role is not None:
            authorization = next(
                (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), None
            )
            try:
                identity = self.authenticator.authorize(
                    authorization, self.peer_name(scope.get("client")), role
                )
            except Unauthenticated as exc:
                await refusal(
                    scope, 401, code_pb2.UNAUTHENTICATED, str(exc), {"WWW-Authenticate": challenge(exc)}
                )(scope, receive, send)
                return
            except Forbidden as exc:
                await refusal(scope, 403, code_pb2.PERMISSION_DENIED, str(exc), {})(scope, receive, send)
                return
            scope.setdefault("state", {})["identity"] = identity
        await self.app(scope, receive, send)
