"""Parity: every example bundle replayed as OTLP into a real server gives the diagnosis `analyze` gives.

One server per transport; the official OTel SDK exporters are the client (gRPC and HTTP). Node
logs travel node-scoped (host.name only) and are joined to the attempt by node and time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_support import EXAMPLES, ServerProcess, analyze, essence, replay, wait_for_diagnosis

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("parity") / "store.db").start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("bundle", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_replay_over_grpc_matches_analyze(server: ServerProcess, bundle: Path) -> None:
    expected = analyze(bundle)
    r = replay(bundle, server.grpc)
    assert r.returncode == 0, r.stderr
    with server.client() as client:
        got = wait_for_diagnosis(client, expected["attempt"]["workload_id"])
    assert essence(got) == essence(expected)
    assert got["id"] == expected["id"]


@pytest.mark.parametrize("bundle", EXAMPLES[:3], ids=[p.name for p in EXAMPLES[:3]])
def test_replay_over_http_matches_analyze(tmp_path: Path, bundle: Path) -> None:
    srv = ServerProcess(tmp_path / "store.db").start()
    try:
        expected = analyze(bundle)
        r = replay(bundle, srv.http, "--http")
        assert r.returncode == 0, r.stderr
        import json

        got = json.loads(r.stdout)  # --http triggers the analysis over REST and prints the diagnosis
        assert essence(got) == essence(expected)
    finally:
        srv.stop()
