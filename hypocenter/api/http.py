"""OTLP/HTTP receiver and the REST API, as one ASGI app (FastAPI), served on :4318.

OTLP/HTTP (opentelemetry-proto `docs/specification.md`):
    POST /v1/logs, /v1/metrics     application/x-protobuf or application/json, Content-Encoding gzip;
                                   the response uses the request's content type. 413 over the size
                                   limit (also after decompression), 415 other content types, 400
                                   malformed bodies (a google.rpc.Status), 503 + Retry-After when the
                                   ingest queue is full; records with neither node nor workload are
                                   rejected in `partialSuccess` with the reason.
REST (/v1, documented in /openapi.json and /docs):
    PUT  /v1/attempts/{workload}/{attempt}            the attempt's scope (attempt.yaml, YAML or JSON)
    GET  /v1/attempts/{workload}/{attempt}            what the server holds for it
    POST /v1/attempts/{workload}/{attempt}/analyze    analyse now, return the diagnosis
    GET  /v1/diagnoses?cluster&outcome&domain&node&workload&since&until&limit
    GET  /v1/diagnoses/{id}                           the diagnosis JSON, byte for byte as stored
    POST /v1/bundles                                  a tar.gz attempt bundle → its diagnosis
    POST /v1/scopes                                   {"slurm": ID} | {"kueue": NS/WL} | {"k8s_job": NS/NAME}:
                                                      scope the job with its connector, analyse now
    GET  /healthz, /readyz
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool

from hypocenter import __version__, strict_yaml
from hypocenter.collector import otlp
from hypocenter.collector.bundle import load_bundle
from hypocenter.errors import BundleError, InputError, TransientError
from hypocenter.model import AttemptContext, Diagnosis
from hypocenter.server.attempts import parse_time
from hypocenter.server.service import Attribution, Backpressure, UnknownAttempt
from hypocenter.store.base import DiagnosisFilter, DiagnosisRow

JSON = "application/json"
PROTOBUF = "application/x-protobuf"


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
    created: str
    url: str


class DiagnosisList(BaseModel):
    diagnoses: list[DiagnosisSummary]


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


class ScopeRequest(BaseModel):
    """A job named by its scheduler id: exactly one field."""

    model_config = ConfigDict(extra="forbid")
    slurm: str | None = Field(None, description="Slurm job id: 81234, array task 81234_7, het component 81234+1")
    kueue: str | None = Field(None, description="a Kueue Workload: NAMESPACE/NAME")
    k8s_job: str | None = Field(None, description="a JobSet, PyTorchJob or Job: NAMESPACE/NAME or NAMESPACE/KIND/NAME")

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


def _summary(row: DiagnosisRow) -> DiagnosisSummary:
    return DiagnosisSummary(id=row.id, workload=row.workload, attempt=row.attempt, cluster=row.cluster,
                            outcome=row.outcome, domain=row.domain, subdomain=row.subdomain, nodes=row.nodes,
                            provisional=row.provisional, created=_iso(row.created) or "", url=f"/v1/diagnoses/{row.id}")


def _problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def _otlp_error(status: int, code: int, message: str, media: str, headers: dict[str, str] | None = None) -> Response:
    """An OTLP/HTTP error: a google.rpc.Status in the request's encoding."""
    st = status_pb2.Status(code=code, message=message)
    if media == PROTOBUF or media == "application/protobuf":
        return Response(st.SerializeToString(), status_code=status, media_type=PROTOBUF, headers=headers)
    return Response(json_format.MessageToJson(st, indent=None), status_code=status, media_type=JSON, headers=headers)


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


