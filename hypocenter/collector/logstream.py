"""A bundle's log files read in fixed-size pieces: never a whole file in memory.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import io
import itertools
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hypocenter.limits import inflate, inflated_past
from hypocenter.lineformat import MAX_LINE
from hypocenter.sources import NotText

_BINARY_PROBE = 8192
CHUNK_BYTES = 8 << 20
"""How much of a file is read at a time; a line longer than this is held whole."""


@dataclass(frozen=True, slots=True)
class LogFacts:
    usable: bool  # False: not text the engine can read (status and reason say why)
    status: str
    reason: str | None
    newlines: int = 0
    ends_with_newline: bool = False
    nbytes: int = 0
    streamed: bool = False  # read in pieces: log_pieces streams it (every file scan_log reads)


_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_INPUT = 1 << 20  # compressed bytes handed to zlib at a time


class _CorruptGzip(Exception):
    """A gzip file whose compressed data cannot be read to its end (the message says why, in the
    words `read_log` uses)."""


def _decompressed(path: Path, f: BinaryIO) -> tuple[bool, Iterator[bytes]]:
    """(is gzip, the file's bytes with gzip undone in pieces of at most CHUNK_BYTES) for the file
    `path` opened as `f`. The pieces raise OSError for a read that fails, _CorruptGzip for damaged
    gzip data (after the pieces before the damage)."""
    head = f.read(CHUNK_BYTES)
    if path.suffix.lower() == ".gz" or head.startswith(_GZIP_MAGIC):
        return True, _gunzip(f, head)
    return False, _plain(f, head)


def _plain(f: BinaryIO, head: bytes) -> Iterator[bytes]:
    piece = head
    while piece:
        yield piece
        piece = f.read(CHUNK_BYTES)


def _gunzip(f: BinaryIO, data: bytes) -> Iterator[bytes]:
    """What `gzip.decompress` makes of the whole file, as a stream: members one after another, NUL
    padding between them skipped, each member's CRC and length checked (by zlib)."""
    members = 0
    while True:
        # the next header's start; after a member, NUL padding first (dropped as it comes: any amount)
        data = data.lstrip(b"\x00") if members else data
        while len(data) < 2:
            more = f.read(min(CHUNK_BYTES, _GZIP_INPUT))
            if not more:
                break
            data = (data + more).lstrip(b"\x00") if members else data + more
        if not data:
            return
        if not data.startswith(_GZIP_MAGIC):
            raise _CorruptGzip(
                "not gzip data (the file ends in .gz but is not gzip-compressed)"
                if not members
                else "damaged compressed data (what follows its gzip data is not gzip)"
            )
        members += 1
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            if not data:
                data = f.read(min(CHUNK_BYTES, _GZIP_INPUT))
                if not data:
                    raise _CorruptGzip(_gzip_problem(EOFError()))
            try:
                out = d.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                raise _CorruptGzip(_gzip_problem(_as_gzip_error(exc))) from None
            data = d.unconsumed_tail
            if out:
                yield out
        data = d.unused_data


def _as_gzip_error(exc: zlib.error) -> BaseException:
    """zlib's words for a bad gzip trailer as `gzip.decompress` words them (read_log's messages)."""
    text = str(exc)
    if text.endswith("incorrect data check"):
        return gzip.BadGzipFile("CRC check failed")
    if text.endswith("incorrect length check"):
        return gzip.BadGzipFile("Incorrect length of data produced")
    return exc


class _LongLines:
    """Counts lines longer than MAX_LINE (characters of str pieces, bytes of bytes pieces) over a
    stream of pieces, as `_long_lines` does over the whole text."""

    def __init__(self) -> None:
        self.open = 0  # length of the line still open at the end of the pieces so far
        self.count = 0

    def feed(self, text: str | bytes) -> None:
        nl = "\n" if isinstance(text, str) else b"\n"
        first = text.find(nl)  # type: ignore[arg-type]
        if first < 0:
            self.open += len(text)
            return
        if self.open + first > MAX_LINE:
            self.count += 1
        last = text.rfind(nl)  # type: ignore[arg-type]
        if last > first:
            self.count += _long_lines(text[first + 1 : last])
        self.open = len(text) - last - 1

    def end(self) -> int:
        return self.count + (1 if self.open > MAX_LINE else 0)


def _long_note(n: int) -> str:
    return (
        f"{n} line{'s' if n > 1 else ''} longer than {MAX_LINE // 1024} KiB: "
        f"only the first {MAX_LINE // 1024} KiB of such a line is matched against rules"
    )


def refused(path: Path) -> tuple[str, str] | None:
    """(status, reason) when `path` is not a regular file that can be opened (a FIFO never is)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if path.is_symlink() and exc.errno == errno.ENOENT:
            return "failed", f"broken symbolic link (its target {_readlink(path)} does not exist)"
        return "failed", f"cannot read: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return "skipped", f"not a regular file: {_kind(path)}"
    return None


def read_log(path: Path) -> tuple[bytes | None, str, str | None]:
    """`read_text`'s answer with the text as UTF-8 bytes, which the engine scans as they are: a
    valid file comes back as read (no decoded copy is kept)."""
    problem = refused(path)
    if problem is not None:
        return None, *problem
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, "failed", f"cannot read: {exc.strerror or exc}"
    gz = path.suffix.lower() == ".gz" or raw.startswith(b"\x1f\x8b")
    if gz:
        # A file of an uploaded archive (collector/archive.py) decompresses within the upload's bounds.
        inflate_limit = getattr(path, "inflate_limit", None)
        try:
            if inflate_limit is None:
                raw = gzip.decompress(raw)
            else:
                raw = inflate(
                    raw,
                    wbits=16 + zlib.MAX_WBITS,
                    limit=inflate_limit(),
                    setting="bundle_max_bytes",
                    what=f"gzip file {path.name!r} in the bundle",
                )
                path.spend(len(raw))  # type: ignore[attr-defined]
        except (OSError, EOFError, zlib.error) as exc:
            return None, "failed", f"corrupt gzip file: {_gzip_problem(exc)}"
    if not raw:
        return None, "skipped", "empty file" + (" (after gzip decompression)" if gz else "")
    notes: list[str] = []
    if b"\x00" in raw:
        probe = raw[:_BINARY_PROBE].replace(b"\x00", b"")
        if not probe.strip():
            return None, "skipped", "no text: only NUL bytes"
        if _looks_binary(probe):
            return None, "skipped", _binary_reason(raw)
        nul = raw.count(b"\x00")
        raw = raw.replace(b"\x00", b"")
        notes.append(
            f"{nul} NUL byte{'s' if nul > 1 else ''} dropped (a log cut short by a crash often has them)"
        )
    if raw.isascii():  # most logs: valid UTF-8 as they are, and as long in characters as in bytes
        if len(raw) > MAX_LINE:
            long_lines = _long_lines(raw)
            if long_lines:
                notes.append(
                    f"{long_lines} line{'s' if long_lines > 1 else ''} longer than {MAX_LINE // 1024} KiB: "
                    f"only the first {MAX_LINE // 1024} KiB of such a line is matched against rules"
                )
        return raw, ("partial" if notes else "ok"), ("; ".join(notes) or None)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        notes.append(f"not valid UTF-8: {bad} undecodable byte sequence{'s' if bad > 1 else ''} replaced")
        raw = text.encode("utf-8")
    if len(text) > MAX_LINE:
        long_lines = _long_lines(text)
        if long_lines:
            notes.append(
                f"{long_lines} line{'s' if long_lines > 1 else ''} longer than {MAX_LINE // 1024} KiB: "
                f"only the first {MAX_LINE // 1024} KiB of such a line is matched against rules"
            )
    del text
    return raw, ("partial" if notes else "ok"), ("; ".join(notes) or None)


def _long_lines(text: str | bytes) -> int:
    """How many lines are longer than MAX_LINE. Every such line contains a whole block of
    MAX_LINE/2 characters of the tiling below, so only the blocks are probed for a newline: a few
    thousand `find` calls for 100 MB of ordinary log lines. (ASCII bytes: characters are bytes.)"""
    step = MAX_LINE // 2
    count = 0
    i = 0
    nl: Any = "\n" if isinstance(text, str) else b"\n"
    while i < len(text):
        if text.find(nl, i, i + step) >= 0:
            i += step
            continue
        start = text.rfind(nl, 0, i) + 1
        end = text.find(nl, i)
        end = len(text) if end < 0 else end
        if end - start > MAX_LINE:
            count += 1
        i = end + 1
    return count


_TEXT_BYTES = bytes([9, 10, 12, 13, 27, *range(32, 256)])
_MAGIC = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bzip2"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
    (b"\x7fELF", "ELF executable or core dump"),
)


def _looks_binary(probe: bytes) -> bool:
    """NUL-free sample → True when it is not text (control bytes or invalid UTF-8 in over 10 %)."""
    control = len(probe.translate(None, _TEXT_BYTES))
    bad = probe.decode("utf-8", errors="replace").count("\ufffd")
    return (control + bad) * 10 > len(probe)


def _binary_reason(raw: bytes) -> str:
    for magic, what in _MAGIC:
        if raw.startswith(magic):
            if what in ("xz", "bzip2", "zstd", "zip"):
                return f"binary file: {what}-compressed data (only .gz files are decompressed; decompress it)"
            return f"binary file ({what}), not a text log"
    return "binary file (NUL and control bytes), not a text log"


def _gzip_problem(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "truncated (the compressed data ends early)"
    if isinstance(exc, gzip.BadGzipFile) and "Not a gzipped file" in str(exc):
        return "not gzip data (the file ends in .gz but is not gzip-compressed)"
    return f"damaged compressed data ({exc})"


def _kind(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except OSError:
        return "broken symbolic link" if path.is_symlink() else "unreadable"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _readlink(path: Path) -> str:
    try:
        return repr(_display(os.readlink(path)))
    except OSError:
        return "?"


def _display(name: str) -> str:
    """A path or node name as valid text: undecodable bytes in file names become U+FFFD."""
    return name.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def scan_log(path: Path) -> LogFacts:
    """`read_log`'s verdict on one log file, reading it (gzip undone) in CHUNK_BYTES pieces. Never
    raises, but LimitExceeded for a gzip file of an uploaded archive that decompresses past its bounds."""
    problem = refused(path)
    if problem is not None:
        return LogFacts(False, *problem)
    bounded = getattr(path, "inflate_limit", None)  # a file of an uploaded archive (collector/archive.py)
    try:
        with path.open("rb") as f:
            gz, pieces = _decompressed(path, f)
            limit = bounded() if gz and bounded is not None else None
            first = next(pieces, b"")
            if not first:
                return LogFacts(
                    False, "skipped", "empty file" + (" (after gzip decompression)" if gz else "")
                )
            nul = newlines = size = 0
            ascii_only = True
            last = b""
            lengths = _LongLines()
            head = b""  # the first _BINARY_PROBE bytes, whatever the pieces' sizes
            piece = first
            while piece:
                if len(head) < _BINARY_PROBE:
                    head += piece[: _BINARY_PROBE - len(head)]
                size += len(piece)
                if limit is not None and size > limit:
                    raise inflated_past(f"gzip file {path.name!r} in the bundle", limit, "bundle_max_bytes")
                newlines += piece.count(b"\n")
                if b"\x00" in piece:
                    nul += piece.count(b"\x00")
                    piece = piece.replace(b"\x00", b"")
                if piece:
                    last = piece[-1:]
                    ascii_only = ascii_only and piece.isascii()
                    if ascii_only:
                        lengths.feed(piece)
                piece = next(pieces, b"")
        if limit is not None:
            path.spend(size)  # type: ignore[attr-defined]
        notes: list[str] = []
        if nul:
            probe = head.replace(b"\x00", b"")
            if not probe.strip():
                return LogFacts(False, "skipped", "no text: only NUL bytes")
            if _looks_binary(probe):
                return LogFacts(False, "skipped", _binary_reason(head))
            notes.append(
                f"{nul} NUL byte{'s' if nul > 1 else ''} dropped (a log cut short by a crash often has them)"
            )
        if ascii_only:
            long_lines = lengths.end()
        else:  # characters, not bytes, and undecodable sequences: read again, decoding
            bad, long_lines, valid = _decoded_facts(path)
            if not valid:
                notes.append(
                    f"not valid UTF-8: {bad} undecodable byte sequence{'s' if bad > 1 else ''} replaced"
                )
    except OSError as exc:
        return LogFacts(False, "failed", f"cannot read: {exc.strerror or exc}")
    except _CorruptGzip as exc:
        return LogFacts(False, "failed", f"corrupt gzip file: {exc}")
    if long_lines:
        notes.append(_long_note(long_lines))
    return LogFacts(
        True,
        "partial" if notes else "ok",
        "; ".join(notes) or None,
        newlines,
        last == b"\n",
        size,
        streamed=True,
    )


def text_bytes(path: Path) -> int:
    """About how much text a file holds: its size, or for a gzip file what its trailer says its (last)
    member decompresses to, when that is more."""
    st = path.stat()
    size = st.st_size
    if path.suffix.lower() != ".gz" or size < 18 or not stat.S_ISREG(st.st_mode):  # a FIFO is never opened
        return size
    with path.open("rb") as f:
        f.seek(-4, os.SEEK_END)
        return max(size, int.from_bytes(f.read(4), "little"))


def _decoded_facts(path: Path) -> tuple[int, int, bool]:
    """(U+FFFD in the text decoded with replacement, lines longer than MAX_LINE characters, valid UTF-8)."""
    lenient = codecs.getincrementaldecoder("utf-8")("replace")
    strict = codecs.getincrementaldecoder("utf-8")("strict")
    valid = True
    bad = 0
    lengths = _LongLines()
    with path.open("rb") as f:
        pieces = _decompressed(path, f)[1]
        while True:
            raw = next(pieces, b"")
            final = not raw
            raw = raw.replace(b"\x00", b"")
            text = lenient.decode(raw, final)
            if valid:
                try:
                    strict.decode(raw, final)
                except UnicodeDecodeError:
                    valid = False
            bad += text.count("\ufffd")
            lengths.feed(text)
            if final:
                return bad, lengths.end(), valid


def log_pieces(path: Path, clean: bool) -> Iterator[bytes]:
    """The file's text as `read_log` returns it (gzip undone), in line-aligned pieces of about
    CHUNK_BYTES: as read when `clean` (scan_log found nothing to repair), else with NUL bytes dropped
    and undecodable sequences replaced. A file gone, unreadable or damaged since ends the text there."""
    return _aligned(_repaired(path, clean))


def _repaired(path: Path, clean: bool) -> Iterator[bytes]:
    decoder = None if clean else codecs.getincrementaldecoder("utf-8")("replace")
    try:
        f = path.open("rb")
    except OSError:
        return
    with f:
        try:
            pieces = _decompressed(path, f)[1]
        except OSError:
            return
        while True:
            try:
                raw = next(pieces, b"")
            except (OSError, _CorruptGzip):
                raw = b""
            final = not raw
            if decoder is not None:
                raw = raw.replace(b"\x00", b"")
                if not (raw.isascii() and not decoder.getstate()[0]) or final:
                    raw = decoder.decode(raw, final).encode("utf-8")
            if raw:
                yield raw
            if final:
                return


def _aligned(texts: Iterator[bytes]) -> Iterator[bytes]:
    """`texts` in pieces that each end with a whole line, but the last (a line longer than a piece
    is held until it ends)."""
    carry = b""
    for raw in texts:
        buf = carry + raw  # no copy when nothing is carried (most files: one read, the whole text)
        cut = buf.rfind(b"\n") + 1
        if cut == len(buf):
            carry = b""
            yield buf
        elif cut:
            carry = buf[cut:]
            yield buf[:cut]
        else:
            carry = buf
    if carry:
        yield carry


def read_once(
    path: Path | str, learned: Callable[[LogFacts], None], data: bytes | None = None
) -> Iterator[bytes]:
    """`log_pieces(path, clean)` with `clean` what `scan_log(path)` would say, from one read of the
    file (one gzip inflate; none when its bytes are `data`, read already): what `scan_log` finds is
    found on the way and handed to `learned` once the text is read to its end, its `newlines` left 0
    (whoever reads the pieces counts the lines). `data` of one piece, ASCII, without NUL bytes or long
    lines (most small logs) is handed out as it is, its verdict known before.

    The text is repaired as it goes (NUL bytes dropped, undecodable sequences replaced), which leaves
    the text of a clean file as it is. A file whose first bytes could make it binary, or hold only
    blanks, is scanned first and then read (the verdict needs every byte: the rare case). A file
    found unusable after pieces were handed out (gzip damaged near its end, a read that fails part
    way) raises `NotText` once `learned` has its verdict. Only for files of a bundle on disk (an
    uploaded archive's files are bounded as they inflate: `scan_log`). `path` may be a str (made a
    `Path` only when the text is not handed out as it is)."""
    if (
        data
        and len(data) <= CHUNK_BYTES
        and data.isascii()
        and b"\x00" not in data
        and not (len(data) > MAX_LINE and _long_lines(data))
    ):
        learned(LogFacts(True, "ok", None, 0, data.endswith(b"\n"), len(data), streamed=True))
        yield data
        return
    path = Path(path)
    problem = None if data is not None else refused(path)
    if problem is not None:
        learned(LogFacts(False, *problem))
        return
    gz = False
    given = False  # pieces handed out
    try:
        with path.open("rb") if data is None else io.BytesIO(data) as f:
            gz, pieces = _decompressed(path, f)
            learn = _Learn()
            head = b""
            held: list[bytes] = []
            for piece in pieces:  # the first _BINARY_PROBE bytes decide whether the text can be streamed
                held.append(piece)
                head += piece[: _BINARY_PROBE - len(head)]
                if len(head) >= _BINARY_PROBE:
                    break
            if not head:
                learned(
                    LogFacts(False, "skipped", "empty file" + (" (after gzip decompression)" if gz else ""))
                )
                return
            probe = head.replace(b"\x00", b"")
            if not probe.strip() or _looks_binary(probe):
                held.clear()
                f.close()
                facts = scan_log(path)
                learned(facts)
                if facts.usable:
                    yield from log_pieces(path, facts.status == "ok")
                return
            for text in _aligned(learn.texts(held, pieces)):
                given = True
                yield text
    except OSError as exc:
        facts = LogFacts(False, "failed", f"cannot read: {exc.strerror or exc}")
    except _CorruptGzip as exc:
        facts = LogFacts(False, "failed", f"corrupt gzip file: {exc}")
    else:
        learned(learn.facts())
        return
    learned(facts)
    if given:
        raise NotText(facts.reason)


class _Learn:
    """`scan_log`'s findings over a stream of pieces, each repaired as `log_pieces` repairs it."""

    def __init__(self) -> None:
        self.size = self.nul = self.bad = 0
        self.last = b""
        self.valid = True
        self.lengths = _LongLines()  # in characters: bytes while the text is ASCII, then decoded text
        self.lenient = codecs.getincrementaldecoder("utf-8")("replace")
        self.strict = codecs.getincrementaldecoder("utf-8")("strict")

    def texts(self, held: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
        for raw in itertools.chain(held, rest):
            self.size += len(raw)
            if b"\x00" in raw:
                self.nul += raw.count(b"\x00")
                raw = raw.replace(b"\x00", b"")
            if not raw:
                continue
            self.last = raw[-1:]
            if raw.isascii() and not self.lenient.getstate()[0]:  # most logs: every piece as it is
                self.lengths.feed(raw)
                yield raw
            else:
                yield self._decoded(raw, False)
        end = self._decoded(b"", True)
        if end:
            yield end

    def _decoded(self, raw: bytes, final: bool) -> bytes:
        text = self.lenient.decode(raw, final)
        if self.valid:
            try:
                self.strict.decode(raw, final)
            except UnicodeDecodeError:
                self.valid = False
        self.bad += text.count("\ufffd")
        self.lengths.feed(text)
        return text.encode("utf-8")

    def facts(self) -> LogFacts:
        notes: list[str] = []
        if self.nul:  # the head is text (read_once): the NUL bytes are dropped
            n = self.nul
            notes.append(
                f"{n} NUL byte{'s' if n > 1 else ''} dropped (a log cut short by a crash often has them)"
            )
        if not self.valid:
            notes.append(
                f"not valid UTF-8: {self.bad} undecodable byte sequence{'s' if self.bad > 1 else ''} replaced"
            )
        long_lines = self.lengths.end()
        if long_lines:
            notes.append(_long_note(long_lines))
        return LogFacts(
            True,
            "partial" if notes else "ok",
            "; ".join(notes) or None,
            0,
            self.last == b"\n",
            self.size,
            streamed=True,
        )


__all__ = ["CHUNK_BYTES", "LogFacts", "log_pieces", "read_log", "read_once", "refused", "scan_log"]
