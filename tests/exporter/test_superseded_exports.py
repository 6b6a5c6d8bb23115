"""A final diagnosis replaces the provisional one it follows, wherever it was exported: Grafana keeps
one annotation per attempt (the provisional one, updated in place with PATCH), Loki gets an entry
that says which verdict it supersedes. Against the wire-faithful fakes (tests/observability_fakes.py)."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from observability_fakes import FakeGrafana, FakeLoki
from server_support import REPO

from hypocenter.exporter.activity import Activity
from hypocenter.exporter.grafana import GrafanaAnnotations
from hypocenter.exporter.loki import LokiExporter
from hypocenter.exporter.outbox import Backoff, InMemoryExporter, Outbox
from hypocenter.store.sqlite import SQLiteStore
from tests.exporter.test_prometheus import NVLINK, store_diagnosis

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    from server_support import analyze

    return analyze(NVLINK)


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki().start()
    yield fake
    fake.stop()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana(token=TOKEN).start()
    yield fake
    fake.stop()


def deliver_all(store: SQLiteStore, box: Outbox) -> None:
    for exporter in box.exporters:
        while box.deliver(exporter):
            pass


def outbox(store: SQLiteStore, *exporters: Any) -> Outbox:
    store.exporters = tuple(e.name for e in exporters)
    return Outbox(store, list(exporters), Activity(), backoff=Backoff(base_s=0.01, max_s=0.05))


def final_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The same attempt's final verdict: the job ended, so its quality reasons differ."""
    d = copy.deepcopy(doc)
    d["quality"] = {"level": "high", "reasons": ["the job's end was reported"]}
    return d


def test_the_final_verdict_updates_the_provisional_annotation(
    grafana: FakeGrafana, loki: FakeLoki, doc: dict[str, Any]
) -> None:
    store = SQLiteStore(":memory:")
    box = outbox(store, GrafanaAnnotations(grafana.url, token=TOKEN), LokiExporter(loki.url, encoding="json"))
    store_diagnosis(store, doc, provisional=True)
    deliver_all(store, box)
    assert len(grafana.annotations) == 1 and "provisional" in grafana.annotations[0]["tags"]
    first_id = grafana.annotations[0]["id"]

    store_diagnosis(store, final_of(doc))
    deliver_all(store, box)
    # one annotation for the attempt, the same one, now saying the final verdict
    assert [a["id"] for a in grafana.annotations] == [first_id]
    assert "provisional" not in grafana.annotations[0]["tags"]
    assert [r["method"] for r in grafana.behaviour.requests] == ["POST", "PATCH"]
    assert grafana.behaviour.requests[1]["path"] == f"/api/annotations/{first_id}"
    # Loki appends: the final entry names the verdict it supersedes
    heads = [e for e in loki.entries if e.metadata["record"] == "diagnosis"]
    assert [h.metadata["provisional"] for h in heads] == ["true", "false"]
    assert "supersedes" not in heads[0].metadata
    assert heads[1].metadata["supersedes"] == doc["id"]
    assert heads[1].metadata["supersedes_revision"] == "1" and heads[1].metadata["revision"] == "2"
    assert json.loads(heads[1].line)["supersedes"] == {"diagnosis_id": doc["id"], "revision": 1}


