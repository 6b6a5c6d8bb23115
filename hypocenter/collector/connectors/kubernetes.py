"""Kubernetes scope connector: a Kueue Workload or a training job → the attempt, its records and pod logs.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import httpx

from hypocenter.collector import logstream
from hypocenter.collector.connectors.base import Collected, ConnectorError, RetryPolicy, Scope
from hypocenter.collector.connectors.kube_api import DEFAULT_POLICY, KubeAPI
from hypocenter.collector.connectors.kube_credentials import credentials
from hypocenter.collector.scheduler_records import render
from hypocenter.collector.spool import Spool
from hypocenter.lineformat import TimeContext, parse_iso
from hypocenter.model import AttemptContext, Coverage, Window, Workload
from hypocenter.sources import FileTextSource, RecordSource, Source, TextSource

Kind = Literal["JobSet", "PyTorchJob", "Job"]

# kind → (API path of the collection, pod label that names the job)
KINDS: dict[str, tuple[str, str]] = {
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", "jobset.sigs.k8s.io/jobset-name"),
    "PyTorchJob": ("/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", "training.kubeflow.org/job-name"),
    "Job": ("/apis/batch/v1/namespaces/{ns}/jobs", "batch.kubernetes.io/job-name"),
}
_KIND_NAMES = {k.lower(): k for k in KINDS} | {
    "jobsets": "JobSet",
    "pytorchjobs": "PyTorchJob",
    "jobs": "Job",
}
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads"
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9.]*[A-Za-z0-9])?")  # DNS names (never `..`, `?`, `%`)
_TERMINAL = {
    "Failed": "FAILED",
    "Complete": "COMPLETED",
    "Completed": "COMPLETED",
    "Succeeded": "COMPLETED",
    "Suspended": "SUSPENDED",
}


# --------------------------------------------------------------------------------------------- scope


def split_ref(text: str, what: str) -> tuple[str, str | None, str]:
    """`NS/NAME` or `NS/KIND/NAME` → (namespace, kind or None, name)."""
    parts = text.strip().split("/")
    if not all(_PATH_SEGMENT.fullmatch(p) for p in parts):  # each part is a URL path segment of the API
        parts = []
    if len(parts) == 2 and all(parts):
        return parts[0], None, parts[1]
    if len(parts) == 3 and all(parts) and parts[1].lower() in _KIND_NAMES:
        return parts[0], _KIND_NAMES[parts[1].lower()], parts[2]
    raise ConnectorError(
        f"{what} {text!r}: expected NAMESPACE/NAME (or NAMESPACE/KIND/NAME, KIND one of "
        "jobset, pytorchjob, job)",
        kind="permanent",
    )


# An answer can be unlike any API server's (a proxy, a half-upgraded CRD): every field is read
# through these, so a wrong type is an absent field, never an exception in the middle of a scope.


def _field(obj: Any, key: str) -> dict[str, Any]:
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if isinstance(v, dict) else {}


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [i for i in v if isinstance(i, dict)] if isinstance(v, list) else []


def _number(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return _field(obj, "metadata")


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return _field(obj, "status")


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return _field(obj, "spec")


def _node_of(pod: dict[str, Any]) -> str | None:
    node = _spec(pod).get("nodeName")
    return node if isinstance(node, str) and node else None


def _items(doc: Any) -> list[dict[str, Any]]:
    return _dicts(doc.get("items")) if isinstance(doc, dict) else []


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in _dicts(_status(obj).get("conditions")) if isinstance(c.get("type"), str)]


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return _dicts(_status(pod).get("containerStatuses"))


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ConnectorError(
            f"{what}: answer is not a Kubernetes object (a JSON {type(doc).__name__})", kind="permanent"
        )
    return doc


_EPOCH = TimeContext(
    tz=timezone.utc,
    start=datetime(1970, 1, 1, tzinfo=timezone.utc),
    end=datetime(2200, 1, 1, tzinfo=timezone.utc),
)


def _when(v: Any) -> datetime | None:
    return parse_iso(v, _EPOCH) if isinstance(v, str) else None


def _terminated(pod: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(container, "state"|"lastState", terminated) for every terminated container of a pod."""
    for cs in _container_statuses(pod):
        for which in ("state", "lastState"):
            term = _field(_field(cs, which), "terminated")
            if term:
                yield str(cs.get("name", "?")), which, term


LOG_MEMORY = 16 << 20
"""Bytes of a scope's pod logs kept in memory; past them, the logs go to one anonymous temporary file."""


