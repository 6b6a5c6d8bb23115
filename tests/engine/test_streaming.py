"""`analyze` reads log files in fixed-size pieces, over worker processes, with a cached rule catalog:
none of it may change a diagnosis, a line number or a coverage count.

Pieces are made tiny here (64 bytes to 4 KiB, instead of 8 MiB) so that every look a candidate takes
past its piece (the stamp it inherits, the next stamp, the context lines its rule reads, srun
labels, the boot-anchor probe, the uptime a stream ends at) crosses piece edges."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import EXTRA_RULE, assert_pieces_read_as_whole
from server_support import REPO, clean_env

from hypocenter.collector import logstream
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import Engine, default_engine, rulecache
from hypocenter.engine.rules import load_ruleset
from hypocenter.lineformat import MAX_LINE, time_context
from hypocenter.sources import AttemptInput, FileTextSource, Source, TextSource

EXAMPLES = REPO / "examples"
BUNDLES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())
ENGINE = default_engine()


def _stretched(name: str, tmp: Path, seed: int = 7) -> Path:
    """An example bundle with runs of unstamped filler lines between its lines (long inherit and
    next-stamp looks), some NUL bytes, an undecodable byte and a line over MAX_LINE in its logs."""
    root = tmp / name
    shutil.copytree(EXAMPLES / name, root)
    rnd = random.Random(seed)
    for path in sorted((root / "logs").rglob("*")):
        if not path.is_file() or path.suffix == ".gz":
            continue
        out: list[bytes] = []
        for line in path.read_bytes().splitlines(keepends=True):
            out.append(line)
            out.extend(
                b"    filler %d of a traceback-like run\n" % i for i in range(rnd.choice((0, 0, 1, 3, 40)))
            )
        if rnd.random() < 0.3:
            out.insert(len(out) // 2, b"a line with NULs \x00\x00 and \xff an undecodable byte\n")
        if rnd.random() < 0.2:
            out.insert(len(out) // 3, b"x" * (MAX_LINE + 100) + b"\n")
        path.write_bytes(b"".join(out))
    return root


def _whole(attempt: AttemptInput) -> AttemptInput:
    """The same attempt with every file's text read whole into memory: extraction from one piece."""
    sources: list[Source] = [
        TextSource(s.name, s.text, s.node, s.source) if isinstance(s, FileTextSource) else s
        for s in attempt.sources
    ]
    return AttemptInput(attempt.context, sources, list(attempt.coverage))


