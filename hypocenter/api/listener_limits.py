"""What one client may hold of a listener: time, connections and buffered bytes (docs/security.md,
"Listener limits").

    ReceiveDeadlines   gRPC: a call whose request message has not arrived `grpc_receive_timeout_s`
                       after its handler started is cancelled, so a stalled call never keeps a worker
    ConnectionCap      HTTP: at most `http_max_connections` open connections, and
                       `http_max_connections_per_client` per client address; others are answered 503
                       and closed at once (before the process runs out of file descriptors)
    BodyBudget         HTTP: request bodies buffered by all requests together stay within
                       `http_body_budget_bytes`; a request that does not fit is answered 503 with
                       Retry-After (OTLP exporters retry it) before its body is read

Each limit logs once when it starts refusing and once when it stops, never once per refusal: an attack
must not turn into a flood of log lines. Who a caller is, is decided in api/auth.py.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from google.rpc import code_pb2
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypocenter.api.problems import refusal
from hypocenter.errors import TransientError

log = logging.getLogger("hypocenter.server")


class StateLog:
    """Logs a limit's 'refusing' and 'recovered' once per change of state, whatever the number of refusals."""

    def __init__(self, refusing: str, recovered: str) -> None:
        self._refusing_text = refusing
        self._recovered_text = recovered
        self.refusing = False
        self.refused = 0
        self._lock = threading.Lock()

    def refuse(self, *args: Any) -> None:
        with self._lock:
            self.refused += 1
            if self.refusing:
                return
            self.refusing = True
        log.warning(self._refusing_text, *args)

    def recover(self) -> None:
        with self._lock:
            if not self.refusing:
                return
            self.refusing = False
            refused = self.refused
            self.refused = 0
        log.warning(self._recovered_text + " (%d refused meanwhile)", refused)


# ----------------------------------------------------------------------------------------- gRPC


class ReceiveDeadlines:
    """One thread that runs each armed callback when its deadline passes, unless disarmed first
    (a timer thread per call would cost more than the calls it guards)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, after_s: float, callback: Callable[[], None]) -> int:
        with self._cond:
            key = next(self._seq)
            heapq.heappush(self._heap, (time.monotonic() + after_s, key, callback))
            self._live.add(key)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hypocenter-grpc-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()
            return key

    def disarm(self, key: int) -> None:
        with self._cond:
            self._live.discard(key)
            if len(self._heap) > 2 * len(self._live) + 64:  # most calls end long before their deadline
                self._heap = [entry for entry in self._heap if entry[1] in self._live]
                heapq.heapify(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                    # drop the disarmed ones from the top so the wait follows the live deadlines
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                _, key, callback = heapq.heappop(self._heap)
                if key not in self._live:
                    continue
                self._live.discard(key)
            try:
                callback()
            except Exception:  # a call already gone: nothing to cancel
                log.debug("receive deadline callback failed", exc_info=True)


# ----------------------------------------------------------------------------------------- HTTP

BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
)


class ConnectionCap:
    """Open HTTP connections, in all and per client address, each against its bound. The global limit
    logs when it is reached and when the count is back under 90 % of it; a client's, when that client
    first reaches it and (once) when its last connection closes."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self._open: Counter[str] = Counter()
        self._capped: dict[str, int] = {}  # clients refused since they reached their limit: how many times
        self._count = 0
        self._log = StateLog(
            "HTTP connection limit reached (%d open, http_max_connections): new connections are "
            "answered 503 and closed",
            "HTTP connections below their limit again",
        )

    def admit(self, client: str) -> bool:
        """Count a new connection from `client` in, or say it must be refused (it is then not counted)."""
        if self._count >= self.total:
            self._log.refuse(self.total)
            return False
        if self._open[client] >= self.per_client:
            if client not in self._capped:
                self._capped[client] = 0
                log.warning(
                    "HTTP connection limit reached for %s (%d open, http_max_connections_per_client): "
                    "its new connections are answered 503 and closed",
                    client,
                    self.per_client,
                )
            self._capped[client] += 1
            return False
        self._count += 1
        self._open[client] += 1
        return True

    def release(self, client: str) -> None:
        self._count -= 1
        self._open[client] -= 1
        if self._open[client] <= 0:
            del self._open[client]
            refused = self._capped.pop(client, None)
            if refused is not None:
                log.warning("%s holds no HTTP connection any more (%d refused meanwhile)", client, refused)
        if self._log.refusing and self._count < self.total * 0.9:
            self._log.recover()

    @property
    def open(self) -> int:
        return self._count


class BudgetSpent(TransientError):
    """The body budget ran out while a request's body was being read (answered 503, Retry-After)."""


class BodyBudget:
    """ASGI middleware: the request body bytes buffered by all requests in progress together stay
    within `budget` (a route keeps what it read until it answers). A request declaring more than what is
    left, or whose body runs past it while arriving, is answered 503 with Retry-After and its
    connection closed: OTLP exporters retry 503, and the memory goes back as the others finish."""

    def __init__(self, app: ASGIApp, budget: int, retry_after_s: float) -> None:
        self.app = app
        self.budget = budget
        self.retry_after = str(max(1, round(retry_after_s)))
        self.used = 0
        self._log = StateLog(
            "request body budget spent (%d bytes buffered, http_body_budget_bytes): requests with a "
            "body are answered 503",
            "request body budget available again",
        )

    def _refuse(self, scope: Scope) -> Response:
        self._log.refuse(self.used)
        return refusal(
            scope,
            503,
            code_pb2.UNAVAILABLE,
            f"the server holds {self.budget:,} bytes of request bodies already (http_body_budget_bytes): "
            "retry later",
            {"Retry-After": self.retry_after, "Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
        if declared.isdigit() and self.budget >= int(declared) > self.budget - self.used:
            await self._refuse(scope)(scope, receive, send)  # never fits now: not a byte of it is read
            return
        taken = 0
        started = False

        async def counted() -> Message:
            nonlocal taken
            message = await receive()
            size = len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if size:
                if self.used + size > self.budget:
                    raise BudgetSpent
                self.used += size
                taken += size
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BudgetSpent:
            if started:
                raise
            await self._refuse(scope)(scope, receive, send)
        finally:
            self.used -= taken
            if self._log.refusing and self.used < self.budget // 2:
                self._log.recover()