class _SpooledLog:
    """One pod log as it streams in: its text appended to the scope's spool as UTF-8 (what a string
    TextSource of the same text is to the engine), its lines counted on the way. The engine reads it
    back in line-aligned pieces (`source`), never whole."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.start = spool.size
        self.newlines = 0
        self.last = ""

    def restart(self) -> None:
        """Forget what a failed try appended."""
        self.spool.truncate(self.start)
        self.newlines = 0
        self.last = ""

    def write(self, text: str) -> None:
        if text:
            self.spool.append(text.encode("utf-8", "surrogateescape"))
            self.newlines += text.count("\n")
            self.last = text[-1]

    @property
    def size(self) -> int:
        return self.spool.size - self.start

    @property
    def lines(self) -> int:
        return self.newlines + (0 if self.last in ("\n", "") else 1)

    def source(self, name: str, node: str | None) -> FileTextSource:
        spool, start, size = self.spool, self.start, self.size
        return FileTextSource(
            name,
            lambda: spool.read_at(start, size),
            node,
            nbytes=size,
            chunks=lambda: spool.pieces(start, size, logstream.CHUNK_BYTES),
        )


_Records = Callable[[Any, str, Sequence[str]], None]
"""Renders a document as one source's records and notes its coverage (KubernetesConnector._scope)."""


@dataclass(slots=True)
class _Found:
    kind: str
    obj: dict[str, Any]
    workload: dict[str, Any] | None = None


