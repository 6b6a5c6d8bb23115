"""Hang-forensics artifacts over the server: uploaded Flight Recorder dumps, replayed bundles with dumps."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import ServerProcess, analyze, essence, replay

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures" / "flight_recorder" / "torch-2.13.0-gloo"
NODES = ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
ATTEMPT = (
    'workload: {id: "fr-%s", attempt: 0, scheduler: slurm, cluster: lab}\n'
    'window: {start: "2026-12-03T07:00:00Z", end: "2026-12-03T09:00:00Z"}\n'
    "state: TIMEOUT\n"
    f"nodes: [{', '.join(NODES)}]\n"
    "ranks: {" + ", ".join(f'{n}: "{i}"' for i, n in enumerate(NODES)) + "}\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("artifacts") / "store.db").start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_uploaded_dumps_name_the_laggards_node(client: httpx.Client) -> None:
    assert client.put("/v1/attempts/fr-up/0", content=ATTEMPT % "up").status_code == 200
    before = client.post("/v1/attempts/fr-up/0/analyze").json()
    assert before["outcome"] == "unattributed"
    for r in range(4):
        raw = (FIXTURES / "pickle" / f"nccl_trace_rank_{r}").read_bytes()
        resp = client.post(
            "/v1/attempts/fr-up/0/artifacts", params={"name": f"nccl_trace_rank_{r}"}, content=raw
        )
        assert resp.status_code == 201, resp.text
        assert (
            resp.json()["kind"] == "flight_recorder"
            and resp.json()["stream"] == f"traces/nccl_trace_rank_{r}"
        )
    records = client.get("/v1/attempts/fr-up/0").json()["log_records"]
    again = client.post(
        "/v1/attempts/fr-up/0/artifacts",
        params={"name": "nccl_trace_rank_2"},
        content=(FIXTURES / "pickle" / "nccl_trace_rank_2").read_bytes(),
    )
    assert again.status_code == 201 and client.get("/v1/attempts/fr-up/0").json()["log_records"] == records
    d = client.post("/v1/attempts/fr-up/0/analyze").json()
    rc = d["root_cause"]
    assert (
        d["outcome"] == "attributed"
        and rc["rule"] == "flight-recorder-laggard"
        and rc["nodes"] == ["gpu-a03"]
    )
    assert "traces/nccl_trace_rank_2" in rc["summary"] and "never issued 4" in rc["summary"]
    assert any(
        e["ref"].startswith("traces/nccl_trace_rank_2:") and e["role"] == "root_cause" for e in d["evidence"]
    )


def test_bad_artifacts_are_refused(client: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps({"version": "2.10", "entries": [Exploit()], "pg_config": {}}, protocol=2)
    r = client.post("/v1/attempts/fr-bad/0/artifacts", params={"name": "nccl_trace_rank_0"}, content=evil)
    assert r.status_code == 400 and "refused global" in r.json()["detail"]
    assert not marker.exists()
    r = client.post("/v1/attempts/fr-bad/0/artifacts", params={"name": "../../etc/passwd"}, content=b"x")
    assert r.status_code == 400 and "plain file name" in r.json()["detail"]
    r = client.post(
        "/v1/attempts/fr-bad/0/artifacts", params={"name": "core.123"}, content=b"\x7fELF\x00\x00\x01"
    )
    assert r.status_code == 400
    r = client.post(
        "/v1/attempts/fr-bad/0/artifacts",
        params={"name": "nccl_trace_rank_0"},
        content=b"\x80\x02" + b"x" * (64 << 20),
    )
    assert r.status_code == 413
    r = client.post("/v1/attempts/fr-bad/0/artifacts", content=b"text")
    assert r.status_code == 422  # name is required


def test_a_replayed_bundle_with_dumps_gets_the_same_diagnosis(
    server: ServerProcess, client: httpx.Client, tmp_path: Path
) -> None:
    root = tmp_path / "b"
    (root / "logs" / "_job").mkdir(parents=True)
    (root / "attempt.yaml").write_text(ATTEMPT % "replay")
    (root / "logs" / "_job" / "out.log").write_text(
        "slurmstepd: error: *** JOB 4242 ON gpu-a01 CANCELLED AT 2026-12-03T09:00:00 DUE TO TIME LIMIT ***\n"
    )
    for r in (0, 1):
        (root / "logs" / NODES[r]).mkdir()
        shutil.copy(FIXTURES / "pickle" / f"nccl_trace_rank_{r}", root / "logs" / NODES[r])
    (root / "traces").mkdir()
    for r in (2, 3):
        shutil.copy(FIXTURES / "json" / f"nccl_trace_rank_{r}.json", root / "traces")
    expected = analyze(root)
    assert expected["root_cause"]["nodes"] == ["gpu-a03"]
    done = replay(root, server.grpc)
    assert done.returncode == 0, done.stderr
    got = client.post("/v1/attempts/fr-replay/0/analyze").json()
    assert essence(got) == essence(expected)
