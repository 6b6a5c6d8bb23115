"""An uploaded bundle archive (tar, tar.gz, tar.xz, tar.bz2) read as a stream, never extracted.

`tarfile.extractall(filter="data")` has had bypasses (CVE-2025-4517 and relatives, fixed only in
3.11.13 / 3.12.11 / 3.13.4) that let a crafted archive write anywhere the server may. So no name
of an upload ever reaches the filesystem: the archive is decompressed as a stream, its members are
read one at a time under the bounds below, their bytes laid end to end in one `Spool` (memory up
to SPOOL_MEMORY, then one anonymous temporary file: no name, unlinked from the start, gone with the
process; collector/spool.py), and the bundle reader (collector/bundle.py) reads them through `ArchivePath`, a path
whose every file operation answers from that spool, a piece at a time. However large the archive,
its files are never in memory whole.

Bounds (hypocenter/limits.py, each a setting), all checked while reading, before the bytes exist:

    bundle_max_members        entries in the archive (200,000 empty files: refused at the 10,001st)
    bundle_max_member_bytes   one member's size (a sparse 4 GiB member: refused from its header)
    bundle_max_bytes          decompressed bytes of the whole archive, headers included, and of the
                              gzip files inside it (nested compression) together
    bundle_max_ratio          decompressed / uploaded bytes, past the first 16 MiB

A member that is not a regular file (link, device, FIFO) is never followed: it is listed in the
bundle's coverage as skipped. Absolute names and `..` are refused outright (BundleError).

pax extended headers (which bsdtar writes for extended attributes, and any tar for long or
non-ASCII names) are read by `_PaxBoundedInfo`, never by CPython's own parser: its regular
expressions take time quadratic in the header while holding the GIL (CVE-2024-6232, fixed only
in 3.11.10 / 3.12.6 / 3.13.0), so a few KB of header would freeze the server. A header over
PAX_MAX_BYTES is refused before it is read, and GNU sparse files described in pax headers are
refused (their maps are parsed by the same regular expressions).
"""

from __future__ import annotations

import bz2
import errno
import inspect
import io
import lzma
import os
import stat
import tarfile
import weakref
import zlib
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import PosixPath, PurePosixPath
from typing import Any

from hypocenter import limits
from hypocenter.collector.bundle import Bundle, load_bundle
from hypocenter.collector.spool import Spool
from hypocenter.errors import BundleError, InputError
from hypocenter.limits import LimitExceeded, Limits
from hypocenter.model import Coverage

_CHUNK = 1 << 16
PAX_MAX_BYTES = 1 << 20
"""Bytes of one pax extended header (extended attributes included); bsdtar's are a few hundred."""
SPOOL_MEMORY = 16 << 20
"""Bytes of an archive's files kept in memory; past them, the spool moves to a temporary file."""


class _MemberReader(io.RawIOBase):
    """One file of an archive, opened: reads answered from the spool."""

    def __init__(self, spool: Spool, offset: int, size: int) -> None:
        self._spool = spool
        self._start = offset
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        left = self._size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        if n <= 0:
            return b""
        data = self._spool.read_at(self._start + self._pos, n)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read()

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


