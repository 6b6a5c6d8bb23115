"""`analyze` reads each small log file of a bundle once (`load_bundle(read_once=True)`): the engine's
read is the only one, and what the load's scan would have said of the file (status, reason, line
counts) is learned there. Coverage must stay exact whenever it is looked at, and no diagnosis may change."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_streaming import _TRICKY, BUNDLES, ENGINE, EXAMPLES, _stretched

from hypocenter.collector import bundle as bundle_module
from hypocenter.collector.bundle import Bundle, load_bundle
from hypocenter.collector.logstream import LogFacts
from hypocenter.lineformat import MAX_LINE


def _coverage(b: Bundle) -> list[dict[str, Any]]:
    return [c.model_dump() for c in b.coverage]


def _tricky(tmp: Path) -> Path:
    """nvlink-xid149 with every kind of file the scan reports on among node02's logs."""
    root = tmp / "tricky"
    shutil.copytree(EXAMPLES / "nvlink-xid149", root)
    for name, raw in _TRICKY.items():
        (root / "logs" / "node02" / name).write_bytes(raw)
    (root / "logs" / "node03" / "rotated.log.1.gz").write_bytes(gzip.compress(b"Nov  2 09:00:00 node03 kernel: ok\n"))
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
    clean = {name for name, raw in texts.items()  # the common case; the others are read as at load
             if raw.isascii() and b"\x00" not in raw and max(map(len, raw.split(b"\n"))) <= MAX_LINE}
    assert clean and clean != set(texts)
    whole: dict[str, int] = {}
    real = Path.read_bytes

    def counted(self: Path) -> bytes:
        whole[self.name] = whole.get(self.name, 0) + 1
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    b = load_bundle(root, read_once=True)
    assert not whole.keys() & texts.keys()  # no log read whole at load (a 4 KiB sniff for Flight Recorder dumps)
    assert ENGINE.analyze(b).to_json() == want_json
    assert {name for name in clean if whole.get(name) == 1} == clean
    monkeypatch.setattr(bundle_module, "scan_log", None)  # coverage needs no scan: the engine's read told it
    assert _coverage(b) == _coverage(want)


def test_facts_learned_in_worker_processes_come_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tricky(tmp_path)
    want = load_bundle(root)
    want_json = ENGINE.analyze(want).to_json()
    b = load_bundle(root, read_once=True)
    parent = os.getpid()
    scan = bundle_module.scan_log

    def in_workers_only(path: Path) -> LogFacts:
        assert os.getpid() != parent, f"{path} scanned again: the worker's read was lost"
        return scan(path)

    monkeypatch.setattr(bundle_module, "scan_log", in_workers_only)
    assert ENGINE.analyze(b, workers=2).to_json() == want_json
    assert _coverage(b) == _coverage(want)
