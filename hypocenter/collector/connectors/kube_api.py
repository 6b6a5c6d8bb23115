"""GETs against one Kubernetes API server (`KubeAPI`), classified and retried per the policy.

HTTP 401/403 → `auth`, 404 → `not_found`, 429/5xx/timeouts → `transient` (retried). A 401 first
finds the credentials again when they can be (`Credentials.renew`: a rotated token) and asks once more.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import httpx

from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy, with_retries
from hypocenter.collector.connectors.http_api import BorrowedTransport
from hypocenter.collector.connectors.kube_credentials import Credentials

DEFAULT_POLICY = RetryPolicy()


class KubeAPI:
    """GETs against one API server, with the policy's timeout, classification and retries.

    Connections are open only inside `with api:` (the connector opens one block per scope; blocks
    may nest, the outermost closes), so one KubeAPI serves many scopes and holds nothing open
    between them. A transport passed in is the caller's: used, never closed (base.py, "Resources")."""

    def __init__(
        self,
        creds: Credentials,
        *,
        policy: RetryPolicy = DEFAULT_POLICY,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.creds = creds
        self.policy = policy
        self.sleep = sleep
        self._transport = BorrowedTransport(transport) if transport is not None else None
        # once, not per block: a client certificate is loaded through a temporary file
        self._verify: ssl.SSLContext | bool = creds.ssl_context() if transport is None else True
        self._client: httpx.Client | None = None
        self._depth = 0

    def __enter__(self) -> KubeAPI:
        if self._client is None:
            transport = self._transport or httpx.HTTPTransport(verify=self._verify)
            self._client = httpx.Client(
                base_url=self.creds.server,
                headers=self.creds.headers,
                transport=transport,
                timeout=httpx.Timeout(self.policy.timeout_s),
            )
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth <= 0:
            self.close()

    def close(self) -> None:
        """Close the connections now; the next `with` opens new ones. The caller's transport stays open."""
        self._depth = 0
        if self._client is not None:
            self._client.close()
            self._client = None

    def get(self, path: str, params: Mapping[str, str] | None = None, *, what: str) -> Any:
        text = self.get_text(path, params, what=what)
        try:
            return json.loads(text)
        except ValueError:
            raise ConnectorError(f"{what}: answer is not JSON", kind="permanent") from None

    def get_text(self, path: str, params: Mapping[str, str] | None = None, *, what: str) -> str:
        return with_retries(lambda: self._once(path, params, what), self.policy, what=what, sleep=self.sleep)

    def stream_text(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        what: str,
        write: Callable[[str], None],
        restart: Callable[[], None],
    ) -> None:
        """`get_text`'s answer handed to `write` a piece at a time as it arrives (decoded the way
        `get_text` decodes it: the pieces joined are its text), never held whole. `restart` is called
        before each try: a retry after a body broke off part way sends the text again from its start."""

        def once() -> None:
            restart()
            self._once(path, params, what, write)

        with_retries(once, self.policy, what=what, sleep=self.sleep)

    def _renew(self) -> bool:
        """Find the credentials again (a 401: the token may have rotated); True if the token changed."""
        renew = self.creds.renew
        if renew is None or self._client is None:
            return False
        try:
            renewed = renew()
        except ConnectorError:
            return False  # the 401 says more than why the credentials cannot be found now
        if renewed.headers == self.creds.headers or renewed.server != self.creds.server:
            return False
        self.creds = replace(self.creds, headers=renewed.headers)
        self._client.headers.update(renewed.headers)
        return True

    def _once(
        self,
        path: str,
        params: Mapping[str, str] | None,
        what: str,
        write: Callable[[str], None] | None = None,
        renew: bool = True,
    ) -> str:
        """The body's text (or "" once every piece of it went to `write`); ConnectorError when it fails."""
        if self._client is None:
            raise RuntimeError("KubeAPI used outside `with api:`")
        try:
            with self._client.stream("GET", path, params=params) as resp:
                if resp.status_code < 300 and write is not None:
                    for text in resp.iter_text():
                        write(text)
                    return ""
                resp.read()
        except httpx.TimeoutException:
            raise ConnectorError(
                f"{what}: no answer from {self.creds.server} within {self.policy.timeout_s:g} s",
                kind="transient",
            ) from None
        except httpx.TransportError as exc:
            raise ConnectorError(
                f"{what}: {self.creds.server}: {type(exc).__name__}: {exc}", kind="transient"
            ) from None
        if resp.status_code == 401 and renew and self._renew():
            return self._once(path, params, what, write, renew=False)  # with the new token, once
        if resp.status_code < 300:
            return resp.text
        message = _status_message(resp)
        detail = f"{what}: HTTP {resp.status_code}: {message}"
        if resp.status_code in (401, 403):
            raise ConnectorError(f"{detail} (credentials from {self.creds.origin})", kind="auth")
        if resp.status_code == 404:
            raise ConnectorError(detail, kind="not_found")
        if resp.status_code in (408, 429) or resp.status_code >= 500:
            raise ConnectorError(detail, kind="transient")
        raise ConnectorError(detail, kind="permanent")


def _status_message(resp: httpx.Response) -> str:
    """A Kubernetes `Status` object's message, else the body."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return str(doc["message"])[:300]
    return resp.text.strip()[:300] or resp.reason_phrase