@dataclass
class ArchiveTree:
    """The regular files of an archive (path → offset and size in its spool), its directories, and
    what was skipped."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    spool: Spool = field(
        default_factory=lambda: Spool(
            SPOOL_MEMORY, what="an uploaded archive's files", prefix="hypocenter-upload-"
        )
    )
    dirs: set[str] = field(default_factory=lambda: {""})
    skipped: dict[str, str] = field(default_factory=dict)  # path → why it was not read
    inflate_budget: int = 0  # bytes gzip files inside may still decompress to (bundle_max_bytes left)
    member_max: int = 0  # bundle_max_member_bytes

    def add_dirs(self, path: str) -> None:
        """`path` and every directory above it."""
        parts = path.split("/") if path else []
        for i in range(len(parts) + 1):
            self.dirs.add("/".join(parts[:i]))


class ArchivePath(PosixPath):
    """A path into one `ArchiveTree`: the Path methods the bundle reader uses, answered from memory.
    Anything else that would touch the disk fails (`os.fspath` of it raises)."""

    _tree: ArchiveTree

    @classmethod
    def root_of(cls, tree: ArchiveTree) -> ArchivePath:
        bound = type("BoundArchivePath", (cls,), {"_tree": tree})
        root: ArchivePath = bound("/")
        return root

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is inside an uploaded archive: it has no file on disk")

    def _key(self) -> str:
        return self.as_posix().lstrip("/")

    def exists(self, *, follow_symlinks: bool = True) -> bool:
        k = self._key()
        return k in self._tree.files or k in self._tree.dirs or k in self._tree.skipped

    def is_dir(self) -> bool:
        return self._key() in self._tree.dirs

    def is_file(self) -> bool:
        return self._key() in self._tree.files

    def is_symlink(self) -> bool:
        return False  # links are never materialised: listed in `skipped`

    def iterdir(self) -> Generator[ArchivePath, None, None]:
        k = self._key()
        if k not in self._tree.dirs:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(self))
        prefix = f"{k}/" if k else ""
        names = {
            p[len(prefix) :].split("/", 1)[0]
            for p in (*self._tree.files, *self._tree.dirs)
            if p.startswith(prefix) and p != k
        }
        for name in sorted(names):
            yield self / name

    def walk_files(self) -> list[ArchivePath]:
        """Regular files under this directory, the order os.walk gives on disk (files of a directory
        first, then its subdirectories, by name; hidden files left out)."""
        out: list[ArchivePath] = []
        children = list(self.iterdir())
        out.extend(c for c in children if c.is_file() and not c.name.startswith("."))
        for sub in (c for c in children if c.is_dir()):
            out.extend(sub.walk_files())
        return out

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        k = self._key()
        if k in self._tree.files:
            return os.stat_result((stat.S_IFREG | 0o444, 0, 0, 1, 0, 0, self._tree.files[k][1], 0, 0, 0))
        if k in self._tree.dirs:
            return os.stat_result((stat.S_IFDIR | 0o555, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        if k in self._tree.skipped:
            return os.stat_result((stat.S_IFIFO | 0o444, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        raise FileNotFoundError(errno.ENOENT, "no such file in the archive", str(self))

    def lstat(self) -> os.stat_result:
        return self.stat()

    def read_bytes(self) -> bytes:
        return self._reader().read()

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def open(self, *args: Any, **kwargs: Any) -> Any:
        """Reading only: a binary file object over the spool (what the bundle reader opens), or a
        UTF-8 text one over it."""
        mode = str(args[0]) if args else str(kwargs.get("mode", "r"))
        if any(c in mode for c in "wax+"):
            raise PermissionError(errno.EROFS, "an uploaded archive is read-only", str(self))
        if "b" not in mode:
            return io.TextIOWrapper(
                io.BufferedReader(self._reader()), encoding=kwargs.get("encoding") or "utf-8"
            )
        return self._reader()

    def _reader(self) -> _MemberReader:
        k = self._key()
        if k not in self._tree.files:
            raise FileNotFoundError(errno.ENOENT, "no such file in the archive", str(self))
        offset, size = self._tree.files[k]
        return _MemberReader(self._tree.spool, offset, size)

    def inflate_limit(self) -> int:
        """How many bytes a gzip file inside the archive may decompress to: one member's bound, within
        what is left of the whole archive's."""
        return min(self._tree.inflate_budget, self._tree.member_max)

    def spend(self, nbytes: int) -> None:
        self._tree.inflate_budget -= nbytes


