"""OTLP/HTTP receiver and the REST API, as one ASGI app (FastAPI), served on :4318.

OTLP/HTTP (opentelemetry-proto `docs/specification.md`):
    POST /v1/logs, /v1/metrics     application/x-protobuf or application/json, Content-Encoding gzip;
                                   the response uses the request's content type. 413 over the size
                                   limit (also after decompression), 415 other content types, 400
                                   malformed bodies (a google.rpc.Status), 503 + Retry-After when the
                                   ingest queue is full; records with neither node nor workload are
                                   rejected in `partialSuccess` with the reason.
REST (/v1, documented in /openapi.json, /docs and /redoc, which work offline):
    PUT  /v1/attempts/{workload}/{attempt}            the attempt's scope (attempt.yaml, YAML or JSON)
    GET  /v1/attempts/{workload}/{attempt}            what the server holds for it
    POST /v1/attempts/{workload}/{attempt}/analyze    analyse now, return the diagnosis
    GET  /v1/diagnoses?cluster&outcome&domain&node&workload&search&since&until&limit&cursor
                                                      newest first, paged by cursor; ETag / If-None-Match
    GET  /v1/diagnoses/{id}                           the diagnosis JSON, byte for byte as stored (its revision
                                                      and source in X-Hypocenter-Revision / -Source headers)
    GET  /v1/diagnoses/{id}/revisions[/{n}]           every verdict of its attempt with provenance; one's JSON
    POST /v1/bundles                                  a tar.gz attempt bundle → its diagnosis
    POST /v1/scopes                                   {"slurm": ID} | {"kueue": NS/WL} | {"k8s_job": NS/NAME}:
                                                      scope the job with its connector, analyse now
    GET  /v1/fleet/suspects, /v1/fleet/findings       fleet memory: recurring culprits (api/fleet_http.py)
    GET  /healthz, /readyz
Web UI (api/ui/): /ui/ and its reads /v1/fleet/culprits, /v1/diagnoses/{id}/context.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.concurrency import run_in_threadpool

from hypocenter import __version__, model_schema, strict_yaml
from hypocenter.api import artifacts, auth, paging, problems, ui
from hypocenter.api.browser_headers import BrowserHeaders
from hypocenter.api.fleet_http import add_fleet_routes
from hypocenter.api.listener_limits import BodyBudget
from hypocenter.api.tls import PeerNames
from hypocenter.collector import otlp
from hypocenter.collector.archive import load_archive_bundle
from hypocenter.errors import InputError, TransientError
from hypocenter.limits import LimitExceeded
from hypocenter.model import AttemptContext, Diagnosis
from hypocenter.modelbase import ATTEMPT_MAX
from hypocenter.server.attempts import parse_time
from hypocenter.server.quarantine import AnalysisFailed
from hypocenter.server.service import Attribution, Backpressure, UnknownAttempt
from hypocenter.store.base import DiagnosisFilter, DiagnosisRow
from hypocenter.store.stats import StatsSnapshot

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
SLURM_JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?")
K8S_NAMESPACE = re.compile(r"(?=.{1,63}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")  # RFC 1123 label
K8S_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
K8S_KIND = re.compile(r"[A-Za-z]{1,63}")


class DiagnosisSummary(BaseModel):
    id: str
    workload: str
    attempt: int
    cluster: str | None
    outcome: str
    domain: str | None
    subdomain: str | None
    nodes: list[str] = Field(description="culprit nodes (root cause and candidates)")
    provisional: bool = Field(description="the attempt had not ended when it was analysed")
    window_start: str | None = None
    window_end: str | None = None
    summary: str | None = Field(None, description="the root cause's one-line summary")
    created: str
    url: str
    revision: int = Field(1, description="how many verdicts the attempt has had; see {url}/revisions")
    provenance: dict[str, Any] | None = Field(
        None,
        description="where this verdict came from: source "
        "(otlp | bundle | put | scope | pull), client, role, time",
    )


class Revision(BaseModel):
    revision: int
    id: str
    outcome: str
    domain: str | None
    subdomain: str | None
    provisional: bool
    created: str
    current: bool = Field(description="the verdict GET /v1/diagnoses/{id} serves now")
    provenance: dict[str, Any]
    url: str = Field(description="this revision's diagnosis JSON, byte for byte as it was stored")


class RevisionList(BaseModel):
    workload: str
    attempt: int
    revisions: list[Revision]


class DiagnosisList(BaseModel):
    diagnoses: list[DiagnosisSummary]
    total: int = Field(description="diagnoses matching the filters, all pages together")
    next_cursor: str | None = Field(
        None, description="pass as `cursor` for the next page; null on the last page"
    )


class AttemptInfo(BaseModel):
    workload: str
    attempt: int
    nodes: list[str]
    scope: dict[str, str]
    context: dict[str, Any] | None
    dirty: bool
    analyzed_at: str | None
    log_records: int
    metric_points: int
    failure: str | None = Field(
        None,
        description="why its last analysis failed: quarantined, not analysed again "
        "until new data arrives or it is asked for (null when it did not fail)",
    )
    failed_at: str | None = None


class FailedAttempt(BaseModel):
    workload: str
    attempt: int
    failure: str
    failed_at: str | None
    url: str


class FailedAttemptList(BaseModel):
    failures: list[FailedAttempt]


class ScopeRequest(BaseModel):
    """A job named by its scheduler id: exactly one field."""

    model_config = ConfigDict(extra="forbid")
    slurm: str | None = Field(
        None, description="Slurm job id: 81234, array task 81234_7, het component 81234+1"
    )
    kueue: str | None = Field(None, description="a Kueue Workload: NAMESPACE/NAME")
    k8s_job: str | None = Field(
        None, description="a JobSet, PyTorchJob or Job: NAMESPACE/NAME or NAMESPACE/KIND/NAME"
    )

    @field_validator("slurm")
    @classmethod
    def _slurm_id(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_JOB_ID.fullmatch(v):
            raise ValueError(f"{v[:64]!r} is not a Slurm job id (81234, 81234_7 or 81234+1)")
        return v

    @field_validator("kueue", "k8s_job")
    @classmethod
    def _kubernetes_ref(cls, v: str | None) -> str | None:
        # Each part becomes a Kubernetes API path segment: only DNS names get there, never `..` or `?`.
        if v is None:
            return v
        parts = v.split("/")
        if (
            len(parts) not in (2, 3)
            or not K8S_NAMESPACE.fullmatch(parts[0])
            or not K8S_NAME.fullmatch(parts[-1])
            or (len(parts) == 3 and not K8S_KIND.fullmatch(parts[1]))
        ):
            raise ValueError(
                f"{v[:300]!r} is not NAMESPACE/NAME (or NAMESPACE/KIND/NAME): a namespace is a DNS label "
                "(a-z, 0-9, '-', at most 63), a name a DNS subdomain (also '.', at most 253)"
            )
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> ScopeRequest:
        if sum(v is not None for v in (self.slurm, self.kueue, self.k8s_job)) != 1:
            raise ValueError("give exactly one of slurm, kueue, k8s_job")
        return self

    def which(self) -> tuple[str, str]:
        for kind in ("slurm", "kueue", "k8s_job"):
            value = getattr(self, kind)
            if value is not None:
                return kind, str(value)
        raise AssertionError("validated")


class Problem(BaseModel):
    code: int
    message: str


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _iso_ns(ns: int | None) -> str | None:
    return None if ns is None else _iso(ns / 1e9)


def _summary(row: DiagnosisRow) -> DiagnosisSummary:
    return DiagnosisSummary(
        id=row.id,
        workload=row.workload,
        attempt=row.attempt,
        cluster=row.cluster,
        outcome=row.outcome,
        domain=row.domain,
        subdomain=row.subdomain,
        nodes=row.nodes,
        provisional=row.provisional,
        created=_iso(row.created) or "",
        url=f"/v1/diagnoses/{row.id}",
        window_start=_iso_ns(row.window_start_ns),
        window_end=_iso_ns(row.window_end_ns),
        summary=(json.loads(row.body).get("root_cause") or {}).get("summary"),
        revision=row.revision,
        provenance=row.provenance,
    )


def _problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return problems.problem(status, message, headers)


def _otlp_error(
    status: int, code: int, message: str, media: str, headers: dict[str, str] | None = None
) -> Response:
    """An OTLP/HTTP error: a google.rpc.Status in the request's encoding."""
    st = status_pb2.Status(code=code, message=message)
    if media == PROTOBUF or media == "application/protobuf":
        return Response(st.SerializeToString(), status_code=status, media_type=PROTOBUF, headers=headers)
    return Response(
        json_format.MessageToJson(st, indent=None), status_code=status, media_type=JSON, headers=headers
    )


