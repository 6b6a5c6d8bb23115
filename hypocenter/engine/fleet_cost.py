"""What failures cost the fleet: lost GPU-hours per cause, per component and per workload, from the
`cost` of many diagnoses (engine/cost.py).

    causes      lost GPU-hours per domain/subdomain, largest first, with each one's share and the
                running share (a Pareto), and the median time to detect
    components  lost GPU-hours behind each node, GPU, host port and switch port (the fleet memory's
                keys, engine/fleet.py): every failure a component was a culprit or candidate of counts
                in full for it
    domains     failures, MTTF (attempts' run time in the window / failures of the domain) and lost
                GPU-hours per domain
    workloads   ETTR per workload (productive time / run time over its attempts) where every part is
                known: the step lines gave each attempt's startup, checkpoints its lost work

Restart overhead: an attempt's `startup_s` (its start → first progress) is what the failure of the
attempt before it (same cluster and workload, attempt - 1) cost again, on the new attempt's GPUs; it
is joined here. Pure and deterministic: diagnosis documents in, one `hypocenter.cost/v1` document out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from hypocenter.engine.fleet import marks_of
from hypocenter.engine.topology import Topology

COMPONENT_KINDS = ("node", "gpu", "port", "switch_port")


def _ts(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _value(cost: Mapping[str, Any], name: str) -> float | None:
    v = (cost.get(name) or {}).get("value")
    return float(v) if isinstance(v, int | float) else None


@dataclass(slots=True)
class AttemptCost:
    """One diagnosed attempt as the roll-up reads it."""

    diagnosis_id: str
    cluster: str
    workload: str
    attempt: int
    outcome: str
    domain: str
    subdomain: str
    end_s: float
    run_s: float | None
    gpus: float | None
    hours: float | None  # lost work + time to detect, as the diagnosis says
    spread: float
    detect_s: float | None
    lost_s: float | None
    startup_s: float | None
    restart_hours: float | None = None  # joined from the next attempt
    keys: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total_hours(self) -> float:
        return (self.hours or 0.0) + (self.restart_hours or 0.0)


def attempt_cost_of(diagnosis: Mapping[str, Any], topology: Topology | None = None) -> AttemptCost | None:
    """The roll-up's view of one final diagnosis; None when it carries no cost (stored before costs)."""
    cost = diagnosis.get("cost")
    if not isinstance(cost, Mapping):
        return None
    att = diagnosis.get("attempt") or {}
    window = att.get("window") or {}
    start, end = _ts(window.get("start")), _ts(window.get("end"))
    rc = diagnosis.get("root_cause") or {}
    outcome = str(diagnosis.get("outcome", ""))
    keys: set[tuple[str, str]] = set()
    for mark in marks_of(diagnosis):
        if mark.role == "app_xid":
            continue
        if mark.kind == "node":
            keys.add(("node", mark.node))
        elif mark.kind == "gpu":
            keys.add(("gpu", f"{mark.node}/{mark.component}"))
        else:
            keys.add(("port", f"{mark.node}/{mark.component}"))
            link = topology.link(mark.node, mark.component) if topology is not None else None
            if link is not None:
                keys.add(("switch_port", f"{link.switch}/{link.switch_port}"))
    hours = cost.get("gpu_hours_lost")
    return AttemptCost(
        diagnosis_id=str(diagnosis.get("id", "")),
        cluster=str(att.get("cluster") or ""),
        workload=str(att.get("workload_id", "")),
        attempt=int(att.get("attempt", 0) or 0),
        outcome=outcome,
        domain=str(rc.get("domain") or ("unattributed" if outcome == "unattributed" else "")),
        subdomain=str(rc.get("subdomain") or ""),
        end_s=end or 0.0,
        run_s=(end - start) if start is not None and end is not None else None,
        gpus=_value(cost, "gpus"),
        hours=float(hours) if isinstance(hours, int | float) else None,
        spread=float(cost.get("gpu_hours_uncertainty") or 0.0),
        detect_s=_value(cost, "time_to_detect_s"),
        lost_s=_value(cost, "lost_work_s"),
        startup_s=_value(cost, "startup_s"),
        keys=sorted(keys),
    )


