"""The lines around each piece of evidence, from what the store still holds of the attempt's logs.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from hypocenter.server.attempts import parse_time
from hypocenter.store.base import Store

_REF = re.compile(r"^(.+):(\d+)$")
MAX_AROUND = 20


class ContextLine(BaseModel):
    line: int
    text: str
    kept: bool = Field(description="false: compaction blanked the line (no rule reads it)")


class EvidenceContext(BaseModel):
    available: bool = Field(description="the store holds this attempt's logs")
    around: int
    files: dict[str, list[ContextLine]] = Field(
        description="per cited file or stream, the lines near its evidence"
    )


def _ns(text: Any) -> int | None:
    when = parse_time(str(text)) if text else None
    return None if when is None else int(when.timestamp() * 1e9)


def evidence_context(store: Store, body: str, around: int) -> EvidenceContext:
    doc = json.loads(body)
    att = doc.get("attempt") or {}
    wanted: dict[str, list[tuple[int, int]]] = {}
    for e in doc.get("evidence") or []:
        m = _REF.match(str(e.get("ref") or ""))
        if m is not None:
            line = int(m.group(2))
            wanted.setdefault(m.group(1), []).append((line - around, line + around))
    row = store.attempt(str(att.get("workload_id")), int(att.get("attempt") or 0))
    if row is None or not wanted:
        return EvidenceContext(available=False, around=around, files={})
    logs = store.attempt_logs(row.id)
    window = att.get("window") or {}
    start, end = _ns(window.get("start")), _ns(window.get("end"))
    if start is not None and end is not None:
        logs += store.node_logs(list(att.get("nodes") or []), start, end)
    files: dict[str, dict[int, ContextLine]] = {}
    for r in logs:
        ranges = wanted.get(r.stream)
        if r.kind != "text" or r.line is None or ranges is None:
            continue
        if any(low <= r.line <= high for low, high in ranges):
            files.setdefault(r.stream, {})[r.line] = ContextLine(line=r.line, text=r.body, kept=bool(r.body))
    return EvidenceContext(
        available=bool(files),
        around=around,
        files={k: [v[n] for n in sorted(v)] for k, v in sorted(files.items())},
    )


__all__ = ["MAX_AROUND", "EvidenceContext", "evidence_context"]
