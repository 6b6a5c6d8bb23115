"""Grafana annotations for diagnoses (`POST /api/annotations`), through the same outbox as Loki.

Body (Grafana HTTP API, legacy annotations, supported through Grafana 13):
    {"time": <ms>, "timeEnd": <ms>, "tags": [...], "text": "...", "dashboardUID": "..."?}
Without `dashboardUID` the annotation belongs to the organisation and shows on every dashboard
whose annotation query asks for its tags (grafana/dashboards/* ask for `hypocenter`). Answer:
200 `{"message": "Annotation added", "id": N}`. Auth: a service-account token (`Bearer`), with
the `annotations:create` and `annotations:write` permissions.

The region spans from where the failure began (root cause first_seen, else the attempt's end) to
the attempt's end. Tags: `hypocenter`, `cluster:<c>`, `outcome:<o>`, `domain:<d>`, `subdomain:<s>`,
`node:<n>` per culprit node (at most NODE_TAGS), `workload:<id>`, `attempt:<n>`.

Annotations are sent one per request so that a failure never re-sends one already added.

One annotation per attempt: when the attempt already has one (the outbox keeps the id Grafana
answered), a later verdict — the final diagnosis after a provisional one — updates it in place with
`PATCH /api/annotations/:id` (text, tags, time and timeEnd; Grafana ≥ 6.0; answer 200 `{"message":
"Annotation patched"}`; permission `annotations:write`). An annotation someone deleted meanwhile
(404 "Annotation not found") is made again with POST.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import httpx

from hypocenter import __version__
from hypocenter.exporter.outbox import ExportRejected, ExportUnavailable, classify_status
from hypocenter.store.base import Delivered, DiagnosisRow

NODE_TAGS = 10


def _ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def annotation(row: DiagnosisRow, dashboard_uid: str = "") -> dict[str, Any]:
    d: dict[str, Any] = json.loads(row.body)
    rc = d.get("root_cause") or {}
    a = d.get("attempt") or {}
    window = a.get("window") or {}
    end = _ms(window.get("end")) or int(row.created * 1000)
    start = min(_ms(rc.get("first_seen")) or end, end)
    nodes = list(rc.get("nodes") or [])
    tags = ["hypocenter", f"outcome:{row.outcome}"]
    if row.cluster:
        tags.append(f"cluster:{row.cluster}")
    if row.domain:
        tags += [f"domain:{row.domain}", f"subdomain:{row.subdomain or ''}"]
    tags += [f"node:{n}" for n in nodes[:NODE_TAGS]]
    tags += [f"workload:{row.workload}", f"attempt:{row.attempt}"]
    if row.provisional:
        tags.append("provisional")
    if rc:
        where = ", ".join(nodes) or "the job"
        comps = ", ".join(f"{c['kind']} {c['id']}" for c in rc.get("components") or [])
        text = (
            f"{row.outcome}: {rc.get('domain')}/{rc.get('subdomain')} on {where}"
            + (f" ({comps})" if comps else "")
            + f" — {rc.get('summary', '')} · action {rc.get('action')}"
        )
    else:
        text = {
            "unattributed": "unattributed: no root cause can be attributed from the evidence available",
            "not_failed": "not failed",
        }.get(row.outcome, row.outcome)
    text += f" · workload {row.workload} attempt {row.attempt} · diagnosis {row.id}"
    body: dict[str, Any] = {"time": start, "timeEnd": end, "tags": tags, "text": text}
    if dashboard_uid:
        body["dashboardUID"] = dashboard_uid
    return body


class GrafanaAnnotations:
    """Adds one annotation per diagnosis; raises ExportRejected / ExportUnavailable on failure."""

    name = "grafana"
    max_batch = 1

    def __init__(
        self,
        url: str,
        *,
        token: str = "",
        dashboard_uid: str = "",
        org_id: int | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/api/annotations"
        self.dashboard_uid = dashboard_uid
        headers = {"User-Agent": f"hypocenter/{__version__}", "Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if org_id is not None:
            headers["X-Grafana-Org-Id"] = str(org_id)
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def send(self, batch: Sequence[DiagnosisRow]) -> None:
        self.revise([(row, None) for row in batch])

    def revise(self, batch: Sequence[tuple[DiagnosisRow, Delivered | None]]) -> list[str]:
        """Add each row's annotation, or update the one its attempt has (`before.ref`); returns the ids."""
        refs: list[str] = []
        for row, before in batch:
            body = annotation(row, self.dashboard_uid)
            if before is not None and before.ref.isdigit():
                patch = {k: body[k] for k in ("time", "timeEnd", "tags", "text")}
                r = self._call("PATCH", f"{self.url}/{before.ref}", patch)
                if r.status_code == 200:
                    refs.append(before.ref)
                    continue
                if r.status_code != 404:  # gone: make it again below
                    raise classify_status(r.status_code, r.text, r.headers.get("Retry-After"))
            r = self._call("POST", self.url, body)
            if r.status_code != 200:
                raise classify_status(r.status_code, r.text, r.headers.get("Retry-After"))
            try:
                answer = r.json()
            except ValueError:
                raise ExportRejected(f"not a Grafana annotations API answer: {r.text[:200]!r}") from None
            if not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
                raise ExportRejected(f"not a Grafana annotations API answer: {r.text[:200]!r}")
            refs.append(str(answer["id"]))
        return refs

    def _call(self, method: str, url: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self._client.request(method, url, content=json.dumps(body))
        except httpx.HTTPError as exc:
            raise ExportUnavailable(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._client.close()
