"""The snippets of docs/sending.md, read from the markdown, so that tests run what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "sending.md"


def snippets(heading: str, lang: str | None = None) -> list[str]:
    """The fenced blocks (of `lang`, if given) under the `##`/`###` heading named `heading`, in order."""
    text = DOC.read_text()
    m = re.search(rf"^#{{2,3}} {re.escape(heading)}\n(.*?)(?=^#{{2,3}} |\Z)", text, re.M | re.S)
    if m is None:
        raise AssertionError(f"docs/sending.md has no section {heading!r}")
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", m.group(1), re.M | re.S)
    return [body for kind, body in blocks if lang is None or kind == lang]


def snippet(heading: str, lang: str) -> str:
    found = snippets(heading, lang)
    if not found:
        raise AssertionError(f"docs/sending.md: no {lang} block under {heading!r}")
    return found[0]
