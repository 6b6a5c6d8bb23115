"""End to end on PostgreSQL: `hypocenter serve --store postgresql://…`, replay an example over OTLP,
fetch the diagnosis; restart the server on the same database and it is still there.

Runs when HYPOCENTER_TEST_POSTGRES_URL is set (CI sets it; see tests/store/test_contract.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, essence, replay, wait_for_diagnosis

pytestmark = [pytest.mark.postgresql, pytest.mark.slow]

BUNDLE = REPO / "examples" / "nvlink-xid149"


@pytest.fixture()
def pg_schema() -> Iterator[str]:
    yield from fresh_schema()


def test_serve_on_postgresql_replay_and_fetch(pg_schema: str, tmp_path: Path) -> None:
    expected = analyze(BUNDLE)
    srv = ServerProcess(pg_schema, log=tmp_path / "server.log").start()
    try:
        r = replay(BUNDLE, srv.grpc)
        assert r.returncode == 0, r.stderr
        with srv.client() as client:
            got = wait_for_diagnosis(client, expected["attempt"]["workload_id"])
            assert client.get("/readyz").json()["diagnoses"] == 1
    finally:
        srv.stop()
    assert essence(got) == essence(expected) and got["id"] == expected["id"]
    again = ServerProcess(pg_schema, log=tmp_path / "server.log").start()
    try:
        with again.client() as client:
            stored = client.get(f"/v1/diagnoses/{got['id']}")
        assert stored.status_code == 200 and stored.json() == got
    finally:
        again.stop()
