"""An HTTP JSON API as pull connectors call it: every call has the policy's timeout, carries the
auth and tenant headers, is classified when it fails (base.py) and retried when that may help.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy, with_retries

Classify = Callable[[httpx.Response, str], ConnectorError | None]
MESSAGE_CHARS = 500  # of a server's error body quoted in a coverage reason
DEFAULT_POLICY = RetryPolicy()


def auth_headers(
    *, token: str | None = None, basic_auth: tuple[str, str] | None = None, tenant: str | None = None
) -> dict[str, str]:
    """Authorization (bearer token or basic) and the multi-tenant `X-Scope-OrgID` header."""
    out: dict[str, str] = {}
    if token:
        out["Authorization"] = f"Bearer {token}"
    elif basic_auth is not None:
        user, password = basic_auth
        out["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    if tenant:
        out["X-Scope-OrgID"] = tenant
    return out


def message_of(response: httpx.Response) -> str:
    """The server's own words, shortened: Prometheus-style JSON `error`, else the body text."""
    text = response.text.strip()
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        text = doc["error"]
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS] + "…"
    return text or response.reason_phrase


def classify_status(response: httpx.Response, what: str) -> ConnectorError | None:
    """The generic HTTP mapping (module docstring); None for a success."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    detail = f"{what}: HTTP {status}: {message_of(response)}"
    if status in (401, 403):
        return ConnectorError(detail, kind="auth")
    if status == 404:
        return ConnectorError(detail, kind="not_found")
    if status in (408, 429) or (status >= 500 and status not in (501, 505)):
        return ConnectorError(detail, kind="transient")
    return ConnectorError(detail, kind="permanent")


class BorrowedTransport(httpx.BaseTransport):
    """A caller's transport: used, never closed (httpx.Client closes its transport with itself, and
    a connector collects many times with the one it was given). Every connector client that is
    handed a transport wraps it in this (base.py, "Resources")."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)


class HttpApi:
    """One backend's base URL with a client that applies the policy to every call."""

    def __init__(
        self,
        base_url: str,
        *,
        policy: RetryPolicy,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        classify: Classify = classify_status,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self.classify = classify
        self.sleep = sleep
        self.calls = 0  # HTTP requests sent, retries included
        self._headers = dict(headers or {})
        self._transport = BorrowedTransport(transport) if transport is not None else None
        self._client: httpx.Client | None = None

    def __enter__(self) -> HttpApi:
        """Open connections for one collection; leaving the block closes them (a connector object
        may live long, its sockets only as long as a collect)."""
        # One timeout for connect, write, pool and each read: a backend that accepts the connection and
        # then says nothing is a transient failure after timeout_s, never a hang.
        self._client = httpx.Client(
            headers=self._headers,
            timeout=httpx.Timeout(self.policy.timeout_s),
            transport=self._transport,
            follow_redirects=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def get(
        self,
        path: str,
        params: Mapping[str, str | int] | list[tuple[str, str]],
        *,
        what: str,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        return with_retries(
            lambda: self._once("GET", path, what, params=params, headers=headers),
            self.policy,
            what=what,
            sleep=self.sleep,
        )

    def post_form(self, path: str, data: Mapping[str, str], *, what: str) -> Any:
        """POST application/x-www-form-urlencoded: long queries do not hit URL length limits."""
        return with_retries(
            lambda: self._once("POST", path, what, data=data), self.policy, what=what, sleep=self.sleep
        )

    def _once(
        self,
        method: str,
        path: str,
        what: str,
        *,
        params: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        if self._client is None:
            raise RuntimeError("HttpApi used outside `with api:`")
        self.calls += 1
        url = self.base_url + path
        try:
            response = self._client.request(method, url, params=params, data=data, headers=headers)
        except httpx.TimeoutException as exc:
            raise ConnectorError(
                f"{what}: no answer from {self.base_url} within {self.policy.timeout_s:g} s "
                f"({type(exc).__name__})",
                kind="transient",
            ) from None
        except httpx.TransportError as exc:  # refused, reset, DNS, protocol errors
            raise ConnectorError(
                f"{what}: {self.base_url}: {type(exc).__name__}: {exc}", kind="transient"
            ) from None
        error = self.classify(response, what)
        if error is not None:
            raise error
        try:
            return response.json()
        except ValueError:
            raise ConnectorError(
                f"{what}: answer is not JSON: {response.text[:200]!r}", kind="permanent"
            ) from None
