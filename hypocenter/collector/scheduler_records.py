"""Render scheduler and Kubernetes documents as canonical one-line records that rules can match.

Inputs: `sacct --json` / `scontrol show job --json` / `scontrol show node --json` / `sinfo --json`
(several Slurm data_parser versions), `kubectl get events -o json`, Pod / Node objects and lists,
and any object with `status.conditions` (Kueue Workload, JobSet, PyTorchJob, batch Job).

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from hypocenter.lineformat import TimeContext, parse_iso
from hypocenter.sources import Record

_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")


def parse_scontrol(text: str) -> dict[str, list[dict[str, Any]]] | None:
    """`scontrol show node` / `scontrol show job` text (Key=Value, blank-line separated records) as
    the JSON shapes `render` reads; None when the text is not in that format."""
    if not re.match(r"\s*(?:NodeName|JobId)=", text):
        return None
    nodes: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        kv: dict[str, str] = {}
        for line in block.splitlines():
            keys = list(_SCONTROL_KEY.finditer(line))
            for i, m in enumerate(keys):
                end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
                kv.setdefault(m.group(1), line[m.end() : end].strip())
        if "NodeName" in kv:
            reason = kv.get("Reason", "")
            when = re.search(r"\[[^@\]]*@([\dT:-]+)\]\s*$", reason)
            by = re.search(r"\[([^@\]]+)@[^\]]*\]\s*$", reason)
            nodes.append(
                {
                    "name": kv["NodeName"],
                    "state": kv.get("State", "UNKNOWN").split("+"),
                    "reason": reason,
                    "reason_changed_at_iso": when.group(1) if when else None,
                    "reason_set_by_user": by.group(1) if by else None,
                }
            )
        elif "JobId" in kv:
            rc, _, sig = kv.get("ExitCode", "0:0").partition(":")
            jobs.append(
                {
                    "job_id": kv["JobId"],
                    "job_state": [kv.get("JobState", "UNKNOWN")],
                    "state_reason": kv.get("Reason", "None"),
                    "exit_code": f"{rc}:{sig or 0}",
                    "nodes": kv.get("NodeList", ""),
                    "end_time_iso": kv.get("EndTime"),
                }
            )
    out: dict[str, list[dict[str, Any]]] = {}
    if nodes:
        out["nodes"] = nodes
    if jobs:
        out["jobs"] = jobs
    return out or None


RECORDS_KIND = "HypocenterSchedulerRecords"
"""A document of records already rendered (the server keeps a pull connector's records this way):
`{"kind": RECORDS_KIND, "records": [{"ref", "time" (RFC 3339 or null), "node", "text"}]}`."""


def render(doc: Any, name: str, ctx: TimeContext) -> list[Record]:
    """All records of one document; unknown shapes yield nothing (the caller reports that)."""
    return list(_walk(doc, name, ctx))


def _sub(ref: str, part: str) -> str:
    """`file#path.to[3].field`: a JSON-pointer-like reference to the record inside its document."""
    if "#" not in ref:
        return f"{ref}#{part}"
    return f"{ref}{part}" if part.startswith("[") else f"{ref}.{part}"


def _walk(doc: Any, ref: str, ctx: TimeContext) -> Iterator[Record]:
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            yield from _walk(item, _sub(ref, f"[{i}]"), ctx)
        return
    if not isinstance(doc, dict):
        return
    if isinstance(doc.get("jobs"), list):
        for i, job in enumerate(doc["jobs"]):
            if isinstance(job, dict):
                yield from _slurm_job(job, _sub(ref, f"jobs[{i}]"), ctx)
    if (
        isinstance(doc.get("nodes"), list)
        and doc["nodes"]
        and isinstance(doc["nodes"][0], dict)
        and "name" in doc["nodes"][0]
    ):
        for i, node in enumerate(doc["nodes"]):
            if isinstance(node, dict):
                yield from _slurm_node(node, _sub(ref, f"nodes[{i}]"), ctx)
    if isinstance(doc.get("items"), list):
        for i, item in enumerate(doc["items"]):
            yield from _walk(item, _sub(ref, f"items[{i}]"), ctx)
        return
    kind = doc.get("kind")
    if kind == RECORDS_KIND and isinstance(doc.get("records"), list):
        for r in doc["records"]:
            if isinstance(r, dict) and isinstance(r.get("text"), str) and isinstance(r.get("ref"), str):
                yield Record(
                    ref=r["ref"],
                    time=_when(r.get("time"), ctx),
                    node=r.get("node") if isinstance(r.get("node"), str) else None,
                    text=r["text"],
                )
        return
    if isinstance(kind, str):
        yield from _k8s_object(doc, kind, ref, ctx)


# --------------------------------------------------------------------------------------------- Slurm


def _number(v: Any) -> Any:
    """Slurm ≥ 23.02 wraps numbers as {"set": true, "infinite": false, "number": N}."""
    if isinstance(v, dict):
        if v.get("set") is False:
            return None
        return v.get("number")
    return v


def _epoch(v: Any) -> datetime | None:
    v = _number(v)
    if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
        try:
            return datetime.fromtimestamp(v, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):  # out of range for a datetime: no usable time
            return None
    return None


def _dict(v: Any) -> dict[str, Any]:
    """`v` when it is a mapping, else an empty one: documents from the field are not always well formed."""
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _name(v: Any) -> str | None:
    return str(v) if v not in (None, "") and not isinstance(v, dict | list) else None


def _states(v: Any) -> str:
    if isinstance(v, dict):
        v = v.get("current", v.get("state"))
    if isinstance(v, list):
        return "+".join(str(s) for s in v)
    return str(v) if v is not None else "UNKNOWN"


def _exit(v: Any) -> str:
    if isinstance(v, dict):
        rc = v.get("return_code")
        sig = v.get("signal")
        rcn = _number(rc)
        if isinstance(sig, dict):
            sig = _number(sig.get("id", sig.get("signal_id")))
        return f"{rcn if rcn is not None else 0}:{sig if sig is not None else 0}"
    if isinstance(v, str | int):
        return str(v)
    return "unknown"


def _nodes(v: Any) -> str:
    if isinstance(v, dict):
        v = v.get("range") or v.get("list")
    if isinstance(v, list):
        return ",".join(str(n) for n in v)
    return str(v) if v else ""


def _clean(text: Any) -> str:
    return " ".join(str(text).split()) if text not in (None, "") else "-"


def slurm_job_label(job: dict[str, Any]) -> str:
    """The id a person types for this job record: `81234`, array task `81234_7`, het component
    `81234+1`; sacct keeps these under `array`/`het`, scontrol and squeue as top-level fields."""
    jid = job.get("job_id", job.get("jobid", "?"))
    array = _dict(job.get("array"))
    array_job, task = array.get("job_id"), array.get("task_id")
    if not array:
        array_job, task = job.get("array_job_id"), job.get("array_task_id")
    if _number(task) is not None and _number(array_job):
        return f"{_number(array_job)}_{_number(task)}"
    het = _dict(job.get("het"))
    het_job, offset = (
        (het.get("job_id"), het.get("job_offset"))
        if het
        else (job.get("het_job_id"), job.get("het_job_offset"))
    )
    if _number(het_job) and _number(offset) is not None:
        return f"{_number(het_job)}+{_number(offset)}"
    return str(_number(jid))


def _slurm_job(job: dict[str, Any], ref: str, ctx: TimeContext) -> Iterator[Record]:
    jid = slurm_job_label(job)
    state = job.get("state", job.get("job_state"))
    reason = state.get("reason") if isinstance(state, dict) else job.get("state_reason")
    times = job.get("time", {})
    end = _epoch(times.get("end")) if isinstance(times, dict) else _epoch(job.get("end_time"))
    if end is None:
        end = _when(job.get("end_time_iso"), ctx)  # scontrol text (parse_scontrol)
    exit_code = job.get("exit_code")
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and "job_state" in job:
        # scontrol/squeue before data_parser (Slurm ≤ 22.05) print the raw wait(2) status: 256 is exit 1.
        exit_code = f"{(exit_code >> 8) & 0xFF}:{exit_code & 0x7F}"
    yield Record(
        ref=ref,
        time=end,
        node=None,
        text=(
            f"slurm job {jid} state={_states(state)} reason={_clean(reason)} "
            f"exit_code={_exit(exit_code)} nodes={_nodes(job.get('nodes'))}"
        ),
    )
    for i, step in enumerate(_list(job.get("steps"))):
        if not isinstance(step, dict):
            continue
        sid = step.get("step", {}).get("id") if isinstance(step.get("step"), dict) else step.get("step_id")
        if isinstance(sid, dict):  # data_parser 0.0.39: {"job_id": .., "step_id": ..}
            sid = f"{sid.get('job_id')}.{_number(sid.get('step_id'))}"
        elif isinstance(step.get("step"), dict) and "job_id" in step["step"] and "." not in str(sid):
            sid = f"{step['step']['job_id']}.{sid}"  # Slurm 22.05 (dbv0.0.38): {"job_id": 3, "id": "batch"}
        st = step.get("time", {})
        send = _epoch(st.get("end")) if isinstance(st, dict) else None
        yield Record(
            ref=_sub(ref, f"steps[{i}]"),
            time=send or end,
            node=None,
            text=(
                f"slurm step {sid} state={_states(step.get('state'))} "
                f"exit_code={_exit(step.get('exit_code'))} nodes={_nodes(step.get('nodes'))}"
            ),
        )


def _slurm_node(node: dict[str, Any], ref: str, ctx: TimeContext) -> Iterator[Record]:
    name = str(node.get("name"))
    reason = node.get("reason") or "-"
    yield Record(
        ref=ref,
        node=name,
        time=_epoch(node.get("reason_changed_at")) or _when(node.get("reason_changed_at_iso"), ctx),
        text=(
            f"slurm node {name} state={_states(node.get('state'))} reason={_clean(reason)}"
            + (f" set_by={node['reason_set_by_user']}" if node.get("reason_set_by_user") else "")
        ),
    )


# --------------------------------------------------------------------------------------------- Kubernetes


def _when(v: Any, ctx: TimeContext) -> datetime | None:
    return parse_iso(v, ctx) if isinstance(v, str) else None


def _k8s_object(obj: dict[str, Any], kind: str, ref: str, ctx: TimeContext) -> Iterator[Record]:
    meta = _dict(obj.get("metadata"))
    name = str(meta.get("name", "?"))
    if "#" not in ref:
        ref = f"{ref}#{kind}/{name}"
    status = _dict(obj.get("status"))
    spec = _dict(obj.get("spec"))
    if kind == "Event":
        inv = _dict(obj.get("involvedObject") or obj.get("regarding"))
        src = _dict(obj.get("source"))
        node = _name(
            inv.get("name")
            if inv.get("kind") == "Node"
            else (src.get("host") or obj.get("reportingInstance"))
        )
        when = (
            _when(obj.get("lastTimestamp"), ctx)
            or _when(obj.get("eventTime"), ctx)
            or _when(obj.get("firstTimestamp"), ctx)
            or _when(meta.get("creationTimestamp"), ctx)
        )
        yield Record(
            ref=ref,
            time=when,
            node=node,
            text=(
                f"k8s event type={_clean(obj.get('type'))} reason={_clean(obj.get('reason'))} "
                f"object={inv.get('kind', '?')}/{inv.get('name', '?')} message={_clean(obj.get('message') or obj.get('note'))}"
            ),
        )
        return
    node_name = _name(spec.get("nodeName")) if kind == "Pod" else (name if kind == "Node" else None)
    if kind == "Pod":
        yield Record(
            ref=ref,
            time=None,
            node=node_name,
            text=(
                f"k8s pod {name} phase={_clean(status.get('phase'))} reason={_clean(status.get('reason'))} "
                f"message={_clean(status.get('message'))}"
            ),
        )
        for group in ("initContainerStatuses", "containerStatuses"):
            for i, cs in enumerate(_list(status.get(group))):
                if not isinstance(cs, dict):
                    continue
                for which in ("state", "lastState"):
                    term = _dict(cs.get(which)).get("terminated")
                    if isinstance(term, dict):
                        yield Record(
                            ref=_sub(ref, f"status.{group}[{i}].{which}"),
                            node=node_name,
                            time=_when(term.get("finishedAt"), ctx),
                            text=(
                                f"k8s container {name}/{cs.get('name', '?')} terminated "
                                f"reason={_clean(term.get('reason'))} exit_code={term.get('exitCode', '?')} "
                                f"signal={term.get('signal', 0)}"
                            ),
                        )
    label = "k8s node" if kind == "Node" else ("k8s pod" if kind == "Pod" else kind.lower())
    for i, cond in enumerate(_list(status.get("conditions"))):
        if not isinstance(cond, dict):
            continue
        yield Record(
            ref=_sub(ref, f"status.conditions[{i}]"),
            node=node_name,
            time=_when(cond.get("lastTransitionTime"), ctx) or _when(cond.get("lastProbeTime"), ctx),
            text=(
                f"{label} {name} condition type={_clean(cond.get('type'))} status={_clean(cond.get('status'))} "
                f"reason={_clean(cond.get('reason'))} message={_clean(cond.get('message'))}"
            ),
        )
