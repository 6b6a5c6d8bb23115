"""Fleet memory: which nodes, GPUs, host ports and switch ports keep turning up behind failures.

One failure is an incident; the same component behind failures of several workloads is a
maintenance ticket. Pure and deterministic: it reads no store and no clock; callers hand it rows.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from hypocenter.engine.topology import Topology
from hypocenter.fleet_mark import FleetMark
from hypocenter.model import Component, Diagnosis, RootCause

APP_XIDS = frozenset({13, 31, 43})
INFRA_DOMAINS = frozenset({"hardware", "network", "storage"})
SUSPECT_KINDS = ("node", "gpu", "port", "switch_port", "switch", "cable")
DEFAULT_HALF_LIFE_S = 7 * 86400.0
DEFAULT_MIN_WORKLOADS = 2

# The driver's Xid line as it appears in evidence text (rules/gpu/xid.yaml, xid-extract, reads it in full).
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (?P<code>\d+)"
)


def _time_s(diagnosis: Mapping[str, Any]) -> float:
    """When the failure happened: the root cause's first sighting, else the attempt window's end."""
    rc = diagnosis.get("root_cause") or {}
    for value in (rc.get("first_seen"), ((diagnosis.get("attempt") or {}).get("window") or {}).get("end")):
        if value:
            try:
                return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def marks_of(diagnosis: Mapping[str, Any]) -> list[FleetMark]:
    """What one diagnosis says about the fleet's hardware, sorted: its root cause's (or, when ambiguous,
    its candidates') infrastructure culprits — node, GPU, port — and every GPU behind an
    application-class Xid in its evidence. Healthy and unattributed attempts say nothing."""
    if diagnosis.get("outcome") not in ("attributed", "ambiguous"):
        return []
    att = diagnosis.get("attempt") or {}
    base: dict[str, Any] = {
        "diagnosis_id": str(diagnosis.get("id", "")),
        "workload": str(att.get("workload_id", "")),
        "attempt": int(att.get("attempt", 0) or 0),
        "cluster": att.get("cluster"),
        "time_s": _time_s(diagnosis),
    }
    out: set[FleetMark] = set()
    causes: list[tuple[str, Mapping[str, Any]]] = []
    if diagnosis.get("outcome") == "attributed" and diagnosis.get("root_cause"):
        causes.append(("culprit", diagnosis["root_cause"]))
    else:
        causes.extend(("candidate", c) for c in diagnosis.get("candidates") or [])
    for role, cause in causes:
        domain, sub, rule = str(cause.get("domain")), str(cause.get("subdomain")), str(cause.get("rule"))
        if domain not in INFRA_DOMAINS:
            continue
        for node in cause.get("nodes") or []:
            out.add(
                FleetMark(
                    **base,
                    role=role,
                    kind="node",
                    node=str(node),
                    component="",
                    domain=domain,
                    subdomain=sub,
                    rule=rule,
                    detail="",
                )
            )
        for comp in cause.get("components") or []:
            kind = str(comp.get("kind"))
            if kind in ("gpu", "port"):
                out.add(
                    FleetMark(
                        **base,
                        role=role,
                        kind=kind,
                        node=str(comp.get("node")),
                        component=str(comp.get("id")),
                        domain=domain,
                        subdomain=sub,
                        rule=rule,
                        detail="",
                    )
                )
    for ev in diagnosis.get("evidence") or []:
        m = _XID.search(str(ev.get("text", "")))
        if m and int(m["code"]) in APP_XIDS and ev.get("node"):
            out.add(
                FleetMark(
                    **base,
                    role="app_xid",
                    kind="gpu",
                    node=str(ev["node"]),
                    component=m["pci"].lower(),
                    domain="software",
                    subdomain="user_code",
                    rule=str(ev.get("rule", "")),
                    detail=m["code"],
                )
            )
    return sorted(out, key=FleetMark.sort_key)


@dataclass(slots=True)
class Suspect:
    """One node, GPU, host port, switch port, switch or cable, and the failures it was behind."""

    kind: str  # one of SUSPECT_KINDS
    name: str  # node | node/gpu | node/port | switch/port | switch | cable
    score: float
    workloads: int  # distinct workloads behind it
    attempts: int  # distinct attempts behind it
    hosts: list[str]  # the hosts it was seen on (a switch port: every host cabled to it)
    first_seen_s: float
    last_seen_s: float
    causes: dict[str, int]  # "domain/subdomain" -> attempts
    app_xids: list[int]  # application-class Xid codes seen on it (a GPU)
    examples: list[str]  # a few diagnosis ids, newest first
    verdict: str  # one sentence: what the history says

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "score": round(self.score, 4),
            "workloads": self.workloads,
            "attempts": self.attempts,
            "hosts": self.hosts,
            "first_seen_s": self.first_seen_s,
            "last_seen_s": self.last_seen_s,
            "causes": dict(sorted(self.causes.items())),
            "app_xids": self.app_xids,
            "examples": self.examples,
            "verdict": self.verdict,
        }


@dataclass(slots=True)
class _Tally:
    marks: list[FleetMark] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)


def _keys(mark: FleetMark, topology: Topology | None) -> list[tuple[str, str]]:
    if mark.kind == "node":
        return [("node", mark.node)]
    if mark.kind == "gpu":
        return [("gpu", f"{mark.node}/{mark.component}")]
    keys = [("port", f"{mark.node}/{mark.component}")]
    link = topology.link(mark.node, mark.component) if topology is not None else None
    if link is not None:
        keys.append(("switch_port", f"{link.switch}/{link.switch_port}"))
        keys.append(("switch", link.switch))
        if link.cable:
            keys.append(("cable", link.cable))
    return keys


def suspects(
    marks: Iterable[FleetMark],
    now_s: float,
    *,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    topology: Topology | None = None,
    kinds: Sequence[str] = SUSPECT_KINDS,
) -> list[Suspect]:
    """Every suspect the marks name, highest score first (ties by kind, then name): deterministic."""
    tallies: dict[tuple[str, str], _Tally] = {}
    for mark in marks:
        for key in _keys(mark, topology):
            if key[0] in kinds:
                tally = tallies.setdefault(key, _Tally())
                tally.marks.append(mark)
                tally.hosts.add(mark.node)
    out = [s for key, tally in tallies.items() if (s := _suspect(key, tally, now_s, half_life_s)) is not None]
    out.sort(key=lambda s: (-s.score, SUSPECT_KINDS.index(s.kind), s.name))
    return out


def _suspect(key: tuple[str, str], tally: _Tally, now_s: float, half_life_s: float) -> Suspect | None:
    kind, name = key
    marks = sorted(tally.marks, key=FleetMark.sort_key)
    infra = [m for m in marks if m.role != "app_xid"]
    app = [m for m in marks if m.role == "app_xid"]
    app_workloads = {(m.cluster, m.workload) for m in app}  # job ids repeat across clusters
    # An application Xid is the user's fault in one workload; on one GPU across workloads, the GPU's.
    lemon = len(app_workloads) >= 2
    counted = infra + (app if lemon else [])
    if not counted:
        return None
    latest: dict[
        tuple[str | None, str], tuple[float, float]
    ] = {}  # workload -> (time, weight) of its latest mark
    for m in counted:
        weight = 0.5 if m.role == "candidate" else 1.0
        prev = latest.get((m.cluster, m.workload))
        if prev is None or (m.time_s, weight) > prev:
            latest[(m.cluster, m.workload)] = (m.time_s, weight)
    score = sum(w * 0.5 ** (max(0.0, now_s - t) / half_life_s) for t, w in latest.values())
    attempts = {(m.cluster, m.workload, m.attempt) for m in counted}
    causes: dict[str, int] = {}
    for cause, *_ in sorted(
        {(f"{m.domain}/{m.subdomain}", m.cluster or "", m.workload, m.attempt) for m in counted}
    ):
        causes[cause] = causes.get(cause, 0) + 1
    examples = [d for _, d in sorted({(m.time_s, m.diagnosis_id) for m in counted}, reverse=True)][:3]
    codes = sorted({int(m.detail) for m in app if m.detail.isdigit()})
    return Suspect(
        kind=kind,
        name=name,
        score=score,
        workloads=len(latest),
        attempts=len(attempts),
        hosts=sorted(tally.hosts),
        first_seen_s=min(m.time_s for m in counted),
        last_seen_s=max(m.time_s for m in counted),
        causes=causes,
        app_xids=codes if lemon else [],
        examples=examples,
        verdict=_verdict(
            kind, name, len(latest), sorted(tally.hosts), causes, codes if lemon else [], len(app_workloads)
        ),
    )


def _verdict(
    kind: str,
    name: str,
    workloads: int,
    hosts: list[str],
    causes: Mapping[str, int],
    codes: list[int],
    app_workloads: int,
) -> str:
    top = ", ".join(f"{c} x{n}" for c, n in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))
    if codes:
        xids = "/".join(str(c) for c in codes)
        return (
            f"GPU {name}: application-class Xid {xids} in {app_workloads} different workloads: suspect the "
            f"hardware, not the code ({top})"
        )
    plural = "workload" if workloads == 1 else "workloads"
    if kind in ("switch", "switch_port", "cable") and len(hosts) > 1:
        return f"{kind.replace('_', ' ')} {name}: errors on {len(hosts)} hosts ({', '.join(hosts)}) in {workloads} {plural} ({top})"
    return f"{kind.replace('_', ' ')} {name}: behind {workloads} {plural} ({top})"


def findings(ranked: Sequence[Suspect], *, min_workloads: int = DEFAULT_MIN_WORKLOADS) -> list[Suspect]:
    """The suspects worth a ticket: behind at least `min_workloads` workloads; a switch, switch port or
    cable also needs errors on more than one host (one host's port is already its own suspect). A
    finding that only restates a wider one (a host port under a switch port found on the same
    workloads) is kept: each names a different thing to check."""
    out: list[Suspect] = []
    for s in ranked:
        if s.workloads < min_workloads:
            continue
        if s.kind in ("switch", "switch_port", "cable") and len(s.hosts) < 2:
            continue
        out.append(s)
    return out


def history_note(
    marks: Iterable[FleetMark],
    diagnosis: Mapping[str, Any],
    now_s: float,
    *,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> list[str]:
    """Quality reasons for one fresh diagnosis from the fleet's history (other workloads only): a GPU
    behind its application-class Xid that faulted the same way in other workloads, or its culprit
    node / GPU / port behind failures of other workloads."""
    own = marks_of(diagnosis)
    if not own:
        return []
    workload = (own[0].cluster, own[0].workload)
    others = [m for m in marks if (m.cluster, m.workload) != workload]
    ranked = {(s.kind, s.name): s for s in suspects([*others, *own], now_s, half_life_s=half_life_s)}
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()
    for m in own:
        key = _keys(m, None)[0]
        s = ranked.get(key)
        if key in seen or s is None:
            continue
        seen.add(key)
        earlier = s.workloads - 1
        if m.role == "app_xid" and s.app_xids:
            notes.append(
                f"fleet history: GPU {s.name} raised application-class Xids in {earlier} other "
                f"workload{'s' if earlier != 1 else ''} too: suspect the GPU, not only the code"
            )
        elif m.role != "app_xid" and earlier >= 1:
            notes.append(
                f"fleet history: {key[0]} {s.name} was behind failures of {earlier} other "
                f"workload{'s' if earlier != 1 else ''}"
            )
    return sorted(notes)


class MarkSource(Protocol):
    """Where a `FleetView` reads marks from: any store (store/base.py `FleetStore`) or a test's list."""

    def fleet_marks(self, since_s: float) -> list[FleetMark]: ...


ECC_WINDOW_S = 7 * 86400.0  # how recent uncorrectable-ECC history must be to temper a GPU OOM


def ecc_history(marks: Iterable[FleetMark], diagnosis: Mapping[str, Any], now_s: float) -> FleetMark | None:
    """The most recent uncorrectable-ECC mark (hardware/gpu_memory: Xid 48/63/94/95, a CUDA ECC error, DCGM
    DBE counters) on the node of a fresh diagnosis that blames GPU memory exhaustion (resource/gpu_oom), from
    another attempt within ECC_WINDOW_S before it: a GPU whose memory failed recently may report its faults as
    allocation failures, so the OOM verdict is not the only reading. On the named GPU when both sides name one."""
    if diagnosis.get("outcome") != "attributed":
        return None
    rc = diagnosis.get("root_cause") or {}
    if (rc.get("domain"), rc.get("subdomain")) != ("resource", "gpu_oom"):
        return None
    nodes = {str(n) for n in rc.get("nodes") or []}
    gpus = {str(c.get("id")).lower() for c in rc.get("components") or [] if c.get("kind") == "gpu"}
    own = str(diagnosis.get("id", ""))
    when = _time_s(diagnosis) or now_s
    hits = [
        m
        for m in marks
        if m.domain == "hardware"
        and m.subdomain == "gpu_memory"
        and m.role in ("culprit", "candidate")
        and m.node in nodes
        and m.diagnosis_id != own
        and when - ECC_WINDOW_S <= m.time_s <= when
        and (m.kind == "node" or not gpus or m.component.lower() in gpus)
    ]
    return max(hits, key=FleetMark.sort_key) if hits else None


def tempered(diagnosis: Diagnosis, ecc: FleetMark) -> Diagnosis:
    """The GPU OOM verdict made ambiguous with the GPU memory fault the fleet saw on that node."""
    rc = diagnosis.root_cause
    assert rc is not None
    comps = [c for c in rc.components if c.kind == "gpu"] or (
        [Component(node=ecc.node, kind="gpu", id=ecc.component)] if ecc.kind == "gpu" else []
    )
    hardware = RootCause(
        domain="hardware",
        subdomain="gpu_memory",
        rule="fleet-ecc-history",
        summary=(
            f"GPU memory of {ecc.node}{f' GPU {ecc.component}' if ecc.kind == 'gpu' else ''} failed with "
            f"uncorrectable errors in an earlier attempt ({ecc.workload} #{ecc.attempt}, diagnosis "
            f"{ecc.diagnosis_id}): a GPU whose memory is failing can report allocation failures"
        ),
        nodes=[ecc.node],
        components=comps,
        first_seen=rc.first_seen,
        action="RESET_GPU",
    )
    cands = [rc, hardware, *diagnosis.candidates]
    root = RootCause(
        domain="ambiguous",
        subdomain="ambiguous",
        rule="ambiguous",
        summary=(
            f"2 causes fit: resource/gpu_oom on {', '.join(rc.nodes)} (the job's allocation failed) and "
            f"hardware/gpu_memory on {ecc.node} (uncorrectable ECC errors there in an earlier attempt)"
        ),
        nodes=sorted(set(rc.nodes) | {ecc.node}),
        components=comps,
        first_seen=rc.first_seen,
        action="INVESTIGATE",
    )
    reason = (
        f"fleet history: {ecc.node} had uncorrectable GPU memory errors in {ecc.workload} #{ecc.attempt}: "
        "the out-of-memory verdict is tempered to ambiguous"
    )
    quality = diagnosis.quality.model_copy(
        update={
            "level": "medium" if diagnosis.quality.level == "high" else diagnosis.quality.level,
            "reasons": [*diagnosis.quality.reasons, reason],
        }
    )
    return diagnosis.model_copy(
        update={"outcome": "ambiguous", "root_cause": root, "candidates": cands, "quality": quality}
    )


class FleetView:
    """The fleet view over a store's marks, with the settings that shape it: what `hypocenter fleet`,
    /v1/fleet/*, the gRPC API and /metrics all show, so they cannot disagree."""

    def __init__(
        self,
        store: MarkSource,
        *,
        window_s: float = 30 * 86400.0,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        min_workloads: int = DEFAULT_MIN_WORKLOADS,
        topology: Topology | None = None,
    ) -> None:
        self.store = store
        self.window_s = window_s
        self.half_life_s = half_life_s
        self.min_workloads = min_workloads
        self.topology = topology

    def marks(self, now_s: float) -> list[FleetMark]:
        return self.store.fleet_marks(now_s - self.window_s)

    def suspects(self, now_s: float, kinds: Sequence[str] = SUSPECT_KINDS) -> list[Suspect]:
        return suspects(
            self.marks(now_s), now_s, half_life_s=self.half_life_s, topology=self.topology, kinds=kinds
        )

    def report(
        self, now_s: float, *, kinds: Sequence[str] = SUSPECT_KINDS, limit: int = 50
    ) -> dict[str, Any]:
        """Suspects (top `limit`) and findings as one JSON document (`hypocenter fleet --format json`)."""
        ranked = self.suspects(now_s, kinds)
        return {
            "schema": "hypocenter.fleet/v1",
            "now_s": now_s,
            "window_s": self.window_s,
            "half_life_s": self.half_life_s,
            "min_workloads": self.min_workloads,
            "topology_links": len(self.topology) if self.topology is not None else 0,
            "suspects": [s.to_json() for s in ranked[: max(0, limit)]],
            "findings": [s.to_json() for s in findings(ranked, min_workloads=self.min_workloads)],
        }


__all__ = [
    "APP_XIDS",
    "DEFAULT_HALF_LIFE_S",
    "DEFAULT_MIN_WORKLOADS",
    "SUSPECT_KINDS",
    "FleetView",
    "MarkSource",
    "Suspect",
    "findings",
    "history_note",
    "marks_of",
    "suspects",
]
