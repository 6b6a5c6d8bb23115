"""The server's fleet memory: the view the APIs and /metrics share, and the history a fresh diagnosis
is told about (engine/fleet.py holds the logic; this module only wires settings and the store to it).

A diagnosis made by the server gains a quality reason when the fleet's history bears on it (the GPU
behind its application-class Xid faulted in other workloads too; its culprit was behind other
workloads' failures), and a GPU OOM on a node whose GPU memory failed recently becomes ambiguous with
that hardware cause. `hypocenter analyze` on a bundle has no history and stays byte-identical.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from hypocenter.config import Settings
from hypocenter.engine.fleet import FleetView, ecc_history, history_note, marks_of, tempered
from hypocenter.engine.topology import Topology, load_topology
from hypocenter.model import Diagnosis
from hypocenter.store.base import FleetStore

log = logging.getLogger("hypocenter.fleet")


def fleet_view(settings: Settings, store: FleetStore) -> FleetView:
    """The fleet view the settings describe; a topology file that cannot be read is an InputError at start."""
    topology: Topology | None = (
        load_topology([Path(p) for p in settings.topology]) if settings.topology else None
    )
    if topology is not None:
        log.info("topology: %d host ports mapped to switch ports", len(topology))
    return FleetView(
        store,
        window_s=settings.fleet_window_s,
        half_life_s=settings.fleet_half_life_s,
        min_workloads=settings.fleet_min_workloads,
        topology=topology,
    )


def backfill(store: FleetStore, stop: Callable[[], bool] = lambda: False, batch: int = 500) -> int:
    """Mark the diagnoses stored before fleet memory (migration 11 lists them), a batch at a time, so
    that the fleet view sees the history an upgraded store already holds. Returns how many."""
    done = 0
    while not stop():
        pending = store.fleet_pending(batch)
        for diagnosis_id, body in pending:
            try:
                marks = marks_of(json.loads(body))
            except (
                ValueError,
                TypeError,
                AttributeError,
            ) as exc:  # a body we cannot read is skipped, said once
                log.warning("fleet memory: diagnosis %s not marked: %s", diagnosis_id, exc)
                marks = []
            store.put_fleet_marks(diagnosis_id, marks)
            done += 1
        if len(pending) < batch:
            break
    if done:
        log.info("fleet memory: marked %d diagnoses stored before it", done)
    return done


def with_history(view: FleetView, diagnosis: Diagnosis, now_s: float | None = None) -> Diagnosis:
    """`diagnosis` with the fleet's history in its quality reasons, or unchanged when there is none. A GPU
    OOM on a node whose GPU memory failed recently becomes ambiguous with that hardware candidate."""
    now = time.time() if now_s is None else now_s
    marks = view.marks(now)
    document = diagnosis.model_dump(mode="json", by_alias=True)
    ecc = ecc_history(marks, document, now)
    if ecc is not None:
        diagnosis = tempered(diagnosis, ecc)
    notes = history_note(marks, document, now, half_life_s=view.half_life_s)
    new = [n for n in notes if n not in diagnosis.quality.reasons]
    if not new:
        return diagnosis
    quality = diagnosis.quality.model_copy(update={"reasons": [*diagnosis.quality.reasons, *new]})
    return diagnosis.model_copy(update={"quality": quality})


__all__ = ["backfill", "fleet_view", "with_history"]