def join_restarts(attempts: Sequence[AttemptCost]) -> None:
    """Give each failed attempt the restart overhead its successor paid: successor GPUs x startup."""
    by_attempt = {(a.cluster, a.workload, a.attempt): a for a in attempts}
    for a in attempts:
        nxt = by_attempt.get((a.cluster, a.workload, a.attempt + 1))
        if (
            a.outcome != "not_failed"
            and nxt is not None
            and nxt.gpus is not None
            and nxt.startup_s is not None
        ):
            a.restart_hours = round(nxt.gpus * nxt.startup_s / 3600.0, 4)


def _median(xs: Iterable[float]) -> float | None:
    values = sorted(xs)
    return round(statistics.median(values), 3) if values else None


def rollup(
    diagnoses: Iterable[Mapping[str, Any]],
    *,
    since_s: float,
    until_s: float,
    topology: Topology | None = None,
    limit: int = 20,
) -> dict[str, Any]:
    """The `hypocenter.cost/v1` document of the final diagnoses whose attempts ended in [since, until]."""
    attempts = sorted(
        (
            a
            for d in diagnoses
            if (a := attempt_cost_of(d, topology)) is not None and since_s <= a.end_s <= until_s
        ),
        key=lambda a: (a.cluster, a.workload, a.attempt, a.diagnosis_id),
    )
    join_restarts(attempts)
    failed = [a for a in attempts if a.outcome != "not_failed"]
    costed = [a for a in failed if a.hours is not None]
    total = sum(a.total_hours for a in costed)

    by_cause: dict[tuple[str, str], list[AttemptCost]] = defaultdict(list)
    for a in failed:
        by_cause[(a.domain, a.subdomain)].append(a)
    causes: list[dict[str, Any]] = []
    for (domain, sub), group in by_cause.items():
        hours = sum(a.total_hours for a in group if a.hours is not None)
        causes.append(
            {
                "domain": domain,
                "subdomain": sub,
                "gpu_hours_lost": round(hours, 4),
                "attempts": len(group),
                "attempts_without_cost": sum(1 for a in group if a.hours is None),
                "median_time_to_detect_s": _median(a.detect_s for a in group if a.detect_s is not None),
            }
        )
    causes.sort(key=lambda c: (-c["gpu_hours_lost"], c["domain"], c["subdomain"]))
    running = 0.0
    for c in causes:
        running += c["gpu_hours_lost"]
        c["share"] = round(c["gpu_hours_lost"] / total, 4) if total else 0.0
        c["cumulative_share"] = round(running / total, 4) if total else 0.0

    per_key: dict[tuple[str, str], list[AttemptCost]] = defaultdict(list)
    for a in costed:
        for key in a.keys:
            per_key[key].append(a)
    components: list[dict[str, Any]] = sorted(
        (
            {
                "kind": kind,
                "name": name,
                "gpu_hours_lost": round(sum(a.total_hours for a in group), 4),
                "attempts": len(group),
                "workloads": len({(a.cluster, a.workload) for a in group}),
            }
            for (kind, name), group in per_key.items()
        ),
        key=lambda c: (-c["gpu_hours_lost"], COMPONENT_KINDS.index(c["kind"]), c["name"]),
    )

    run_s = sum(a.run_s for a in attempts if a.run_s is not None)
    by_domain: dict[str, list[AttemptCost]] = defaultdict(list)
    for a in failed:
        by_domain[a.domain].append(a)
    domains = [
        {
            "domain": domain,
            "failures": len(group),
            "mttf_s": round(run_s / len(group), 3),
            "gpu_hours_lost": round(sum(a.total_hours for a in group if a.hours is not None), 4),
            "median_time_to_detect_s": _median(a.detect_s for a in group if a.detect_s is not None),
        }
        for domain, group in sorted(by_domain.items())
    ]

    by_workload: dict[tuple[str, str], list[AttemptCost]] = defaultdict(list)
    for a in attempts:
        by_workload[(a.cluster, a.workload)].append(a)
    workloads: list[dict[str, Any]] = []
    for (cluster, workload), group in sorted(by_workload.items()):
        productive = _productive(group)
        wall = sum(a.run_s or 0.0 for a in group)
        if productive is None or wall <= 0:
            continue
        workloads.append(
            {
                "cluster": cluster,
                "workload": workload,
                "attempts": len(group),
                "failures": sum(1 for a in group if a.outcome != "not_failed"),
                "run_s": round(wall, 3),
                "productive_s": round(productive, 3),
                "ettr": round(productive / wall, 4),
            }
        )
    workloads.sort(key=lambda w: (w["ettr"], w["cluster"], w["workload"]))
    return {
        "schema": "hypocenter.cost/v1",
        "since_s": since_s,
        "until_s": until_s,
        "total": {
            "gpu_hours_lost": round(total, 4),
            "gpu_hours_uncertainty": round(sum(a.spread for a in costed), 4),
            "failed_attempts": len(failed),
            "attempts_without_cost": len(failed) - len(costed),
            "restart_gpu_hours": round(sum(a.restart_hours or 0.0 for a in costed), 4),
            "run_s": round(run_s, 3),
        },
        "causes": causes,
        "components": components[: max(0, limit)],
        "domains": domains,
        "workloads": workloads[: max(0, limit)],
    }


