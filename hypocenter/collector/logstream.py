"""A bundle's log files read in fixed-size pieces: never a whole file in memory.

    scan_log(path)          → LogFacts: what `bundle.read_log` says of the file (status, reason,
                              lines), found while reading it CHUNK_BYTES at a time
    log_pieces(path, clean) → the text the engine scans (the bytes `read_log` would return), in pieces
                              that each end with a whole line, but the last

A plain file is streamed. A gzip file (rotated logs are small) and a file of an uploaded archive
(already in memory, within the upload's bounds) go through `read_log` whole, as before.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypocenter.collector.bundle import (
    _BINARY_PROBE,
    _binary_reason,
    _long_lines,
    _looks_binary,
    read_log,
    refused,
)
from hypocenter.lineformat import MAX_LINE

CHUNK_BYTES = 8 << 20
"""How much of a file is read at a time; a line longer than this is held whole."""


@dataclass(frozen=True, slots=True)
class LogFacts:
    usable: bool              # False: not text the engine can read (status and reason say why)
    status: str
    reason: str | None
    newlines: int = 0
    ends_with_newline: bool = False
    nbytes: int = 0
    streamed: bool = False    # read in pieces (log_pieces can stream it); else read_log reads it whole


def streamable(path: Path, first: bytes) -> bool:
    """A plain file on disk (not gzip, not a member of an uploaded archive)."""
    return (getattr(path, "inflate_limit", None) is None and path.suffix.lower() != ".gz"
            and not first.startswith(b"\x1f\x8b"))


class _LongLines:
    """Counts lines longer than MAX_LINE (characters of str pieces, bytes of bytes pieces) over a
    stream of pieces, as `bundle._long_lines` does over the whole text."""

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
            self.count += _long_lines(text[first + 1:last])
        self.open = len(text) - last - 1

    def end(self) -> int:
        return self.count + (1 if self.open > MAX_LINE else 0)


def _long_note(n: int) -> str:
    return (f"{n} line{'s' if n > 1 else ''} longer than {MAX_LINE // 1024} KiB: "
            f"only the first {MAX_LINE // 1024} KiB of such a line is matched against rules")


def scan_log(path: Path) -> LogFacts:
    """`read_log`'s verdict on one log file, reading a plain file in CHUNK_BYTES pieces. Never raises."""
    problem = refused(path)
    if problem is not None:
        return LogFacts(False, *problem)
    try:
        with path.open("rb") as f:
            first = f.read(CHUNK_BYTES)
            if not streamable(path, first):
                return _whole(path)
            if not first:
                return LogFacts(False, "skipped", "empty file")
            nul = newlines = size = 0
            ascii_only = True
            last = b""
            lengths = _LongLines()
            piece = first
            while piece:
                size += len(piece)
                newlines += piece.count(b"\n")
                if b"\x00" in piece:
                    nul += piece.count(b"\x00")
                    piece = piece.replace(b"\x00", b"")
                if piece:
                    last = piece[-1:]
                    ascii_only = ascii_only and piece.isascii()
                    if ascii_only:
                        lengths.feed(piece)
                piece = f.read(CHUNK_BYTES)
    except OSError as exc:
        return LogFacts(False, "failed", f"cannot read: {exc.strerror or exc}")
    notes: list[str] = []
    if nul:
        probe = first[:_BINARY_PROBE].replace(b"\x00", b"")
        if not probe.strip():
            return LogFacts(False, "skipped", "no text: only NUL bytes")
        if _looks_binary(probe):
            return LogFacts(False, "skipped", _binary_reason(first))
        notes.append(f"{nul} NUL byte{'s' if nul > 1 else ''} dropped (a log cut short by a crash often has them)")
    if ascii_only:
        long_lines = lengths.end()
    else:  # characters, not bytes, and undecodable sequences: read again, decoding
        bad, long_lines, valid = _decoded_facts(path)
        if not valid:
            notes.append(f"not valid UTF-8: {bad} undecodable byte sequence{'s' if bad > 1 else ''} replaced")
    if long_lines:
        notes.append(_long_note(long_lines))
    return LogFacts(True, "partial" if notes else "ok", "; ".join(notes) or None, newlines, last == b"\n", size,
                    streamed=True)


def _decoded_facts(path: Path) -> tuple[int, int, bool]:
    """(U+FFFD in the text decoded with replacement, lines longer than MAX_LINE characters, valid UTF-8)."""
    lenient = codecs.getincrementaldecoder("utf-8")("replace")
    strict = codecs.getincrementaldecoder("utf-8")("strict")
    valid = True
    bad = 0
    lengths = _LongLines()
    with path.open("rb") as f:
        while True:
            raw = f.read(CHUNK_BYTES)
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


def _whole(path: Path) -> LogFacts:
    data, status, reason = read_log(path)
    if data is None:
        return LogFacts(False, status, reason)
    return LogFacts(True, status, reason, data.count(b"\n"), data.endswith(b"\n"), len(data))


def log_pieces(path: Path, clean: bool) -> Iterator[bytes]:
    """The file's text as `read_log` returns it, in line-aligned pieces of about CHUNK_BYTES: as read
    when `clean` (scan_log found nothing to repair), else with NUL bytes dropped and undecodable
    sequences replaced. A file gone or unreadable since ends the text there."""
    decoder = None if clean else codecs.getincrementaldecoder("utf-8")("replace")
    carry = b""
    try:
        f = path.open("rb")
    except OSError:
        return
    with f:
        while True:
            try:
                raw = f.read(CHUNK_BYTES)
            except OSError:
                raw = b""
            final = not raw
            if decoder is not None:
                raw = raw.replace(b"\x00", b"")
                if not (raw.isascii() and not decoder.getstate()[0]) or final:
                    raw = decoder.decode(raw, final).encode("utf-8")
            if final:
                if carry or raw:
                    yield carry + raw
                return
            buf = carry + raw  # no copy when nothing is carried (most files: one read, the whole text)
            cut = buf.rfind(b"\n") + 1
            if cut == len(buf):
                carry = b""
                yield buf
            elif cut:
                carry = buf[cut:]
                yield buf[:cut]
            else:
                carry = buf  # a line longer than a piece: held until it ends


__all__ = ["CHUNK_BYTES", "LogFacts", "log_pieces", "scan_log", "streamable"]
