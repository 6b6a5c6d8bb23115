"""`FleetMark`: one thing a final diagnosis says about the fleet's hardware.

The engine makes and ranks marks (engine/fleet.py) and the stores keep them (store/base.py
`FleetStore`); the record lives below both so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FleetMark:
    """One mark: a culprit, a candidate or an application Xid, on a node, a GPU or a port."""

    diagnosis_id: str
    workload: str
    attempt: int
    cluster: str | None
    time_s: float
    role: str  # culprit (the root cause) | candidate (of an ambiguous verdict) | app_xid
    kind: str  # node | gpu | port
    node: str
    component: str  # GPU PCI id / UUID, or host port; "" for a node
    domain: str
    subdomain: str
    rule: str
    detail: str  # the Xid code of an app_xid mark

    def sort_key(self) -> tuple[float, str, str, str, str, str, str, str]:
        return (
            self.time_s,
            self.diagnosis_id,
            self.role,
            self.kind,
            self.node,
            self.component,
            self.rule,
            self.detail,
        )
