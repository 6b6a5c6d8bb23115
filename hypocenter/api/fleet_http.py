"""REST routes of fleet memory (engine/fleet.py), read role like every GET under /v1:

    GET /v1/fleet/suspects?kind=node|gpu|port|switch_port|switch|cable&limit=N   ranked suspects
    GET /v1/fleet/findings                                                    suspects worth a ticket

    GET /v1/fleet/cost?limit=N     lost GPU-hours per cause, component, domain and workload

The first two answer the `hypocenter.fleet/v1` document `hypocenter fleet --format json` prints, the
last the `hypocenter.cost/v1` document of `hypocenter fleet --cost --format json` (engine/fleet_cost.py).
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

    @app.get(
        "/v1/fleet/cost",
        tags=["fleet"],
        summary="What failures cost in the cost window (cost_window_s): lost GPU-hours per cause (a "
        "Pareto), per node / GPU / port / switch port, MTTF per domain, ETTR per workload",
    )
    async def fleet_cost(limit: int = Query(20, ge=1, le=1000)) -> Any:
        doc = await run_in_threadpool(lambda: service.cost.report(time.time(), limit=limit))
        return JSONResponse(doc)


__all__ = ["add_fleet_routes"]
