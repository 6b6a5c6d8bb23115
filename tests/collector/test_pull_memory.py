"""Pulled pod logs and replayed bundles are streamed, not held: the Kubernetes connector hands the
engine each log as a spooled file read in pieces (collector/spool.py), which says exactly what the
same text held whole said and is read again from its start when its stream breaks off; `replay`
sends each file as it reads it. Neither grows in memory with the logs' size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from kube_fake import FakeKube, documents, example_logs
from server_support import REPO, ServerProcess, clean_env

from hypocenter.collector import logstream
from hypocenter.collector.connectors import kubernetes
from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.collector.connectors.kube_api import KubeAPI
from hypocenter.collector.connectors.kube_credentials import Credentials
from hypocenter.collector.connectors.kubernetes import KubernetesConnector
from hypocenter.engine import default_engine
from hypocenter.sources import AttemptInput, FileTextSource, Source, TextSource

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hbm-ecc-xid48"
FIX = REPO / "tests" / "fixtures" / "kubernetes"
FAST = RetryPolicy(timeout_s=5, attempts=3, backoff_s=0.0, max_backoff_s=0.0)
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)
POD = ("train-worker-2", None, False)  # the pod whose log holds the failing rank's own lines


def _objects() -> list[dict[str, object]]:
    return documents(
        *sorted((EXAMPLE / "events").glob("*.json")), *sorted((FIX / EXAMPLE.name).glob("*.json"))
    )


def _pull(fake: FakeKube) -> AttemptInput:
    api = KubeAPI(
        Credentials(server="https://k8s.test", headers={"Authorization": "Bearer fake-token"}),
        policy=FAST,
        transport=fake.transport,
        sleep=lambda s: None,
    )
    scope = KubernetesConnector.for_job("ml-team/train", api=api, now=lambda: NOW).scope()
    node_logs = [
        TextSource(name=str(p.relative_to(EXAMPLE)), text=p.read_text(), node=p.parent.name)
        for p in sorted((EXAMPLE / "logs").glob("*/journal*"))
    ]
    return AttemptInput(scope.context, [*scope.collected.sources, *node_logs], scope.collected.coverage)


def _held_whole(inp: AttemptInput) -> AttemptInput:
    """The same pull with each pod log a string, as the connector held it before (httpx's `.text`)."""
    sources: list[Source] = [
        TextSource(s.name, s.text.decode("utf-8", "replace"), s.node) if isinstance(s, FileTextSource) else s
        for s in inp.sources
    ]
    return AttemptInput(inp.context, sources, inp.coverage, inp.notes)


def test_a_streamed_pod_log_says_what_the_same_text_held_whole_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Pieces of 64 bytes and a spool on disk from its first KiB: the diagnosis, coverage and line
    counts are those of the text held whole, undecodable bytes, NUL bytes and a last line without
    its newline included."""
    monkeypatch.setattr(logstream, "CHUNK_BYTES", 64)
    monkeypatch.setattr(kubernetes, "LOG_MEMORY", 1024)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs: dict[tuple[str, str | None, bool], object] = dict(example_logs(EXAMPLE))
    logs[POD] = (
        b"2026-10-21T13:20:45.110000000Z stderr F caf\xc3 \xff\xfe bytes no decoder takes\n"
        b"2026-10-21T13:20:45.110000000Z stderr F a NUL \x00 in a line\n"
        + str(logs[POD]).encode()
        + b"2026-10-21T13:40:00.000000000Z stderr F the end, without a newline"
    )
    fake = FakeKube(_objects(), logs)  # type: ignore[arg-type]
    streamed = _pull(fake)
    pod_logs = [s for s in streamed.sources if isinstance(s, FileTextSource)]
    assert len(pod_logs) == 4 and all(not isinstance(s.text, str) for s in pod_logs)
    assert list(tmp_path.iterdir()) == []  # the spool has no name
    whole = _held_whole(streamed)
    engine = default_engine()
    got, want = engine.analyze(streamed).to_json(), engine.analyze(whole).to_json()
    assert got == want
    cov = {c.source: c for c in streamed.coverage}["logs/h100-n21/train-worker-2.log"]
    assert (cov.status, cov.observations) == ("ok", 88)  # 85 lines, 2 before, 1 after without a newline
    assert "logs/h100-n21/train-worker-2.log:27" in [e["ref"] for e in json.loads(got)["evidence"]]


def test_the_server_keeps_a_streamed_pod_log_as_it_kept_it_held_whole(tmp_path: Path) -> None:
    """`serve`'s scope pulls store a pod log line by line (store_scope), now read in pieces: the stored
    attempt's diagnosis is the one the same log held whole gave."""
    from hypocenter.config import load_settings
    from hypocenter.server.service import Attribution
    from hypocenter.store import open_store

    logs: dict[tuple[str, str | None, bool], object] = dict(example_logs(EXAMPLE))
    logs[POD] = (
        b"2026-10-21T13:20:45.110000000Z stderr F caf\xc3 \xff\n\n" + str(logs[POD]).encode() + b"no newline"
    )
    streamed = _pull(FakeKube(_objects(), logs))  # type: ignore[arg-type]
    got = []
    for inp in (streamed, _held_whole(streamed)):
        settings, _ = load_settings(
            {"store": str(tmp_path / f"{len(got)}.db"), "settle_s": 3600, "idle_timeout_s": 86400}, environ={}
        )
        store = open_store(settings.store)
        service = Attribution(settings, store)
        try:
            assert service.store_scope(inp.context, inp.sources)
            got.append(service.analyze(inp.context.workload.id, inp.context.workload.attempt)[0].to_json())
        finally:
            service.close()
            store.close()
    assert got[0] == got[1]
    assert "logs/h100-n21/train-worker-2.log:27" in [e["ref"] for e in json.loads(got[0])["evidence"]]


def _breaks_off(data: bytes, times: list[int]) -> Iterator[bytes]:
    yield data[: len(data) // 2]
    if times:
        times.pop()
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
    yield data[len(data) // 2 :]


@pytest.mark.parametrize("memory", [16 << 20, 256])
def test_a_log_whose_stream_breaks_off_is_read_again_from_its_start(
    memory: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retried as any transient failure; the part read before the break is not kept twice (in memory,
    or in the temporary file past 256 bytes). A log that breaks off on every try is a failed coverage
    entry, and the other logs are whole."""
    monkeypatch.setattr(kubernetes, "LOG_MEMORY", memory)
    logs: dict[tuple[str, str | None, bool], object] = dict(example_logs(EXAMPLE))
    text = str(logs[POD]).encode()
    breaks = [1]
    logs[POD] = lambda: _breaks_off(text, breaks)
    always = [1] * 10
    master = str(logs[("train-worker-0", None, False)]).encode()
    logs[("train-worker-0", None, False)] = lambda: _breaks_off(master, always)
    fake = FakeKube(_objects(), logs)  # type: ignore[arg-type]
    inp = _pull(fake)
    got = {s.name: s for s in inp.sources if isinstance(s, FileTextSource)}
    assert not breaks and got["logs/h100-n21/train-worker-2.log"].text == text
    assert "logs/h100-n12/train-worker-0.log" not in got
    cov = {c.source: c for c in inp.coverage}
    failed = cov["logs/h100-n12/train-worker-0.log"]
    assert failed.status == "failed" and failed.reason == (
        "log of train-worker-0/pytorch: https://k8s.test: RemoteProtocolError: peer closed connection without "
        "sending complete message body (gave up after 3 tries)"
    )
    for name in ("logs/h100-n07/train-master-0.log", "logs/h100-n13/train-worker-1.log"):
        pod = name.split("/")[-1].removesuffix(".log")
        assert got[name].text == str(example_logs(EXAMPLE)[(pod, None, False)]).encode()
        assert (cov[name].status, cov[name].observations) == ("ok", got[name].text.count(b"\n"))


# ------------------------------------------------------------------- memory: bounded, not the bytes

_PULL = """
import resource, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], str(Path(sys.argv[1]).parent)]
import tests.collector.test_pull_memory as t
from kube_fake import FakeKube, example_logs
from hypocenter.engine import default_engine
before, after = t.chatter()
logs = dict(example_logs(t.EXAMPLE))
log = logs[t.POD].encode()
times = int(sys.argv[2])
logs[t.POD] = lambda: iter([*([before] * times), log, *([after] * times)])
print(default_engine().analyze(t._pull(FakeKube(t._objects(), logs))).to_json())
# VmHWM, not RUSAGE_SELF (tests/collector/test_bounded_memory.py says why); forked extraction workers are RUSAGE_CHILDREN
hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
print(max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024, file=sys.stderr)
"""


def chatter() -> tuple[bytes, bytes]:
    """1 MiB pieces of a healthy trainer's output (CRI lines, as `timestamps=true` gives them), stamped
    at the log's first and last time: what comes before and after the failure in a long run."""

    def lines(stamp: str) -> bytes:
        one = b"".join(
            f"{stamp} stdout F train step {i} lr 3.0e-04 tokens/s 41210 samples/s 80.4 "
            f"mfu 0.{i % 97:02d}\n".encode()
            for i in range(100)
        )
        return one * ((1 << 20) // len(one))

    return lines("2026-10-21T13:20:45.110000000Z"), lines("2026-10-21T13:31:02.500000000Z")


def test_a_large_pod_log_is_pulled_and_analysed_in_bounded_memory() -> None:
    """256 MiB of a pod's log around its failure, streamed by the fake API server in 1 MiB pieces: the
    pull and the analysis stay far below the log's size, and the failure is found at its line."""
    before, after = chatter()
    times = 128
    size = times * (len(before) + len(after))
    r = subprocess.run(
        [sys.executable, "-c", _PULL, str(REPO / "tests"), str(times)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    peak = int(r.stderr.strip().splitlines()[-1])
    assert peak < size // 2, f"peak RSS {peak:,} bytes for a pod log of {size:,} bytes"
    d = json.loads(r.stdout)
    shift = times * before.count(b"\n")
    assert f"logs/h100-n21/train-worker-2.log:{shift + 25}" in [e["ref"] for e in d["evidence"]]
    assert d["root_cause"]["nodes"] == ["h100-n21"]


_REPLAY = """
import resource, sys
from pathlib import Path
from hypocenter.cli import main
code = main(["replay", *sys.argv[1:]])
hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
print(code, hwm * 1024, file=sys.stderr)
"""

# auditd's proctitle is the command line hex-encoded: long lines, as JSON application logs have them
_AUDIT = b"".join(
    b"Nov  2 10:%02d:%02d node02 kernel: [%d.000001] audit: type=1327 proctitle=%s\n"
    % (10 + i % 40, i % 60, 294000 + i, b"2F7573722F62696E2F707974686F6E33" * 250)
    for i in range(40)
)


def _bundle(root: Path, mib: int, attempt: int) -> tuple[int, int]:
    """The NVLink example as attempt `attempt`, its node02 kern.log (the Xid 149 the diagnosis names)
    between `mib` MiB of audit lines: (the log's size, lines before its own)."""
    shutil.copytree(REPO / "examples" / "nvlink-xid149", root)
    yaml = root / "attempt.yaml"
    yaml.write_text(yaml.read_text().replace("attempt: 0", f"attempt: {attempt}", 1))
    kern = root / "logs/node02/kern.log"
    own = kern.read_bytes()
    times = (mib << 20) // 2 // len(_AUDIT)
    with kern.open("wb") as f:
        f.writelines([_AUDIT] * times)
        f.write(own)
        f.writelines([_AUDIT] * times)
    return kern.stat().st_size, times * _AUDIT.count(b"\n")


def test_a_large_bundle_is_replayed_in_memory_that_does_not_grow_with_it(tmp_path: Path) -> None:
    """Replays of 48 MiB and 112 MiB of node log (over OTLP/HTTP to a server, which then diagnoses
    the large one): the larger takes hardly more memory than the smaller (here ~4 MB more for 64 MiB
    more; the replay before this change held about twice the bytes it sent), and the server names
    the Xid 149 at its line in the large log. Below ~48 MiB the exporters' and the allocator's own
    buffers are still growing to their steady size, so the smaller replay is not smaller still."""
    srv = ServerProcess(tmp_path / "s.db").start()
    try:
        peaks = []
        for attempt, mib in ((1, 48), (0, 112)):
            root = tmp_path / f"b{attempt}"
            size, before = _bundle(root, mib, attempt)
            r = subprocess.run(
                [sys.executable, "-c", _REPLAY, str(root), "--endpoint", srv.http, "--http"],
                capture_output=True,
                text=True,
                env=clean_env(),
                cwd=REPO,
                timeout=300,
                check=False,
            )
            code, peak = map(int, r.stderr.strip().splitlines()[-1].split())
            assert code == 0, r.stderr[-2000:]
            peaks.append((size, peak))
    finally:
        srv.stop()
    (small, small_peak), (big, big_peak) = peaks
    assert big_peak - small_peak < (big - small) // 4, (
        f"peak RSS {small_peak:,} -> {big_peak:,} bytes for {small:,} -> {big:,} bytes of log"
    )
    d = json.loads(r.stdout)
    assert f"logs/node02/kern.log:{before + 4}" in [e["ref"] for e in d["evidence"]]
