"""The server's pull side: the same connectors as `hypocenter analyze --slurm/--loki/--prometheus`.

    Pulls        data connectors consulted when an attempt is analysed: Loki (`pull_loki_url`) for
                 an attempt no log record reached over OTLP, Prometheus (`pull_prometheus_url`) for
                 one no metric point did — a deployment that already ships logs to Loki and
                 metrics to Prometheus needs only the scheduler's word to get a diagnosis, and one
                 that pushes over OTLP never gets the same lines twice.
    SlurmPoller  every `slurm_poll_s`, asks Slurm accounting (`sacct --json`) which jobs ended since
                 the last look, scopes each with the Slurm connector (attempt = requeue count,
                 window, nodes, state, exit code) and stores that scope and Slurm's records as
                 the attempt's; the trigger loop then analyses it like any attempt that ended.
    KueuePoller  every `kube_poll_s`, lists Kueue Workloads (all namespaces) whose Finished or
                 Evicted condition turned true since the last look and does the same with the
                 Kubernetes connector (pod logs, previous containers, events, node conditions).

Credentials are never settings: Loki's come from logcli's variables (`LOKI_BEARER_TOKEN[_FILE]`,
`LOKI_USERNAME` + `LOKI_PASSWORD`; tenant `LOKI_ORG_ID` unless `pull_loki_tenant` is set),
Prometheus' from the same names with `PROMETHEUS_`. The sources are the `LokiSource` /
`PrometheusSource` of `hypocenter analyze` (`Settings.pull_loki`), turned into connector arguments
the same way.

A failing connector never stops an analysis: its coverage entry says what failed and quality
drops. A poll that fails is logged and tried again at the next interval. Replicas sharing one
PostgreSQL each run the pollers, but only the one holding a poller's lease polls
(server/leadership.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from hypocenter.collector.connectors import connector_class
from hypocenter.collector.connectors.base import (
    Collected,
    ConnectorError,
    DataConnector,
    RetryPolicy,
    Scope,
    with_retries,
)
from hypocenter.collector.connectors.kube_api import KubeAPI
from hypocenter.collector.connectors.kube_credentials import credentials
from hypocenter.collector.connectors.kubernetes import KubernetesConnector
from hypocenter.collector.connectors.slurm import SlurmConnector, run_command
from hypocenter.collector.scheduler_records import RECORDS_KIND, slurm_job_label
from hypocenter.config import Settings
from hypocenter.engine.rules import Ruleset
from hypocenter.model import Coverage
from hypocenter.server.attempts import parse_time
from hypocenter.sources import AttemptInput, MetricSource, RecordSource, Source, TextSource
from hypocenter.store.base import StoreUnavailable

log = logging.getLogger("hypocenter.server")

Runner = Callable[[Sequence[str], float], str]
# Slurm's terminal job states (sacct -s takes these abbreviations): BOOT_FAIL, CANCELLED, COMPLETED,
# DEADLINE, FAILED, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, TIMEOUT.
ENDED_STATES = "BF,CA,CD,DL,F,NF,OOM,PR,TO"


class Pulls:
    """Data connectors the server consults at analysis time."""

    def __init__(self, settings: Settings, ruleset: Ruleset) -> None:
        policy = RetryPolicy(timeout_s=settings.pull_timeout_s)
        queries = ruleset.queries()
        self.logs: DataConnector | None = None
        self.metrics: DataConnector | None = None
        # The same source model and connector arguments as `hypocenter analyze --loki/--prometheus`
        # (credentials from logcli's variables: never a setting; precedence in hypocenter/config.py).
        if settings.pull_loki is not None:
            self.logs = connector_class("loki")(
                settings.pull_loki.url,
                policy=policy,
                queries=queries,
                **settings.pull_loki.connector_arguments(os.environ),
                lookback_s=settings.node_lookback_s,
                slack_s=settings.node_slack_s,
            )
        if settings.pull_prometheus is not None:
            self.metrics = connector_class("prometheus")(
                settings.pull_prometheus.url,
                policy=policy,
                queries=queries,
                **settings.pull_prometheus.connector_arguments(os.environ),
                lookback_s=settings.node_lookback_s,
                slack_s=settings.node_slack_s,
            )

    def __bool__(self) -> bool:
        return self.logs is not None or self.metrics is not None

    def collect(self, inp: AttemptInput) -> tuple[list[Source], list[Coverage]]:
        """What the connectors add to an attempt assembled from the store. Where a connector stands in
        for OTLP (no log record or no metric point arrived), the store's `otlp` entries for that kind
        (`logs/<node>` missing) are taken out of `inp.coverage`: coverage describes the sources used."""
        sources: list[Source] = []
        coverage: list[Coverage] = []
        pushed_text = any(isinstance(s, TextSource) for s in inp.sources)
        pushed_metrics = any(isinstance(s, MetricSource) for s in inp.sources)
        for connector, pushed in ((self.logs, pushed_text), (self.metrics, pushed_metrics)):
            if connector is None:
                continue
            if pushed:
                coverage.append(
                    Coverage(
                        connector=connector.name,
                        source=connector.name,
                        status="skipped",
                        observations=0,
                        reason="the attempt's records arrived over OTLP",
                    )
                )
                continue
            got = _safe_collect(connector, inp)
            sources.extend(got.sources)
            coverage.extend(got.coverage)
            if connector is self.logs:
                inp.coverage[:] = [
                    c
                    for c in inp.coverage
                    if not (c.connector == "otlp" and c.source.startswith("logs/") and c.status == "missing")
                ]
        return sources, coverage


def _safe_collect(connector: DataConnector, inp: AttemptInput) -> Collected:
    try:
        return connector.collect(inp.context)
    except Exception as exc:  # a data connector must not stop the analysis, whatever went wrong
        log.warning("%s: %s", connector.name, exc)
        return Collected(
            coverage=[
                Coverage(
                    connector=connector.name,
                    source=connector.name,
                    status="failed",
                    observations=0,
                    reason=f"{type(exc).__name__}: {exc}",
                )
            ]
        )


# --------------------------------------------------------------------------------------------- Slurm


def ended_jobs(runner: Runner, policy: RetryPolicy, since: datetime, until: datetime) -> list[str]:
    """Ids (`81234`, `81234_7`, `81234+1`) of the jobs that ended in [since, until], oldest first."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    argv = [
        "sacct",
        "--json",
        "--allusers",
        "--allocations",
        "--state",
        ENDED_STATES,
        "--starttime",
        since.astimezone(timezone.utc).strftime(fmt),
        "--endtime",
        until.astimezone(timezone.utc).strftime(fmt),
    ]
    text = with_retries(lambda: runner(argv, policy.timeout_s), policy, what="sacct")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConnectorError(f"sacct --json printed something that is not JSON: {exc}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise ConnectorError("sacct --json: no `jobs` list in its answer")
    seen: dict[str, float] = {}
    for job in jobs:
        if isinstance(job, dict):
            label = slurm_job_label(job)
            end = job.get("time", {}).get("end") if isinstance(job.get("time"), dict) else None
            if isinstance(end, dict):
                end = end.get("number")
            seen.setdefault(label, float(end) if isinstance(end, int | float) else 0.0)
    return sorted(seen, key=lambda k: (seen[k], k))


class _Poller:
    """A thread that asks a scheduler which jobs ended since its last look and keeps each one's scope
    in the store (the trigger loop then analyses it like any attempt that ended). A scope the store
    already holds is not stored again, so overlapping looks and restarts cost nothing."""

    what = "poll"

    def __init__(
        self,
        interval_s: float,
        lookback_s: float,
        timeout_s: float,
        store_context: Callable[[Any, list[Source]], bool],
        active: Callable[[], bool] | None = None,
    ) -> None:
        self.interval = interval_s
        self._active = active or (lambda: True)  # whether this replica polls (server/leadership.py)
        self.lookback = timedelta(seconds=lookback_s)
        self.policy = RetryPolicy(timeout_s=timeout_s)
        self._store_context = store_context
        self._since: datetime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"hypocenter-{self.what.replace(' ', '-')}", daemon=True
        )
        self.scoped = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.policy.timeout_s + 5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._active():  # another replica polls this scheduler; look again in a while
                self._stop.wait(min(self.interval, 1.0))
                continue
            try:
                self.poll()
            except ConnectorError as exc:
                self.failures += 1
                log.warning("%s: %s (retrying in %g s)", self.what, exc, self.interval)
            except StoreUnavailable:  # logged by the store, once per outage
                self.failures += 1
            except Exception:  # the poller must outlive one bad answer
                self.failures += 1
                log.exception(self.what)
            self._stop.wait(self.interval)

    def _jobs(self, since: datetime, now: datetime) -> list[str]:
        raise NotImplementedError

    def _scope(self, job: str) -> Scope:
        raise NotImplementedError

    def poll(self, now: datetime | None = None) -> int:
        """One look; returns how many attempts were scoped anew."""
        now = now or datetime.now(timezone.utc)
        since = self._since or now - self.lookback
        new = 0
        for job in self._jobs(since - timedelta(minutes=1), now):
            if self._stop.is_set():
                break
            try:
                scope = self._scope(job)
            except ConnectorError as exc:
                log.warning("%s: %s: %s", self.what, job, exc)
                continue
            if self._store_context(scope.context, scope.collected.sources):
                new += 1
        self._since = now
        self.scoped += new
        return new


