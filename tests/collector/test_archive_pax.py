"""pax extended headers of uploaded bundles are read in linear time, never by CPython's own parser.

CPython's `TarInfo._proc_pax` takes time quadratic in a header's size while holding the GIL
(CVE-2024-6232; fixed in 3.11.10, 3.12.6 and 3.13.0, and the server allows 3.11.0 on): a few KB of
header froze every other request. These tests replace that parser with one that fails, so they
fail on any code that still calls it, whatever the Python.
"""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import ServerProcess

from hypocenter.collector import archive
from hypocenter.errors import BundleError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NVLINK = REPO / "examples" / "nvlink-xid149"
LONG = "logs/gpu-node-ç/" + "very-long-directory-name/" * 5 + "kern.log"


def _header(payload: bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    hdr = tarfile.TarInfo("././@PaxHeader")
    hdr.type = kind
    hdr.size = len(payload)
    return hdr.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)


def _file(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)


def crafted(payload: bytes) -> bytes:
    """A plain-tar bundle whose attempt.yaml is preceded by a pax header holding `payload`."""
    yaml = (NVLINK / "attempt.yaml").read_bytes()
    return _header(payload) + _file("b/attempt.yaml", yaml) + b"\0" * 1024


@pytest.fixture()
def no_cpython_pax(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: tarfile.TarInfo, tar: tarfile.TarFile) -> tarfile.TarInfo:
        raise AssertionError("CPython's pax header parser ran on an upload")

    monkeypatch.setattr(tarfile.TarInfo, "_proc_pax", refuse)


@pytest.mark.usefixtures("no_cpython_pax")
def test_pax_names_and_attributes_are_read_without_cpythons_parser() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(NVLINK, arcname="nvlink")
        data = b"Dec 3 07:00:00 gpu kernel: hello\n"
        info = tarfile.TarInfo("nvlink/" + LONG)
        info.size = len(data)
        info.pax_headers = {"SCHILY.xattr.user.origin": "bsdtar", "LIBARCHIVE.creationtime": "1700000000"}
        tar.addfile(info, io.BytesIO(data))
    root = archive.read_archive(buf.getvalue())
    assert (root / LONG).read_bytes() == data
    assert (root / "attempt.yaml").read_bytes() == (NVLINK / "attempt.yaml").read_bytes()


@pytest.mark.usefixtures("no_cpython_pax")
@pytest.mark.parametrize(
    "payload",
    [b"1" * 60_000, b"1 " * 30_000, b"9 a=b\n" * 10_000],
    ids=["digits", "digit-spaces", "short-records"],
)
def test_hostile_pax_headers_are_read_in_one_pass(payload: bytes) -> None:
    """The shapes that make CPython's regular expressions backtrack are just a header that ends early."""
    root = archive.read_archive(crafted(payload))
    assert (root / "attempt.yaml").is_file()


def test_pax_records_are_those_cpython_reads() -> None:
    buf = b"18 path=a/b/c.log\n" + b"26 SCHILY.xattr.user.x=\xff\xfe\n" + b"\0" * 100
    assert archive.pax_records(buf) == [(b"path", b"a/b/c.log"), (b"SCHILY.xattr.user.x", b"\xff\xfe")]
    with pytest.raises(tarfile.ReadError):
        archive.pax_records(b"0 x=y\n")


@pytest.mark.usefixtures("no_cpython_pax")
def test_an_oversized_pax_header_is_refused_unread() -> None:
    with pytest.raises(BundleError, match="pax extended header of 1,048,577 bytes"):
        archive.read_archive(crafted(b"1" * (archive.PAX_MAX_BYTES + 1)))


@pytest.mark.usefixtures("no_cpython_pax")
def test_gnu_sparse_in_pax_is_refused() -> None:
    with pytest.raises(BundleError, match="GNU sparse"):
        archive.read_archive(crafted(b"22 GNU.sparse.size=10\n"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("pax") / "store.db").start()
    yield srv
    srv.stop()


def test_a_crafted_upload_is_answered_and_health_keeps_answering(server: ServerProcess) -> None:
    answers: list[int] = []

    def upload() -> None:
        with server.client() as c:
            answers.append(c.post("/v1/bundles", content=crafted(b"1 " * 500_000)).status_code)
            answers.append(c.post("/v1/bundles", content=crafted(b"1" * (2 << 20))).status_code)

    t = threading.Thread(target=upload)
    t.start()
    health = [httpx.get(f"{server.base}/healthz", timeout=30).status_code for _ in range(5)]
    t.join(120)
    assert not t.is_alive(), "the uploads were not answered"
    assert health == [200] * 5
    assert answers[0] in (200, 201) and answers[1] == 400
