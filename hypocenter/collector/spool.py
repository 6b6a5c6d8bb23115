"""Bytes too many to hold, laid end to end and read back by offset: an uploaded archive's files
(collector/archive.py) and the pod logs a Kubernetes pull streams in (connectors/kubernetes.py).

A `Spool` keeps its bytes in memory until they pass its `memory` bound, then moves them to one
anonymous temporary file (`tempfile.TemporaryFile`: unlinked, or never named where O_TMPFILE
exists; gone with the process). Positional reads (`os.pread`) let any number of readers, forked
workers too, share it. `pieces` reads a stretch of it back as line-aligned pieces, the shape the
engine reads a file in (sources.FileTextSource.chunks).
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any


class Spool:
    """Bytes appended one after another and read back by offset (module docstring). `what` names
    them in the error a failing temporary file raises, `prefix` the temporary file."""

    def __init__(self, memory: int, *, what: str, prefix: str = "hypocenter-spool-") -> None:
        self.memory = memory
        self.what = what
        self.prefix = prefix
        self._memory = bytearray()
        self._file: Any = None
        self.size = 0

    @property
    def on_disk(self) -> bool:
        return self._file is not None

    def append(self, data: bytes) -> None:
        """RuntimeError (the server's fault, not the input's) when the temporary file cannot be made
        or written."""
        try:
            if self._file is None and self.size + len(data) > self.memory:
                self._file = tempfile.TemporaryFile(prefix=self.prefix)  # noqa: SIM115
                weakref.finalize(self, self._file.close)  # closed by `close`, or when the last reader goes
                self._file.write(self._memory)
                self._memory = bytearray()
            if self._file is None:
                self._memory += data
            else:
                self._file.write(data)
        except OSError as exc:
            raise RuntimeError(
                f"{self.what} cannot be spooled to a temporary file in "
                f"{tempfile.gettempdir()} (TMPDIR): {exc}"
            ) from exc
        self.size += len(data)

    def truncate(self, size: int) -> None:
        """Drop every byte from `size` on (what a failed read had appended, before it is read again)."""
        if size >= self.size:
            return
        if self._file is None:
            del self._memory[size:]
        else:
            self._file.flush()
            self._file.truncate(size)
            self._file.seek(size)
        self.size = size

    def seal(self) -> None:
        """Every byte written: reads may start."""
        if self._file is not None:
            self._file.flush()

    def read_at(self, offset: int, n: int) -> bytes:
        if self._file is None:
            return bytes(memoryview(self._memory)[offset : offset + n])
        out = os.pread(self._file.fileno(), n, offset)
        while len(out) < n:  # a short read is allowed of pread; the bytes are all there
            more = os.pread(self._file.fileno(), n - len(out), offset + len(out))
            if not more:
                break
            out += more
        return out

    def pieces(self, offset: int, size: int, piece: int) -> Iterator[bytes]:
        """The `size` bytes from `offset` in pieces of about `piece` bytes that each end with a whole
        line, but the last (a line longer than a piece is read on until it ends)."""
        end = offset + size
        while offset < end:
            data = self.read_at(offset, min(piece, end - offset))
            cut = data.rfind(b"\n") + 1
            while cut == 0 and data and offset + len(data) < end:
                more = self.read_at(offset + len(data), min(piece, end - offset - len(data)))
                if not more:
                    break
                if b"\n" in more:
                    cut = len(data) + more.rfind(b"\n") + 1
                data += more
            if offset + len(data) < end and cut:
                data = data[:cut]
            if not data:
                return  # the spool was cut short (it never is once sealed)
            offset += len(data)
            yield data

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


__all__ = ["Spool"]
