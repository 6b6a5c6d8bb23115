"""Slurm scope connector: a job id → the attempt it names, and Slurm's own account of how it ended.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any, Literal

import httpx

from hypocenter.collector.connectors.base import (
    Collected,
    ConnectorError,
    RetryPolicy,
    Scope,
    with_retries,
)
from hypocenter.collector.connectors.http_api import BorrowedTransport
from hypocenter.collector.hostlist import HostlistError, expand, expand_hostlist
from hypocenter.collector.rankmap import task_layout
from hypocenter.collector.scheduler_records import parse_scontrol, render, slurm_job_label
from hypocenter.errors import PermanentConnectorError
from hypocenter.lineformat import TimeContext, parse_iso
from hypocenter.model import AttemptContext, Coverage, Window, Workload
from hypocenter.modelbase import STATES
from hypocenter.sources import RecordSource

DEFAULT_POLICY = RetryPolicy()
Runner = Callable[[Sequence[str], float], str]
"""Runs a command (argv, timeout in seconds) and returns its standard output; raises ConnectorError."""

REST_VERSIONS = ("v0.0.41", "v0.0.42", "v0.0.43", "v0.0.40", "v0.0.44")
"""slurmrestd API versions tried in order: v0.0.41 is served by Slurm 24.05, 24.11 and 25.05."""

_BASE_STATES = (
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REQUEUED",
)
_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Connection timed out"
    r"|slurmctld.*not responding|Problem talking to the database|Unable to connect to database"
    r"|Zero Bytes were transmitted or received|Slurm backup controller in standby mode|Resource temporarily unavailable",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(
    r"Invalid job id specified|Invalid node name specified|Unable to find job", re.IGNORECASE
)
_NO_JSON = re.compile(r"unrecognized option '--json'|invalid option|unknown option", re.IGNORECASE)


def run_command(argv: Sequence[str], timeout: float) -> str:
    """The default runner: the real binary, its stdout; failures classified for retry."""
    tool = argv[0]
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise ConnectorError(
            f"{tool} not found on PATH: install Slurm's client commands or use --slurm-rest URL",
            kind="permanent",
        ) from None
    except subprocess.TimeoutExpired:
        raise ConnectorError(f"{tool} did not answer within {timeout:g} s", kind="transient") from None
    except OSError as exc:
        raise ConnectorError(f"{tool} could not be run: {exc.strerror or exc}", kind="permanent") from None
    if proc.returncode != 0:
        raise classify(tool, proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")
    return proc.stdout


def classify(tool: str, message: str) -> ConnectorError:
    """A Slurm command's complaint as a ConnectorError of the right kind."""
    text = " ".join(message.split())[:400]
    if "Could not establish a configuration source" in text:
        # the client found no slurm.conf (nor a configless DNS SRV record): say what to do, not the DNS noise
        return ConnectorError(
            f"{tool}: no Slurm configuration on this host (no slurm.conf, $SLURM_CONF unset, no "
            "DNS SRV record for configless mode): point SLURM_CONF at the cluster's slurm.conf, "
            "or use --slurm-rest URL",
            kind="permanent",
        )
    if _TRANSIENT.search(text):
        return ConnectorError(f"{tool}: {text}", kind="transient")
    if _NOT_FOUND.search(text):
        return ConnectorError(f"{tool}: {text}", kind="not_found")
    if re.search(r"Access/permission denied|Invalid user|authentication", text, re.IGNORECASE):
        return ConnectorError(f"{tool}: {text}", kind="auth")
    return ConnectorError(f"{tool}: {text}", kind="permanent")


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job id as typed: `81234`, `81234_7` (array task) or `81234+1` (heterogeneous component)."""

    text: str
    job: int
    task: int | None = None
    offset: int | None = None

    @classmethod
    def parse(cls, text: str) -> JobRef:
        t = text.strip()
        m = re.fullmatch(r"(\d+)(?:_(\d+)|\+(\d+))?", t)
        if not m:
            raise ConnectorError(
                f"{text!r} is not a Slurm job id (expected 81234, 81234_7 for an array task, "
                "or 81234+1 for a heterogeneous job component)",
                kind="permanent",
            )
        return cls(
            t,
            int(m.group(1)),
            int(m.group(2)) if m.group(2) else None,
            int(m.group(3)) if m.group(3) else None,
        )

    def matches(self, job: dict[str, Any]) -> bool:
        label = slurm_job_label(job)
        if self.task is not None or self.offset is not None:
            return label == self.text
        own = _int(job.get("job_id", job.get("jobid")))
        return (
            label == self.text
            or (own == self.job and "_" not in label and "+" not in label)
            or label.startswith((f"{self.job}_", f"{self.job}+"))
        )


@dataclass(slots=True)
class _Facts:
    """One job record of either format, reduced to what the scope needs."""

    label: str
    name: str | None
    cluster: str | None
    state: str | None
    reason: str | None
    rc: int | None
    signal: int | None
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    nodes: str
    restarts: int | None
    raw: dict[str, Any] = field(repr=False)


def _int(v: Any) -> int | None:
    if isinstance(v, dict):
        if v.get("set") is False or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    return None


def _time(v: Any) -> datetime | None:
    n = _int(v)
    if n is None or n <= 0:
        return None
    try:
        return datetime.fromtimestamp(n, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def _first_state(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("current")
    items = v if isinstance(v, list) else [v] if v else []
    names = [str(x).upper() for x in items]
    return next((n for n in names if n in _BASE_STATES), names[0] if names else None)


def _exit(v: Any, raw_status: bool) -> tuple[int | None, int | None]:
    """(return code, signal) from every exit_code shape Slurm has printed."""
    if isinstance(v, dict):
        rc = _int(v.get("return_code"))
        sig = v.get("signal")
        sig_n = _int(sig.get("id", sig.get("signal_id"))) if isinstance(sig, dict) else _int(sig)
        return rc, sig_n or None
    if isinstance(v, str) and ":" in v:
        a, _, b = v.partition(":")
        return _int(a), _int(b) or None
    n = _int(v)
    if n is not None and raw_status:  # a wait(2) status (Slurm ≤ 22.05 controller JSON)
        return (n >> 8) & 0xFF, (n & 0x7F) or None
    return n, None


def _facts(job: dict[str, Any], meta_cluster: str | None) -> _Facts:
    controller = "job_state" in job
    times = job.get("time") if isinstance(job.get("time"), dict) else {}
    assert isinstance(times, dict)
    reason = (
        job.get("state", {}).get("reason") if isinstance(job.get("state"), dict) else job.get("state_reason")
    )
    rc, sig = _exit(job.get("exit_code"), raw_status=controller)
    start = _time(times.get("start")) if times else _time(job.get("start_time"))
    end = _time(times.get("end")) if times else _time(job.get("end_time"))
    end = end or _iso(job.get("end_time_iso"))  # scontrol's text form (parse_scontrol)
    nodes = job.get("nodes")
    return _Facts(
        label=slurm_job_label(job),
        name=str(job["name"]) if job.get("name") else None,
        cluster=str(job["cluster"]) if job.get("cluster") else meta_cluster,
        state=_first_state(job.get("state") if not controller else job.get("job_state")),
        reason=None if reason in (None, "", "None") else str(reason),
        rc=rc,
        signal=sig,
        submit=_time(times.get("submission")) if times else _time(job.get("submit_time")),
        start=start,
        end=end,
        nodes=nodes if isinstance(nodes, str) and nodes not in ("None assigned", "(null)") else "",
        restarts=_int(job.get("restart_cnt")),
        raw=job,
    )


_ANY_TIME = TimeContext(
    tz=timezone.utc,
    start=datetime(1970, 1, 1, tzinfo=timezone.utc),
    end=datetime(2200, 1, 1, tzinfo=timezone.utc),
)


def _iso(v: Any) -> datetime | None:
    return parse_iso(v, _ANY_TIME) if isinstance(v, str) else None


def _meta_cluster(doc: dict[str, Any]) -> str | None:
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    assert isinstance(meta, dict)
    for key in ("slurm", "Slurm"):
        part = meta.get(key)
        if isinstance(part, dict) and part.get("cluster"):
            return str(part["cluster"])
    return None


def _load_json(tool: str, text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConnectorError(
            f"{tool}: answer is not JSON ({exc.msg} at line {exc.lineno})", kind="permanent"
        ) from None
    if not isinstance(doc, dict):
        raise ConnectorError(f"{tool}: answer is not a JSON object", kind="permanent")
    errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
    if errors and not doc.get("jobs") and not doc.get("nodes"):
        first = errors[0]
        raise classify(tool, str(first.get("description") or first.get("error") or first))
    return doc


class SlurmConnector:
    """Scope one Slurm job (see the module docstring)."""

    name = "slurm"

    def __init__(
        self,
        job_id: str,
        *,
        runner: Runner | None = None,
        policy: RetryPolicy = DEFAULT_POLICY,
        rest_url: str | None = None,
        rest_token: str | None = None,
        rest_version: str | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.ref = JobRef.parse(job_id)
        self.runner = runner or run_command
        self.policy = policy
        self.rest_url = rest_url.rstrip("/") if rest_url else None
        self.rest_token = rest_token if rest_token is not None else os.environ.get("SLURM_JWT")
        self.rest_versions = (rest_version,) if rest_version else REST_VERSIONS
        self._transport = BorrowedTransport(transport) if transport is not None else None
        self.sleep = sleep
        self.now = now or (lambda: datetime.now(timezone.utc))
        self._client: httpx.Client | None = None

    # ------------------------------------------------------------------ asking Slurm

    def _run(self, argv: list[str]) -> str:
        return with_retries(
            lambda: self.runner(argv, self.policy.timeout_s), self.policy, what=argv[0], sleep=self.sleep
        )

    def _get(self, path: str, what: str) -> dict[str, Any]:
        """One slurmrestd GET, trying API versions until one is served."""
        if self._client is None:
            headers = {"Accept": "application/json"}
            if self.rest_token:
                headers["X-SLURM-USER-TOKEN"] = self.rest_token
                if os.environ.get("SLURM_USER"):
                    headers["X-SLURM-USER-NAME"] = os.environ["SLURM_USER"]
            self._client = httpx.Client(
                base_url=self.rest_url or "",
                headers=headers,
                timeout=self.policy.timeout_s,
                transport=self._transport,
            )
        last: ConnectorError | None = None
        for version in self.rest_versions:
            url = path.format(v=version)
            try:
                return with_retries(
                    partial(self._get_once, url, what), self.policy, what=what, sleep=self.sleep
                )
            except _UnknownVersion as exc:
                last = ConnectorError(str(exc), kind="not_found")
                continue
        raise last or ConnectorError(f"{what}: no slurmrestd API version answered", kind="not_found")

    def _get_once(self, url: str, what: str) -> dict[str, Any]:
        assert self._client is not None
        try:
            resp = self._client.get(url)
        except httpx.TimeoutException:
            raise ConnectorError(
                f"{what}: slurmrestd did not answer within {self.policy.timeout_s:g} s", kind="transient"
            ) from None
        except httpx.TransportError as exc:
            raise ConnectorError(
                f"{what}: cannot reach slurmrestd at {self.rest_url}: {exc}", kind="transient"
            ) from None
        if resp.status_code in (401, 403):
            raise ConnectorError(
                f"{what}: slurmrestd refused the request (HTTP {resp.status_code}): "
                "set a token with $SLURM_JWT (scontrol token)",
                kind="auth",
            )
        if resp.status_code == 429 or resp.status_code >= 500:
            try:
                return _load_json(what, resp.text)  # slurmrestd answers 500 with a Slurm error list
            except ConnectorError as exc:
                if exc.kind != "permanent":
                    raise
            raise ConnectorError(f"{what}: slurmrestd answered HTTP {resp.status_code}", kind="transient")
        if resp.status_code == 404:
            try:
                doc = resp.json()
            except ValueError:
                doc = None
            if not isinstance(doc, dict) or not ("errors" in doc or "jobs" in doc):
                raise _UnknownVersion(f"{what}: slurmrestd does not serve {url} (HTTP 404)")
            return _load_json(what, resp.text)
        if resp.status_code >= 400:
            raise ConnectorError(
                f"{what}: slurmrestd answered HTTP {resp.status_code}: {resp.text[:200]}", kind="permanent"
            )
        doc = _load_json(what, resp.text)
        self.rest_versions = (url.split("/")[2],)  # the version that answered serves the next calls too
        return doc

    def _accounting(self) -> dict[str, Any]:
        if self.rest_url:
            return self._get(f"/slurmdb/{{v}}/job/{self.ref.text}", "slurmrestd slurmdb job")
        return _load_json("sacct", self._run(["sacct", "--json", "--duplicates", "-j", self.ref.text]))

    def _controller(self) -> tuple[dict[str, Any], str]:
        if self.rest_url:
            return self._get(f"/slurm/{{v}}/job/{self.ref.text}", "slurmrestd job"), "slurmrestd job"
        try:
            return _load_json(
                "scontrol", self._run(["scontrol", "show", "job", self.ref.text, "--json"])
            ), "scontrol"
        except ConnectorError as exc:
            if not _NO_JSON.search(str(exc)):
                raise
        # Slurm ≤ 22.05: scontrol has no --json, squeue has (every job slurmctld still holds).
        doc = _load_json("squeue", self._run(["squeue", "--json", "--states=all", "--jobs", self.ref.text]))
        return doc, "squeue"

    def _nodes(self, hostlist: str) -> tuple[dict[str, Any], str]:
        if self.rest_url:
            return self._get("/slurm/{v}/nodes", "slurmrestd nodes"), "slurmrestd nodes"
        try:
            return _load_json(
                "scontrol", self._run(["scontrol", "show", "node", hostlist, "--json"])
            ), "scontrol"
        except ConnectorError as exc:
            if not _NO_JSON.search(str(exc)):
                raise
        text = self._run(["scontrol", "show", "node", hostlist])
        doc = parse_scontrol(text)
        if doc is None:
            raise ConnectorError("scontrol show node: output not in the Key=Value form", kind="permanent")
        return dict(doc), "scontrol"

    # ------------------------------------------------------------------ the scope

    def scope(self) -> Scope:
        try:
            return self._scope()
        finally:  # slurmrestd's connections, opened on first use, live for this scope only (base.py)
            if self._client is not None:
                self._client.close()
                self._client = None

    def _scope(self) -> Scope:
        coverage: list[Coverage] = []
        notes: list[str] = []
        acct_doc: dict[str, Any] | None = None
        ctl_doc: dict[str, Any] | None = None
        ctl_tool = "scontrol"
        errors: list[ConnectorError] = []
        label = self.ref.text
        try:
            acct_doc = self._accounting()
        except ConnectorError as exc:
            errors.append(exc)
            coverage.append(
                Coverage(
                    connector=self.name,
                    source=f"slurm/sacct-{label}.json",
                    status="missing" if exc.kind == "not_found" else "failed",
                    observations=0,
                    reason=str(exc),
                )
            )
        try:
            ctl_doc, ctl_tool = self._controller()
        except ConnectorError as exc:
            errors.append(exc)
            coverage.append(
                Coverage(
                    connector=self.name,
                    source=f"slurm/scontrol-job-{label}.json",
                    status="missing" if exc.kind == "not_found" else "failed",
                    observations=0,
                    reason=(
                        "slurmctld no longer holds the job (finished longer ago than MinJobAge)"
                        if exc.kind == "not_found"
                        else str(exc)
                    ),
                )
            )
        acct = (
            [_facts(j, _meta_cluster(acct_doc)) for j in _jobs(acct_doc) if self.ref.matches(j)]
            if acct_doc
            else []
        )
        ctl = (
            [_facts(j, _meta_cluster(ctl_doc)) for j in _jobs(ctl_doc) if self.ref.matches(j)]
            if ctl_doc
            else []
        )
        if not acct and not ctl:
            # What each source said: an error, a list of jobs without this one, or an answer not understood.
            said = errors + [
                _without_job(doc, tool)
                for doc, tool in ((acct_doc, "accounting"), (ctl_doc, ctl_tool))
                if doc is not None
            ]
            real = [e for e in said if e.kind != "not_found"]
            if len(real) == len(said):
                kind = "transient" if any(e.transient for e in real) else real[0].kind
                raise ConnectorError(f"Slurm job {label}: " + "; ".join(str(e) for e in real), kind=kind)
            raise ConnectorError(
                f"Slurm job {label} not found: neither accounting (sacct) nor slurmctld knows it",
                kind="not_found",
            )
        acct = self._one_job(acct)
        ctl = self._one_job(ctl)
        context, chosen, same_instance = self._context(acct, ctl, notes)
        tctx = TimeContext(tz=timezone.utc, start=context.window.start, end=context.window.end)
        sources: list[RecordSource] = []
        if acct_doc is not None:
            kept = [f.raw for f in acct if chosen is None or f is chosen or f.label != chosen.label]
            records = render({"jobs": kept}, f"slurm/sacct-{label}.json", tctx)
            sources.append(RecordSource(name=f"slurm/sacct-{label}.json", records=records))
            coverage.append(
                _answer_coverage(
                    self.name,
                    f"slurm/sacct-{label}.json",
                    acct_doc,
                    "accounting",
                    bool(acct),
                    len(records),
                    "accounting has no record of this job",
                )
            )
        if ctl_doc is not None:
            records = render({"jobs": [f.raw for f in ctl]}, f"slurm/{ctl_tool}-job-{label}.json", tctx)
            used = len(records) if not acct else 0  # accounting already says the same: no duplicate records
            if used:
                sources.append(RecordSource(name=f"slurm/{ctl_tool}-job-{label}.json", records=records))
            coverage.append(
                _answer_coverage(
                    self.name,
                    f"slurm/scontrol-job-{label}.json",
                    ctl_doc,
                    ctl_tool,
                    bool(ctl),
                    len(ctl),
                    "slurmctld no longer holds this job"
                    if not ctl
                    else None
                    if same_instance
                    else "slurmctld describes a newer instance of the job: used for the requeue count only",
                )
            )
        if context.nodes:
            sources_n, cov = self._node_records(context.nodes, chosen, tctx, label)
            sources.extend(sources_n)
            coverage.append(cov)
        coverage.sort(key=lambda c: (c.source, c.connector))
        tasks = _task_layout(chosen, context.nodes) if chosen is not None else {}
        return Scope(
            context=context,
            collected=Collected(sources=list(sources), coverage=coverage),
            notes=notes,
            tasks=tasks,
        )

    def _one_job(self, facts: list[_Facts]) -> list[_Facts]:
        """Refuse a bare array id that names several tasks: the tasks are separate attempts."""
        tasks = sorted({f.label for f in facts if "_" in f.label})
        if self.ref.task is None and len(tasks) > 1:
            raise ConnectorError(
                f"Slurm job {self.ref.text} is a job array ({len(tasks)} tasks: "
                f"{', '.join(tasks[:4])}{' …' if len(tasks) > 4 else ''}): name one task, "
                f"e.g. {tasks[-1]}",
                kind="permanent",
            )
        return facts

    def _context(
        self, acct: list[_Facts], ctl: list[_Facts], notes: list[str]
    ) -> tuple[AttemptContext, _Facts | None, bool]:
        het = len({f.label for f in (acct or ctl)}) > 1  # a bare het job id: every component
        # sacct --duplicates lists one instance per attempt, oldest first
        instances = sorted(acct, key=lambda f: f.submit or datetime.min.replace(tzinfo=timezone.utc))
        chosen: _Facts | None = None
        attempt = 0
        same = True
        if instances and not het:
            started = [f for f in instances if f.start is not None]
            chosen = started[-1] if started else instances[-1]
            idx = instances.index(chosen)
            attempt = idx
            if chosen is not instances[-1]:
                notes.append(
                    f"the newest instance of job {self.ref.text} has not started "
                    f"({instances[-1].state}); the attempt before it is analysed"
                )
            if chosen.restarts is not None:
                attempt = chosen.restarts
            elif ctl and ctl[0].restarts is not None:
                attempt = max(0, ctl[0].restarts - (len(instances) - 1 - idx))
            same = chosen is instances[-1]
        elif ctl and not het:
            chosen = ctl[0]
            attempt = ctl[0].restarts or 0
        # The controller's view wins for the end state when it is about the same instance.
        primary = [chosen] if chosen is not None else (acct or ctl)
        facts = ctl if (ctl and same and not het) else primary
        # The component that failed speaks for a het job, before one cancelled because of it.
        lead = next(
            (f for f in facts if f.state not in (None, "COMPLETED", "CANCELLED")),
            next((f for f in facts if f.state not in (None, "COMPLETED")), facts[0]),
        )
        starts = [t for f in primary if (t := f.start or f.submit) is not None]
        start = min(starts, default=None)
        end = max((f.end for f in primary if f.end is not None), default=None)
        now = self.now()
        if start is None:
            start = now
            notes.append(f"job {self.ref.text} has not started: the window is empty")
        if end is None or lead.state in ("RUNNING", "PENDING", "SUSPENDED"):
            end = max(start, now)
            if lead.state in ("RUNNING", "SUSPENDED"):
                notes.append(f"job {self.ref.text} is still {lead.state.lower()}: the window ends now")
        end = max(start, end)
        nodes: list[str] = []
        for f in facts if het else primary:
            hostlist = f.nodes or next((c.nodes for c in ctl if c.nodes), "")
            try:
                nodes.extend(expand(hostlist))
            except HostlistError as exc:
                notes.append(str(exc))
                nodes.extend(expand_hostlist(hostlist))
        exit_code = None
        if lead.signal:
            exit_code = 128 + lead.signal  # the shell's convention, as torchrun and Kubernetes report it
        elif lead.rc is not None:
            exit_code = lead.rc
        if attempt:
            notes.append(f"attempt {attempt}: job {self.ref.text} was requeued {attempt} time(s) before it")
        state = lead.state
        if state is not None and state not in STATES:  # a newer Slurm's state, or a garbled answer
            notes.append(f"job {self.ref.text} is in state {state!r}, which is no job state known here")
            state = None
        context = AttemptContext(
            workload=Workload(
                id=self.ref.text,
                attempt=attempt,
                name=lead.name,
                scheduler="slurm",
                cluster=next((f.cluster for f in facts + primary if f.cluster), None),
            ),
            window=Window(start=start, end=end),
            state=state,
            exit_code=exit_code,
            reason=lead.reason,
            nodes=list(dict.fromkeys(nodes)),
            gpus_per_node=_gpus_per_node(facts if het else primary, len(set(nodes)))
            or (_gpus_per_node(ctl, len(set(nodes))) if ctl and same and not het else None),
        )
        return context, chosen, same

    def _node_records(
        self, nodes: list[str], chosen: _Facts | None, tctx: TimeContext, label: str
    ) -> tuple[list[RecordSource], Coverage]:
        source = f"slurm/nodes-{label}.json"
        hostlist = chosen.nodes if chosen is not None and chosen.nodes else ",".join(nodes)
        try:
            doc, _tool = self._nodes(hostlist)
        except ConnectorError as exc:
            return [], Coverage(
                connector=self.name,
                source=source,
                status="failed",
                observations=0,
                reason=f"node states and drain reasons not read: {exc}",
            )
        if not isinstance(doc.get("nodes"), list):
            return [], Coverage(
                connector=self.name,
                source=source,
                status="failed",
                observations=0,
                reason=f"node states and drain reasons not read: answer not understood (no list of "
                f"nodes): {str(doc)[:200]}",
            )
        wanted = set(nodes)
        kept = [n for n in doc["nodes"] if isinstance(n, dict) and str(n.get("name")) in wanted]
        records = render({"nodes": kept}, source, tctx) if kept else []
        missing = sorted(wanted - {str(n.get("name")) for n in kept})
        status: Literal["ok", "partial", "missing"] = (
            "ok" if not missing else ("partial" if kept else "missing")
        )
        reason = None if not missing else f"no state for {len(missing)} node(s): {', '.join(missing[:5])}"
        return ([RecordSource(name=source, records=records)] if records else []), Coverage(
            connector=self.name, source=source, status=status, observations=len(records), reason=reason
        )


def _gpus_allocated(job: dict[str, Any]) -> int | None:
    """The GPUs Slurm allocated to a job record: sacct's `tres.allocated` (`{type: gres, name: gpu,
    count}`; a typed `gpu:<model>` entry when the plain one is not listed), else the controller's
    `tres_alloc_str` (`…,gres/gpu=16`)."""
    tres = job.get("tres")
    allocated = tres.get("allocated") if isinstance(tres, dict) else None
    if isinstance(allocated, list):
        counts: dict[str, int] = {}
        for t in allocated:
            if (
                isinstance(t, dict)
                and t.get("type") == "gres"
                and str(t.get("name") or "").split(":")[0] == "gpu"
            ):
                n = _int(t.get("count"))
                if n is not None and n > 0:
                    counts[str(t["name"])] = n
        if counts:
            return counts.get("gpu", max(counts.values()))
    text = job.get("tres_alloc_str")
    if isinstance(text, str):
        for part in text.split(","):
            key, _, value = part.partition("=")
            if key.strip() == "gres/gpu" and value.strip().isdigit() and int(value) > 0:
                return int(value)
    return None


def _gpus_per_node(jobs: list[_Facts], nodes: int) -> int | None:
    """GPUs per node of the attempt (what the cost of a failure multiplies by): the GPUs allocated to
    its job records over its nodes, when they divide evenly; None when Slurm names none."""
    total = sum(n for f in jobs if (n := _gpus_allocated(f.raw)) is not None)
    return total // nodes if nodes and total >= nodes and total % nodes == 0 else None


def _task_layout(job: _Facts, nodes: list[str]) -> dict[str, list[int]]:
    """Node → task numbers (SLURM_PROCID) of the job's main step: the numbered step with the most tasks
    (not batch, extern or interactive), laid out as its `task.distribution` says (block by default)."""
    best: tuple[int, list[str], str | None] | None = None
    for step in job.raw.get("steps") or []:
        if not isinstance(step, dict) or not isinstance(step.get("step"), dict):
            continue
        sid = str(step["step"].get("id", "")).rpartition(".")[2]
        tasks = _int(step.get("tasks", {}).get("count")) if isinstance(step.get("tasks"), dict) else None
        where = step.get("nodes") if isinstance(step.get("nodes"), dict) else {}
        assert isinstance(where, dict)
        try:
            hosts = (
                [str(n) for n in where["list"]]
                if isinstance(where.get("list"), list)
                else expand(str(where.get("range") or ""))
            )
        except HostlistError:
            continue
        dist = step.get("task", {}).get("distribution") if isinstance(step.get("task"), dict) else None
        if (
            sid.isdigit()
            and tasks
            and hosts
            and set(hosts) <= set(nodes)
            and (best is None or tasks > best[0])
        ):
            best = (tasks, hosts, str(dist) if dist else None)
    return task_layout(best[1], best[0], best[2]) if best else {}


class _UnknownVersion(PermanentConnectorError):
    """slurmrestd does not serve this API version (a plain 404): try the next one."""


def _jobs(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    jobs = doc.get("jobs") if doc else None
    return [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []


def _understood(doc: dict[str, Any]) -> bool:
    """A list of job objects, maybe empty: what every Slurm release answers, whether it knows the job or not."""
    jobs = doc.get("jobs")
    return isinstance(jobs, list) and all(isinstance(j, dict) for j in jobs)


def _without_job(doc: dict[str, Any], tool: str) -> ConnectorError:
    """An answer that does not name the job: `not_found` when it is a list of jobs, else not understood."""
    if _understood(doc):
        return ConnectorError(f"{tool}: no such job", kind="not_found")
    return ConnectorError(
        f"{tool}: answer not understood (no list of jobs): {str(doc)[:200]}", kind="permanent"
    )


def _answer_coverage(
    connector: str,
    source: str,
    doc: dict[str, Any],
    tool: str,
    has_job: bool,
    observations: int,
    reason: str | None,
) -> Coverage:
    """Coverage of a source that answered: ok when it named the job, missing when its list of jobs
    lacks it, failed when the answer is not understood."""
    if has_job:
        return Coverage(
            connector=connector, source=source, status="ok", observations=observations, reason=reason
        )
    if not _understood(doc):
        return Coverage(
            connector=connector,
            source=source,
            status="failed",
            observations=0,
            reason=str(_without_job(doc, tool)),
        )
    return Coverage(
        connector=connector, source=source, status="missing", observations=observations, reason=reason
    )
