"""A poison attempt never stops the server (issue #12): the 462-byte record whose rank map names a
trillion ranks is refused at the bound, its attempt is quarantined with the reason (REST, gRPC,
/metrics), not re-analysed at restart, and other attempts keep being diagnosed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from postgres_support import fresh_schema
from server_support import ServerProcess

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.store import open_store
from hypocenter.store.base import Entry, Store

pytestmark = pytest.mark.slow

T0 = 1_793_000_000_000_000_000


def _request(resource: dict[str, str], body: str, time_ns: int = T0) -> bytes:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for k, v in resource.items():
        rl.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    rec = rl.scope_logs.add().log_records.add()
    rec.time_unix_nano = time_ns
    rec.body.string_value = body
    rec.attributes.append(KeyValue(key="log.file.path", value=AnyValue(string_value="/var/log/train.log")))
    return req.SerializeToString()


POISON = _request(
    {
        "host.name": "n1",
        "slurm.job.id": "666",
        "hypocenter.attempt.ranks": "n1=0-1000000000000",
        "hypocenter.attempt.state": "FAILED",
        "hypocenter.workload.cluster": "eos",
    },
    "[rank0]: RuntimeError: NCCL communicator was aborted on rank 0. Original reason for failure "
    "was: [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout",
)


def _healthy(client: httpx.Client, job: str) -> None:
    body = _request(
        {"host.name": "gpu07", "slurm.job.id": job, "hypocenter.attempt.state": "FAILED"},
        "2026-10-26T09:33:20Z [rank3]:[E1026 09:33:20.000] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds",
    )
    r = client.post("/v1/logs", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text


def _wait(predicate: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _diagnosed(client: httpx.Client, job: str) -> bool:
    rows = client.get("/v1/diagnoses", params={"workload": job}).json()["diagnoses"]
    return any(not r["provisional"] for r in rows)


def test_the_462_byte_record_is_quarantined_and_survives_two_restarts(tmp_path: Path) -> None:
    assert len(POISON) <= 462, len(POISON)
    server = ServerProcess(tmp_path / "h.db").start()
    try:
        with server.client() as client:
            r = client.post("/v1/logs", content=POISON, headers={"Content-Type": "application/x-protobuf"})
            assert r.status_code == 200, r.text
            attempt = _wait(lambda: client.get("/v1/attempts/666/0").json().get("failure"), "the failure")
            assert "max_ranks_per_attempt" in str(attempt) and "1,000,000,000,001" in str(attempt)
            failed_at = client.get("/v1/attempts/666/0").json()["failed_at"]
            _healthy(client, "1001")
            _wait(lambda: _diagnosed(client, "1001"), "the healthy attempt's diagnosis")
            metrics = httpx.get(f"http://{server.metrics}/metrics").text
            assert 'hypocenter_analysis_failures_total{reason="limit"} 1.0' in metrics, metrics
        for restart in range(2):
            server.stop()
            server.start()
            with server.client() as client:
                time.sleep(0.5)  # several analysis ticks (--tick-s 0.05)
                assert server.alive()
                failures = client.get("/v1/failures").json()["failures"]
                assert [(f["workload"], f["attempt"]) for f in failures] == [("666", 0)]
                assert "max_ranks_per_attempt" in failures[0]["failure"]
                info = client.get("/v1/attempts/666/0").json()
                assert info["failed_at"] == failed_at and info["dirty"] is False  # not re-analysed
                job = f"200{restart}"
                _healthy(client, job)
                _wait(lambda job=job: _diagnosed(client, job), f"attempt {job}'s diagnosis")  # type: ignore[misc]
                r = client.post(
                    "/v1/attempts/666/0/analyze"
                )  # asked for: tried again, refused with the reason
                assert r.status_code == 422 and "max_ranks_per_attempt" in r.json()["detail"], r.text
                failed_at = client.get("/v1/attempts/666/0").json()["failed_at"]
        with grpc.insecure_channel(server.grpc) as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.AttributionStub(channel).Analyze(
                    pb.AnalyzeRequest(workload="666", attempt=0), timeout=30
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
            assert "max_ranks_per_attempt" in err.value.details()  # type: ignore[attr-defined]
        assert server.alive()
    finally:
        server.stop()
    assert "Traceback" not in server.log_path.read_text()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    url = str(tmp_path / "store.db") if request.param == "sqlite" else next(iter(fresh_schema_once(request)))
    opened: list[Store] = []

    def connect() -> Store:
        opened.append(open_store(url))
        return opened[-1]

    yield connect
    for s in opened:
        s.close()


def fresh_schema_once(request: pytest.FixtureRequest) -> Iterator[str]:
    gen = fresh_schema()
    url = next(gen)
    request.addfinalizer(lambda: next(gen, None))
    yield url


def test_an_attempt_the_process_died_in_twice_is_quarantined(store: Callable[[], Store]) -> None:
    """The crash-loop guard, on both stores: one interruption is retried (a SIGKILL during a healthy
    analysis loses nothing), the second in a row quarantines the attempt; a success clears it."""
    s = store()
    s.ingest(
        [
            Entry(
                workload="w",
                attempt=0,
                node="n1",
                stream="s",
                kind="text",
                body="x",
                time_ns=T0,
                line=1,
                dedup="w|1",
                scope={"state": "FAILED"},
            )
        ],
        [],
        time.time() - 100,
    )
    row = s.attempt("w", 0)
    assert row is not None and row.failure is None
    s.mark_analysing(row.id, time.time())
    s.close()
    s = store()  # "restart"
    assert s.recover_interrupted(time.time(), 2) == []
    assert [r.workload for r in s.attempts_due(time.time(), 0, 1e9)] == ["w"]  # retried
    s.mark_analysing(row.id, time.time())
    s.close()
    s = store()
    quarantined = s.recover_interrupted(time.time(), 2)
    assert [r.workload for r in quarantined] == ["w"] and "stopped during the analysis" in str(
        quarantined[0].failure
    )
    assert s.attempts_due(time.time(), 0, 0) == []
    assert [r.workload for r in s.failed_attempts(10)] == ["w"] and s.stats()["attempts_failed"] == 1
    s.fail_analysis(row.id, "boom", time.time(), time.time())
    assert s.failed_attempts(10)[0].failure == "boom"


def test_the_service_quarantines_at_start_what_two_processes_died_in(tmp_path: Path) -> None:
    from hypocenter.config import load_settings
    from hypocenter.server.service import Attribution

    settings, _ = load_settings({"store": str(tmp_path / "h.db"), "tick_s": 60}, environ={})
    s = open_store(settings.store)
    s.ingest(
        [
            Entry(
                workload="w",
                attempt=0,
                node="n1",
                stream="s",
                kind="text",
                body="x",
                time_ns=T0,
                line=1,
                dedup="w|1",
                scope={"state": "FAILED"},
            )
        ],
        [],
        time.time() - 100,
    )
    row = s.attempt("w", 0)
    assert row is not None
    s.mark_analysing(row.id, time.time())  # the first process died in its analysis …
    assert s.recover_interrupted(time.time(), 2) == []  # … the second started, retried it …
    s.mark_analysing(row.id, time.time())  # … and died in it too
    service = Attribution(settings, s)
    service.start()
    try:
        assert [r.workload for r in s.failed_attempts(10)] == ["w"]
        assert service.activity.snapshot().analysis_failures == {"interrupted": 1}
    finally:
        service.close()
        s.close()
