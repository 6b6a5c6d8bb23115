"""WatchDiagnoses slots are shared between callers: two read-token holders opening all they may
(`watch_max_per_client`) leave a slot for a third, whose watch is then served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

READERS = [f"reader-{i}-token-0123456789abcdef" for i in range(3)]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("read:\n" + "".join(f"  - {t}\n" for t in READERS))
    srv, thread = serve_in_thread(settings(tmp_path, auth_tokens_file=str(tokens), grpc_workers=8))
    yield srv
    srv.shutdown()
    thread.join(30)


def _watch(stub: Any, reader: int) -> Any:
    return stub.WatchDiagnoses(
        pb.WatchDiagnosesRequest(), metadata=(("authorization", f"Bearer {READERS[reader]}"),)
    )


def _subscribed(call: Any) -> bool:
    try:
        return dict(call.initial_metadata()).get("hypocenter-watch") == "subscribed"
    except grpc.RpcError:
        return False


def test_a_third_reader_still_gets_a_watch(server: Server) -> None:
    assert server.settings.grpc_workers // 2 == 4 and server.settings.watch_max_per_client == 2
    channel = grpc.insecure_channel(server.grpc_address)
    stub = pb_grpc.AttributionStub(channel)
    calls: list[Any] = []
    try:
        for reader in (0, 0, 1):
            calls.append(_watch(stub, reader))
            assert _subscribed(calls[-1])
        second = _watch(stub, 1)  # would take the last slot while reader 1 already holds one
        calls.append(second)
        assert not _subscribed(second)
        assert second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holding no watch" in second.details()
        third = _watch(stub, 2)
        calls.append(third)
        assert _subscribed(third)
    finally:
        for call in calls:
            call.cancel()
        channel.close()
