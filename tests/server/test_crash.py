"""Crash safety: SIGKILL the server in the middle of an attempt's ingest, restart it on the same
SQLite file, finish the replay: no acknowledged record is lost, nothing is stored twice, and the
diagnosis is the one `hypocenter analyze` gives. Diagnoses survive a restart too."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from interleave_support import otlp_requests
from server_support import REPO, ServerProcess, analyze, essence, replay, wait_for_diagnosis

pytestmark = pytest.mark.slow

BUNDLE = REPO / "examples" / "nvlink-xid149"


def _stored(db: Path) -> list[tuple[str, int]]:
    """(stream, record number) of every stored line: a row with its text, or one of the lines a gap
    row stands for (the run of lines extraction on arrival left out, ending at its record number)."""
    out: list[tuple[str, int]] = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        for s, n, kind, body in con.execute(
            "SELECT stream, line, kind, body FROM log_entries WHERE kind != 'state'"
        ):
            count = int(body) if kind == "gap" else 1
            out.extend((s, n - i) for i in range(count))
    return out


def test_sigkill_mid_ingest_loses_nothing_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    requests = otlp_requests(BUNDLE)
    assert len(requests) > 10
    expected = analyze(BUNDLE)

    srv = ServerProcess(db).start()
    acked: list[tuple[str, int]] = []
    sent = 0
    stop = threading.Event()

    def send() -> None:
        nonlocal sent
        with httpx.Client(base_url=srv.base, timeout=10) as c:
            for body, keys in requests[:-1]:  # everything but the terminal state
                if stop.is_set():
                    return
                try:
                    r = c.post("/v1/logs", content=body, headers={"Content-Type": "application/x-protobuf"})
                except httpx.HTTPError:
                    return
                sent += 1
                if r.status_code == 200:
                    acked.extend(keys)

    t = threading.Thread(target=send)
    t.start()
    deadline = time.monotonic() + 30
    while len(acked) < len(requests) * 20 // 3 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    srv.kill()  # mid-replay: the sender is still going
    stop.set()
    t.join(30)
    assert acked, "nothing was acknowledged before the kill"
    assert sent < len(requests) - 1, "the kill came after the replay had finished"

    srv = ServerProcess(db).start()  # same file
    try:
        stored = _stored(db)
        assert set(acked) <= set(stored), f"acknowledged but lost: {sorted(set(acked) - set(stored))[:5]}"
        # finish the replay: the whole bundle again, as a restarted collector would resend
        r = replay(BUNDLE, srv.grpc)
        assert r.returncode == 0, r.stderr
        with srv.client() as client:
            got = wait_for_diagnosis(client, "81234")
        assert essence(got) == essence(expected)
        stored = _stored(db)
        assert len(stored) == len(set(stored)), "a record was stored twice"
        total = sum(len(keys) for _, keys in requests[:-1])
        assert len(stored) == total
    finally:
        srv.kill()

    # diagnoses and data survive a restart (a hard one: SIGKILL above)
    srv = ServerProcess(db).start()
    try:
        with srv.client() as client:
            doc: dict[str, Any] = client.get(f"/v1/diagnoses/{expected['id']}").json()
            assert essence(doc) == essence(expected)
            assert client.get("/v1/attempts/81234/0").json()["log_records"] > 0
    finally:
        srv.stop()
