"""Hang-forensics artifacts uploaded to a running server for one attempt.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import datetime, timedelta, timezone

from hypocenter.collector import flight_recorder
from hypocenter.errors import InputError
from hypocenter.lineformat import TimeContext, parse_line
from hypocenter.store.base import Entry

MAX_ARTIFACT_BYTES = flight_recorder.MAX_DUMP_BYTES
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def stream_name(name: str, node: str | None) -> str:
    """`traces/[<node>/]<name>`; InputError for a name or node that is not a plain file/host name."""
    if not _NAME.match(name):
        raise InputError(
            f"name {name[:80]!r}: expected a plain file name (letters, digits, '.', '_', '+', '-'), "
            "e.g. nccl_trace_rank_3"
        )
    if node is not None and not _NODE.match(node):
        raise InputError(f"node {node[:80]!r}: expected a host name")
    return f"traces/{node}/{name}" if node else f"traces/{name}"


def artifact_entries(
    workload: str, attempt: int, name: str, node: str | None, raw: bytes
) -> tuple[list[Entry], str]:
    """The log records one uploaded artifact becomes, and what it was (`flight_recorder` | `text`)."""
    stream = stream_name(name, node)
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise InputError(f"artifact of {len(raw)} bytes is over the {MAX_ARTIFACT_BYTES >> 20} MiB limit")
    if flight_recorder.is_dump_bytes(raw[:4096]) or (
        flight_recorder.is_dump_name(name) and raw.startswith(b"\x80")
    ):
        try:
            text = flight_recorder.render_file(raw, name)
        except flight_recorder.DumpError as exc:
            raise InputError(f"{name}: Flight Recorder dump not read: {exc}") from None
        kind = "flight_recorder"
    else:
        if b"\x00" in raw[:8192]:
            raise InputError(f"{name}: binary data that is not a Flight Recorder dump")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{name}: not UTF-8 text and not a Flight Recorder dump") from None
        kind = "text"
    now = time.time_ns()
    wall = datetime.now(timezone.utc)
    tctx = TimeContext(tz=timezone.utc, start=wall - timedelta(days=30), end=wall)
    entries: list[Entry] = []
    last = now
    for i, line in enumerate(text.split("\n"), start=1):
        if not line and i > 1:
            continue
        stamp = parse_line(line[:4096], tctx).time if line.strip() else None
        last = int(stamp.timestamp() * 1e9) if stamp is not None else last
        digest = hashlib.blake2b(
            "\x1f".join(("artifact", workload, str(attempt), stream, str(i), line)).encode(
                "utf-8", "surrogatepass"
            ),
            digest_size=16,
        ).hexdigest()
        entries.append(
            Entry(
                workload=workload,
                attempt=attempt,
                node=node,
                stream=stream,
                kind="text",
                body=line,
                time_ns=last,
                line=i,
                dedup=digest,
            )
        )
    return entries, kind
