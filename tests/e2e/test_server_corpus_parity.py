"""Parity on the generated accuracy corpus (issue 3's generator): one bundle per failure mode,
replayed as OTLP into one server (node names recur across bundles, as on a real fleet), gives
`analyze`'s diagnosis for every one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine_support import analyze_bundle
from server_support import essence

from bench.generate import main as generate
from hypocenter.cli.assembly import Server, serve_in_thread
from hypocenter.cli.replay import replay
from hypocenter.config import load_settings
from hypocenter.engine import default_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("corpus") / "c"
    assert generate(["--out", str(out), "--count", "40", "--seed", "7", "--prior", "uniform"]) == 0
    bundles = sorted(p for p in out.iterdir() if (p / "attempt.yaml").is_file())
    assert len(bundles) == 40
    return bundles


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings, _ = load_settings(
        {
            "grpc_listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "metrics_listen": "127.0.0.1:0",
            "store": str(tmp_path_factory.mktemp("cs") / "s.db"),
            "settle_s": 3600,
            "idle_timeout_s": 86400,
            "log_level": "error",
        },
        environ={},
    )
    srv, thread = serve_in_thread(settings)
    yield srv
    srv.shutdown()
    thread.join(30)


def test_every_mode_replays_to_the_same_diagnosis(corpus: list[Path], server: Server) -> None:
    engine = default_engine()
    mismatches: list[str] = []
    for i, bundle in enumerate(corpus):
        expected = json.loads(analyze_bundle(bundle, engine).to_json())
        ctx, _ = replay(bundle, server.http_address if i % 2 else server.grpc_address, http=bool(i % 2))
        r = httpx.post(
            f"http://{server.http_address}/v1/attempts/{ctx.workload.id}/{ctx.workload.attempt}/analyze",
            timeout=60,
        )
        assert r.status_code == 200, r.text
        if essence(r.json()) != essence(expected):
            mismatches.append(bundle.name)
    assert not mismatches, f"{len(mismatches)}/{len(corpus)} differ: {mismatches}"