def build_app(service: Attribution, ready: Callable[[], bool] = lambda: True) -> FastAPI:
    app = FastAPI(
        title="hypocenter", version=__version__,
        description="Root-cause attribution for distributed AI workloads: OTLP in, diagnoses out "
                    "(schema hypocenter.diagnosis/v1).")
    limit = service.settings.max_message_bytes

    async def export(request: Request, signal: str) -> Response:
        try:
            media = otlp.media_type(request.headers.get("content-type"))
            raw = await _read_body(request, limit)
            body = await run_in_threadpool(otlp.decompress, raw, request.headers.get("content-encoding"), limit)
            tagged, warnings = await run_in_threadpool(otlp.receive, signal, body, media)
            logs, points = (tagged.accepted, []) if signal == "logs" else ([], tagged.accepted)
            await asyncio.wrap_future(service.queue.submit(logs, points))
        except otlp.UnsupportedMediaType as exc:
            service.activity.refused(signal, "otlp_http", "unsupported_media_type")
            return _otlp_error(415, code_pb2.INVALID_ARGUMENT, str(exc), JSON)
        except otlp.MessageTooLarge as exc:
            service.activity.refused(signal, "otlp_http", "too_large")
            return _otlp_error(413, code_pb2.RESOURCE_EXHAUSTED, str(exc), media)
        except Backpressure as exc:
            service.activity.refused(signal, "otlp_http", "backpressure")
            return _otlp_error(503, code_pb2.UNAVAILABLE, str(exc), media,
                               headers={"Retry-After": str(max(1, round(exc.retry_after)))})
        except TransientError as exc:
            service.activity.refused(signal, "otlp_http", "store_unavailable")
            return _otlp_error(503, code_pb2.UNAVAILABLE, str(exc), media, headers={"Retry-After": "1"})
        except InputError as exc:
            service.activity.refused(signal, "otlp_http", "malformed")
            return _otlp_error(400, code_pb2.INVALID_ARGUMENT, str(exc), media)
        service.activity.ingested(signal, "otlp_http", len(tagged.accepted), len(raw), tagged.rejected_by)
        return _otlp_ok(otlp.export_response(signal, tagged, warnings), media)

    @app.post("/v1/logs", tags=["otlp"], summary="OTLP/HTTP logs export (protobuf or JSON)")
    async def otlp_logs(request: Request) -> Response:
        return await export(request, "logs")

    @app.post("/v1/metrics", tags=["otlp"], summary="OTLP/HTTP metrics export (protobuf or JSON)")
    async def otlp_metrics(request: Request) -> Response:
        return await export(request, "metrics")

    # ------------------------------------------------------------------------------- attempts

    @app.put("/v1/attempts/{workload:path}/{attempt}", tags=["attempts"], status_code=200,
             summary="Set an attempt's scope from an attempt.yaml (YAML or JSON body)",
             responses={400: {"model": Problem}, 413: {"model": Problem}})
    async def put_attempt(workload: str, attempt: int, request: Request) -> Response:
        try:
            ctx = _context_from(await _read_body(request, 1 << 20), workload, attempt)
        except otlp.MessageTooLarge as exc:
            return _problem(413, str(exc))
        except InputError as exc:
            return _problem(400, str(exc))
        await run_in_threadpool(service.set_context, ctx)
        return JSONResponse(ctx.model_dump(mode="json"))

    @app.get("/v1/attempts/{workload:path}/{attempt}", tags=["attempts"], response_model=AttemptInfo,
             responses={404: {"model": Problem}})
    async def get_attempt(workload: str, attempt: int) -> Any:
        row = await run_in_threadpool(service.store.attempt, workload, attempt)
        if row is None:
            return _problem(404, f"no attempt {attempt} of workload {workload!r}")
        logs = await run_in_threadpool(service.store.attempt_logs, row.id)
        points = await run_in_threadpool(service.store.attempt_points, row.id)
        return AttemptInfo(workload=row.workload, attempt=row.attempt, nodes=row.nodes, scope=row.scope,
                           context=row.context, dirty=row.dirty, analyzed_at=_iso(row.analyzed_at),
                           log_records=sum(int(r.body) if r.kind == "gap" and r.body.isdigit() else 1 for r in logs),  # a gap row: its lines
                           metric_points=len(points))

    @app.post("/v1/attempts/{workload:path}/{attempt}/analyze", tags=["attempts"],
              summary="Analyse the attempt now and return its diagnosis",
              responses={200: {"model": Diagnosis}, 404: {"model": Problem}})
    async def analyze(workload: str, attempt: int) -> Response:
        try:
            diagnosis, provisional = await run_in_threadpool(service.analyze, workload, attempt)
        except UnknownAttempt as exc:
            return _problem(404, str(exc))
        return Response(diagnosis.to_json(), media_type=JSON,
                        headers={"X-Hypocenter-Provisional": str(provisional).lower()})

    @app.post("/v1/scopes", tags=["attempts"], summary="Analyse a job named by its scheduler id",
              description="Exactly one of `slurm` (81234, 81234_7, 81234+1), `kueue` (NS/WORKLOAD) or `k8s_job` "
                          "(NS/NAME or NS/KIND/NAME): the server asks the scheduler for the attempt with the "
                          "same connector as `hypocenter analyze --slurm/--kueue/--k8s-job`, keeps that scope and "
                          "the records and pod logs it brought, and analyses now (with the pull connectors, if "
                          "configured). For a Slurm epilog: `curl -X POST -d '{\"slurm\": \"'$SLURM_JOB_ID'\"}'`.",
              responses={200: {"model": Diagnosis}, 400: {"model": Problem}, 404: {"model": Problem},
                         503: {"model": Problem}})
    async def analyze_scope(request: ScopeRequest) -> Response:
        kind, job = request.which()
        try:
            diagnosis, provisional = await run_in_threadpool(service.analyze_scope, kind, job)
        except UnknownAttempt as exc:
            return _problem(404, str(exc))
        except TransientError as exc:
            return _problem(503, str(exc), headers={"Retry-After": "5"})
        except InputError as exc:
            return _problem(400, str(exc))
        return Response(diagnosis.to_json(), media_type=JSON,
                        headers={"X-Hypocenter-Provisional": str(provisional).lower()})

    # ------------------------------------------------------------------------------- diagnoses

    @app.get("/v1/diagnoses", tags=["diagnoses"], response_model=DiagnosisList)
    async def list_diagnoses(
        cluster: str | None = None, outcome: str | None = None, domain: str | None = None,
        node: str | None = Query(None, description="a culprit node"), workload: str | None = None,
        since: str | None = Query(None, description="RFC 3339: attempts whose window ends after this"),
        until: str | None = Query(None, description="RFC 3339: attempts whose window starts before this"),
        limit: int = Query(100, ge=1, le=1000),
    ) -> Any:
        bounds: list[int | None] = []
        for name, text in (("since", since), ("until", until)):
            if text is None:
                bounds.append(None)
                continue
            when = parse_time(text)
            if when is None:
                return _problem(400, f"{name}: {text!r} is not an RFC 3339 time")
            bounds.append(int(when.timestamp() * 1e9))
        flt = DiagnosisFilter(cluster=cluster, outcome=outcome, domain=domain, node=node, workload=workload,
                              since_ns=bounds[0], until_ns=bounds[1], limit=limit)
        rows = await run_in_threadpool(service.diagnoses, flt)
        return DiagnosisList(diagnoses=[_summary(r) for r in rows])

    @app.get("/v1/diagnoses/{diagnosis_id}", tags=["diagnoses"],
             responses={200: {"model": Diagnosis}, 404: {"model": Problem}})
    async def get_diagnosis(diagnosis_id: str) -> Response:
        row = await run_in_threadpool(service.diagnosis, diagnosis_id)
        if row is None:
            return _problem(404, f"no diagnosis {diagnosis_id!r}")
        return Response(row.body, media_type=JSON, headers={"X-Hypocenter-Provisional": str(row.provisional).lower()})

    @app.post("/v1/bundles", tags=["attempts"], summary="Upload an attempt bundle (tar.gz) and analyse it",
              responses={200: {"model": Diagnosis}, 400: {"model": Problem}, 413: {"model": Problem}})
    async def upload_bundle(request: Request) -> Response:
        try:
            raw = await _read_body(request, limit)
            diagnosis = await run_in_threadpool(_analyze_bundle, service, raw)
        except otlp.MessageTooLarge as exc:
            return _problem(413, str(exc))
        except InputError as exc:
            return _problem(400, str(exc))
        return Response(diagnosis.to_json(), media_type=JSON)

    # ------------------------------------------------------------------------------- probes

    @app.get("/healthz", tags=["probes"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"], summary="Ready to take data: store open, listeners up, queue not full")
    async def readyz() -> Response:
        try:
            stats = await run_in_threadpool(service.store.stats)
        except Exception as exc:  # any store failure means not ready
            return _problem(503, f"store unavailable: {exc}")
        full = service.queue.pending >= service.queue.capacity
        if not ready() or full:
            return _problem(503, "ingest queue is full" if full else "starting")
        return JSONResponse({"status": "ready", "queue": service.queue.pending, **stats})

    return app


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
        raise InputError(f"attempt.yaml describes workload {wl.get('id')!r} attempt {wl.get('attempt')}, "
                         f"not {workload!r} attempt {attempt}")
    wl.update(id=workload, attempt=attempt)
    doc = {**doc, "workload": wl}
    try:
        return AttemptContext.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"attempt.yaml: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def _analyze_bundle(service: Attribution, raw: bytes) -> Diagnosis:
    with tempfile.TemporaryDirectory(prefix="hypocenter-bundle-") as tmp:
        try:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(f"not a readable tar.gz bundle: {exc}") from None
        roots = sorted(p.parent for p in Path(tmp).rglob("attempt.yaml"))
        if not roots:
            raise BundleError("the archive holds no attempt.yaml (a bundle is a directory with attempt.yaml, logs/, …)")
        root = min(roots, key=lambda p: len(p.parts))
        bundle = load_bundle(root)
        context = bundle.context
        diagnosis = service.engine.analyze(bundle.context, bundle.sources, bundle.coverage)
    service.analyze_context(context, diagnosis)
    return diagnosis


__all__ = ["build_app"]
