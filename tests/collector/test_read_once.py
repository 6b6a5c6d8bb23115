"""`analyze` reads each small log file of a bundle once (`load_bundle(read_once=True)`): the engine's
read is the only one, and what the load's scan would have said of the file (status, reason, line
counts) is learned there. Coverage must stay exact whenever it is looked at, and no diagnosis may change."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from hypocenter.collector import bundle_logs, logstream
from hypocenter.collector.bundle import Bundle, load_bundle
from hypocenter.collector.logstream import LogFacts
from hypocenter.lineformat import MAX_LINE
from tests.engine.test_flight_recorder import _bundle as _fr_bundle
from tests.engine.test_flight_recorder import _real as _real_dumps
from tests.engine.test_streaming import _TRICKY, BUNDLES, ENGINE, EXAMPLES, _stretched


def _coverage(b: Bundle) -> list[dict[str, Any]]:
    return [c.model_dump() for c in b.coverage]


def _tricky(tmp: Path) -> Path:
    """nvlink-xid149 with every kind of file the scan reports on among node02's logs."""
    root = tmp / "tricky"
    shutil.copytree(EXAMPLES / "nvlink-xid149", root)
    for name, raw in _TRICKY.items():
        (root / "logs" / "node02" / name).write_bytes(raw)
    (root / "logs" / "node03" / "rotated.log.1.gz").write_bytes(
        gzip.compress(b"Nov  2 09:00:00 node03 kernel: ok\n")
    )
    (root / "logs" / "node04" / "gone.log").symlink_to(root / "nowhere")
    (root / "logs" / "only-empty").mkdir()
    (root / "logs" / "only-empty" / "empty.log").write_bytes(b"")
    return root


def _roots(tmp: Path) -> list[Path]:
    return [EXAMPLES / name for name in BUNDLES] + [_stretched("ib-link-flap", tmp), _tricky(tmp)]


def test_coverage_read_once_is_the_coverage_of_a_scan_at_load(tmp_path: Path) -> None:
    for root in _roots(tmp_path):
        want = load_bundle(root)
        want_json = ENGINE.analyze(want).to_json()
        early = load_bundle(root, read_once=True)  # looked at before the engine reads anything: scanned then
        assert _coverage(early) == _coverage(want), root.name
        late = load_bundle(root, read_once=True)
        assert ENGINE.analyze(late).to_json() == want_json, root.name
        assert _coverage(late) == _coverage(want), root.name


def test_a_small_file_is_read_whole_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _stretched("nvlink-xid149", tmp_path)
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    texts = {p.name: p.read_bytes() for p in (root / "logs").rglob("*") if p.is_file()}
    clean = {
        name
        for name, raw in texts.items()  # the common case; the others are read as at load
        if raw.isascii() and b"\x00" not in raw and max(map(len, raw.split(b"\n"))) <= MAX_LINE
    }
    assert clean and clean != set(texts)
    whole: dict[str, int] = {}
    real = bundle_logs.read_file

    def counted(path: str, size: int = 0) -> bytes:
        name = os.path.basename(path)
        whole[name] = whole.get(name, 0) + 1
        return real(path, size)

    monkeypatch.setattr(bundle_logs, "read_file", counted)
    b = load_bundle(root, read_once=True)
    assert not whole.keys() & texts.keys()  # no log read at load
    assert ENGINE.analyze(b).to_json() == want_json
    assert {name for name in clean if whole.get(name) == 1} == clean
    monkeypatch.setattr(bundle_logs, "scan_log", None)  # coverage needs no scan: the engine's read told it
    assert _coverage(b) == _coverage(want)


def test_facts_learned_in_worker_processes_come_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tricky(tmp_path)
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    b = load_bundle(root, read_once=True)
    parent = os.getpid()
    scan = bundle_logs.scan_log

    def in_workers_only(path: Path) -> LogFacts:
        assert os.getpid() != parent, f"{path} scanned again: the worker's read was lost"
        return scan(path)

    monkeypatch.setattr(bundle_logs, "scan_log", in_workers_only)
    assert ENGINE.analyze(b, workers=2).to_json() == want_json
    assert _coverage(b) == _coverage(want)


_XID = b"Nov  2 10:50:00 node03 kernel: [294000.000000] NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_EVT Fatal XC0\n"


