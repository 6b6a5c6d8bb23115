"""Slurm hostlist expressions: `gpu-a[01-16,20]`, `rack[1-2]-n[01-02]`, `a1,b[3-4]` → node names.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import json
import re

from hypocenter import limits
from hypocenter.errors import InputError

# A range like 1-100000 in a typo'd hostlist would make a million node names; no cluster has that.
# The bound is the setting max_nodes_per_attempt (hypocenter/limits.py); this is its default.
MAX_HOSTS = limits.DEFAULT.max_nodes_per_attempt
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(InputError):
    """A hostlist expression that cannot be expanded (unbalanced brackets, a bad range, too many hosts)."""


class HostlistTooLarge(limits.LimitExceeded, HostlistError):
    """A hostlist that names more hosts than max_nodes_per_attempt: refused even where bad syntax is tolerated."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "max_nodes_per_attempt")


def _max_hosts() -> int:
    return limits.active().max_nodes_per_attempt


def _split_top(text: str) -> list[str]:
    """Split on commas and white space outside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"hostlist {text!r}: nested '[' inside a bracket group")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"hostlist {text!r}: ']' without '['")
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise HostlistError(f"hostlist {text!r}: '[' without ']'")
    if cur:
        parts.append("".join(cur))
    return parts


def _group(body: str, whole: str) -> list[str]:
    """The values of one bracket group: `01-03,07` → 01 02 03 07."""
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        m = _RANGE.fullmatch(item)
        if not m:
            raise HostlistError(f"hostlist {whole!r}: {item!r} is not a number or a range like 01-16")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise HostlistError(f"hostlist {whole!r}: range {item!r} runs backwards")
        if int(hi) - int(lo) >= _max_hosts():
            raise HostlistTooLarge(
                f"hostlist {whole[:200]!r}: range {item!r} has more than {_max_hosts()} values"
            )
        width = len(lo) if lo.startswith("0") else 0
        out.extend(f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    return out


def _expand_one(token: str) -> list[str]:
    names = [""]
    pos = 0
    while pos < len(token):
        start = token.find("[", pos)
        if start < 0:
            names = [n + token[pos:] for n in names]
            break
        prefix = token[pos:start]
        end = token.index("]", start)  # balanced: _split_top checked
        values = _group(token[start + 1 : end], token)
        if len(names) * len(values) > _max_hosts():
            raise HostlistTooLarge(f"hostlist {token[:200]!r} names more than {_max_hosts()} hosts")
        names = [n + prefix + v for n in names for v in values]
        pos = end + 1
    return names


def expand(text: str) -> list[str]:
    """Every host of a hostlist expression, in order, without duplicates; HostlistError if malformed.
    A JSON list of names (as some tools write) is accepted too; empty text or `(null)` is no host."""
    t = text.strip()
    if t in ("", "(null)", "None assigned"):
        return []
    if t.startswith("[") and t.endswith("]"):
        try:
            doc = json.loads(t)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, list):
            return list(dict.fromkeys(str(x) for x in doc))
    out: list[str] = []
    for token in _split_top(t):
        out.extend(_expand_one(token))
        if len(out) > _max_hosts():
            raise HostlistTooLarge(f"hostlist names more than {_max_hosts()} hosts")
    return list(dict.fromkeys(out))


def expand_hostlist(text: str) -> list[str]:
    """Like `expand`, but a part that is not valid hostlist syntax is kept as written. Only a
    hostlist naming more than max_nodes_per_attempt hosts raises (HostlistTooLarge)."""
    try:
        return expand(text)
    except HostlistTooLarge:
        raise
    except HostlistError:
        pass
    out: list[str] = []
    try:
        tokens = _split_top(text.strip())
    except HostlistError:
        tokens = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    for token in tokens:
        try:
            out.extend(_expand_one(token))
        except HostlistTooLarge:
            raise
        except (HostlistError, ValueError):
            out.append(token)
        if len(out) > _max_hosts():  # each token within the bound, all of them together not
            raise HostlistTooLarge(f"hostlist names more than {_max_hosts()} hosts")
    return list(dict.fromkeys(out))
