"""Gzip logs and the files of uploaded archives are read as streams, like plain logs: what a bundle
says does not change (coverage, line numbers, the diagnosis byte for byte), the bounds on
decompression hold as they did, and the memory `analyze` takes does not grow with the bytes.

The large inputs are made fast and small on disk: one block of log lines is deflated once after a
full flush, and that deflate segment repeated (`_gzip_of`): hundreds of megabytes of text from a
few megabytes of gzip."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import assert_pieces_read_as_whole
from server_support import REPO, clean_env

from hypocenter import engine
from hypocenter.collector import archive, logstream
from hypocenter.collector.archive import load_archive_bundle
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.engine.forked import cores
from hypocenter.limits import LimitExceeded, Limits
from hypocenter.sources import FileTextSource

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
NVLINK = EXAMPLES / "nvlink-xid149"
BUNDLES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())


def _gzip_of(parts: list[tuple[bytes, int]]) -> Iterator[bytes]:
    """One gzip member holding each (bytes, times) of `parts` in turn, `bytes` repeated `times`: each
    part is deflated once, after a full flush (its segment refers to nothing before it), and its
    segment repeated."""
    yield b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # magic, deflate, no flags, no mtime, unknown OS
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc = size = 0
    for data, times in parts:
        segment = deflate.compress(data) + deflate.flush(zlib.Z_FULL_FLUSH)
        for _ in range(times):
            yield segment
            crc = zlib.crc32(data, crc)
        size += len(data) * times
    yield deflate.flush()
    yield struct.pack("<II", crc, size & 0xFFFFFFFF)


# ------------------------------------------------------------------------- gzip files read in pieces

_LINES = b"".join(b"line %d of a rotated log\n" % i for i in range(200))
_GOOD = gzip.compress(_LINES)
_GZIP_FILES = {
    "plain.log.gz": _GOOD,
    "two-members.log.gz": gzip.compress(b"first member\n")
    + gzip.compress(b"second member\nno final newline"),
    "padded.log.gz": _GOOD + b"\x00" * 700 + gzip.compress(b"after NUL padding\n") + b"\x00" * 3,
    "long-padding.log.gz": _GOOD + b"\x00" * 100_000,
    "only-nul.log.gz": b"\x00" * 5000,  # padding follows a member: before any, it is not gzip
    "empty.log.gz": b"",
    "empty-member.log.gz": gzip.compress(b""),
    "no-suffix.log": _GOOD,  # gzip's magic without the suffix: decompressed all the same
    "nul-and-utf8.log.gz": gzip.compress(
        b"a\x00b\n" * 50 + "température ✓\n".encode() + b"caf\xc3\n" + b"z" * 70_000
    ),
    "binary.log.gz": gzip.compress(b"\x7fELF" + bytes(range(256)) * 20 + b"\x00"),
    "repeats.log.gz": b"".join(_gzip_of([(b"head\n", 1), (_LINES, 40), (b"tail without newline", 1)])),
    # damaged
    "truncated.log.gz": _GOOD[: len(_GOOD) // 2],
    "cut-trailer.log.gz": _GOOD[:-3],
    "not-gzip.log.gz": _LINES,
    "one-byte.log.gz": b"\x1f",
    "bad-crc.log.gz": _GOOD[:-8] + struct.pack("<I", zlib.crc32(_LINES) ^ 1) + _GOOD[-4:],
    "bad-length.log.gz": _GOOD[:-4] + struct.pack("<I", len(_LINES) + 1),
    "bad-block.log.gz": _GOOD[:10] + b"\xff" * 20 + _GOOD[30:],
}


@pytest.mark.parametrize("chunk", [7, 64, 4096, 1 << 20])
def test_a_gzip_log_read_in_pieces_says_what_reading_it_whole_says(
    chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstream, "CHUNK_BYTES", chunk)
    for name, raw in _GZIP_FILES.items():
        (tmp_path / name).write_bytes(raw)
        assert_pieces_read_as_whole(tmp_path / name)  # read whole: gzip.decompress of the whole file
    reasons = {name: logstream.scan_log(tmp_path / name).reason for name in _GZIP_FILES}
    assert (
        reasons["truncated.log.gz"]
        == reasons["cut-trailer.log.gz"]
        == ("corrupt gzip file: truncated (the compressed data ends early)")
    )
    assert reasons["bad-crc.log.gz"] == "corrupt gzip file: damaged compressed data (CRC check failed)"
    assert reasons["not-gzip.log.gz"] == (
        "corrupt gzip file: not gzip data (the file ends in .gz but is not gzip-compressed)"
    )


def test_bytes_after_the_gzip_data_are_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "kern.log.1.gz"
    path.write_bytes(_GOOD + b"garbage appended by a broken copy")
    assert logstream.scan_log(path).reason == (
        "corrupt gzip file: damaged compressed data (what follows its gzip data is not gzip)"
    )


# ------------------------------------------------------------------------- uploaded archives


def _tar_gz(bundle: Path, extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(bundle, arcname=bundle.name)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(f"{bundle.name}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("name", BUNDLES)
def test_an_archive_spooled_to_a_temporary_file_gives_the_diagnosis_of_its_directory(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "SPOOL_MEMORY", 1024)  # every example past it: its files read from disk
    monkeypatch.setattr(logstream, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = default_engine()
    root = tmp_path / name
    shutil.copytree(EXAMPLES / name, root)
    node_logs = sorted(p for p in (root / "logs").rglob("*") if p.is_file() and p.suffix != ".gz")
    gz = node_logs[0].with_name(node_logs[0].name + ".gz")  # one log gzip'd inside the archive
    gz.write_bytes(gzip.compress(node_logs[0].read_bytes()))
    node_logs[0].unlink()
    bundle = load_archive_bundle(_tar_gz(root))
    assert [c.model_dump() for c in bundle.coverage] == [c.model_dump() for c in load_bundle(root).coverage]
    assert engine.analyze(bundle).to_json() == engine.analyze(load_bundle(root)).to_json()
    assert list(tmp_path.iterdir()) == [root]  # the spool has no name


def test_gzip_logs_in_an_archive_stop_at_the_same_bounds_with_the_same_message() -> None:
    small = Limits(bundle_max_member_bytes=8 << 20, bundle_max_bytes=32 << 20)
    bomb = gzip.compress(b"a" * (64 << 20))
    with pytest.raises(LimitExceeded) as refused:
        load_archive_bundle(_tar_gz(NVLINK, {"logs/node01/kern.log.gz": bomb}), small)
    assert str(refused.value) == (
        "gzip file 'kern.log.gz' in the bundle is over 8,388,608 bytes once decompressed "
        "(limit set by bundle_max_bytes)"
    )
    # each under one member's bound, together over what the archive leaves of the whole bound (here the
    # ratio bound's 16 MiB floor: the archive is small)
    six = gzip.compress(b"b\n" * (3 << 20))
    files = {f"logs/node0{i}/rotated.log.gz": six for i in range(1, 4)}
    load_archive_bundle(_tar_gz(NVLINK, dict(list(files.items())[:2])), small)
    with pytest.raises(LimitExceeded, match=r"rotated\.log\.gz' in the bundle is over .* bundle_max_bytes"):
        load_archive_bundle(_tar_gz(NVLINK, files), small)


# ------------------------------------------------------------------- memory: bounded, not the bytes

_CHATTER = (
    b"".join(
        b'Nov  2 10:%02d:%02d node02 kernel: [%d.000001] audit: type=1400 apparmor="ALLOWED" '
        b'operation="open" profile="snap" name="/proc/%d/stat"\n'
        % (10 + i % 40, i % 60, 294000 + i, 4000 + i)
        for i in range(40)
    )
    * 200
)  # 1.1 MB
_TIMES = (128 << 20) // len(_CHATTER)  # 128 MiB of chatter before the node's own kern.log, 128 after
_DECOMPRESSED = 2 * _TIMES * len(_CHATTER) + (NVLINK / "logs/node02/kern.log").stat().st_size

_PEAK = """
import resource, sys
from pathlib import Path
from hypocenter.collector.archive import load_archive_bundle
from hypocenter.engine import default_engine
from hypocenter.limits import Limits
from hypocenter.cli import main
path = Path(sys.argv[1])
if path.is_dir():
    main(["analyze", str(path), "--format", "json"])