def _productive(group: Sequence[AttemptCost]) -> float | None:
    """Productive seconds over a workload's attempts: run time less startup, lost work and time to
    detect; None when any attempt lacks one of them (ETTR is then not known)."""
    out = 0.0
    for a in group:
        if a.run_s is None or a.startup_s is None:
            return None
        lost = 0.0
        if a.outcome != "not_failed":
            if a.lost_s is None or a.detect_s is None:
                return None
            lost = a.lost_s + a.detect_s
        out += max(0.0, a.run_s - a.startup_s - lost)
    return out


class DiagnosisBodies(Protocol):
    """Where a `CostView` reads final diagnoses from: a store (store/base.py `FinalDiagnoses`) or a test's list."""

    def version(self) -> str: ...
    def bodies(self, since_ns: int) -> list[str]: ...


class CostView:
    """The cost roll-up over the final diagnoses of the last `window_s`: what `hypocenter fleet --cost`,
    GET /v1/fleet/cost and /metrics all show, so they cannot disagree. The diagnoses read are kept until
    the source's version changes."""

    def __init__(
        self, source: DiagnosisBodies, *, window_s: float = 30 * 86400.0, topology: Topology | None = None
    ) -> None:
        self.source = source
        self.window_s = window_s
        self.topology = topology
        self._cache: tuple[str, float, list[dict[str, Any]]] | None = None

    def diagnoses(self, now_s: float) -> list[dict[str, Any]]:
        """The final diagnoses (parsed) whose attempts overlap the window ending at `now_s`."""
        import json

        since = now_s - self.window_s
        version = self.source.version()
        if self._cache is not None and self._cache[0] == version and self._cache[1] <= since:
            return self._cache[2]
        out: list[dict[str, Any]] = []
        for body in self.source.bodies(int(since * 1e9)):
            try:
                out.append(json.loads(body))
            except ValueError:
                continue  # a body that cannot be read counts nowhere
        self._cache = (version, since, out)
        return out

    def report(self, now_s: float, *, limit: int = 20) -> dict[str, Any]:
        doc = rollup(
            self.diagnoses(now_s),
            since_s=now_s - self.window_s,
            until_s=now_s,
            topology=self.topology,
            limit=limit,
        )
        doc["window_s"] = self.window_s
        return doc


__all__ = [
    "COMPONENT_KINDS",
    "AttemptCost",
    "CostView",
    "DiagnosisBodies",
    "attempt_cost_of",
    "join_restarts",
    "rollup",
]