class SlurmPoller(_Poller):
    """Every `slurm_poll_s`, scopes the jobs Slurm accounting reports ended since the last look."""

    what = "slurm poll"

    def __init__(
        self,
        settings: Settings,
        store_context: Callable[[Any, list[Source]], bool],
        runner: Runner = run_command,
        active: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(
            settings.slurm_poll_s,
            settings.slurm_poll_lookback_s,
            settings.pull_timeout_s,
            store_context,
            active,
        )
        self.rest_url = settings.slurm_rest_url or None
        self.runner = runner

    def _jobs(self, since: datetime, now: datetime) -> list[str]:
        return ended_jobs(self.runner, self.policy, since, now)

    def _scope(self, job: str) -> Scope:
        scope: Scope = SlurmConnector(
            job, runner=self.runner, policy=self.policy, rest_url=self.rest_url
        ).scope()
        return scope


# --------------------------------------------------------------------------------------------- Kueue

KUEUE_WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/workloads"
# Conditions that end an attempt of a Kueue Workload: it finished (succeeded or failed), or it was
# evicted (preempted, PodsReady timeout, deactivated) — each eviction ends one admission.
ENDING_CONDITIONS = ("Finished", "Evicted")


def ended_workloads(api: KubeAPI, since: datetime) -> list[str]:
    """`NS/NAME` of the Kueue Workloads (all namespaces) whose Finished or Evicted condition turned
    true at or after `since`, oldest first."""
    with api:
        doc = api.get(KUEUE_WORKLOADS, what="Kueue Workloads")
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ConnectorError("Kueue Workloads: no `items` list in the answer")
    found: dict[str, datetime] = {}
    for wl in items:
        meta = wl.get("metadata") if isinstance(wl, dict) else None
        status = wl.get("status") if isinstance(wl, dict) else None
        if not isinstance(meta, dict) or not isinstance(status, dict):
            continue
        for cond in status.get("conditions") or []:
            if (
                not isinstance(cond, dict)
                or cond.get("type") not in ENDING_CONDITIONS
                or cond.get("status") != "True"
            ):
                continue
            when = parse_time(str(cond.get("lastTransitionTime") or ""))
            if when is not None and when >= since:
                ref = f"{meta.get('namespace')}/{meta.get('name')}"
                found[ref] = min(found.get(ref, when), when)
    return sorted(found, key=lambda k: (found[k], k))


class KueuePoller(_Poller):
    """Every `kube_poll_s`, scopes the Kueue Workloads that finished or were evicted since the last look."""

    what = "kueue poll"

    def __init__(
        self,
        settings: Settings,
        store_context: Callable[[Any, list[Source]], bool],
        api: KubeAPI | None = None,
        active: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(
            settings.kube_poll_s,
            settings.kube_poll_lookback_s,
            settings.pull_timeout_s,
            store_context,
            active,
        )
        self._api = api
        self._kubeconfig = settings.kubeconfig or None
        self._context = settings.kube_context or None

    def _jobs(self, since: datetime, now: datetime) -> list[str]:
        return ended_workloads(self.api, since)

    @property
    def api(self) -> KubeAPI:
        if self._api is None:
            self._api = KubeAPI(credentials(self._kubeconfig, self._context), policy=self.policy)
        return self._api

    def _scope(self, job: str) -> Scope:
        scope: Scope = KubernetesConnector.for_kueue(job, api=self.api, policy=self.policy).scope()
        return scope


def records_document(sources: list[RecordSource]) -> dict[str, Any]:
    """Scheduler records as one document the store keeps and `render` reads back unchanged."""
    return {
        "kind": RECORDS_KIND,
        "records": [
            {"ref": r.ref, "time": r.time.isoformat() if r.time else None, "node": r.node, "text": r.text}
            for s in sources
            for r in s.records
        ],
    }


__all__ = [
    "ENDED_STATES",
    "KueuePoller",
    "Pulls",
    "SlurmPoller",
    "ended_jobs",
    "ended_workloads",
    "records_document",
]
