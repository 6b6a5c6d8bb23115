"""The in-memory doubles of the store's roles (store/memory.py) behave like SQLiteStore on the methods
they implement: the same calls on both give the same answers (times of storage aside), so a test that
uses a double tests what the server would do."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from hypocenter.engine.fleet import FleetView, marks_of
from hypocenter.store.base import DiagnosisFilter, DiagnosisRow, PendingExport, RevisionRow
from hypocenter.store.memory import InMemoryDiagnoses
from hypocenter.store.sqlite import SQLiteStore
from tests.engine.test_fleet import NOW, diagnosis

Put = Callable[[dict[str, Any], tuple[int | None, int | None], bool], int]
EXPORTERS = ("loki", "grafana")


def _summary(d: dict[str, Any], window: tuple[int | None, int | None]) -> dict[str, Any]:
    rc = d["root_cause"] or {}
    return {
        "id": d["id"],
        "workload": d["attempt"]["workload_id"],
        "attempt": d["attempt"]["attempt"],
        "cluster": d["attempt"]["cluster"],
        "outcome": d["outcome"],
        "domain": rc.get("domain"),
        "subdomain": rc.get("subdomain"),
        "terminal_state": "FAILED",
        "window_start_ns": window[0],
        "window_end_ns": window[1],
        "culprits": sorted({*rc.get("nodes", []), *(n for c in d["candidates"] for n in c["nodes"])}),
        "affected": d["attempt"]["nodes"],
        "marks": marks_of(d),
    }


def _sqlite() -> tuple[Any, Any, Put]:
    store = SQLiteStore(":memory:")
    store.exporters = EXPORTERS

    def put(d: dict[str, Any], window: tuple[int | None, int | None], provisional: bool) -> int:
        a = d["attempt"]
        store.set_context(a["workload_id"], a["attempt"], {}, NOW)
        row = store.attempt(a["workload_id"], a["attempt"])
        assert row is not None
        return store.put_diagnosis(
            row.id, json.dumps(d), _summary(d, window), provisional, time.time(), {"source": "test"}
        )

    return store, store, put


def _doubles() -> tuple[Any, Any, Put]:
    diagnoses = InMemoryDiagnoses(exporters=EXPORTERS)
    attempt_ids: dict[tuple[str, int], int] = {}

    def put(d: dict[str, Any], window: tuple[int | None, int | None], provisional: bool) -> int:
        a = d["attempt"]
        aid = attempt_ids.setdefault((a["workload_id"], a["attempt"]), len(attempt_ids) + 1)
        return diagnoses.put_diagnosis(
            aid, json.dumps(d), _summary(d, window), provisional, time.time(), {"source": "test"}
        )

    return diagnoses, diagnoses.exports, put


def _row(r: DiagnosisRow | RevisionRow | None) -> dict[str, Any] | None:
    return None if r is None else {k: v for k, v in asdict(r).items() if k != "created"}


def _claimed(rows: list[PendingExport]) -> list[tuple[str, str, int, str | None]]:
    return [(r.exporter, r.diagnosis_id, r.attempts, r.diagnosis.id if r.diagnosis else None) for r in rows]


FILTERS = [
    DiagnosisFilter(),
    DiagnosisFilter(cluster="eos"),
    DiagnosisFilter(outcome="ambiguous"),
    DiagnosisFilter(domain="hardware"),
    DiagnosisFilter(node="n1"),
    DiagnosisFilter(workload="w2"),
    DiagnosisFilter(search="W_"),
    DiagnosisFilter(search="w3"),
    DiagnosisFilter(since_ns=250),
    DiagnosisFilter(until_ns=120),
    DiagnosisFilter(since_ns=0, until_ns=0),
    DiagnosisFilter(limit=0),
]


def _transcript(make: Callable[[], tuple[Any, Any, Put]]) -> list[Any]:
    """One history of diagnoses and deliveries, and every answer the roles give along it."""
    store, queue, put = make()
    out: list[Any] = []
    w1 = diagnosis("w1", nodes=("n1",), components=(("n1", "gpu", "GPU-aa"),))
    history = [
        (w1, (100, 200), False),
        (w1, (100, 200), False),  # the very same again: nothing changes
        (diagnosis("w2", nodes=("n2",), cluster="other"), (150, 300), False),
        (diagnosis("w3", outcome="ambiguous", nodes=("n1", "n3")), (None, None), False),
        (diagnosis("W_4", nodes=("n4",)), (50, 200), True),  # provisional: not in facts nor fleet marks
        (diagnosis("w5", nodes=("n5",), xids=(("n5", "0000:3b:00", 31),)), (10, None), False),
    ]
    versions = []
    for d, window, provisional in history:
        out.append(("put", d["id"], put(d, window, provisional)))
        versions.append(store.diagnoses_version())
    revised = diagnosis("w2", domain="software", subdomain="user_code", nodes=("n2",), cluster="other")
    revised["id"] = "dx-w2-0-rev2"
    out.append(("revised", put(revised, (150, 300), False)))
    out.append(("same verdict, same version", versions[0] == versions[1], versions[1] == versions[2]))
    out.append(("version count", store.diagnoses_version().split("-")[0]))
    for ident in ("dx-w1-0", "dx-w2-0", "dx-w2-0-rev2", "dx-w3-0", "dx-W_4-0", "nope"):
        out.append(("get", ident, _row(store.get_diagnosis(ident))))
        out.append(("revisions", ident, [_row(r) for r in store.diagnosis_revisions(ident)]))
    for flt in FILTERS:
        out.append(("list", repr(flt), [r.id for r in store.list_diagnoses(flt)], store.count_diagnoses(flt)))
    page, after = [], None
    while True:  # keyset paging, two at a time
        rows = store.list_diagnoses(DiagnosisFilter(limit=2, after=after))
        if not rows:
            break
        page.append([r.id for r in rows])
        after = (rows[-1].window_end_ns, rows[-1].id)
    out.append(("pages", page))
    out.append(("facts", [asdict(f) for f in store.diagnosis_facts(0)]))
    out.append(("facts later", store.diagnosis_facts(time.time() + 60)))
    out.append(("marks", [asdict(m) for m in store.fleet_marks(0)]))
    out.append(("suspects", [(s.kind, s.name, s.workloads) for s in FleetView(store).suspects(NOW)]))
    # the outbox: claim under a lease, retry, finish
    now = time.time() + 1
    out.append(("backlog", {k: n for k, (n, _) in queue.export_backlog().items()}))
    first = queue.claim_exports("loki", now, 2, 60.0)
    out.append(("claim", _claimed(first)))
    out.append(
        ("the rest (the two claimed are leased)", _claimed(queue.claim_exports("loki", now, 10, 60.0)))
    )
    queue.retry_exports([first[0].id], now, "503 " + "x" * 600)
    queue.finish_exports([first[1].id])
    again = queue.claim_exports("loki", now, 10, 60.0)
    out.append(("after retry", _claimed(again)))
    queue.finish_exports([r.id for r in again])
    out.append(("loki later", _claimed(queue.claim_exports("loki", now + 61, 10, 60.0))))
    grafana = queue.claim_exports("grafana", now, 100, 60.0)
    out.append(("grafana", _claimed(grafana)))
    queue.finish_exports([r.id for r in grafana])
    out.append(("backlog after", {k: n for k, (n, _) in queue.export_backlog().items()}))
    out.append(("re-analysed", put(diagnosis("w5", nodes=("n6",)), (10, None), False)))
    out.append(("queued again", _claimed(queue.claim_exports("grafana", time.time() + 1, 10, 60.0))))
    return out


def test_the_doubles_answer_as_sqlite_does() -> None:
    expected, got = _transcript(_sqlite), _transcript(_doubles)
    for want, have in zip(expected, got, strict=True):
        assert have == want
    # the history is one that exercises what it claims to
    answers = {a[0]: a[1:] for a in expected if a[0] in ("pages", "suspects", "after retry")}
    assert len(answers["pages"][0]) == 3 and answers["suspects"][0]
    assert answers["after retry"][0] and answers["after retry"][0][0][2] == 1


@pytest.mark.parametrize("exporters", [(), ("memory",)])
def test_a_diagnosis_is_queued_once_per_exporter(exporters: tuple[str, ...]) -> None:
    diagnoses = InMemoryDiagnoses(exporters=exporters)
    d = diagnosis("w1")
    for _ in range(2):
        diagnoses.put_diagnosis(1, json.dumps(d), _summary(d, (1, 2)), False, time.time())
    assert {k: n for k, (n, _) in diagnoses.exports.export_backlog().items()} == dict.fromkeys(exporters, 1)
