"""A verdict for an attempt that already has one is a new revision with its provenance (source, client,
role, time), never a silent replacement; the history is readable over REST; diagnosis JSON (contract 3 of docs/design.md) is the
same bytes as before; the store migration keeps existing diagnoses (both stores' revisions:
test_store_contract)."""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from server_support import REPO

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.cli.assembly import Server, serve_in_thread
from hypocenter.store.migrations import MIGRATIONS
from hypocenter.store.sqlite import SQLiteStore
from tests.api.test_auth import bearer, settings, tokens_file

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "nvlink-xid149"


def _bundle(drop_kernel_logs: bool = False) -> bytes:
    """The example as a tar.gz; without its kern.log files the NVLink Xid is gone and the verdict changes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(EXAMPLE.rglob("*")):
            if path.is_file() and not (drop_kernel_logs and path.name == "kern.log"):
                tar.add(path, arcname=f"bundle/{path.relative_to(EXAMPLE)}")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("provenance")
    srv, thread = serve_in_thread(settings(tmp, auth_tokens_file=str(tokens_file(tmp))))
    yield srv
    srv.shutdown()
    thread.join(30)


def test_a_new_verdict_is_a_new_revision_with_provenance(server: Server) -> None:
    base = f"http://{server.http_address}"
    with httpx.Client(base_url=base, timeout=120) as c:
        first = c.post("/v1/bundles", content=_bundle(), headers=bearer("admin"))
        assert first.status_code == 200, first.text
        did = first.json()["id"]
        assert first.json()["outcome"] == "attributed"
        forged = c.post("/v1/bundles", content=_bundle(drop_kernel_logs=True), headers=bearer("admin"))
        assert forged.status_code == 200, forged.text
        assert forged.json()["root_cause"] != first.json()["root_cause"]
        again = c.post("/v1/bundles", content=_bundle(), headers=bearer("admin"))  # back to the first verdict
        assert again.content == first.content

        current = c.get(f"/v1/diagnoses/{did}", headers=bearer("read"))
        assert current.content == first.content  # diagnosis JSON bytes (contract 3), nothing added to them
        assert current.headers["X-Hypocenter-Revision"] == "3"
        assert current.headers["X-Hypocenter-Source"] == "bundle"

        history = c.get(f"/v1/diagnoses/{did}/revisions", headers=bearer("read")).json()
        assert [r["revision"] for r in history["revisions"]] == [1, 2, 3]
        assert [r["current"] for r in history["revisions"]] == [False, False, True]
        for r in history["revisions"]:
            p = r["provenance"]
            assert p["source"] == "bundle" and p["role"] == "admin" and p["client"].startswith("token:admin:")
            assert p["time"].endswith("Z")
        old = c.get(history["revisions"][1]["url"], headers=bearer("read"))
        assert old.content == forged.content  # the replaced verdict is still there, byte for byte

        # the same verdict again is not a revision
        c.post("/v1/bundles", content=_bundle(), headers=bearer("admin"))
        assert len(c.get(f"/v1/diagnoses/{did}/revisions", headers=bearer("read")).json()["revisions"]) == 3

        listed = c.get(
            "/v1/diagnoses", params={"workload": history["workload"]}, headers=bearer("read")
        ).json()
        assert listed["diagnoses"][0]["revision"] == 3
        assert listed["diagnoses"][0]["provenance"]["source"] == "bundle"
        assert c.get("/v1/diagnoses/nope/revisions", headers=bearer("read")).status_code == 404
        assert c.get(f"/v1/diagnoses/{did}/revisions", headers=bearer("ingest")).status_code == 403

    # the same history over gRPC
    with grpc.insecure_channel(server.grpc_address) as ch:
        got = pb_grpc.AttributionStub(ch).ListRevisions(
            pb.ListRevisionsRequest(id=did, include_json=True),
            timeout=30,
            metadata=(("authorization", bearer("read")["Authorization"]),),
        )
    assert [m.revision for m in got.revisions] == [1, 2, 3]
    assert [json.loads(m.provenance_json)["source"] for m in got.revisions] == ["bundle"] * 3
    assert got.revisions[1].diagnosis_json == forged.text and got.revisions[0].diagnosis_json == first.text


def test_a_put_scope_and_an_analysis_request_are_recorded(server: Server) -> None:
    yaml = (
        "workload: {id: prov-put, attempt: 0, cluster: eos}\n"
        "window: {start: '2026-11-02T10:00:00Z', end: '2026-11-02T11:00:00Z'}\nnodes: [n1]\nstate: FAILED\n"
    )
    with httpx.Client(base_url=f"http://{server.http_address}", timeout=60) as c:
        assert c.put("/v1/attempts/prov-put/0", content=yaml, headers=bearer("admin")).status_code == 200
        r = c.post("/v1/attempts/prov-put/0/analyze", headers=bearer("admin"))
        assert r.status_code == 200
        history = c.get(f"/v1/diagnoses/{r.json()['id']}/revisions", headers=bearer("read")).json()[
            "revisions"
        ]
        p = history[-1]["provenance"]
        assert (p["source"], p["role"], p["trigger"]) == ("put", "admin", "request")


# ----------------------------------------------------------------------------------------- migration


def test_a_store_from_before_revisions_keeps_its_diagnoses(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied REAL NOT NULL)")
    for version, ddl in enumerate(MIGRATIONS[:6], 1):
        db.executescript(ddl)
        db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
    db.execute(
        "INSERT INTO diagnoses (id, workload, attempt, outcome, provisional, created, body)"
        " VALUES ('dx-old', '81234', 0, 'attributed', 0, 1.0, '{\"id\": \"dx-old\"}')"
    )
    db.commit()
    db.close()
    store = SQLiteStore(path)
    try:
        row = store.get_diagnosis("dx-old")
        assert row is not None and row.revision == 1 and row.provenance == {"source": "unknown"}
        revisions = store.diagnosis_revisions("dx-old")
        assert [(r.revision, r.body) for r in revisions] == [(1, '{"id": "dx-old"}')]
    finally:
        store.close()
