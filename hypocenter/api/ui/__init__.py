"""The web UI: a dashboard at /ui served by `hypocenter serve` itself, plus the fleet endpoint it reads.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from hypocenter import __version__
from hypocenter.api.ui.context import MAX_AROUND, EvidenceContext, evidence_context
from hypocenter.server.service import Attribution
from hypocenter.store.base import DiagnosisFacts

STATIC = Path(__file__).resolve().parent / "static"


class CulpritCount(BaseModel):
    cluster: str | None
    node: str
    kind: str | None = Field(None, description="component kind (gpu, port, …); null for a whole node")
    component: str | None = Field(None, description="component id, e.g. a GPU's PCI address or a port")
    diagnoses: int = Field(description="final diagnoses in the window naming it in their root cause")
    list_url: str = Field(description="the diagnoses naming this node as a culprit")


class FleetCulprits(BaseModel):
    window_s: float
    diagnoses: int = Field(description="final diagnoses in the window")
    nodes: list[CulpritCount]
    components: list[CulpritCount]


def culprit_counts(facts: list[DiagnosisFacts], top: int) -> tuple[list[CulpritCount], list[CulpritCount]]:
    """The same tallies as /metrics' hypocenter_recent_node_root_causes and ..._component_root_causes:
    one count per final diagnosis naming the node (or component) in its root cause or candidates.
    Most frequent first, ties by name, so the same store always gives the same answer."""
    by_node: Counter[tuple[str, str]] = Counter()
    by_component: Counter[tuple[str, str, str, str]] = Counter()
    for f in facts:
        cluster = f.cluster or ""
        for node in f.culprits:
            by_node[(cluster, node)] += 1
        for node, kind, ident in sorted(set(f.components)):
            by_component[(cluster, node, kind, ident)] += 1

    def link(cluster: str, node: str) -> str:
        return "/ui/#/?" + urlencode({"node": node, **({"cluster": cluster} if cluster else {})})

    nodes = [
        CulpritCount(cluster=c or None, node=n, kind=None, component=None, diagnoses=v, list_url=link(c, n))
        for (c, n), v in sorted(by_node.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    ]
    components = [
        CulpritCount(cluster=c or None, node=n, kind=k, component=i, diagnoses=v, list_url=link(c, n))
        for (c, n, k, i), v in sorted(by_component.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    ]
    return nodes, components


def router(service: Attribution) -> APIRouter:
    settings = service.settings
    api = APIRouter()
    # The tallies read every root cause's components out of the stored JSON (about 0.8 s for 10,000
    # diagnoses, see bench/ui_load.py): one answer is kept while no diagnosis is stored, replaced or
    # removed (the store's version) and for at most a minute (the window's edge moves).
    cached: dict[tuple[Any, ...], tuple[float, bytes]] = {}

    @api.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @api.get("/ui/", include_in_schema=False)
    async def ui_page() -> Response:
        # no-cache: a new version of the page is picked up on reload; the modules it loads are revalidated too
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @api.get("/ui/config.json", tags=["ui"], summary="What the web UI needs from the settings")
    async def ui_config() -> dict[str, Any]:
        return {
            "version": __version__,
            "grafana_url": settings.ui_grafana_url.rstrip("/"),
            "loki_datasource_uid": settings.ui_loki_datasource_uid,
            "loki_node_label": settings.ui_loki_node_label,
        }

    @api.get(
        "/v1/fleet/culprits",
        tags=["diagnoses"],
        response_model=FleetCulprits,
        summary="Nodes and components (GPUs, ports) that keep appearing as root causes",
        description="Counted over final diagnoses stored in the last `window_s` seconds (default: the "
        "metrics_window_s setting), as /metrics counts them; most frequent first.",
    )
    async def fleet_culprits(
        window_s: float | None = Query(None, gt=0, le=366 * 86400.0),
        cluster: str | None = None,
        top: int = Query(50, ge=1, le=1000),
    ) -> Any:
        window = window_s or settings.metrics_window_s
        key = (await run_in_threadpool(service.store.diagnoses_version), window, cluster, top)
        hit = cached.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return Response(hit[1], media_type="application/json")
        facts = await run_in_threadpool(service.store.diagnosis_facts, time.time() - window)
        if cluster is not None:
            facts = [f for f in facts if (f.cluster or "") == cluster]
        nodes, components = culprit_counts(facts, top)
        body = (
            FleetCulprits(window_s=window, diagnoses=len(facts), nodes=nodes, components=components)
            .model_dump_json()
            .encode()
        )
        cached.clear()
        cached[key] = (time.monotonic() + 60.0, body)
        return Response(body, media_type="application/json")

    @api.get(
        "/v1/diagnoses/{diagnosis_id}/context",
        tags=["diagnoses"],
        response_model=EvidenceContext,
        summary="The stored log lines around each piece of evidence",
        description="For attempts whose logs the store holds (OTLP); lines compaction blanked come back "
        "with kept=false. `available` is false for a diagnosis made from an uploaded bundle.",
        responses={404: {"description": "no such diagnosis"}},
    )
    async def diagnosis_context(diagnosis_id: str, around: int = Query(3, ge=0, le=MAX_AROUND)) -> Any:
        row = await run_in_threadpool(service.diagnosis, diagnosis_id)
        if row is None:
            return JSONResponse({"code": 404, "message": f"no diagnosis {diagnosis_id!r}"}, status_code=404)
        found = await run_in_threadpool(evidence_context, service.store, row.body, around)
        return Response(found.model_dump_json(), media_type="application/json")

    return api


def install(app: FastAPI, service: Attribution) -> None:
    """Add the UI's routes and its static files to the REST app (one call from api/http.py)."""
    app.include_router(router(service))
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")


__all__ = ["culprit_counts", "install", "router"]
