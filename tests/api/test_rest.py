"""The REST API: bundles, attempt scope uploads, explicit and idle triggers, list filters, probes, OpenAPI."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from server_support import REPO, ServerProcess, analyze, essence

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"


def _tar(bundle: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(bundle, arcname=bundle.name)
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("rest") / "store.db", "--idle-timeout-s", "0.5").start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_probes_and_openapi(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/logs",
        "/v1/metrics",
        "/v1/diagnoses",
        "/v1/diagnoses/{diagnosis_id}",
        "/v1/bundles",
        "/v1/attempts/{workload}/{attempt}/analyze",
    ):
        assert path in paths, path


def test_bundle_upload_and_filters(client: httpx.Client) -> None:
    for name in ("nvlink-xid149", "ib-link-flap", "completed-noisy"):
        r = client.post(
            "/v1/bundles", content=_tar(EXAMPLES / name), headers={"Content-Type": "application/gzip"}
        )
        assert r.status_code == 200, r.text
        assert essence(r.json()) == essence(analyze(EXAMPLES / name))
    ids = {d["workload"]: d["id"] for d in client.get("/v1/diagnoses").json()["diagnoses"]}
    assert {"81234", "233410", "70113"} <= set(ids)

    def listed(**params: str) -> set[str]:
        return {d["workload"] for d in client.get("/v1/diagnoses", params=params).json()["diagnoses"]}

    assert listed(domain="hardware") >= {"81234"} and "233410" not in listed(domain="hardware")
    assert "233410" in listed(domain="network")
    assert "70113" in listed(outcome="not_failed") and "81234" not in listed(outcome="not_failed")
    assert listed(node="node02") == {"81234"}
    assert "81234" in listed(cluster="eos")
    assert "81234" not in listed(since="2030-01-01T00:00:00Z")
    assert "81234" in listed(since="2026-11-02T10:30:00Z", until="2026-11-02T10:40:00Z")
    assert client.get("/v1/diagnoses", params={"since": "yesterday"}).status_code == 400
    body = client.get(f"/v1/diagnoses/{ids['81234']}")
    assert body.status_code == 200 and body.json()["root_cause"]["subdomain"] == "nvlink"


def test_bad_bundle_uploads(client: httpx.Client) -> None:
    r = client.post("/v1/bundles", content=b"not a tarball")
    assert r.status_code == 400 and "tar.gz" in r.json()["detail"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("x/readme.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    r = client.post("/v1/bundles", content=buf.getvalue())
    assert r.status_code == 400 and "attempt.yaml" in r.json()["detail"]


def test_an_oversize_attempt_yaml_is_refused_with_413(client: httpx.Client) -> None:
    r = client.put(
        "/v1/attempts/w/0", content=b"# " + b"x" * (2 << 20), headers={"Content-Type": "application/yaml"}
    )
    assert r.status_code == 413 and r.json()["detail"]
    assert client.get("/healthz").status_code == 200


def test_unknown_things_are_404(client: httpx.Client) -> None:
    assert client.get("/v1/diagnoses/dx-nope").status_code == 404
    assert client.post("/v1/attempts/nope/0/analyze").status_code == 404
    assert client.get("/v1/attempts/nope/0").status_code == 404


PROBLEM_KEYS = {"type", "title", "status", "detail"}


def test_every_rest_error_is_an_rfc9457_problem(client: httpx.Client) -> None:
    """One shape for every error, validation (422) included: application/problem+json."""
    answers = {
        422: client.get("/v1/diagnoses?limit=0"),
        400: client.get("/v1/diagnoses?since=yesterday"),
        404: client.get("/v1/diagnoses/dx-nope"),
        405: client.delete("/v1/diagnoses"),
    }
    unknown = client.get("/v1/no-such-route")
    assert unknown.status_code == 404
    for status, r in [*answers.items(), (404, unknown)]:
        assert r.status_code == status, r.text
        assert r.headers["content-type"] == "application/problem+json", (status, r.headers["content-type"])
        doc = r.json()
        assert set(doc) >= PROBLEM_KEYS and doc["status"] == status and doc["type"] == "about:blank", doc
        assert doc["title"] and doc["detail"]
    invalid = answers[422].json()
    assert invalid["detail"].startswith("query.limit:") and invalid["errors"][0]["loc"] == ["query", "limit"]


def _post_lines(
    client: httpx.Client,
    resource: dict[str, str],
    lines: list[str],
    path: str,
    attrs: dict[str, str] | None = None,
    start_ns: int = 1_793_000_000_000_000_000,
) -> None:
    records = [
        {
            "timeUnixNano": str(start_ns + i * 1_000_000_000),
            "body": {"stringValue": line},
            "attributes": [
                {"key": "log.file.path", "value": {"stringValue": path}},
                {"key": "log.file.record_number", "value": {"intValue": str(i + 1)}},
                *({"key": k, "value": {"stringValue": v}} for k, v in (attrs or {}).items()),
            ],
        }
        for i, line in enumerate(lines)
    ]
    doc = {
        "resourceLogs": [
            {
                "resource": {
                    "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
                },
                "scopeLogs": [{"logRecords": records}],
            }
        ]
    }
    r = client.post("/v1/logs", content=json.dumps(doc), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert "partialSuccess" not in r.json() or not r.json()["partialSuccess"]


def test_idle_attempt_gets_a_provisional_diagnosis_then_the_final_one(client: httpx.Client) -> None:
    job = {"slurm.job.id": "991", "host.name": "gpu07"}
    _post_lines(
        client,
        job,
        [
            "2026-10-26T09:33:20Z [rank3]:[E1026 09:33:20.000] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds"
        ],
        "/var/log/train.log",
    )
    deadline = time.monotonic() + 20
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline and not rows:
        rows = client.get("/v1/diagnoses", params={"workload": "991"}).json()["diagnoses"]
        time.sleep(0.05)
    assert rows and rows[0]["provisional"] is True
    first = client.get(str(rows[0]["url"]))
    assert first.headers["X-Hypocenter-Provisional"] == "true"
    _post_lines(
        client,
        {"slurm.job.id": "991"},
        ["job ended"],
        "hypocenter/state",
        attrs={"hypocenter.attempt.state": "FAILED"},
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = client.get("/v1/diagnoses", params={"workload": "991"}).json()["diagnoses"]
        if rows and rows[0]["provisional"] is False:
            break
        time.sleep(0.05)
    assert rows[0]["provisional"] is False
    assert client.get(str(rows[0]["url"])).json()["terminal_state"] == "FAILED"


def test_uploaded_attempt_yaml_sets_the_scope(client: httpx.Client) -> None:
    yaml_text = (EXAMPLES / "nvlink-xid149" / "attempt.yaml").read_text().replace('"81234"', '"5555"')
    r = client.put("/v1/attempts/5555/0", content=yaml_text)
    assert r.status_code == 200, r.text
    assert r.json()["nodes"] == ["node01", "node02", "node03", "node04"]
    # node-scoped kernel lines from node02, no workload: joined by node and time
    kern = (EXAMPLES / "nvlink-xid149" / "logs" / "node02" / "kern.log").read_text().splitlines()
    in_window = int(datetime(2026, 11, 2, 10, 30, tzinfo=timezone.utc).timestamp()) * 10**9
    _post_lines(client, {"host.name": "node02.cluster.local"}, kern, "/var/log/kern.log", start_ns=in_window)
    d = client.post("/v1/attempts/5555/0/analyze")
    assert d.status_code == 200
    doc = d.json()
    assert doc["root_cause"]["subdomain"] == "nvlink" and doc["root_cause"]["nodes"] == ["node02"]
    assert any(e["ref"].startswith("node02.cluster.local:/var/log/kern.log:") for e in doc["evidence"])
    mismatch = client.put("/v1/attempts/other/0", content=yaml_text)
    assert mismatch.status_code == 400 and "5555" in mismatch.json()["detail"]
    bad = client.put("/v1/attempts/5555/0", content="workload: {id: '5555'}\nwindow: nope\n")
    assert bad.status_code == 400
