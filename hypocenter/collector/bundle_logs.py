"""A bundle's logs/<node>/ files read once, by the engine: what `load_bundle(read_once=True)` does per file.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypocenter.collector import flight_recorder, logstream
from hypocenter.collector.logstream import LogFacts, scan_log
from hypocenter.model import Coverage
from hypocenter.sources import FileTextSource


@dataclass(frozen=True, slots=True)
class DumpRead:
    """What the engine's read of a file found it to be: a Flight Recorder dump, rendered as `text`
    (None: not read, `coverage` says why)."""

    text: bytes | None
    coverage: Coverage


class NodeCoverage:
    """The coverage of one logs/<node> directory: an entry per file with a problem (and per Flight
    Recorder dump), and the directory's own entry with its line count, from what reading each file
    found (`LogFacts`), in file order. A file the engine reads once (a `FileTextSource` here) tells it
    when it has been read."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.dump_lines = 0  # Flight Recorder dumps among the logs
        self.files: list[tuple[str, Path | str, LogFacts | FileTextSource]] = []

    def unread(self) -> bool:
        return any(isinstance(got, FileTextSource) for _, _, got in self.files)

    def entries(self) -> list[Coverage]:
        lines = self.dump_lines
        problems: list[str] = []
        out: list[Coverage] = []
        for rel, path, got in self.files:
            # what the scan at load found, what the engine's read found, or a scan now (not read yet)
            newlines = None
            if isinstance(got, LogFacts):
                facts = got
            elif isinstance(got.facts, LogFacts) and got.newlines is not None:
                facts, newlines = got.facts, got.newlines  # the engine counted its lines
            else:
                dump = got.facts if isinstance(got.facts, DumpRead) else _dump_at(Path(path), rel)
                if dump is not None:
                    out.append(dump.coverage)
                    lines += dump.coverage.observations
                    continue
                facts = scan_log(Path(path))
            if newlines is None:
                newlines = facts.newlines
            if facts.status != "ok":
                problems.append(f"{rel}: {facts.reason}")
                out.append(
                    Coverage(
                        connector="files",
                        source=rel,
                        status=facts.status,  # type: ignore[arg-type]
                        observations=newlines,
                        reason=facts.reason,
                    )
                )
            if facts.usable:
                lines += newlines + (0 if facts.ends_with_newline or not facts.nbytes else 1)
        src = self.src
        status = ("partial" if problems else "ok") if lines else ("failed" if problems else "missing")
        return [
            *out,
            Coverage(
                connector="files",
                source=src,
                status=status,  # type: ignore[arg-type]
                observations=lines,
                reason="; ".join(problems) if problems else (None if lines else f"no log files in {src}"),
            ),
        ]


def _dump_at(path: Path, rel: str) -> DumpRead | None:
    """A file not read yet by the engine, looked at as its read would: a dump, or None (a log)."""
    dump = flight_recorder.read_source(path, rel, None)
    if dump is None:
        return None
    return DumpRead(None, dump[1])


def node_files(node_dir: str) -> list[tuple[str, os.DirEntry[str]]]:
    """(path under `node_dir`, entry) of every file below it, as `os.walk` (sorted, dot-files left
    out, symbolic links to directories not followed) lists them: files of a directory, then its
    subdirectories'. A directory that cannot be listed adds nothing (as `os.walk`)."""
    out: list[tuple[str, os.DirEntry[str]]] = []
    _walk(node_dir, "", out)
    return out


def dir_entries(top: str) -> list[os.DirEntry[str]]:
    """The entries of a directory but dot-files, sorted by name. OSError when it cannot be listed."""
    with os.scandir(top) as it:
        entries = [e for e in it if not e.name.startswith(".")]
    entries.sort(key=_name)
    return entries


