"""Cursors for the REST diagnosis list: an opaque token naming where the previous page ended.

Keyset paging, not offsets: a page continues after the last row shown (its window end and id), so
diagnoses stored while someone pages do not shift rows from one page to the next.
"""

from __future__ import annotations

import base64
import json

from hypocenter.store.base import DiagnosisRow


def encode(row: DiagnosisRow) -> str:
    raw = json.dumps([row.window_end_ns, row.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(token: str) -> tuple[int | None, str]:
    """The (window_end_ns, id) a cursor names; ValueError with a message a client can act on."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        end, ident = json.loads(raw)
    except (ValueError, TypeError):
        raise ValueError(f"cursor {token[:40]!r} is not a next_cursor this server gave") from None
    if not (end is None or (isinstance(end, int) and not isinstance(end, bool))) or not isinstance(
        ident, str
    ):
        raise ValueError(f"cursor {token[:40]!r} is not a next_cursor this server gave")
    return end, ident
