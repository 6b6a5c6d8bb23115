"""gRPC `hypocenter.v1.Attribution` (hypocenter/api/v1/attribution.proto), served next to OTLP on :4317.

    Analyze         POST /v1/attempts/{workload}/{attempt}/analyze
    GetDiagnosis    GET  /v1/diagnoses/{id}
    ListDiagnoses   GET  /v1/diagnoses?cluster&outcome&domain&node&workload&since&until&limit
    ListRevisions   GET  /v1/diagnoses/{id}/revisions (every verdict of the attempt, with provenance)
    WatchDiagnoses  a server stream of every diagnosis stored from now on (no REST twin)

`diagnosis_json` is the stored diagnosis JSON (contract 3 of docs/design.md), the same bytes REST returns; the other fields are
the store's index columns. Status codes: NOT_FOUND (unknown attempt or id), INVALID_ARGUMENT (bad
request), UNAVAILABLE (store trouble: retry), RESOURCE_EXHAUSTED (too many watchers, or a watcher
too slow to keep up).

A watch holds one of the server's gRPC worker threads for as long as it is open, so at most half
of `grpc_workers` watches run at once: OTLP exports always have threads left. One client (token,
certificate, or address when anonymous) holds at most `watch_max_per_client` of them, and the last
quarter of the slots (at least one) only goes to a client holding none, so a third client still
gets a watch when two have opened all they may.

This module translates between protobuf and the service; it holds no state of its own but the
watchers' queues.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from hypocenter.api import auth
from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.engine.fleet import SUSPECT_KINDS
from hypocenter.errors import InputError, TransientError
from hypocenter.model import Diagnosis
from hypocenter.server.quarantine import AnalysisFailed
from hypocenter.server.service import Attribution, UnknownAttempt
from hypocenter.store.base import DiagnosisFilter, DiagnosisRow

log = logging.getLogger("hypocenter.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Attribution"].full_name
WATCH_QUEUE = 1000  # diagnoses waiting for one slow watcher before it is cut off
_T = TypeVar("_T")


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _message(row: DiagnosisRow, *, include_json: bool = True) -> pb.Diagnosis:
    msg = pb.Diagnosis(
        id=row.id,
        workload=row.workload,
        attempt=row.attempt,
        outcome=row.outcome,
        nodes=row.nodes,
        provisional=row.provisional,
        created=_timestamp(row.created),
    )
    for name in ("cluster", "domain", "subdomain"):
        value = getattr(row, name)
        if value is not None:
            setattr(msg, name, value)
    if include_json:
        msg.diagnosis_json = row.body
    msg.revision = row.revision
    if row.provenance is not None:
        msg.provenance_json = json.dumps(row.provenance, sort_keys=True)
    return msg


def _row_from_body(diagnosis_id: str, body: str, provisional: bool, created: float) -> DiagnosisRow:
    """A diagnosis' indexed fields read back from its JSON (a verdict the `diagnoses` table no longer holds)."""
    doc: dict[str, Any] = json.loads(body)
    rc = doc.get("root_cause") or {}
    culprits = set(rc.get("nodes") or [])
    for c in doc.get("candidates") or []:
        culprits.update(c.get("nodes") or [])
    return DiagnosisRow(
        id=diagnosis_id,
        workload=doc["attempt"]["workload_id"],
        attempt=doc["attempt"]["attempt"],
        cluster=doc["attempt"].get("cluster"),
        outcome=doc["outcome"],
        domain=rc.get("domain"),
        subdomain=rc.get("subdomain"),
        provisional=provisional,
        created=created,
        body=body,
        nodes=sorted(culprits),
    )


def _from_diagnosis(diagnosis: Diagnosis, body: str, provisional: bool, created: float) -> pb.Diagnosis:
    """The message for a diagnosis the store no longer holds (replaced or swept in between)."""
    return _message(_row_from_body(diagnosis.id, body, provisional, created))


def _filter(f: pb.DiagnosisFilter) -> DiagnosisFilter:
    return DiagnosisFilter(
        cluster=f.cluster if f.HasField("cluster") else None,
        outcome=f.outcome if f.HasField("outcome") else None,
        domain=f.domain if f.HasField("domain") else None,
        node=f.node if f.HasField("node") else None,
        workload=f.workload if f.HasField("workload") else None,
    )


