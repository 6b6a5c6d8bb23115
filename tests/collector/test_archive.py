"""Uploaded bundles are read in memory under bounds, never extracted (collector/archive.py, issue #12):
links are never followed or created, names leaving the bundle are refused, and bombs (a sparse
4 GiB member, gzip inside, 200,000 members, a huge compression ratio) are refused with 413 and the
setting to raise, while the server keeps working and leaves nothing in its temporary directory."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import ServerProcess

from hypocenter.collector.archive import load_archive_bundle
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.errors import BundleError
from hypocenter.limits import LimitExceeded, Limits

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NVLINK = EXAMPLES / "nvlink-xid149"
SMALL = Limits(bundle_max_member_bytes=8 << 20, bundle_max_bytes=32 << 20)


def _tar(bundle: Path, extra: list[tuple[tarfile.TarInfo, bytes]] = (), mode: str = "w:gz") -> bytes:  # type: ignore[assignment]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        tar.add(bundle, arcname=bundle.name)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _member(name: str, data: bytes = b"", **fields: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in fields.items():
        setattr(info, k, v)
    return info, data


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file()))
def test_an_uploaded_example_gives_the_same_diagnosis_byte_for_byte(name: str) -> None:
    engine = default_engine()
    bundle = load_archive_bundle(_tar(EXAMPLES / name))
    assert engine.analyze(bundle).to_json() == engine.analyze(load_bundle(EXAMPLES / name)).to_json()


def test_links_are_listed_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.log"
    secret.write_text("2026-11-02T10:30:00Z NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    raw = _tar(
        NVLINK,
        [
            _member("nvlink-xid149/logs/node01/leak.log", type=tarfile.SYMTYPE, linkname=str(secret)),
            _member(
                "nvlink-xid149/logs/node01/hard.log",
                type=tarfile.LNKTYPE,
                linkname="nvlink-xid149/attempt.yaml",
            ),
            _member("nvlink-xid149/logs/node01/tty", type=tarfile.CHRTYPE, devmajor=5, devminor=0),
            _member("nvlink-xid149/logs/node01/escape", type=tarfile.SYMTYPE, linkname=str(tmp_path)),
            _member("nvlink-xid149/logs/node01/escape/pwned", b"written through a link\n"),
        ],
    )
    bundle = load_archive_bundle(raw)
    skipped = {c.source: c.reason for c in bundle.coverage if c.status == "skipped"}
    assert "symbolic link" in str(skipped["logs/node01/leak.log"]) and "hard link" in str(
        skipped["logs/node01/hard.log"]
    )
    assert "device" in str(skipped["logs/node01/tty"])
    assert not any("fallen off the bus" in str(getattr(s, "text", "")) for s in bundle.sources)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["/etc/cron.d/x", "nvlink-xid149/../../x", "../attempt.yaml"])
def test_names_that_leave_the_bundle_are_refused(name: str) -> None:
    with pytest.raises(BundleError, match=r"absolute path or '\.\.'"):
        load_archive_bundle(_tar(NVLINK, [_member(name, b"x")]))


def test_a_sparse_4_gib_member_is_refused_from_its_header(tmp_path: Path) -> None:
    big = tmp_path / "nvlink-xid149" / "logs" / "node01" / "sparse.log"
    subprocess.run(["cp", "-r", str(NVLINK), str(tmp_path)], check=True)
    with big.open("wb") as f:
        f.truncate(4 << 30)
    out = tmp_path / "b.tar.gz"
    subprocess.run(["tar", "-S", "-czf", str(out), "-C", str(tmp_path), "nvlink-xid149"], check=True)
    assert out.stat().st_size < 1 << 20
    with pytest.raises(LimitExceeded, match="bundle_max_member_bytes"):
        load_archive_bundle(out.read_bytes(), SMALL)


def test_a_gzip_log_inside_the_bundle_decompresses_within_the_bounds() -> None:
    bomb = gzip.compress(b"a" * (64 << 20))
    with pytest.raises(LimitExceeded, match=r"kern\.log\.gz"):
        load_archive_bundle(_tar(NVLINK, [_member("nvlink-xid149/logs/node01/kern.log.gz", bomb)]), SMALL)
    # an archive inside is one (gzip) file like any other, never unpacked as a second bundle
    inner = _tar(NVLINK)
    bundle = load_archive_bundle(
        _tar(NVLINK, [_member("nvlink-xid149/logs/node01/inner.tar.gz", inner)]), SMALL
    )
    assert [s.name for s in bundle.sources if "inner" in s.name] == ["logs/node01/inner.tar.gz"]


def test_200000_members_are_refused_at_the_bound() -> None:
    header = tarfile.TarInfo("b/logs/n1/empty.log").tobuf()  # the same empty member 200,000 times
    raw = gzip.compress(header * 200_000, 1)
    with pytest.raises(LimitExceeded, match="bundle_max_members"):
        load_archive_bundle(raw)


def test_a_compression_bomb_is_refused_by_its_ratio() -> None:
    raw = _tar(NVLINK, [_member("nvlink-xid149/logs/node01/zeros.log", b"\0" * (20 << 20))])
    assert len(raw) < 200 << 10
    with pytest.raises(LimitExceeded, match="bundle_max_ratio"):
        load_archive_bundle(raw)


# ----------------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("uploads")
    scratch = tmp / "tmpdir"
    scratch.mkdir()
    srv = ServerProcess(
        tmp / "store.db",
        "--bundle-max-member-bytes",
        str(8 << 20),
        "--bundle-max-bytes",
        str(32 << 20),
        env={"TMPDIR": str(scratch)},
    ).start()
    yield srv, scratch
    srv.stop()


def test_bombs_over_http_are_413_and_the_server_keeps_working(server: tuple[ServerProcess, Path]) -> None:
    srv, scratch = server
    bombs = {
        "gzip log": _tar(
            NVLINK, [_member("nvlink-xid149/logs/node01/kern.log.gz", gzip.compress(b"a" * (64 << 20)))]
        ),
        "ratio": _tar(
            NVLINK, [_member(f"nvlink-xid149/logs/node01/zeros{i}.log", b"\0" * (7 << 20)) for i in range(3)]
        ),
        "member": _tar(NVLINK, [_member("nvlink-xid149/logs/node01/big.log", b"\0" * (9 << 20))]),
    }
    with srv.client() as client:
        for what, raw in bombs.items():
            r = client.post("/v1/bundles", content=raw, headers={"Content-Type": "application/gzip"})
            assert r.status_code == 413, (what, r.text)
            assert "limit set by bundle_max" in r.json()["detail"], (what, r.text)
        r = client.post("/v1/bundles", content=_tar(NVLINK, [_member("../x", b"x")]))
        assert r.status_code == 400 and "'..'" in r.json()["detail"]
        r = client.post("/v1/bundles", content=_tar(NVLINK), headers={"Content-Type": "application/gzip"})
        assert r.status_code == 200 and r.json()["root_cause"]["subdomain"] == "nvlink"
        assert httpx.get(f"{srv.base}/healthz").status_code == 200
    assert os.listdir(scratch) == []  # nothing of an upload is ever written
