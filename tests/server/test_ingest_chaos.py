"""Chaos around one `hypocenter serve` on PostgreSQL: the database goes away in the middle of an
attempt's ingest and comes back. Nothing acknowledged is lost, the collector's retries are answered
503 (retry) meanwhile, the stored streams are byte-identical to one replica storing them in order,
the attempt gets one diagnosis equal to `hypocenter analyze`, and the outage is logged once when it
starts and once when it ends — not a traceback per refused request.

The database is the test's own throwaway instance (tests/own_postgres.py: initdb and pg_ctl on a
free loopback port), so stopping it disturbs no other test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from interleave_support import Senders, in_order, lines_held, send_rest, stored, stream_requests
from own_postgres import OwnPostgres
from server_support import REPO, ServerProcess, analyze, essence, wait_for_diagnosis

from hypocenter.store import open_store

BUNDLE = REPO / "examples" / "nvlink-xid149"
OUTAGE_S = 15

pytestmark = pytest.mark.slow


def _check(
    url: str,
    want: dict[str, Any],
    diagnosis: dict[str, Any],
    diagnoses: list[Any],
    log: Path,
    outages: int | None = 1,
) -> dict[str, Any]:
    """What every chaos test ends with: the streams stored as one replica stores them in order, one
    diagnosis equal to `analyze`, the outage logged `outages` times each way (None: at most once) and
    no traceback. Returns what the store holds."""
    store = open_store(url)
    try:
        held = stored(store)
    finally:
        store.close()
    streams = dict(held, rows=[r for r in held["rows"] if r[1] != "hypocenter/attempt-state"])  # sent last
    assert streams == want
    expected = analyze(BUNDLE)
    assert essence(diagnosis) == essence(expected) and diagnosis["id"] == expected["id"]
    assert len(diagnoses) == 1
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert " ERROR " not in text, text[-3000:]  # a refused request is not an error of the server's
    for message in ("store unavailable", "store available again"):  # the store's own lines
        count = text.count(f"hypocenter.store: {message}")
        assert count == outages if outages is not None else count <= 1, text[-3000:]
    # one line per change in all: the lease keeper adds none of its own to the store's
    assert "leases: the store is" not in text, text[-3000:]
    return held


@pytest.fixture()
def own_pg() -> Iterator[OwnPostgres]:
    pg = OwnPostgres().start()
    yield pg
    pg.destroy()


def test_postgresql_restarted_mid_ingest(own_pg: OwnPostgres, tmp_path: Path) -> None:
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    want = in_order(str(tmp_path / "in-order.db"), [r.body for r in requests])
    log = tmp_path / "server.log"
    srv = ServerProcess(own_pg.url, log=log).start()
    try:
        senders = Senders(lambda k, tries: srv.base, requests).start()
        deadline = time.monotonic() + 120
        while len(senders.acked) < len(requests) // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        own_pg.stop()
        acked_before = list(senders.acked)
        time.sleep(OUTAGE_S)  # the senders keep retrying: every request is refused meanwhile
        refused_during = senders.refused
        own_pg.start()
        senders.join()
        wl = send_rest(BUNDLE, srv.grpc)
        with srv.client() as client:
            r = client.post(f"/v1/attempts/{wl}/0/analyze")
            assert r.status_code == 200, r.text
            got = wait_for_diagnosis(client, wl)
            rows = client.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        srv.stop()
    assert acked_before and len(acked_before) < len(requests), "the outage did not fall mid-ingest"
    assert refused_during > 0, "no request was refused while the database was down"
    held = _check(own_pg.url, want, got, rows, log)
    assert "no longer holds" not in log.read_text()  # the only replica got its roles back
    acked_lines = {(r.path, r.first + i) for r in senders.acked for i in range(r.count)}
    assert acked_lines <= lines_held(held["rows"])


def _in_transaction(pg: OwnPostgres, name: str) -> bool:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL",
            (name,),
        ).fetchone()
    return bool(row and row[0])


def test_a_replica_stopped_inside_a_transaction_holds_up_no_other(
    own_pg: OwnPostgres, tmp_path: Path
) -> None:
    """Replica A is stopped (SIGSTOP) while one of its transactions is open — holding row locks
    (a stream's state, the attempt) that replica B's batches may need. B finishes the whole ingest
    while A stays stopped, and the database ends A's transaction (idle in transaction), so its
    locks do not outlive it; A, continued, reconnects and answers; one diagnosis, equal to `analyze`."""
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    want = in_order(str(tmp_path / "in-order.db"), [r.body for r in requests])
    a = ServerProcess(f"{own_pg.url}?application_name=replica-a", log=tmp_path / "a.log").start()
    b = ServerProcess(f"{own_pg.url}?application_name=replica-b", log=tmp_path / "b.log").start()
    stopped = False
    try:
        assert a.proc is not None
        pid = a.proc.pid

        def target(k: int, tries: int) -> str:
            return (a if (k + tries) % 2 == 0 and not stopped else b).base

        senders = Senders(target, requests, timeout=5.0).start()
        caught = False
        for _ in range(2000):  # stop A until it is caught with its transaction open
            if len(senders.acked) == len(requests):
                break
            os.kill(pid, signal.SIGSTOP)
            stopped = True
            if _in_transaction(own_pg, "replica-a"):
                caught = True
                break
            os.kill(pid, signal.SIGCONT)
            stopped = False
            time.sleep(0.002)
        assert caught, "replica A was never caught inside a transaction"
        senders.join()  # every request acknowledged, by B, while A stays stopped
        deadline = time.monotonic() + 120
        while _in_transaction(own_pg, "replica-a") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _in_transaction(own_pg, "replica-a"), "A's transaction (and its locks) outlived it"
        os.kill(pid, signal.SIGCONT)
        stopped = False
        wl = send_rest(BUNDLE, b.grpc)
        with a.client() as client:  # A answers again, from the same database
            r = client.post(f"/v1/attempts/{wl}/0/analyze")
            assert r.status_code == 200, r.text
            got = wait_for_diagnosis(client, wl)
            rows = client.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        if stopped and a.proc is not None:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()
    _check(own_pg.url, want, got, rows, tmp_path / "a.log", outages=None)


class _Namespace:
    """A network namespace joined to this host by a veth pair (host side `host_ip`, namespace side
    `ns_ip`, a /24 of their own); `cut()` takes the host side's link down — packets dropped, no reset,
    as a partition does — and `mend()` brings it up. Traffic stays on this machine."""

    def __init__(self) -> None:
        n = os.getpid() % 200 + 20
        self.name = f"hc-{os.getpid()}"
        self.host_if, ns_if = f"hch{os.getpid() % 100000}", f"hcn{os.getpid() % 100000}"
        self.network = f"10.231.{n}.0/24"
        self.host_ip, self.ns_ip = f"10.231.{n}.1", f"10.231.{n}.2"
        try:
            self._ip("netns", "add", self.name)
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"network namespaces unusable here: {exc}")
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", ns_if)
        self._ip("link", "set", ns_if, "netns", self.name)
        self._ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("-n", self.name, "addr", "add", f"{self.ns_ip}/24", "dev", ns_if)
        self._ip("-n", self.name, "link", "set", ns_if, "up")
        self._ip("-n", self.name, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    @property
    def wrap(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def cut(self) -> None:
        self._ip("link", "set", self.host_if, "down")

    def mend(self) -> None:
        self._ip("link", "set", self.host_if, "up")

    def delete(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ip("netns", "delete", self.name)  # its end of the veth pair goes, and so the pair


@pytest.fixture()
def netns() -> Iterator[_Namespace]:
    ns = _Namespace()
    yield ns
    ns.delete()


def test_a_replica_cut_from_postgresql_for_30_s(netns: _Namespace, tmp_path: Path) -> None:
    """Replica A runs in a network namespace of its own (veth pair; see `_Namespace`) and is cut off
    from PostgreSQL — and from the collectors — for 30 s in the middle of an attempt's ingest; B
    takes what A does not acknowledge. A notices the partition (keepalives / tcp_user_timeout, not
    the kernel's TCP timeouts), logs it once and once again when the link is back, and answers
    again; nothing acknowledged is lost, the streams are stored as one replica stores them in order,
    and the attempt gets one diagnosis, equal to `analyze`."""
    pg = OwnPostgres()
    pg.allow(netns.host_ip, netns.network)
    pg.start()
    requests = [r for rs in stream_requests(BUNDLE).values() for r in rs]
    want = in_order(str(tmp_path / "in-order.db"), [r.body for r in requests])
    listen = [f"--{kind}-listen={netns.ns_ip}:0" for kind in ("grpc", "http", "metrics")]
    listen.append("--allow-unauthenticated")  # a private namespace on this machine
    a_url = f"postgresql://hypocenter@{netns.host_ip}:{pg.port}/postgres"
    a = ServerProcess(a_url, *listen, log=tmp_path / "a.log", wrap=netns.wrap).start()
    b = ServerProcess(pg.url, log=tmp_path / "b.log").start()
    cut = False
    try:

        def target(k: int, tries: int) -> str:
            return (a if (k + tries) % 2 == 0 and not cut else b).base

        senders = Senders(target, requests, timeout=5.0).start()
        deadline = time.monotonic() + 120
        while len(senders.acked) < len(requests) // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        netns.cut()
        cut = True
        acked_before = len(senders.acked)
        time.sleep(30)
        netns.mend()
        cut = False
        senders.join()
        wl = send_rest(BUNDLE, b.grpc)
        deadline = time.monotonic() + 120
        while "store available again" not in (tmp_path / "a.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, "replica A never reached the database again"
            time.sleep(0.2)
        with a.client() as client:  # A answers again, from the same database
            r = client.post(f"/v1/attempts/{wl}/0/analyze")
            assert r.status_code == 200, r.text
            got = wait_for_diagnosis(client, wl)
            rows = client.get("/v1/diagnoses", params={"workload": wl}).json()["diagnoses"]
    finally:
        a.stop()
        b.stop()
    try:
        _check(pg.url, want, got, rows, tmp_path / "a.log")
    finally:
        pg.destroy()
    assert 0 < acked_before < len(requests), "the cut did not fall mid-ingest"