class _Inflating(io.RawIOBase):
    """The archive's bytes decompressed on demand; LimitExceeded as soon as the output passes the
    budget (so that no read, tarfile's own included, ever holds more than that)."""

    def __init__(self, raw: bytes, budget: Limits) -> None:
        self._src = raw
        self._pos = 0
        self._pending = b""
        self.produced = 0
        self._max = budget.bundle_max_bytes
        self.ratio_max = max(limits.RATIO_FLOOR_BYTES, budget.bundle_max_ratio * len(raw))
        self._ratio = budget.bundle_max_ratio
        magic = raw[:6]
        self._zlib = magic.startswith(b"\x1f\x8b")
        self._d: Any
        if magic.startswith(b"\x1f\x8b"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif magic.startswith(b"\xfd7zXZ\x00"):
            self._d = lzma.LZMADecompressor()
        elif magic.startswith(b"BZh"):
            self._d = bz2.BZ2Decompressor()
        else:
            self._d = None  # a plain tar

    def readable(self) -> bool:
        return True

    def _more(self, n: int) -> bytes:
        """Up to `n` more decompressed bytes; b"" at the end."""
        if self._d is None:
            chunk = self._src[self._pos : self._pos + n]
            self._pos += len(chunk)
            return chunk
        try:
            while True:
                if self._zlib and self._d.unconsumed_tail:
                    out = self._d.decompress(self._d.unconsumed_tail, n)
                elif not self._zlib and not self._d.needs_input and not self._d.eof:
                    out = self._d.decompress(b"", max_length=n)
                elif self._pos >= len(self._src) or self._d.eof:
                    return b""
                else:
                    data = self._src[self._pos : self._pos + _CHUNK]
                    self._pos += len(data)
                    out = (
                        self._d.decompress(data, n) if self._zlib else self._d.decompress(data, max_length=n)
                    )
                if out:
                    return bytes(out)
        except (zlib.error, lzma.LZMAError, OSError, EOFError) as exc:
            raise InputError(f"not a readable tar.gz bundle: damaged compressed data ({exc})") from None

    def readinto(self, buffer: Any) -> int:
        n = len(buffer)
        data = self._pending or self._more(min(n, _CHUNK))
        self._pending = data[n:]
        data = data[:n]
        self.produced += len(data)
        if self.produced > self._max:
            raise LimitExceeded(f"bundle is over {self._max:,} bytes once decompressed", "bundle_max_bytes")
        if self.produced > self.ratio_max:
            raise LimitExceeded(
                f"bundle decompresses to over {self._ratio}x its {len(self._src):,} uploaded bytes "
                "(a compression bomb?)",
                "bundle_max_ratio",
            )
        buffer[: len(data)] = data
        return len(data)


def pax_records(buf: bytes) -> list[tuple[bytes, bytes]]:
    """The `<length> <keyword>=<value>\\n` records of a pax header, in one linear pass. Like CPython,
    reading stops at the first record that is not one (the header's padding); a zero length is an
    error."""
    out: list[tuple[bytes, bytes]] = []
    pos = 0
    while pos < len(buf):
        space = buf.find(b" ", pos, pos + 21)
        digits = buf[pos:space] if space > pos else b""
        if not digits.isdigit():
            break
        length = int(digits)
        if length == 0:
            raise tarfile.ReadError("invalid pax header: a record of length 0")
        end = pos + length
        equals = buf.find(b"=", space + 1, end)
        if end > len(buf) or equals <= space + 1:
            break
        out.append((buf[space + 1 : equals], buf[equals + 1 : end - 1]))
        pos = end
    return out


_FROMTARFILE_DIRCHECK = "dircheck" in inspect.signature(tarfile.TarInfo.fromtarfile).parameters


class _PaxBoundedInfo(tarfile.TarInfo):
    """tarfile's member header, with pax extended headers read by `pax_records` (the module docstring
    says why). The rest of the processing is CPython's own `_proc_pax`, step for step."""

    def _proc_pax(self, archive: Any) -> tarfile.TarInfo:
        if self.size > PAX_MAX_BYTES:
            raise BundleError(
                f"archive has a pax extended header of {self.size:,} bytes (at most {PAX_MAX_BYTES:,} are read)"
            )
        block = self._block(self.size)  # type: ignore[attr-defined]
        buf = archive.fileobj.read(block)[: self.size]
        pax_headers = archive.pax_headers if self.type == tarfile.XGLTYPE else archive.pax_headers.copy()
        records = pax_records(buf)
        charset = next((v for k, v in records if k == b"hdrcharset"), None)
        if charset is not None:
            pax_headers["hdrcharset"] = charset.decode("utf-8", "replace")
        encoding = archive.encoding if pax_headers.get("hdrcharset") == "BINARY" else "utf-8"
        for raw_key, raw_value in records:
            key = self._decode_pax_field(raw_key, "utf-8", "utf-8", archive.errors)  # type: ignore[attr-defined]
            if key.startswith("GNU.sparse."):
                raise BundleError(
                    "archive has a GNU sparse file in pax format (not read: make the archive without --sparse)"
                )
            pax_headers[key] = self._decode_pax_field(  # type: ignore[attr-defined]
                raw_value,
                encoding if key in tarfile.PAX_NAME_FIELDS else "utf-8",
                archive.encoding if key in tarfile.PAX_NAME_FIELDS else "utf-8",
                archive.errors,
            )
        try:
            # Pythons fixed for CVE-2025-13462 read the header after a pax header with dircheck=False
            following = (
                self.fromtarfile(archive, dircheck=False)  # type: ignore[call-arg]
                if _FROMTARFILE_DIRCHECK
                else self.fromtarfile(archive)
            )
        except tarfile.HeaderError as exc:
            raise tarfile.ReadError(str(exc)) from None
        if self.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            following._apply_pax_info(pax_headers, archive.encoding, archive.errors)  # type: ignore[attr-defined]
            following.offset = self.offset
            if "size" in pax_headers:
                offset = following.offset_data
                if following.isreg() or following.type not in tarfile.SUPPORTED_TYPES:
                    offset += following._block(following.size)  # type: ignore[attr-defined]
                archive.offset = offset
        return following


def read_archive(raw: bytes, bounds: Limits | None = None) -> ArchivePath:
    """The bundle root (the shallowest directory holding attempt.yaml) of an uploaded archive, in
    memory. BundleError / InputError for an archive that is not a usable bundle, LimitExceeded
    for one past a bound."""
    b = bounds or limits.active()
    tree = ArchiveTree()
    weakref.finalize(tree, tree.spool.close)  # the temporary file closes with the last path into it
    stream = _Inflating(raw, b)
    members = 0
    try:
        with tarfile.open(
            fileobj=io.BufferedReader(stream, _CHUNK), mode="r|", tarinfo=_PaxBoundedInfo
        ) as tar:
            for member in tar:
                members += 1
                if members > b.bundle_max_members:
                    raise LimitExceeded(
                        f"archive has more than {b.bundle_max_members:,} members", "bundle_max_members"
                    )
                name = _member_name(member.name)
                if name is None:
                    continue
                if member.isdir():
                    tree.add_dirs(name)
                    continue
                if member.size > b.bundle_max_member_bytes:  # a sparse member's size is its apparent size
                    raise LimitExceeded(
                        f"archive member {name!r} is {member.size:,} bytes, over the limit of "
                        f"{b.bundle_max_member_bytes:,}",
                        "bundle_max_member_bytes",
                    )
                if not member.isreg() or member.issparse():
                    what = (
                        "a sparse file"
                        if member.issparse()
                        else "a symbolic link"
                        if member.issym()
                        else "a hard link"
                        if member.islnk()
                        else "a device or FIFO"
                    )
                    tree.skipped[name] = (
                        f"not read: {what} in an uploaded archive (never followed or created)"
                    )
                    tree.add_dirs(name.rpartition("/")[0])
                    continue
                f = tar.extractfile(member)
                start = tree.spool.size
                while f is not None and (data := f.read(_CHUNK * 16)):
                    tree.spool.append(data)
                tree.files[name] = (start, tree.spool.size - start)
                tree.add_dirs(name.rpartition("/")[0])
    except tarfile.TarError as exc:
        tree.spool.close()
        raise InputError(f"not a readable tar.gz bundle: {exc}") from None
    except (EOFError, OSError) as exc:
        tree.spool.close()
        raise InputError(f"not a readable tar.gz bundle: {exc or 'it ends early'}") from None
    except BaseException:
        tree.spool.close()
        raise
    tree.spool.seal()
    # gzip files inside spend what the archive left of both the byte bound and the ratio bound
    tree.inflate_budget = min(b.bundle_max_bytes, stream.ratio_max) - stream.produced
    tree.member_max = b.bundle_max_member_bytes
    roots = sorted(
        (p.rpartition("/")[0] for p in tree.files if p.rpartition("/")[2] == "attempt.yaml"),
        key=lambda p: (p.count("/") + (1 if p else 0), p),
    )
    if not roots:
        raise BundleError(
            "the archive holds no attempt.yaml (a bundle is a directory with attempt.yaml, logs/, …)"
        )
    root = ArchivePath.root_of(tree)
    return root / roots[0] if roots[0] else root


def _member_name(name: str) -> str | None:
    """A member's path inside the bundle, normalised; None for the archive's own `.`; BundleError for
    names that would leave it."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise BundleError(
            f"archive member {name[:200]!r}: an absolute path or '..' (refused: a bundle's "
            "files stay inside it)"
        )
    return "/".join(parts) or None


def load_archive_bundle(raw: bytes, bounds: Limits | None = None) -> Bundle:
    """An uploaded archive read as a bundle: `read_archive`, then the bundle reader over it, with the
    members that were not read (links, devices) in its coverage."""
    root = read_archive(raw, bounds)
    bundle = load_bundle(root)
    tree = root._tree
    base = root._key()
    for name, reason in tree.skipped.items():
        if base and not name.startswith(f"{base}/"):
            continue
        bundle.coverage.append(
            Coverage(
                connector="files",
                source=name[len(base) + 1 if base else 0 :],
                status="skipped",
                observations=0,
                reason=reason,
            )
        )
    bundle.coverage.sort(key=lambda c: (c.source, c.connector))
    return bundle


__all__ = ["ArchivePath", "ArchiveTree", "load_archive_bundle", "read_archive"]