def entry_is_dir(entry: os.DirEntry[str]) -> bool:
    """A directory, or a symbolic link to one (as `os.walk` and `Path.is_dir` tell)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _walk(top: str, under: str, out: list[tuple[str, os.DirEntry[str]]]) -> None:
    try:
        with os.scandir(top) as it:
            entries = list(it)
    except OSError:
        return
    entries.sort(key=_name)
    dirs: list[os.DirEntry[str]] = []
    for entry in entries:
        if entry_is_dir(entry):
            dirs.append(entry)
        elif not entry.name.startswith("."):
            out.append((under + entry.name, entry))
    for entry in dirs:
        if not entry.is_symlink():
            _walk(entry.path, under + entry.name + "/", out)


def read_whole_size(entry: os.DirEntry[str]) -> int | None:
    """The size of a file the engine reads whole (its read also sniffs it for a dump): a regular,
    non-empty plain file of one piece (at most CHUNK_BYTES, not .gz); None for any other file."""
    try:
        st = entry.stat()
    except OSError:
        return None
    if (
        not stat.S_ISREG(st.st_mode)
        or not st.st_size
        or st.st_size > logstream.CHUNK_BYTES
        or entry.name[-3:].lower() == ".gz"
    ):
        return None
    return st.st_size


def streamed_size(path: Path) -> int | None:
    """About how much text a log file the engine reads in pieces holds (a big or gzip'd file of a
    bundle on disk: `read_whole_size` said no): its size, or a gzip file's inflated size. None for a
    file that is not regular, empty or gone."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or not st.st_size:
            return None
        return logstream.text_bytes(path)
    except OSError:
        return None


class EngineRead(FileTextSource):
    """A log file left to the engine's read: a plain file of one piece read whole (`_read_once`), any
    other streamed (`logstream.read_once`, gzip undone once). What the read finds (`LogFacts`, or a
    `DumpRead` when `sniff` and its first bytes are a Flight Recorder dump's) is left on `facts`; a
    read after that one (rare: a boot-anchor probe) reads the text it found. One object per file
    (a bundle may hold thousands)."""

    __slots__ = ("path", "sniff", "whole")

    def __init__(
        self, rel: str, path: Path | str, node: str | None, size: int, whole: bool, *, sniff: bool = False
    ) -> None:
        super().__init__(rel, self._text, node, nbytes=size)
        self.path = path
        self.whole = whole
        self.sniff = sniff

    def _text(self) -> bytes:
        return b"".join(self.chunks())

    def chunks(self) -> Iterator[bytes]:
        facts = self.facts
        if isinstance(facts, DumpRead):
            return iter(() if facts.text is None else (facts.text,))
        if isinstance(facts, LogFacts):
            return logstream.log_pieces(Path(self.path), facts.status == "ok") if facts.usable else iter(())
        if self.whole:
            return _read_once(self)
        return logstream.read_once(Path(self.path), self._learned)

    def _learned(self, facts: LogFacts | DumpRead) -> None:
        self.facts = facts
        if isinstance(facts, DumpRead) and facts.text is not None:
            self.source = "app"  # as the dump's own TextSource (flight_recorder.source_of)


def read_file(path: str, size: int = 0) -> bytes:
    """A file's bytes, read whole: one open, one read of its `size` (as `stat` told it) when it has
    not grown since, reads to its end when it has."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        data = os.read(fd, size + 1)
        if len(data) <= size:  # a short read of a regular file: its end
            return data
        parts = [data]
        while part := os.read(fd, 1 << 20):
            parts.append(part)
    finally:
        os.close(fd)
    return b"".join(parts)


def _read_once(file: EngineRead) -> Iterator[bytes]:
    """A small plain file's text for the engine, read whole once: a Flight Recorder dump's rendered
    lines (when `file.sniff`: its first bytes decide), else the log checked and repaired (if it must
    be) by `logstream.read_once`, which hands what `scan_log` would say of it to `file`."""
    try:
        raw: bytes | None = read_file(str(file.path), file.nbytes or 0)
    except OSError:
        raw = None  # read_once says why
    rel = file.name
    if file.sniff and raw and flight_recorder.sniffed(raw, rel):
        dump = flight_recorder.source_of(raw, rel, file.node)
        if dump is not None:
            text = dump[0].text if dump[0] is not None else None
            found = DumpRead(
                text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text, dump[1]
            )
            file._learned(found)
            if found.text is not None:
                yield found.text
            return
    yield from logstream.read_once(file.path, file._learned, raw)