def _matches(flt: DiagnosisFilter, row: DiagnosisRow) -> bool:
    return (
        (flt.cluster is None or row.cluster == flt.cluster)
        and (flt.outcome is None or row.outcome == flt.outcome)
        and (flt.domain is None or row.domain == flt.domain)
        and (flt.workload is None or row.workload == flt.workload)
        and (flt.node is None or flt.node in row.nodes)
    )


def _client_key(context: grpc.ServicerContext) -> str:
    """Whom a watch counts against: the authenticated caller, or its address when anonymous."""
    identity = auth.current.get()
    if identity is not None and identity is not auth.ANONYMOUS:
        return identity.name
    peer = context.peer() or ""  # "ipv4:127.0.0.1:53412" / "ipv6:[::1]:53412"
    return peer.rpartition(":")[0] or peer


class AttributionGrpc(pb_grpc.AttributionServicer):
    def __init__(self, service: Attribution, max_watchers: int, max_per_client: int = 2) -> None:
        self.service = service
        self.max_watchers = max_watchers
        self.max_per_client = max_per_client
        self.reserved = max(1, max_watchers // 4)  # slots only a client holding no watch may take
        self._per_client: Counter[str] = Counter()
        self._per_client_lock = threading.Lock()

    def Analyze(self, request: pb.AnalyzeRequest, context: grpc.ServicerContext) -> pb.Diagnosis:
        if not request.workload:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "workload is required")
        try:
            caller = auth.current.get()
            diagnosis, provisional = self.service.analyze(
                request.workload, request.attempt, caller.provenance() if caller is not None else None
            )
        except UnknownAttempt as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except TransientError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except AnalysisFailed as exc:  # quarantined: the reason stays readable (server/quarantine.py)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        body = diagnosis.to_json()  # what REST's analyze returns
        row = self.service.diagnosis(diagnosis.id)
        if row is None or row.body != body:
            return _from_diagnosis(diagnosis, body, provisional, time.time())
        return _message(row)

    def GetDiagnosis(self, request: pb.GetDiagnosisRequest, context: grpc.ServicerContext) -> pb.Diagnosis:
        row = self._read(context, lambda: self.service.diagnosis(request.id))
        if row is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no diagnosis {request.id!r}")
        return _message(row)

    def ListDiagnoses(
        self, request: pb.ListDiagnosesRequest, context: grpc.ServicerContext
    ) -> pb.ListDiagnosesResponse:
        limit = request.limit or 100
        if not 1 <= limit <= 1000:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"limit must be 1..1000 (0 = 100), not {request.limit}"
            )
        flt = _filter(request.filter)
        flt.limit = limit
        if request.HasField("since"):
            flt.since_ns = request.since.ToNanoseconds()
        if request.HasField("until"):
            flt.until_ns = request.until.ToNanoseconds()
        rows = self._read(context, lambda: self.service.diagnoses(flt))
        return pb.ListDiagnosesResponse(
            diagnoses=[_message(r, include_json=request.include_json) for r in rows]
        )

    def ListRevisions(
        self, request: pb.ListRevisionsRequest, context: grpc.ServicerContext
    ) -> pb.ListRevisionsResponse:
        revisions = self._read(context, lambda: self.service.store.diagnosis_revisions(request.id))
        if not revisions:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no diagnosis {request.id!r}")
        out = pb.ListRevisionsResponse()
        for r in revisions:
            row = _row_from_body(r.diagnosis_id, r.body, r.provisional, r.created)
            row.revision, row.provenance = r.revision, r.provenance
            out.revisions.append(_message(row, include_json=request.include_json))
        return out

    def ListFleetSuspects(
        self, request: pb.ListFleetSuspectsRequest, context: grpc.ServicerContext
    ) -> pb.ListFleetSuspectsResponse:
        kinds = list(request.kinds) or list(SUSPECT_KINDS)
        bad = sorted(set(kinds) - set(SUSPECT_KINDS))
        if bad:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"kinds: unknown {', '.join(bad)} (expected {', '.join(SUSPECT_KINDS)})",
            )
        doc = self._read(
            context, lambda: self.service.fleet.report(time.time(), kinds=kinds, limit=request.limit or 50)
        )

        def suspect(s: dict[str, Any]) -> pb.FleetSuspect:
            return pb.FleetSuspect(
                kind=s["kind"],
                name=s["name"],
                score=s["score"],
                workloads=s["workloads"],
                attempts=s["attempts"],
                hosts=s["hosts"],
                verdict=s["verdict"],
            )

        return pb.ListFleetSuspectsResponse(
            suspects=[suspect(s) for s in doc["suspects"]],
            findings=[suspect(s) for s in doc["findings"]],
            report_json=json.dumps(doc, sort_keys=True),
        )

    def GetFleetCost(self, request: pb.GetFleetCostRequest, context: grpc.ServicerContext) -> pb.FleetCost:
        doc = self._read(context, lambda: self.service.cost.report(time.time(), limit=request.limit or 20))
        return pb.FleetCost(
            gpu_hours_lost=doc["total"]["gpu_hours_lost"],
            gpu_hours_uncertainty=doc["total"]["gpu_hours_uncertainty"],
            causes=[
                pb.CauseCost(
                    domain=c["domain"],
                    subdomain=c["subdomain"],
                    gpu_hours_lost=c["gpu_hours_lost"],
                    attempts=c["attempts"],
                    share=c["share"],
                    cumulative_share=c["cumulative_share"],
                )
                for c in doc["causes"]
            ],
            components=[
                pb.ComponentCost(
                    kind=c["kind"],
                    name=c["name"],
                    gpu_hours_lost=c["gpu_hours_lost"],
                    attempts=c["attempts"],
                    workloads=c["workloads"],
                )
                for c in doc["components"]
            ],
            report_json=json.dumps(doc, sort_keys=True),
        )

    def WatchDiagnoses(
        self, request: pb.WatchDiagnosesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Diagnosis]:
        client = _client_key(context)
        refusal = self._take_watch(client)
        if refusal is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            yield from self._watch(request, context)
        finally:
            with self._per_client_lock:
                self._per_client[client] -= 1
                if self._per_client[client] <= 0:
                    del self._per_client[client]

    def _take_watch(self, client: str) -> str | None:
        """Count a watch in for `client`, or say why not. A client already holding one may open another
        only while more than `reserved` slots stay free: the last ones are kept for clients holding
        none, so a few clients cannot take every slot."""
        with self._per_client_lock:
            held = self._per_client[client]
            free = self.max_watchers - sum(self._per_client.values())
            if held >= self.max_per_client:
                return f"at most {self.max_per_client} watches per client at once (watch_max_per_client)"
            if free <= 0:
                return f"at most {self.max_watchers} watches at once (half of grpc_workers)"
            if held and free <= self.reserved:
                return (
                    f"the last {self.reserved} of {self.max_watchers} watch slots are kept for clients "
                    "holding no watch: close one of yours first"
                )
            self._per_client[client] += 1
            return None

    def _watch(
        self, request: pb.WatchDiagnosesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Diagnosis]:
        flt = _filter(request.filter)
        pending: queue.Queue[DiagnosisRow | None] = queue.Queue(WATCH_QUEUE)
        overflow = threading.Event()

        def deliver(row: DiagnosisRow) -> None:  # runs on the analysis thread: never blocks
            if not _matches(flt, row):
                return
            try:
                pending.put_nowait(row)
            except queue.Full:
                overflow.set()

        def wake() -> None:
            try:
                pending.put_nowait(None)
            except queue.Full:
                overflow.set()

        cancel = self.service.watch(deliver)
        context.add_callback(wake)
        try:
            context.send_initial_metadata((("hypocenter-watch", "subscribed"),))
            while context.is_active():
                if overflow.is_set():
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"watcher fell {WATCH_QUEUE} diagnoses behind: reconnect and list to catch up",
                    )
                try:
                    row = pending.get(timeout=1.0)
                except queue.Empty:
                    continue
                if row is not None:
                    yield _message(row)
        finally:
            cancel()

    @staticmethod
    def _read(context: grpc.ServicerContext, read: Callable[[], _T]) -> _T:
        try:
            return read()
        except Exception as exc:  # a store that cannot answer now: the client may retry
            log.error("store read failed: %s", exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {exc}")