def _otlp_ok(msg: Message, media: str) -> Response:
    if media == JSON:
        return Response(json_format.MessageToJson(msg, indent=None), media_type=JSON)
    return Response(msg.SerializeToString(), media_type=PROTOBUF)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise otlp.MessageTooLarge(f"body of {declared} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise otlp.MessageTooLarge(f"body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _caller(request: Request) -> dict[str, str]:
    identity: auth.Identity = getattr(request.state, "identity", auth.ANONYMOUS)
    return identity.provenance()


def build_app(
    service: Attribution,
    ready: Callable[[], bool] = lambda: True,
    authenticator: auth.Authenticator | None = None,
    peers: PeerNames | None = None,
) -> FastAPI:
    """The ASGI app on :4318: OTLP/HTTP and the REST API, one router per concern, behind the auth guard."""
    app = (
        FastAPIOffline(  # FastAPI whose /docs and /redoc load Swagger UI and ReDoc from the wheel, not a CDN
            title="hypocenter",
            version=__version__,
            description="Root-cause attribution for distributed AI workloads: OTLP in, diagnoses out "
            "(schema hypocenter.diagnosis/v1). Every route but /healthz and /readyz takes "
            "`Authorization: Bearer <token>` when the server has tokens: reads need the read role, "
            "OTLP the ingest role, everything else admin.",
        )
    )
    problems.install(app)
    # Added first, so it runs inside the auth guard: only an authorised request's body is ever read.
    app.add_middleware(
        BodyBudget,
        budget=service.settings.http_body_budget_bytes,
        retry_after_s=service.settings.retry_after_s,
    )
    app.add_middleware(
        auth.AuthGuard,
        authenticator=authenticator or auth.Authenticator(),
        peer_name=(peers or PeerNames()).get,
    )
    app.add_middleware(BrowserHeaders)  # outermost: refusals carry the headers too
    for router in (
        otlp_routes(service),
        attempt_routes(service),
        diagnosis_routes(service),
        bundle_routes(service),
        probe_routes(service, ready),
    ):
        app.include_router(router)
    ui.install(app, service)  # the web UI (/ui) and its fleet endpoint
    add_fleet_routes(app, service)  # GET /v1/fleet/suspects, /v1/fleet/findings (api/fleet_http.py)
    return app


# An uncompressed OTLP request up to this size is decoded on the event loop (a few ms of work) when a
# decode slot is free: handing it to a worker thread and back costs about as much on a busy machine.
# An attempt number in a path: a restart count, within what the store keeps (422 otherwise).
ATTEMPT_NUMBER = Path(ge=0, le=ATTEMPT_MAX, description="the attempt number: 0, 1, … (at most 2^31-1)")
INLINE_DECODE_BYTES = 1 << 20


def _receive_inline(signal: str, raw: bytes, media: str, limit: int) -> tuple[otlp.Tagged, list[str]] | None:
    try:
        return otlp.receive_bounded(signal, raw, None, media, limit, wait_s=0)
    except otlp.DecoderBusy:  # every slot taken: wait for one in a worker thread, not on the event loop
        return None


def otlp_routes(service: Attribution) -> APIRouter:
    """The OTLP/HTTP receiver: POST /v1/logs and /v1/metrics (protobuf or JSON)."""
    router = APIRouter()
    limit = service.settings.max_message_bytes

    async def export(request: Request, signal: str) -> Response:
        try:
            media = otlp.media_type(request.headers.get("content-type"))
            raw = await _read_body(request, limit)
            encoding = request.headers.get("content-encoding")
            inline = (
                _receive_inline(signal, raw, media, limit)
                if len(raw) <= INLINE_DECODE_BYTES and encoding in (None, "", "identity")
                else None
            )
            if inline is None:
                inline = await run_in_threadpool(otlp.receive_bounded, signal, raw, encoding, media, limit)
            tagged, warnings = inline
            logs, points = (tagged.accepted, []) if signal == "logs" else ([], tagged.accepted)
            await asyncio.wrap_future(service.queue.submit(logs, points, tagged.blocks))
        except otlp.UnsupportedMediaType as exc:
            service.activity.refused(signal, "otlp_http", "unsupported_media_type")
            return _otlp_error(415, code_pb2.INVALID_ARGUMENT, str(exc), JSON)
        except otlp.MessageTooLarge as exc:
            service.activity.refused(signal, "otlp_http", "too_large")
            return _otlp_error(413, code_pb2.RESOURCE_EXHAUSTED, str(exc), media)
        except Backpressure as exc:
            service.activity.refused(signal, "otlp_http", "backpressure")
            return _otlp_error(
                503,
                code_pb2.UNAVAILABLE,
                str(exc),
                media,
                headers={"Retry-After": str(max(1, round(exc.retry_after)))},
            )
        except TransientError as exc:
            service.activity.refused(signal, "otlp_http", "store_unavailable")
            return _otlp_error(503, code_pb2.UNAVAILABLE, str(exc), media, headers={"Retry-After": "1"})
        except InputError as exc:
            service.activity.refused(signal, "otlp_http", "malformed")
            return _otlp_error(400, code_pb2.INVALID_ARGUMENT, str(exc), media)
        service.activity.ingested(signal, "otlp_http", tagged.count, len(raw), tagged.rejected_by)
        return _otlp_ok(otlp.export_response(signal, tagged, warnings), media)

    @router.post("/v1/logs", tags=["otlp"], summary="OTLP/HTTP logs export (protobuf or JSON)")
    async def otlp_logs(request: Request) -> Response:
        return await export(request, "logs")

    @router.post("/v1/metrics", tags=["otlp"], summary="OTLP/HTTP metrics export (protobuf or JSON)")
    async def otlp_metrics(request: Request) -> Response:
        return await export(request, "metrics")

    return router


def attempt_routes(service: Attribution) -> APIRouter:
    """An attempt's scope, its state, and analysis on request (by attempt or by scheduler id)."""
    router = APIRouter()

    # ------------------------------------------------------------------------------- attempts

    @router.put(
        "/v1/attempts/{workload:path}/{attempt}",
        tags=["attempts"],
        status_code=200,
        summary="Set an attempt's scope from an attempt.yaml (YAML or JSON body)",
        responses={400: {"model": Problem}, 413: {"model": Problem}, 422: {"model": Problem}},
    )
    async def put_attempt(workload: str, request: Request, attempt: int = ATTEMPT_NUMBER) -> Response:
        try:
            raw = await _read_body(request, 1 << 20)
            # YAML parsing and the scope's checks run off the event loop: other requests never wait on them.
            ctx = await run_in_threadpool(_context_from, raw, workload, attempt)
        except otlp.MessageTooLarge as exc:
            return _problem(413, str(exc))
        except LimitExceeded as exc:
            return _problem(422, str(exc))
        except InputError as exc:
            return _problem(400, str(exc))
        await run_in_threadpool(service.set_context, ctx, _caller(request))
        return JSONResponse(ctx.model_dump(mode="json"))

    @router.get(
        "/v1/attempts/{workload:path}/{attempt}",
        tags=["attempts"],
        response_model=AttemptInfo,
        responses={404: {"model": Problem}},
    )
    async def get_attempt(workload: str, attempt: int = ATTEMPT_NUMBER) -> Any:
        row = await run_in_threadpool(service.store.attempt, workload, attempt)
        if row is None:
            return _problem(404, f"no attempt {attempt} of workload {workload!r}")
        logs = await run_in_threadpool(service.store.attempt_logs, row.id)
        points = await run_in_threadpool(service.store.attempt_points, row.id)
        return AttemptInfo(
            workload=row.workload,
            attempt=row.attempt,
            nodes=row.nodes,
            scope=row.scope,
            context=row.context,
            dirty=row.dirty,
            analyzed_at=_iso(row.analyzed_at),
            log_records=sum(
                int(r.body) if r.kind == "gap" and r.body.isdigit() else 1 for r in logs
            ),  # a gap row: its lines
            metric_points=len(points),
            failure=row.failure,
            failed_at=_iso(row.failed_at),
        )

    @router.get(
        "/v1/failures",
        tags=["attempts"],
        response_model=FailedAttemptList,
        summary="Attempts whose analysis failed (quarantined), newest first",
    )
    async def list_failures(limit: int = Query(100, ge=1, le=1000)) -> Any:
        rows = await run_in_threadpool(service.store.failed_attempts, limit)
        return FailedAttemptList(
            failures=[
                FailedAttempt(
                    workload=r.workload,
                    attempt=r.attempt,
                    failure=r.failure or "",
                    failed_at=_iso(r.failed_at),
                    url=f"/v1/attempts/{r.workload}/{r.attempt}",
                )
                for r in rows
            ]
        )

    @router.post(
        "/v1/attempts/{workload:path}/{attempt}/analyze",
        tags=["attempts"],
        summary="Analyse the attempt now and return its diagnosis",
        responses={200: {"model": model_schema.Diagnosis}, 404: {"model": Problem}, 422: {"model": Problem}},
    )
    async def analyze(workload: str, http_request: Request, attempt: int = ATTEMPT_NUMBER) -> Response:
        try:
            diagnosis, provisional = await run_in_threadpool(
                service.analyze, workload, attempt, _caller(http_request)
            )
        except UnknownAttempt as exc:
            return _problem(404, str(exc))
        except AnalysisFailed as exc:
            return _problem(422, str(exc))
        return Response(
            diagnosis.to_json(),
            media_type=JSON,
            headers={"X-Hypocenter-Provisional": str(provisional).lower()},
        )

    @router.post(
        "/v1/attempts/{workload:path}/{attempt}/artifacts",
        tags=["attempts"],
        status_code=201,
        summary="Upload one hang-forensics artifact of the attempt (Flight Recorder dump, ncclras, stack dump)",
        description="The body is the file as written: a PyTorch Flight Recorder dump (pickle or JSON, read "
        "without unpickling anything but plain values), `ncclras` output, or a py-spy / faulthandler "
        "stack dump. `name` is its file name (the rank ends it: nccl_trace_rank_3), `node` the host "
        "it came from (optional: the rank map places it). Stored as the attempt's records under "
        "`traces/[<node>/]<name>`; the next analysis merges it with the rest.",
        responses={400: {"model": Problem}, 413: {"model": Problem}, 503: {"model": Problem}},
    )
    async def upload_artifact(
        workload: str,
        request: Request,
        attempt: int = ATTEMPT_NUMBER,
        name: str = Query(..., description="file name, e.g. nccl_trace_rank_3"),
        node: str | None = Query(None, description="the node it came from"),
    ) -> Response:
        try:
            raw = await _read_body(request, artifacts.MAX_ARTIFACT_BYTES)
            entries, kind = await run_in_threadpool(
                artifacts.artifact_entries, workload, attempt, name, node, raw
            )
            await asyncio.wrap_future(service.queue.submit(entries, []))
        except otlp.MessageTooLarge as exc:
            return _problem(413, str(exc))
        except TransientError as exc:
            return _problem(503, str(exc), headers={"Retry-After": "1"})
        except InputError as exc:
            return _problem(400, str(exc))
        return JSONResponse(
            {"stream": artifacts.stream_name(name, node), "kind": kind, "records": len(entries)},
            status_code=201,
        )

    @router.post(
        "/v1/scopes",
        tags=["attempts"],
        summary="Analyse a job named by its scheduler id",
        description="Exactly one of `slurm` (81234, 81234_7, 81234+1), `kueue` (NS/WORKLOAD) or `k8s_job` "
        "(NS/NAME or NS/KIND/NAME): the server asks the scheduler for the attempt with the "
        "same connector as `hypocenter analyze --slurm/--kueue/--k8s-job`, keeps that scope and "
        "the records and pod logs it brought, and analyses now (with the pull connectors, if "
        "configured). For a Slurm epilog: `curl -X POST -d '{\"slurm\": \"'$SLURM_JOB_ID'\"}'`.",
        responses={
            200: {"model": model_schema.Diagnosis},
            400: {"model": Problem},
            404: {"model": Problem},
            503: {"model": Problem},
        },
    )
    async def analyze_scope(request: ScopeRequest, http_request: Request) -> Response:
        kind, job = request.which()
        try:
            diagnosis, provisional = await run_in_threadpool(
                service.analyze_scope, kind, job, _caller(http_request)
            )
        except UnknownAttempt as exc:
            return _problem(404, str(exc))
        except TransientError as exc:
            return _problem(503, str(exc), headers={"Retry-After": "5"})
        except InputError as exc:
            return _problem(400, str(exc))
        return Response(
            diagnosis.to_json(),
            media_type=JSON,
            headers={"X-Hypocenter-Provisional": str(provisional).lower()},
        )

    return router


def diagnosis_routes(service: Attribution) -> APIRouter:
    """The diagnoses made, filtered or one by id."""
    router = APIRouter()

    # ------------------------------------------------------------------------------- diagnoses

    @router.get(
        "/v1/diagnoses",
        tags=["diagnoses"],
        response_model=DiagnosisList,
        description="Newest window end first. `next_cursor` continues the list where a page ended, "
        "unaffected by diagnoses stored meanwhile. The ETag changes whenever a diagnosis is "
        "stored, replaced or removed: poll with If-None-Match and get 304 while nothing changed.",
        responses={
            304: {"description": "nothing stored, replaced or removed since the ETag"},
            400: {"model": Problem},
        },
    )
    async def list_diagnoses(
        request: Request,
        cluster: str | None = None,
        outcome: str | None = None,
        domain: str | None = None,
        node: str | None = Query(None, description="a culprit node"),
        workload: str | None = Query(None, description="a workload id, exactly"),
        search: str | None = Query(None, max_length=200, description="a part of the workload id, any case"),
        since: str | None = Query(None, description="RFC 3339: attempts whose window ends after this"),
        until: str | None = Query(None, description="RFC 3339: attempts whose window starts before this"),
        limit: int = Query(100, ge=1, le=1000),
        cursor: str | None = Query(None, max_length=400, description="`next_cursor` of the previous page"),
    ) -> Any:
        etag = f'W/"{await run_in_threadpool(service.store.diagnoses_version)}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        bounds: list[int | None] = []
        for name, text in (("since", since), ("until", until)):
            if text is None:
                bounds.append(None)
                continue
            when = parse_time(text)
            if when is None:
                return _problem(400, f"{name}: {text!r} is not an RFC 3339 time between 1970 and 2262")
            bounds.append(int(when.timestamp() * 1e9))
        try:
            after = paging.decode(cursor) if cursor else None
        except ValueError as exc:
            return _problem(400, str(exc))
        flt = DiagnosisFilter(
            cluster=cluster,
            outcome=outcome,
            domain=domain,
            node=node,
            workload=workload,
            search=search or None,
            since_ns=bounds[0],
            until_ns=bounds[1],
            limit=min(limit + 1, 1000),
            after=after,
        )
        rows = await run_in_threadpool(service.diagnoses, flt)
        total = await run_in_threadpool(service.store.count_diagnoses, flt)
        more = len(rows) > limit or (limit == 1000 and len(rows) == limit)
        rows = rows[:limit]
        body = DiagnosisList(
            diagnoses=[_summary(r) for r in rows],
            total=total,
            next_cursor=paging.encode(rows[-1]) if more and rows else None,
        )
        return JSONResponse(body.model_dump(mode="json"), headers={"ETag": etag, "Cache-Control": "no-cache"})

    @router.get(
        "/v1/diagnoses/{diagnosis_id}",
        tags=["diagnoses"],
        responses={200: {"model": model_schema.Diagnosis}, 404: {"model": Problem}},
    )
    async def get_diagnosis(diagnosis_id: str) -> Response:
        row = await run_in_threadpool(service.diagnosis, diagnosis_id)
        if row is None:
            return _problem(404, f"no diagnosis {diagnosis_id!r}")
        return Response(
            row.body,
            media_type=JSON,
            headers={
                "X-Hypocenter-Provisional": str(row.provisional).lower(),
                "X-Hypocenter-Revision": str(row.revision),
                "X-Hypocenter-Source": str((row.provenance or {}).get("source", "unknown")),
            },
        )

    @router.get(
        "/v1/diagnoses/{diagnosis_id}/revisions",
        tags=["diagnoses"],
        response_model=RevisionList,
        summary="Every verdict the diagnosis' attempt has had, oldest first, with provenance",
        responses={404: {"model": Problem}},
    )
    async def list_revisions(diagnosis_id: str) -> Any:
        revisions = await run_in_threadpool(service.store.diagnosis_revisions, diagnosis_id)
        if not revisions:
            return _problem(404, f"no diagnosis {diagnosis_id!r}")
        last = revisions[-1].revision
        return RevisionList(
            workload=revisions[0].workload,
            attempt=revisions[0].attempt,
            revisions=[
                Revision(
                    revision=r.revision,
                    id=r.diagnosis_id,
                    outcome=r.outcome,
                    domain=r.domain,
                    subdomain=r.subdomain,
                    provisional=r.provisional,
                    created=_iso(r.created) or "",
                    current=r.revision == last,
                    provenance=r.provenance,
                    url=f"/v1/diagnoses/{diagnosis_id}/revisions/{r.revision}",
                )
                for r in revisions
            ],
        )

    @router.get(
        "/v1/diagnoses/{diagnosis_id}/revisions/{revision}",
        tags=["diagnoses"],
        responses={200: {"model": model_schema.Diagnosis}, 404: {"model": Problem}},
    )
    async def get_revision(diagnosis_id: str, revision: int) -> Response:
        revisions = await run_in_threadpool(service.store.diagnosis_revisions, diagnosis_id)
        found = [r for r in revisions if r.revision == revision]
        if not found:
            return _problem(404, f"no revision {revision} of diagnosis {diagnosis_id!r}")
        return Response(
            found[0].body,
            media_type=JSON,
            headers={
                "X-Hypocenter-Revision": str(revision),
                "X-Hypocenter-Source": str(found[0].provenance.get("source", "unknown")),
            },
        )

    return router


def bundle_routes(service: Attribution) -> APIRouter:
    """An attempt bundle uploaded as tar.gz and analysed at once."""
    router = APIRouter()
    limit = service.settings.max_message_bytes

    @router.post(
        "/v1/bundles",
        tags=["attempts"],
        summary="Upload an attempt bundle (tar.gz) and analyse it",
        responses={200: {"model": model_schema.Diagnosis}, 400: {"model": Problem}, 413: {"model": Problem}},
    )
    async def upload_bundle(request: Request) -> Response:
        try:
            raw = await _read_body(request, limit)
            diagnosis = await run_in_threadpool(_analyze_bundle, service, raw, _caller(request))
        except (otlp.MessageTooLarge, LimitExceeded) as exc:
            return _problem(413, str(exc))
        except InputError as exc:
            return _problem(400, str(exc))
        return Response(diagnosis.to_json(), media_type=JSON)

    return router


def probe_routes(service: Attribution, ready: Callable[[], bool]) -> APIRouter:
    """Liveness and readiness for Kubernetes probes and load balancers."""
    router = APIRouter()

    # ------------------------------------------------------------------------------- probes

    @router.get("/healthz", tags=["probes"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/readyz",
        tags=["probes"],
        summary="Ready to take data: store open, listeners up, queue not full",
        description="200 with `status`, `queue`, `leases`, the store's counts (`attempts`, `attempts_open`, "
        "`attempts_failed`, `log_entries`, `log_rows`, `metric_points`, `diagnoses`) and `stats_age_s`: the "
        "counts are a snapshot that many seconds old, recounted in the background once older than 2 s. "
        "503 when the store does not answer, the ingest queue is full or the server is starting.",
    )
    async def readyz() -> Response:
        try:
            stats = await run_in_threadpool(_probe_store, service)
        except Exception as exc:  # any store failure means not ready
            return _problem(503, f"store unavailable: {exc}")
        full = service.queue.pending >= service.queue.capacity
        if not ready() or full:
            return _problem(503, "ingest queue is full" if full else "starting")
        return JSONResponse(
            {
                "status": "ready",
                "queue": service.queue.pending,
                "leases": service.leadership.held(),
                **stats.counts,
                "stats_age_s": round(stats.age_s, 3),
            }
        )

    return router


def _probe_store(service: Attribution) -> StatsSnapshot:
    """The store answers a trivial query now; the counts come from the last snapshot (store/stats.py),
    so a probe never counts the log table."""
    service.store.ping()
    return service.stats.read()


def _context_from(raw: bytes, workload: str, attempt: int) -> AttemptContext:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("attempt.yaml is not valid UTF-8") from None
    doc = strict_yaml.loads(text, "attempt.yaml")
    if not isinstance(doc, dict):
        raise InputError("attempt.yaml: expected a mapping with workload, window, nodes, …")
    wl = dict(doc.get("workload") or {})
    if str(wl.get("id", workload)) != workload or int(wl.get("attempt", attempt)) != attempt:
        raise InputError(
            f"attempt.yaml describes workload {wl.get('id')!r} attempt {wl.get('attempt')}, "
            f"not {workload!r} attempt {attempt}"
        )
    wl.update(id=workload, attempt=attempt)
    doc = {**doc, "workload": wl}
    try:
        return AttemptContext.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"attempt.yaml: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def _analyze_bundle(service: Attribution, raw: bytes, client: dict[str, str] | None = None) -> Diagnosis:
    # Read as a stream under the upload bounds, never extracted (collector/archive.py).
    bundle = load_archive_bundle(raw)
    diagnosis = service.engine.analyze(bundle)
    service.analyze_context(bundle.context, diagnosis, client)
    return diagnosis


__all__ = ["attempt_routes", "build_app", "bundle_routes", "diagnosis_routes", "otlp_routes", "probe_routes"]
