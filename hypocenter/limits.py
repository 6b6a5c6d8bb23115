"""The bounds on everything the server expands from input, and their defaults.

A few bytes of input can name a billion ranks (`n1=0-1000000000000`), a million hosts
(`a[0-65535],b[0-65535],…`), a 4 GiB sparse tar member or a gzip bomb. Every such expansion is
checked against one of these bounds *before* it is made, and a bound that is hit raises
`LimitExceeded` naming the bound's setting, which the APIs answer with 413 / 422 /
RESOURCE_EXHAUSTED, and the analysis loop records as the attempt's failure (never a crash).

    setting                      default      bounds
    max_ranks_per_attempt        262,144      ranks named by an attempt's rank map (all nodes together)
    max_nodes_per_attempt        65,536       nodes of an attempt, and hosts of one Slurm hostlist
    max_records_per_request      65,536       log records + metric points of one OTLP export request
    max_attributes_per_request   131,072      attributes (key-value pairs, nested ones too) of one
                                              OTLP/JSON request, counted before it is parsed
    max_concurrent_decodes       4            OTLP requests decompressed and decoded at the same time
    bundle_max_members           10,000       entries of an uploaded bundle archive
    bundle_max_member_bytes      256 MiB      one file of a bundle, after any decompression
    bundle_max_bytes             1 GiB        all files of a bundle together, after decompression
    bundle_max_ratio             100          decompressed / uploaded bytes (beyond the first 16 MiB)

The server sets the process-wide bounds from its settings at start (`configure`); library use
(`hypocenter analyze`) gets the defaults. This module knows no wire format and no store.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from hypocenter.errors import InputError

MIB = 1 << 20
RATIO_FLOOR_BYTES = 16 * MIB  # below this much output, any compression ratio is fine


class LimitExceeded(InputError):
    """Input that would expand past a bound (HTTP 413 / 422, gRPC RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(f"{message} (limit set by {setting})")
        self.setting = setting


@dataclass(frozen=True)
class Limits:
    max_ranks_per_attempt: int = 1 << 18
    max_nodes_per_attempt: int = 1 << 16
    max_records_per_request: int = 1 << 16
    max_attributes_per_request: int = 1 << 17
    max_concurrent_decodes: int = 4
    bundle_max_members: int = 10_000
    bundle_max_member_bytes: int = 256 * MIB
    bundle_max_bytes: int = 1024 * MIB
    bundle_max_ratio: int = 100

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        """The bounds a settings object (config.Settings) carries under the same names."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)})


DEFAULT = Limits()
_active = DEFAULT
_decodes = threading.BoundedSemaphore(DEFAULT.max_concurrent_decodes)


def configure(limits: Limits) -> None:
    """Make `limits` the process-wide bounds (the server, at start)."""
    global _active, _decodes
    if limits.max_concurrent_decodes != _active.max_concurrent_decodes:
        _decodes = threading.BoundedSemaphore(limits.max_concurrent_decodes)
    _active = limits


def active() -> Limits:
    return _active


@contextmanager
def decode_slot(timeout: float) -> Iterator[None]:
    """Hold one of the `max_concurrent_decodes` slots; TimeoutError when none frees up in `timeout` s."""
    sem = _decodes
    if not sem.acquire(timeout=timeout):
        raise TimeoutError(f"{_active.max_concurrent_decodes} requests are being decoded already")
    try:
        yield
    finally:
        sem.release()


def check_count(what: str, count: int, setting: str) -> None:
    """LimitExceeded when `count` is over the bound `setting` names."""
    bound = getattr(_active, setting)
    if count > bound:
        raise LimitExceeded(f"{what}: {count:,} is over the limit of {bound:,}", setting)


def inflated_past(what: str, limit: int, setting: str) -> LimitExceeded:
    """The error for `what` decompressing to more than `limit` bytes (`inflate`, and readers that
    decompress a stream a piece at a time and count)."""
    return LimitExceeded(f"{what} is over {limit:,} bytes once decompressed", setting)


def inflate(data: bytes, *, wbits: int, limit: int, setting: str, what: str) -> bytes:
    """Decompress zlib/gzip `data` without ever producing more than `limit` bytes (checked while
    decompressing, a chunk at a time). Concatenated gzip members are all read, like gzip.decompress.
    zlib.error and EOFError (truncated data) pass through for the caller to describe."""
    out: list[bytes] = []
    size = 0
    rest = data
    while True:
        d = zlib.decompressobj(wbits)
        chunk = d.decompress(rest, limit - size + 1)
        while True:
            size += len(chunk)
            if size > limit:
                raise inflated_past(what, limit, setting)
            out.append(chunk)
            if not d.unconsumed_tail:
                break
            chunk = d.decompress(d.unconsumed_tail, limit - size + 1)
        if not d.eof:
            raise EOFError("compressed data ends early")
        rest = d.unused_data
        if not rest.strip(b"\x00") or wbits <= zlib.MAX_WBITS:
            return b"".join(out)


__all__ = [
    "DEFAULT",
    "LimitExceeded",
    "Limits",
    "active",
    "check_count",
    "configure",
    "decode_slot",
    "inflate",
    "inflated_past",
]