def _events(engine: Engine, attempt: AttemptInput, workers: int = 1) -> list[dict[str, object]]:
    result = engine.extractor.extract(
        attempt.sources, attempt.context, time_context(attempt.context), workers=workers
    )
    return [e.model_dump(mode="json") for e in result.events] + [
        {"candidates": result.candidates, "lines": result.lines_scanned}
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLES)
def test_pieces_find_the_events_and_diagnosis_of_the_whole_text(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _stretched(name, tmp_path)
    whole = _whole(load_bundle(root))
    want_events = _events(ENGINE, whole)
    want = ENGINE.analyze(whole).to_json()
    for chunk in (64, 1000, 4096):
        monkeypatch.setattr(logstream, "CHUNK_BYTES", chunk)
        bundle = load_bundle(root)
        assert [c.model_dump() for c in bundle.coverage] == [c.model_dump() for c in whole.coverage], chunk
        assert _events(ENGINE, bundle) == want_events, (name, chunk)
        assert ENGINE.analyze(bundle).to_json() == want, (name, chunk)


def _edgy(root: Path, seed: int) -> Path:
    """A bundle whose candidates sit anywhere relative to piece edges: hung-task stacks (14 context
    lines after), py-spy dumps (12), unstamped NCCL warnings after runs of over BACKSCAN_LINES
    unstamped lines, raw dmesg placed by an RTC anchor, srun-labelled job output."""
    rnd = random.Random(seed)
    nodes = ["node01", "node02"]
    (root / "logs" / "_job").mkdir(parents=True)
    (root / "attempt.yaml").write_text(
        '{"workload": {"id": "edgy", "attempt": 0, "scheduler": "slurm"}, "window": {"start": '
        '"2026-11-02T10:00:00Z", "end": "2026-11-02T11:00:00Z"}, "state": "FAILED", "exit_code": 1, '
        '"nodes": ["node01", "node02"], "ranks": {"node01": "0-3", "node02": "4-7"}, "timezone": "UTC"}'
    )
    for i, node in enumerate(nodes):
        d = root / "logs" / node
        d.mkdir()
        kern: list[str] = []
        rank: list[str] = []
        for k in range(rnd.randint(30, 60)):
            m, sec = 10 + k % 40, k % 60
            kern.append(f"Nov  2 10:{m:02d}:{sec:02d} {node} kernel: [{1000 + k}.000001] audit: chatter {k}")
            if rnd.random() < 0.15:
                kern.append(
                    f"Nov  2 10:{m:02d}:{sec:02d} {node} kernel: [{1000 + k}.5] INFO: task python3:{4000 + k} "
                    "blocked for more than 120 seconds."
                )
                kern.extend(
                    f"Nov  2 10:{m:02d}:{sec:02d} {node} kernel: [{1000 + k}.6]  "
                    f"{rnd.choice(['nfs_wait_bit_killable', 'schedule', 'nv_wait'])}+0x20/0x80"
                    for _ in range(16)
                )
            rank.append(f"[2026-11-02 10:{m:02d}:{sec:02d}] step {k} loss 1.0")
            rank.extend(
                f"    unstamped progress {j}"
                for j in range(rnd.choice((0, 2, 50, 4200 if k % 17 == 3 else 5)))
            )
            if rnd.random() < 0.2 or k % 23 == 5:
                rank.append(
                    f"{node}:1234:5678 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
                    "peer 10.10.0.3<43012> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
                )
                if (
                    k % 23 == 5
                ):  # no stamp within BACKSCAN_LINES after it: none looked for again in the stream
                    rank.extend(f"    unstamped tail {j}" for j in range(4200))
            if rnd.random() < 0.1:
                rank.extend(
                    [
                        'Thread 0x7F00AB (idle): "MainThread"',
                        "    all_reduce (torch/distributed/c10d.py:2050)",
                        "    train_step (train.py:88)",
                    ]
                )
        (d / "kern.log").write_text("\n".join(kern) + "\n")
        (d / "rank.log").write_text("\n".join(rank) + ("\n" if i else ""))
        dmesg = [
            "[    0.000000] Linux version 6.8.0",
            "[    1.234567] rtc_cmos 00:00: setting system clock to 2026-11-02T09:00:00 UTC (1793610000)",
        ]
        dmesg += [f"[{5 + k:5d}.000000] pcieport chatter {k}" for k in range(rnd.randint(10, 400))]
        dmesg.append("[ 4000.123456] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
        (d / "dmesg.txt").write_text("\n".join(dmesg) + "\n")
    job = [
        f"{t}: [rank{t}]:[E1102 10:51:{t:02d}.000000 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) "
        f"Rank {t}] Process group watchdog thread terminated with exception: NCCL error: remote process exited "
        "or there was a network error, NCCL version 2.26.2"
        for t in range(2)
    ]
    job = [f"{rnd.randint(0, 1)}: chatter {j}" for j in range(rnd.randint(5, 300))] + job
    job.append("srun: error: node01: task 1: Exited with exit code 1")  # the last line decides task 1's node
    (root / "logs" / "_job" / "slurm.out").write_text("\n".join(job) + "\n")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_pieces_at_every_edge_find_the_events_of_the_whole_text(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _edgy(tmp_path / "b", seed)
    whole = _whole(load_bundle(root))
    want_events = _events(ENGINE, whole)
    assert any(e.get("kind") == "hung_task" for e in want_events) and any(
        e.get("inherited") for e in want_events
    )
    want = ENGINE.analyze(whole).to_json()
    for chunk in (64, 700, 4096, 70_000):
        monkeypatch.setattr(logstream, "CHUNK_BYTES", chunk)
        bundle = load_bundle(root)
        assert _events(ENGINE, bundle) == want_events, (seed, chunk)
        assert ENGINE.analyze(bundle).to_json() == want, (seed, chunk)


def test_worker_processes_give_the_diagnosis_of_one(tmp_path: Path) -> None:
    for name in ("nvlink-xid149", "ib-link-flap", "host-oom"):
        root = _stretched(name, tmp_path)
        bundle = load_bundle(root)
        assert _events(ENGINE, bundle, workers=2) == _events(ENGINE, bundle)
        assert ENGINE.analyze(bundle, workers=3).to_json() == ENGINE.analyze(bundle).to_json()


_TRICKY = {
    "plain.log": b"line one\nline two\n" * 50,
    "no-final-newline.log": b"a\nb\nlast without newline",
    "nul.log": b"before\n" * 30 + b"\x00\x00mid\x00\n" + b"after\n" * 30,
    "only-nul.log": b"\x00" * 5000,
    "binary.log": b"\x7fELF" + bytes(range(256)) * 20 + b"\x00",
    "utf8.log": ("température ✓ 🚀\n" * 40).encode(),
    "bad-utf8.log": b"ok\n" * 20 + b"caf\xc3" + b"\n\xe2\x82 broken\xff\xfe\n" + ("é" * 30).encode() + b"\n",
    "long-ascii.log": b"short\n" + b"y" * (MAX_LINE + 1) + b"\n" + b"z" * MAX_LINE + b"\nend",
    "long-utf8.log": b"short\n" + "é".encode() * (MAX_LINE // 2 + 10) + b"\n" + "é".encode() * (MAX_LINE + 1),
    "empty.log": b"",
}


@pytest.mark.parametrize("chunk", [7, 64, 4096, 1 << 20])
def test_scan_in_pieces_says_what_reading_whole_says(
    chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstream, "CHUNK_BYTES", chunk)
    for name, raw in _TRICKY.items():
        (tmp_path / name).write_bytes(raw)
        assert_pieces_read_as_whole(tmp_path / name)


def test_a_file_is_read_in_pieces_never_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 MB log read with 64 KiB pieces: no read asks for more than a piece."""
    monkeypatch.setattr(logstream, "CHUNK_BYTES", 1 << 16)
    path = tmp_path / "big.log"
    path.write_bytes(b"2026-11-02T10:00:00Z healthy chatter of a node\n" * 45_000)
    sizes: list[int] = []
    real_open = Path.open

    def spying_open(self: Path, *args: object, **kwargs: object) -> object:
        f = real_open(self, *args, **kwargs)  # type: ignore[call-overload]
        read = f.read

        def spy(n: int = -1) -> bytes:
            sizes.append(n)
            return read(n)  # type: ignore[no-any-return]

        f.read = spy
        return f

    monkeypatch.setattr(Path, "open", spying_open)
    assert logstream.scan_log(path).newlines == 45_000
    assert sum(len(p) for p in logstream.log_pieces(path, True)) == path.stat().st_size
    assert sizes and all(0 < n <= 1 << 16 for n in sizes)


# ------------------------------------------------------------------------------------ rule catalog cache


def _extra(tmp: Path, title: str) -> Path:
    rules = tmp / "extra.yaml"
    rules.write_text(EXTRA_RULE.replace("the frobnicator exploded", title, 1), encoding="utf-8")
    return rules


def test_a_cached_catalog_is_the_catalog_and_a_changed_file_is_never_served_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    extra = _extra(tmp_path, "the frobnicator exploded")
    first = rulecache.load_ruleset_cached([extra])
    assert first.fingerprint == load_ruleset([extra]).fingerprint
    assert len(list((tmp_path / "cache" / "hypocenter").glob("ruleset-*.pickle"))) == 1

    def not_loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("served from the files, not the cache")

    monkeypatch.setattr(rulecache, "load_ruleset", not_loaded)
    again = rulecache.load_ruleset_cached([extra])
    assert again.fingerprint == first.fingerprint and [r.model_dump() for r in again.rules] == [
        r.model_dump() for r in first.rules
    ]
    bundle = load_bundle(EXAMPLES / "nvlink-xid149")
    assert Engine(again).analyze(bundle).to_json() == Engine(first).analyze(bundle).to_json()
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _extra(tmp_path, "the frobnicator exploded!")  # one byte of one rule file: another catalog
    changed = rulecache.load_ruleset_cached([extra])
    assert changed.fingerprint != first.fingerprint
    assert changed.by_id["frobnicator-exploded"].title == "the frobnicator exploded!"


def test_the_cache_is_skipped_when_it_cannot_be_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert rulecache.load_ruleset_cached().fingerprint == load_ruleset().fingerprint
    # A cache file others can write is never unpickled (a pickle is code).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rulecache.load_ruleset_cached()
    (cached,) = (tmp_path / "cache" / "hypocenter").glob("ruleset-*.pickle")
    cached.write_bytes(b"not a pickle")
    os.chmod(cached, 0o666)
    assert rulecache.load_ruleset_cached().fingerprint == load_ruleset().fingerprint


def test_analyze_imports_neither_the_server_nor_the_pull_machinery() -> None:
    code = (
        "import sys; from hypocenter.cli import main; code = main(['analyze', sys.argv[1], '--format', 'json']); "
        "heavy = sorted(m for m in sys.modules if m.startswith(('hypocenter.server', 'hypocenter.store', "
        "'hypocenter.config', 'hypocenter.collector.pull', 'grpc', 'pydantic_settings', 'httpx'))); "
        "print(code, heavy, file=sys.stderr)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES / "nvlink-xid149")],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert r.stderr.strip().splitlines()[-1] == "0 []", r.stderr[-2000:]
    assert '"outcome": "attributed"' in r.stdout
