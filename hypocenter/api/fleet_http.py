"""REST routes of fleet memory (engine/fleet.py), read role like every GET under /v1:

    GET /v1/fleet/suspects?kind=node|gpu|port|switch_port|switch|cable&limit=N   ranked suspects
    GET /v1/fleet/findings                                                    suspects worth a ticket

Both answer the `hypocenter.fleet/v1` document `hypocenter fleet --format json` prints.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from hypocenter.engine.fleet import SUSPECT_KINDS
from hypocenter.server.service import Attribution


def _problem(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)  # api/http.py's shape


def add_fleet_routes(app: FastAPI, service: Attribution) -> None:
    def report(kinds: list[str] | None, limit: int) -> dict[str, Any]:
        return service.fleet.report(time.time(), kinds=kinds or SUSPECT_KINDS, limit=limit)

    @app.get(
        "/v1/fleet/suspects",
        tags=["fleet"],
        summary="Nodes, GPUs, host ports, switch ports, switches and cables behind failures of several "
        "workloads, by a score that decays with time (fleet_half_life_s)",
    )
    async def fleet_suspects(
        kind: Annotated[list[str] | None, Query(description="keep only these kinds (repeatable)")] = None,
        limit: int = Query(50, ge=1, le=1000),
    ) -> Any:
        bad = sorted(set(kind or ()) - set(SUSPECT_KINDS))
        if bad:
            return _problem(400, f"kind: unknown {', '.join(bad)} (expected {', '.join(SUSPECT_KINDS)})")
        doc = await run_in_threadpool(report, kind, limit)
        return JSONResponse(doc)

    @app.get(
        "/v1/fleet/findings",
        tags=["fleet"],
        summary="Suspects behind at least fleet_min_workloads workloads (a switch or cable: on several hosts)",
    )
    async def fleet_findings() -> Any:
        doc = await run_in_threadpool(report, None, 0)
        return JSONResponse({k: v for k, v in doc.items() if k != "suspects"})


__all__ = ["add_fleet_routes"]
