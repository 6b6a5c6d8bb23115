"""Headers that tell a browser what the server's pages may do: no framing by other sites (clickjacking),
no MIME sniffing, and a Content-Security-Policy per kind of page.

    /ui, /ui/...            scripts, styles, fetches only from the server itself; no inline code
    /docs, /redoc, ...      the same, plus the pages' own inline script (allowed by its hash) and the
                            inline styles and blob: workers Swagger UI and ReDoc need
    everything else         JSON and OTLP answers: nothing to load, nothing to frame

This module only adds headers to what the routes answer; it never changes a body.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FRAME_ANCESTORS = "frame-ancestors 'none'"
UI_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    f"base-uri 'none'; form-action 'self'; {FRAME_ANCESTORS}"
)
API_POLICY = f"default-src 'none'; {FRAME_ANCESTORS}"
DOC_PAGES = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def docs_policy(html: bytes) -> str:
    """The policy of an API documentation page: its inline scripts allowed by their SHA-256 only."""
    sources = ["'self'"] + [
        f"'sha256-{base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode()}'"
        for m in _INLINE_SCRIPT.finditer(html)
    ]
    return (
        f"default-src 'none'; script-src {' '.join(sources)}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
        f"base-uri 'none'; form-action 'self'; {FRAME_ANCESTORS}"
    )


def _with(message: Message, policy: str) -> Message:
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-security-policy"]
    headers += [
        (b"content-security-policy", policy.encode("latin-1")),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    ]
    return {**message, "headers": headers}


class BrowserHeaders:
    """ASGI middleware adding the headers above to every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in DOC_PAGES:
            await self._docs(scope, receive, send)
            return
        policy = UI_POLICY if path == "/ui" or path.startswith("/ui/") else API_POLICY

        async def send_with(message: Message) -> None:
            await send(_with(message, policy) if message["type"] == "http.response.start" else message)

        await self.app(scope, receive, send_with)

    async def _docs(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A documentation page is a few KB: hold it until its inline scripts can be hashed."""
        start: Message | None = None
        body: list[bytes] = []

        async def hold(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                page = b"".join(body)
                await send(_with(start, docs_policy(page)))
                await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, hold)