else:  # an upload, as the server reads it (the ratio bound is raised: the test's archive is all repeats)
    print(default_engine().analyze(load_archive_bundle(path.read_bytes(), Limits(bundle_max_ratio=10**6))).to_json())
# VmHWM, not RUSAGE_SELF: Linux's ru_maxrss keeps what the process held before exec (the test runner's
# size, at the fork that started it); the workers forked to scan and extract are RUSAGE_CHILDREN
hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
print(max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024, file=sys.stderr)
"""


def _peak_and_diagnosis(path: Path) -> tuple[int, str]:
    """(peak resident bytes of analysing `path` in a process of its own and its workers, diagnosis)."""
    r = subprocess.run(
        [sys.executable, "-c", _PEAK, str(path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stderr.strip().splitlines()[-1]), r.stdout


@pytest.fixture(scope="module")
def big_node_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[bytes, int]]]:
    """The NVLink example whose node02 kern.log (the Xid 149 the diagnosis names) sits between 256 MiB
    of chatter, as kern.log.gz: (bundle, the parts of the log's text)."""
    root = tmp_path_factory.mktemp("big") / "nvlink-xid149"
    shutil.copytree(NVLINK, root)
    kern = root / "logs/node02/kern.log"
    parts = [(_CHATTER, _TIMES), (kern.read_bytes(), 1), (_CHATTER, _TIMES)]
    kern.unlink()
    with (root / "logs/node02/kern.log.gz").open("wb") as f:
        f.writelines(_gzip_of(parts))
    return root, parts


def test_a_large_gzip_log_is_analysed_in_bounded_memory_with_the_diagnosis_of_the_plain_file(
    big_node_log: tuple[Path, list[tuple[bytes, int]]], tmp_path: Path
) -> None:
    root, parts = big_node_log
    assert (root / "logs/node02/kern.log.gz").stat().st_size < _DECOMPRESSED // 50
    peak, diagnosis = _peak_and_diagnosis(root)
    assert peak < _DECOMPRESSED // 2, f"peak RSS {peak:,} bytes for {_DECOMPRESSED:,} bytes of gzip'd text"
    refs = [e["ref"] for e in json.loads(diagnosis)["evidence"]]
    xid_line = _TIMES * _CHATTER.count(b"\n") + 4
    assert f"logs/node02/kern.log.gz:{xid_line}" in refs  # the Xid 149's line, counted through the gzip
    plain = tmp_path / "plain"
    shutil.copytree(root, plain)
    (plain / "logs/node02/kern.log.gz").unlink()
    with (plain / "logs/node02/kern.log").open("wb") as f:
        for data, times in parts:
            f.writelines([data] * times)
    want = default_engine().analyze(load_bundle(plain)).to_json()
    assert diagnosis.strip() == want.strip().replace("kern.log:", "kern.log.gz:")


def test_a_large_uploaded_archive_is_analysed_in_bounded_memory(
    big_node_log: tuple[Path, list[tuple[bytes, int]]], tmp_path: Path
) -> None:
    """The same bundle as a tar.gz upload whose node02 kern.log is plain text inside the archive."""
    root, parts = big_node_log
    members = b""
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "kern.log.gz"):
        info = tarfile.TarInfo(f"b/{path.relative_to(root).as_posix()}")
        info.size = path.stat().st_size
        members += info.tobuf() + path.read_bytes() + b"\0" * (-info.size % 512)
    big = tarfile.TarInfo("b/logs/node02/kern.log")
    big.size = sum(len(data) * times for data, times in parts)
    upload = tmp_path / "upload.tar.gz"
    with upload.open("wb") as f:
        f.writelines(
            _gzip_of([(members + big.tobuf(), 1), *parts, (b"\0" * (-big.size % 512) + b"\0" * 1024, 1)])
        )
    peak, diagnosis = _peak_and_diagnosis(upload)
    assert peak < _DECOMPRESSED // 2, f"peak RSS {peak:,} bytes for an upload of {_DECOMPRESSED:,} bytes"
    want = default_engine().analyze(load_bundle(root)).to_json()
    assert diagnosis.strip() == want.strip().replace("kern.log.gz:", "kern.log:")