class KubernetesConnector:
    """Scope one Kueue Workload or training job (see the module docstring)."""

    name = "kubernetes"

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        kind: str | None = None,
        workload: bool = False,
        api: KubeAPI | None = None,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        policy: RetryPolicy = DEFAULT_POLICY,
        transport: httpx.BaseTransport | None = None,
        now: Callable[[], datetime] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.namespace, self.job_name, self.kind, self.is_workload = namespace, name, kind, workload
        self._api = api
        self._api_args = (kubeconfig, context, policy, transport)
        self.now = now or (lambda: datetime.now(timezone.utc))
        self.progress = progress or (lambda text: None)

    @classmethod
    def for_kueue(cls, ref: str, **kwargs: Any) -> KubernetesConnector:
        ns, _kind, name = split_ref(ref, "--kueue")
        return cls(ns, name, workload=True, **kwargs)

    @classmethod
    def for_job(cls, ref: str, **kwargs: Any) -> KubernetesConnector:
        ns, kind, name = split_ref(ref, "--k8s-job")
        return cls(ns, name, kind=kind, **kwargs)

    @property
    def api(self) -> KubeAPI:
        if self._api is None:
            kubeconfig, context, policy, transport = self._api_args
            self._api = KubeAPI(credentials(kubeconfig, context), policy=policy, transport=transport)
        return self._api

    # ------------------------------------------------------------------ finding the objects

    def _find(self) -> _Found:
        ns = self.namespace
        if self.is_workload:
            what = f"Kueue Workload {ns}/{self.job_name}"
            wl = _object(self.api.get(f"{WORKLOADS.format(ns=ns)}/{self.job_name}", what=what), what)
            owner = next(
                (
                    o
                    for o in _dicts(_meta(wl).get("ownerReferences"))
                    if isinstance(o.get("kind"), str) and o["kind"] in KINDS
                ),
                None,
            )
            if owner is None:
                raise ConnectorError(
                    f"Kueue Workload {ns}/{self.job_name} is owned by no JobSet, PyTorchJob or Job",
                    kind="permanent",
                )
            kind = str(owner["kind"])
            what = f"{kind} {ns}/{owner['name']}"
            return _Found(
                kind,
                _object(self.api.get(f"{KINDS[kind][0].format(ns=ns)}/{owner['name']}", what=what), what),
                wl,
            )
        kinds = [self.kind] if self.kind else list(KINDS)
        missing: list[str] = []
        for kind in kinds:
            try:
                what = f"{kind} {ns}/{self.job_name}"
                obj = _object(
                    self.api.get(f"{KINDS[kind][0].format(ns=ns)}/{self.job_name}", what=what), what
                )
            except ConnectorError as exc:
                if exc.kind != "not_found":
                    raise
                missing.append(kind)
                continue
            return _Found(kind, obj)
        raise ConnectorError(
            f"no {' / '.join(missing)} named {self.job_name} in namespace {ns}", kind="not_found"
        )

    def _workload_of(self, found: _Found, coverage: list[Coverage]) -> dict[str, Any] | None:
        uid = _meta(found.obj).get("uid")
        try:
            doc = self.api.get(WORKLOADS.format(ns=self.namespace), what="Kueue Workloads")
        except ConnectorError as exc:
            status: Literal["skipped", "failed"] = "skipped" if exc.kind == "not_found" else "failed"
            coverage.append(
                Coverage(
                    connector=self.name,
                    source="k8s/workload.json",
                    status=status,
                    observations=0,
                    reason="Kueue is not installed" if exc.kind == "not_found" else str(exc),
                )
            )
            return None
        for wl in _items(doc):
            owners = _dicts(_meta(wl).get("ownerReferences"))
            if any(
                o.get("uid") == uid or (o.get("kind") == found.kind and o.get("name") == self.job_name)
                for o in owners
            ):
                return wl
        return None

    def _pods(self, found: _Found) -> list[dict[str, Any]]:
        name = _meta(found.obj).get("name", self.job_name)
        label = KINDS[found.kind][1]
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        pods = _items(self.api.get(path, {"labelSelector": f"{label}={name}"}, what="pods"))
        if not pods and found.kind == "Job":  # clusters before 1.27 label only job-name
            pods = _items(self.api.get(path, {"labelSelector": f"job-name={name}"}, what="pods"))
        if found.kind == "JobSet":  # pods of earlier restarts, if any survive, are other attempts
            restarts = str(_status(found.obj).get("restarts", 0))
            pods = [
                p
                for p in pods
                if _field(_meta(p), "labels").get("jobset.sigs.k8s.io/restart-attempt", restarts) == restarts
            ]
        return sorted(pods, key=lambda p: str(_meta(p).get("name")))

    # ------------------------------------------------------------------ the scope

    def scope(self) -> Scope:
        self.progress(f"kubernetes: reading {self.namespace}/{self.job_name}")
        with self.api:  # connections live for this scope only (base.py, "Resources")
            return self._scope()

    def _scope(self) -> Scope:
        coverage: list[Coverage] = []
        notes: list[str] = []
        found = self._find()
        workload = found.workload if found.workload is not None else self._workload_of(found, coverage)
        pods: list[dict[str, Any]] = []
        try:
            pods = self._pods(found)
        except ConnectorError as exc:
            coverage.append(
                Coverage(
                    connector=self.name,
                    source="k8s/pods.json",
                    status="failed",
                    observations=0,
                    reason=str(exc),
                )
            )
        context = self._context(found, workload, pods, notes)
        tctx = TimeContext(tz=timezone.utc, start=context.window.start, end=context.window.end)
        sources: list[Source] = []

        def records(doc: Any, source: str, failed: Sequence[str] = ()) -> None:
            """The document's records and its one coverage entry: partial when some of it was not read."""
            recs = render(doc, source, tctx)
            if recs:
                sources.append(RecordSource(name=source, records=recs))
            coverage.append(
                Coverage(
                    connector=self.name,
                    source=source,
                    status="partial" if failed else "ok",
                    observations=len(recs),
                    reason="; ".join(failed[:3]) or None,
                )
            )

        records(found.obj, f"k8s/{found.kind.lower()}-{self.job_name}.json")
        if workload is not None:
            records(workload, f"k8s/workload-{_meta(workload).get('name')}.json")
        if pods:
            records({"kind": "PodList", "items": pods}, "k8s/pods.json")
        elif not any(c.source == "k8s/pods.json" for c in coverage):
            coverage.append(
                Coverage(
                    connector=self.name,
                    source="k8s/pods.json",
                    status="missing",
                    observations=0,
                    reason="no pods left (deleted after the job ended?): no pod logs or states",
                )
            )
        involved = [(found.kind, str(_meta(found.obj).get("name")))]
        if workload is not None:
            involved.append(("Workload", str(_meta(workload).get("name"))))
        involved += [("Pod", str(_meta(p).get("name"))) for p in pods]
        self._events(involved, records, coverage)
        self._nodes(context.nodes, records, coverage)
        sources.extend(self._logs(pods, coverage))
        coverage.sort(key=lambda c: (c.source, c.connector))
        return Scope(context=context, collected=Collected(sources=sources, coverage=coverage), notes=notes)

    def _events(self, involved: list[tuple[str, str]], records: _Records, coverage: list[Coverage]) -> None:
        items: list[dict[str, Any]] = []
        failed: list[str] = []
        for kind, name in involved:
            try:
                doc = self.api.get(
                    f"/api/v1/namespaces/{self.namespace}/events",
                    {"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
                    what=f"events of {kind}/{name}",
                )
            except ConnectorError as exc:
                failed.append(f"{kind}/{name}: {exc}")
                continue
            items.extend(_items(doc))
        by_key: dict[str, dict[str, Any]] = {}
        for e in items:  # an event can involve the same object through two queries: keep one
            by_key.setdefault(str(_meta(e).get("uid") or _meta(e).get("name") or id(e)), e)
        unique = list(by_key.values())
        self._listed("EventList", unique, failed, "k8s/events.json", records, coverage)
        if not unique and not failed:
            coverage.append(
                Coverage(
                    connector=self.name,
                    source="k8s/events.json",
                    status="missing",
                    observations=0,
                    reason="no events left (the API server keeps them about an hour)",
                )
            )

    def _nodes(self, nodes: list[str], records: _Records, coverage: list[Coverage]) -> None:
        got: list[dict[str, Any]] = []
        failed: list[str] = []
        for node in nodes:
            try:
                got.append(self.api.get(f"/api/v1/nodes/{node}", what=f"node {node}"))
            except ConnectorError as exc:
                failed.append(f"{node}: {exc}")
        self._listed("NodeList", got, failed, "k8s/nodes.json", records, coverage)

    def _listed(
        self,
        kind: str,
        items: list[dict[str, Any]],
        failed: list[str],
        source: str,
        records: _Records,
        coverage: list[Coverage],
    ) -> None:
        """Objects read one query each: their records (partial when some queries failed), or a
        failed entry when every query did; nothing when there was nothing to read."""
        if items:
            records({"kind": kind, "items": items}, source, failed)
        elif failed:
            coverage.append(
                Coverage(
                    connector=self.name,
                    source=source,
                    status="failed",
                    observations=0,
                    reason="; ".join(failed[:3]),
                )
            )

    def _logs(self, pods: list[dict[str, Any]], coverage: list[Coverage]) -> list[TextSource]:
        out: list[TextSource] = []
        spool = Spool(LOG_MEMORY, what="pod logs", prefix="hypocenter-podlogs-")  # every log of the scope
        for pod in pods:
            pod_name = str(_meta(pod).get("name"))
            node = _node_of(pod) or "_job"
            statuses = {str(cs.get("name")): cs for cs in _container_statuses(pod)}
            containers = [str(c.get("name")) for c in _dicts(_spec(pod).get("containers"))]
            containers = containers or list(statuses)
            for i, container in enumerate(containers):
                stem = f"logs/{node}/{pod_name}" + ("" if i == 0 else f".{container}")
                cs = statuses.get(container, {})
                previous = bool(_number(cs.get("restartCount"))) or bool(
                    _field(_field(cs, "lastState"), "terminated")
                )
                for prev in (True, False) if previous else (False,):
                    name = stem + (".previous" if prev else "") + ".log"
                    self.progress(f"kubernetes: log {name}")
                    params = {"container": container, "timestamps": "true"}
                    if prev:
                        params["previous"] = "true"
                    log = _SpooledLog(spool)
                    try:
                        self.api.stream_text(
                            f"/api/v1/namespaces/{self.namespace}/pods/{pod_name}/log",
                            params,
                            what=f"log of {pod_name}/{container}" + (" (previous)" if prev else ""),
                            write=log.write,
                            restart=log.restart,
                        )
                    except ConnectorError as exc:
                        log.restart()
                        coverage.append(
                            Coverage(
                                connector=self.name,
                                source=name,
                                status="missing" if exc.kind == "not_found" else "failed",
                                observations=0,
                                reason=str(exc),
                            )
                        )
                        continue
                    if log.size:
                        out.append(log.source(name, None if node == "_job" else node))
                    coverage.append(
                        Coverage(
                            connector=self.name,
                            source=name,
                            status="ok" if log.size else "missing",
                            observations=log.lines,
                            reason=None if log.size else "empty log",
                        )
                    )
        spool.seal()
        return out

    def _context(
        self, found: _Found, workload: dict[str, Any] | None, pods: list[dict[str, Any]], notes: list[str]
    ) -> AttemptContext:
        obj = found.obj
        meta, status = _meta(obj), _status(obj)
        # attempt (module docstring)
        if self.is_workload and workload is not None:
            count = _number(_field(_status(workload), "requeueState").get("count")) or 0
            wl_conds = {c.get("type"): c for c in _conditions(workload)}
            evicted = (wl_conds.get("Evicted") or {}).get("status") == "True"
            admitted = (wl_conds.get("Admitted") or {}).get("status") == "True"
            attempt = max(0, count - 1) if evicted and not admitted else count
        elif found.kind == "JobSet":
            attempt = _number(status.get("restarts")) or 0
        elif found.kind == "PyTorchJob":
            attempt = max(
                (_number(cs.get("restartCount")) or 0 for p in pods for cs in _container_statuses(p)),
                default=0,
            )
        else:
            attempt = 0
            if status.get("failed"):
                notes.append(f"batch Job: {status['failed']} failed pod(s) were retried within this attempt")
        state, reason = self._state(found, workload)
        # exit code: the first container to terminate with a non-zero code
        terms = sorted(
            (
                (_when(t.get("finishedAt")) or datetime.max.replace(tzinfo=timezone.utc), t)
                for p in pods
                for _c, _w, t in _terminated(p)
                if _number(t.get("exitCode"))
            ),
            key=lambda x: x[0],
        )
        exit_code = _number(terms[0][1]["exitCode"]) if terms else None
        # window: creation or start … completion, last condition change or last container end
        starts = [
            t
            for t in (
                _when(status.get("startTime")),
                _when(meta.get("creationTimestamp")),
                *(_when(_status(p).get("startTime")) for p in pods),
            )
            if t
        ]
        ends = [
            t
            for t in (
                _when(status.get("completionTime")),
                *(_when(c.get("lastTransitionTime")) for c in _conditions(obj) if c.get("status") == "True"),
                *(_when(t.get("finishedAt")) for p in pods for _c, _w, t in _terminated(p)),
            )
            if t
        ]
        if workload is not None:
            ends += [
                t
                for c in _conditions(workload)
                if c.get("type") in ("Evicted", "Finished")
                and c.get("status") == "True"
                and (t := _when(c.get("lastTransitionTime")))
            ]
        now = self.now()
        start = min(starts) if starts else now
        end = max(ends) if ends and state not in ("RUNNING", None) else now
        if state == "RUNNING":
            notes.append(
                f"{found.kind} {self.namespace}/{self.job_name} is still running: the window ends now"
            )
        nodes = list(dict.fromkeys(node for p in pods if (node := _node_of(p))))
        return AttemptContext(
            # the job object names the workload, also when it was found through its Kueue Workload
            workload=Workload(
                id=f"{self.namespace}/{meta.get('name', self.job_name)}",
                attempt=attempt,
                name=str(meta.get("name", self.job_name)),
                scheduler="kueue" if self.is_workload else "kubernetes",
                cluster=None,
            ),
            window=Window(start=start, end=max(start, end)),
            state=state,
            exit_code=exit_code,
            reason=reason,
            nodes=nodes,
            gpus_per_node=_gpus_per_node(pods),
        )

    def _state(self, found: _Found, workload: dict[str, Any] | None) -> tuple[str | None, str | None]:
        if workload is not None:
            conds = {c.get("type"): c for c in _conditions(workload) if c.get("status") == "True"}
            if "Evicted" in conds:
                ev = conds["Evicted"]
                pre = conds.get("Preempted")
                if ev.get("reason") == "Preempted":
                    return "PREEMPTED", str(ev.get("reason"))
                return "EVICTED", str(ev.get("reason") or (pre or {}).get("reason") or "Evicted")
        true = sorted(
            (c for c in _conditions(found.obj) if c.get("status") == "True" and c.get("type") in _TERMINAL),
            key=lambda c: str(c.get("lastTransitionTime") or ""),
        )
        if true:
            last = true[-1]
            return _TERMINAL[str(last["type"])], (str(last["reason"]) if last.get("reason") else None)
        return "RUNNING", None


def _gpus_per_node(pods: list[dict[str, Any]]) -> int | None:
    """GPUs the pods were allocated per node (their containers' nvidia.com/gpu limits, the most any
    node got): what the cost of a failure multiplies by; None when no pod asks for GPUs."""
    per_node: dict[str, int] = {}
    for p in pods:
        node = _node_of(p)
        for c in _dicts(_spec(p).get("containers")):
            n = _number(_field(_field(c, "resources"), "limits").get("nvidia.com/gpu"))
            if node and n is not None and n > 0:
                per_node[node] = per_node.get(node, 0) + n
    return max(per_node.values()) if per_node else None
