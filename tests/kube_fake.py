"""An in-memory Kubernetes API server for connector tests, served through httpx.MockTransport.

It answers the GETs the Kubernetes connector makes the way the API server does: an object by name
(core and /apis groups), a namespaced list filtered by `labelSelector` (k=v,…) and `fieldSelector`
(involvedObject.kind/name), nodes, and pod logs (`container`, `previous`, `timestamps`; a log given
as bytes is served as they are, one given as a function as the stream of pieces it returns, sent
as chunked transfer the way the API server streams a log). A kind it
does not hold answers a plain `404 page not found`, like a CRD that is not installed; a missing object
answers a `Status` 404; a wrong bearer token a `Status` 401. `fail` queues status codes per path
for retry tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

Log = str | bytes | Callable[[], Iterator[bytes]]
PLURALS = {
    "pods": "Pod",
    "events": "Event",
    "nodes": "Node",
    "jobs": "Job",
    "jobsets": "JobSet",
    "pytorchjobs": "PyTorchJob",
    "workloads": "Workload",
}
_PATH = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?"
    r"(?P<log>/log)?$"
)


def _status(code: int, reason: str, message: str) -> httpx.Response:
    return httpx.Response(
        code,
        json={
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
    )


class FakeKube:
    def __init__(
        self,
        objects: Iterable[dict[str, Any]],
        logs: dict[tuple[str, str | None, bool], Log] | None = None,
        *,
        token: str | None = "fake-token",
        fail: dict[str, list[int]] | None = None,
    ) -> None:
        self.objects = [o for o in objects if isinstance(o, dict) and o.get("kind")]
        self.logs = logs or {}
        self.token = token
        self.fail = fail or {}
        self.requests: list[httpx.Request] = []
        self.kinds = {o["kind"] for o in self.objects}

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if self.fail.get(path):
            code = self.fail[path].pop(0)
            return _status(code, "TooManyRequests" if code == 429 else "InternalError", f"injected {code}")
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        m = _PATH.match(path)
        kind = PLURALS.get(m.group("plural")) if m else None
        if m is None or kind is None or kind not in self.kinds | {"Event", "Pod"}:
            return httpx.Response(404, text="404 page not found")
        ns, name = m.group("ns"), m.group("name")
        params = request.url.params
        if m.group("log"):
            return self._log(ns, name or "", params.get("container"), params.get("previous") == "true")
        matches = [
            o
            for o in self.objects
            if o["kind"] == kind and (ns is None or o.get("metadata", {}).get("namespace") in (ns, None))
        ]
        if name is not None:
            for o in matches:
                if o["metadata"]["name"] == name:
                    return httpx.Response(200, json=o)
            return _status(404, "NotFound", f'{m.group("plural")} "{name}" not found')
        for sel in filter(None, (params.get("labelSelector") or "").split(",")):
            key, _, value = sel.partition("=")
            matches = [o for o in matches if (o["metadata"].get("labels") or {}).get(key) == value]
        for sel in filter(None, (params.get("fieldSelector") or "").split(",")):
            key, _, value = sel.partition("=")
            field = key.removeprefix("involvedObject.")
            matches = [o for o in matches if (o.get("involvedObject") or {}).get(field) == value]
        return httpx.Response(200, json={"kind": f"{kind}List", "apiVersion": "v1", "items": matches})

    def _log(self, ns: str | None, pod: str, container: str | None, previous: bool) -> httpx.Response:
        for key in ((pod, container, previous), (pod, None, previous)):
            if key in self.logs:
                log = self.logs[key]
                if callable(log):
                    return httpx.Response(200, headers={"Content-Type": "text/plain"}, content=log())
                return (
                    httpx.Response(200, text=log)
                    if isinstance(log, str)
                    else httpx.Response(200, content=log)
                )
        if previous:
            return _status(
                400, "BadRequest", f'previous terminated container "{container}" in pod "{pod}" not found'
            )
        return _status(404, "NotFound", f'pods "{pod}" not found')


def documents(*paths: Path) -> list[dict[str, Any]]:
    """Objects from JSON files: single objects or lists (kind List / …List with items)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        doc = json.loads(p.read_text())
        out.extend(doc.get("items", []) if "items" in doc else [doc])
    return out


def example_logs(example: Path) -> dict[tuple[str, str | None, bool], str]:
    """Pod logs of an example bundle: logs/<node>/<pod>.log → (pod, None, False)."""
    return {(p.stem, None, False): p.read_text() for p in (example / "logs").glob("*/*.log")}