def test_gzip_logs_count_by_their_text_when_deciding_to_extract_in_workers(tmp_path: Path) -> None:
    """Two gzip files of 40 MiB of text each (a few hundred KB on disk) are worth forked workers, as the
    same text plain would be (a FIFO among them is sized without being opened: skipped)."""
    root = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "nvlink-xid149", root)
    chatter = _CHATTER.replace(b"node02", b"node01")
    for i in range(2):
        path = root / "logs" / "node01" / f"kern.log.{i + 1}.gz"
        path.write_bytes(b"".join(_gzip_of([(chatter, (40 << 20) // len(chatter))])))
    os.mkfifo(root / "logs" / "node01" / "pipe.log.gz")  # opening a FIFO would wait for a writer
    on_disk = sum(p.stat().st_size for p in (root / "logs").rglob("*.gz") if p.is_file())
    assert on_disk < engine.PARALLEL_BYTES // 10
    bundle = load_bundle(root, read_once=True)
    assert (
        sum(s.nbytes or 0 for s in bundle.sources if isinstance(s, FileTextSource)) >= engine.PARALLEL_BYTES
    )
    assert engine.auto_workers(bundle.sources) == cores()
    assert any(c.source.endswith("pipe.log.gz") and c.status == "skipped" for c in bundle.coverage)