def _opened(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """logs/<node>/<file> → how many times a log file's text was read from its start: whole
    (`bundle_logs.read_file`), or in pieces, gzip undone (every such read, scan or extraction, starts with
    `_decompressed` of the open file)."""
    reads: dict[str, int] = {}
    decompressed, read_file = logstream._decompressed, bundle_logs.read_file

    def count(path: Path) -> None:
        if path.parts[-3] == "logs":
            name = "/".join(path.parts[-3:])
            reads[name] = reads.get(name, 0) + 1

    def counted(path: Path, f: BinaryIO) -> tuple[bool, Iterator[bytes]]:
        if not isinstance(f, io.BytesIO):  # bytes read already
            count(path)
        return decompressed(path, f)

    def counted_whole(path: str, size: int = 0) -> bytes:
        count(Path(path))
        return read_file(path, size)

    monkeypatch.setattr(logstream, "_decompressed", counted)
    monkeypatch.setattr(bundle_logs, "read_file", counted_whole)
    return reads


def test_gzip_and_multi_piece_files_are_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every log of a bundle whose files are gzip'd (one of two members) or span many pieces is
    decompressed or read once by load + analysis + coverage, with the diagnosis and coverage of a
    scan at load, in one process and in forked workers."""
    monkeypatch.setattr(
        logstream, "CHUNK_BYTES", 1 << 14
    )  # (narrower, the engine reads a stream again whole)
    root = _stretched("nvlink-xid149", tmp_path)
    job = root / "logs" / "_job" / "slurm-81234.out"
    raw = job.read_bytes()
    # the job log twice: as it is, and in two gzip members (each many pieces); then half the others gzip'd
    (job.parent / "copy.out.gz").write_bytes(
        gzip.compress(raw[: len(raw) // 2]) + gzip.compress(raw[len(raw) // 2 :])
    )
    for path in [p for p in sorted((root / "logs").rglob("*")) if p.is_file()][2::2]:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    names = {p.relative_to(root).as_posix() for p in (root / "logs").rglob("*") if p.is_file()}
    assert len(raw) > 3 * logstream.CHUNK_BYTES and len([n for n in names if n.endswith(".gz")]) >= 2
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    for workers in (1, 2):
        reads = _opened(monkeypatch)
        b = load_bundle(root, read_once=True)
        assert ENGINE.analyze(b, workers=workers).to_json() == want_json
        monkeypatch.setattr(
            bundle_logs, "scan_log", None
        )  # coverage needs no scan: the engine's read told it
        assert _coverage(b) == _coverage(want)
        monkeypatch.undo()
        monkeypatch.setattr(logstream, "CHUNK_BYTES", 1 << 14)
        if (
            workers == 1
        ):  # forked workers' reads are not seen here (test_facts_learned_in_worker_processes_come_back)
            assert reads == dict.fromkeys(names, 1)


def test_a_file_found_unusable_while_extracting_is_reported_as_a_scan_at_load_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damaged gzip data found only at the end of a file, after the engine has extracted pieces of it
    (one with an Xid line), a failing read, a binary file and text whose problems come late: each
    file's coverage entry is the one a scan at load gives, none of a dropped file's events count, the
    other files are analysed as ever, and a damaged gzip file is still read once."""
    monkeypatch.setattr(logstream, "CHUNK_BYTES", 1 << 12)
    root = tmp_path / "late"
    shutil.copytree(EXAMPLES / "nvlink-xid149", root)
    node03 = root / "logs" / "node03"
    text = b"".join(
        b"Nov  2 10:%02d:00 node03 kernel: [294000.%06d] eth0: link up %d\n" % (i % 50, i, i)
        for i in range(4000)
    )
    packed = gzip.compress(_XID + text)
    late = {
        "truncated.log.gz": packed[:-200],
        "bad-crc.log.gz": packed[:-8] + bytes(4) + packed[-4:],
        "trailing-junk.log.gz": packed + b"junk after the member",
        "late-nul.log": text + b"\x00\x00 crash\n" + text,
        "late-utf8.log": text
        + b"caf\xc3\n"
        + "é".encode() * (MAX_LINE + 1)
        + b"\n"
        + text[:5000]
        + b"\xe2\x82",
        "binary.log.gz": gzip.compress(b"\x7fELF" + bytes(range(256)) * 40 + b"\x00" + _XID),
        "blank-head.log": b" \n" * 8192 + _XID + b"\x00",
    }
    for name, raw in late.items():
        (node03 / name).write_bytes(raw)
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    entries = {c["source"].rsplit("/", 1)[-1]: c for c in _coverage(want)}
    assert [entries[n]["status"] for n in late] == [
        "failed",
        "failed",
        "failed",
        "partial",
        "partial",
        "skipped",
        "skipped",
    ]
    for workers in (1, 2):
        reads = _opened(monkeypatch)
        b = load_bundle(root, read_once=True)
        assert ENGINE.analyze(b, workers=workers).to_json() == want_json
        assert _coverage(b) == _coverage(want)
        if workers == 1:
            assert all(reads[f"logs/node03/{n}"] == 1 for n in late if "gz" in n and "binary" not in n)


def _dumps_among_logs(tmp: Path) -> Path:
    """The real torch dumps among the nodes' logs (pickle and JSON), one refused pickle, a JSON-lines
    log that mentions a dump's keys, a link to a dump (read as a log) and a log of each node."""
    root = _fr_bundle(tmp / "dumps", _real_dumps("pickle"))
    json_dump = _real_dumps("json")[3]
    (root / "logs" / "gpu-a04" / json_dump[0]).write_bytes(json_dump[1])
    (root / "logs" / "gpu-a01" / "fr_dump_7").write_bytes(
        pickle.dumps({"version": "2.10", "x": os.stat_result}, protocol=2)
    )
    (root / "logs" / "gpu-a01" / "trainer.jsonl").write_text(
        '{"msg": "profiling_name=nccl:all_reduce slow", "time": "2026-12-03T07:20:00Z"}\n{"msg": "step 10"}\n'
    )
    (root / "logs" / "gpu-a02" / "linked_rank_1").symlink_to(root / "logs" / "gpu-a02" / "nccl_trace_rank_1")
    for node in ("gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"):
        (root / "logs" / node / "kern.log").write_text(f"Dec  3 07:10:00 {node} kernel: eth0: link up\n")
    return root


def test_flight_recorder_dumps_among_logs_are_read_once_as_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump among a node's logs is found by the engine's one read of the file (no sniff at load):
    the diagnosis and coverage are those of a bundle read at load, in one process or in workers, with
    coverage looked at before the engine reads anything or after; and load + analysis + coverage open
    each log file once."""
    root = _dumps_among_logs(tmp_path)
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    dumps = {c.source.rsplit("/", 1)[-1]: c.status for c in want.coverage if c.connector == "flight_recorder"}
    assert dumps == {
        **{f"nccl_trace_rank_{r}": "ok" for r in range(4)},
        "nccl_trace_rank_3.json": "ok",
        "fr_dump_7": "failed",
    }
    early = load_bundle(root, read_once=True)
    assert _coverage(early) == _coverage(want)
    assert ENGINE.analyze(early).to_json() == want_json
    opened: dict[str, int] = {}
    real_open, real_io_open = os.open, io.open

    def count(path: object) -> None:
        name = os.fspath(path)  # type: ignore[call-overload]
        if isinstance(name, str) and "/logs/" in name:
            opened[name] = opened.get(name, 0) + 1

    def counted_os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        count(path)
        return real_os_open(path, *args, **kwargs)

    def counted_io_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        count(file)
        return real_io_open(file, *args, **kwargs)

    real_os_open = real_open
    for workers in (1, 2):
        opened.clear()
        monkeypatch.setattr(os, "open", counted_os_open)
        monkeypatch.setattr(io, "open", counted_io_open)
        b = load_bundle(root, read_once=True)
        assert ENGINE.analyze(b, workers=workers).to_json() == want_json
        assert _coverage(b) == _coverage(want)
        monkeypatch.undo()
        if workers == 1:  # forked workers' opens are not seen here
            files = {str(p) for p in (root / "logs").rglob("*") if p.is_file() and not p.is_symlink()}
            assert {name: n for name, n in opened.items() if name in files} == dict.fromkeys(files, 1)


def test_a_log_that_grows_or_shrinks_after_load_is_read_to_its_end(tmp_path: Path) -> None:
    """The engine reads a file whole by the size listed at load, and to its end when it has changed."""
    log = tmp_path / "kern.log"
    log.write_bytes(b"a\n" * 1000)
    assert bundle_logs.read_file(str(log), 2000) == b"a\n" * 1000
    assert bundle_logs.read_file(str(log), 10) == b"a\n" * 1000
    assert bundle_logs.read_file(str(log), 5000) == b"a\n" * 1000
    assert bundle_logs.read_file(str(log)) == b"a\n" * 1000