def test_an_annotation_deleted_in_grafana_is_made_again(grafana: FakeGrafana, doc: dict[str, Any]) -> None:
    store = SQLiteStore(":memory:")
    box = outbox(store, GrafanaAnnotations(grafana.url, token=TOKEN))
    store_diagnosis(store, doc, provisional=True)
    deliver_all(store, box)
    gone = grafana.annotations[0]["id"]
    r = httpx.delete(f"{grafana.url}/api/annotations/{gone}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and not grafana.annotations
    store_diagnosis(store, final_of(doc))
    deliver_all(store, box)
    assert len(grafana.annotations) == 1 and grafana.annotations[0]["id"] != gone
    assert store.export_backlog() == {}
    # the next verdict updates the new one
    store_diagnosis(store, {**final_of(doc), "quality": {"level": "low", "reasons": ["changed"]}})
    deliver_all(store, box)
    assert len(grafana.annotations) == 1 and grafana.behaviour.requests[-1]["method"] == "PATCH"


def test_a_redelivered_verdict_does_not_supersede_itself(loki: FakeLoki, doc: dict[str, Any]) -> None:
    """A crash between the push and the row's deletion sends it again: same entry, nothing superseded."""
    store = SQLiteStore(":memory:")
    box = outbox(store, LokiExporter(loki.url, encoding="json"))
    store_diagnosis(store, doc)
    claimed = store.claim_exports("loki", time.time(), 10, 0.0)
    box._send(box.exporters[0], claimed, split=True)
    store_diagnosis(store, doc, provisional=True)  # flag flips back and forth: queued afresh …
    store_diagnosis(store, doc)  # … the same final verdict and revision as delivered
    deliver_all(store, box)
    heads = [e for e in loki.entries if e.metadata["record"] == "diagnosis"]
    assert all("supersedes" not in h.metadata for h in heads if h.metadata["revision"] == "1")


def test_exporters_that_do_not_revise_still_get_every_verdict(doc: dict[str, Any]) -> None:
    store = SQLiteStore(":memory:")
    memory = InMemoryExporter()
    box = outbox(store, memory)
    store_diagnosis(store, doc, provisional=True)
    deliver_all(store, box)
    store_diagnosis(store, final_of(doc))
    deliver_all(store, box)
    assert [r.provisional for r in memory.sent] == [True, False]
    receipt = store.delivered("memory", doc["attempt"]["workload_id"], doc["attempt"]["attempt"])
    assert receipt is not None and receipt.revision == 2 and receipt.ref == ""


@pytest.mark.parametrize(
    ("method", "body", "status", "message"),
    [
        ("PATCH", {"text": "x"}, 404, "Annotation not found"),
        ("PUT", {"text": "x"}, 404, "Annotation not found"),
        ("DELETE", None, 404, "Annotation not found"),
        ("PATCH", {"text": "x"}, 400, "annotationId is invalid"),
    ],
)
def test_the_fake_answers_unknown_annotations_as_grafana_does(
    grafana: FakeGrafana, method: str, body: Any, status: int, message: str
) -> None:
    ident = "abc" if status == 400 else "999"
    r = httpx.request(
        method,
        f"{grafana.url}/api/annotations/{ident}",
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert (r.status_code, r.json()["message"]) == (status, message)


def test_the_fake_patches_only_what_is_given(grafana: FakeGrafana) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(
        f"{grafana.url}/api/annotations",
        json={"time": 1000, "timeEnd": 2000, "tags": ["a"], "text": "first"},
        headers=auth,
    )
    ident = r.json()["id"]
    patch: Callable[[dict[str, Any]], httpx.Response] = lambda b: httpx.patch(  # noqa: E731
        f"{grafana.url}/api/annotations/{ident}", json=b, headers=auth
    )
    assert patch({"text": "", "time": 0}).json() == {"message": "Annotation patched"}
    got = httpx.get(f"{grafana.url}/api/annotations/{ident}", headers=auth).json()
    assert (got["text"], got["time"], got["tags"]) == ("first", 1000, ["a"])
    patch({"tags": ["b"], "timeEnd": 3000})
    got = httpx.get(f"{grafana.url}/api/annotations/{ident}", headers=auth).json()
    assert (got["tags"], got["timeEnd"], got["text"]) == (["b"], 3000, "first")


def test_the_attempt_dashboard_marks_one_verdict_per_attempt(loki: FakeLoki, doc: dict[str, Any]) -> None:
    """The attempt dashboard's Loki annotation query, run over what the outbox pushed for a
    provisional and then a final verdict, gives one mark: the final one."""
    store = SQLiteStore(":memory:")
    box = outbox(store, LokiExporter(loki.url, encoding="json"))
    store_diagnosis(store, doc, provisional=True)
    deliver_all(store, box)
    store_diagnosis(store, final_of(doc))
    deliver_all(store, box)
    board = json.loads((REPO / "grafana" / "dashboards" / "hypocenter-attempt.json").read_text())
    (query,) = [a for a in board["annotations"]["list"] if a.get("datasource", {}).get("type") == "loki"]
    values = {"cluster": ".*", "workload": doc["attempt"]["workload_id"], "attempt": "0", "diagnosis": ".+"}
    expr = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], query["expr"])
    now = time.time_ns()
    r = httpx.get(
        f"{loki.url}/loki/api/v1/query_range",
        params={
            "query": expr,
            "start": str(now - 7 * 86400 * 10**9),
            "end": str(now + 10**9),
            "limit": "100",
        },
        headers={"X-Loki-Response-Encoding-Flags": "categorize-labels"},
    )
    assert r.status_code == 200, r.text
    marks = [v for s in r.json()["data"]["result"] for v in s["values"]]
    assert len(marks) == 1
    assert marks[0][2]["structuredMetadata"]["provisional"] == "false"
    assert marks[0][2]["structuredMetadata"]["supersedes"] == doc["id"]
