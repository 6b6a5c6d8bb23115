"""Rule patterns compiled for linear-time matching: a log line must never cost quadratic time.

Python's `re` backtracks: `(?P<client>\\S+?):? Connection …` searched over a 64 KiB line with no
space tries every start position and every length, 12 s for one line, while ingest waits. So:

    RE2 (PyPI `google-re2`)   every pattern it accepts (all built-in patterns but one): time linear
                              in the text, whatever the pattern.
    Python `re`, bounded      built-in catalog only: a pattern RE2 cannot run (lookaround,
                              backreference), reviewed with the catalog, without nested quantifiers
                              (`(a+)+`, `(\\w*x?)*`), that only ever sees the first
                              `FALLBACK_MAX_CHARS` characters of a text. A user's rule file must be
                              RE2 throughout: no syntactic check catches every backtracking pattern
                              (`(?=a)(a|aa)+$` takes exponential time on 45 characters).

`pattern_problem` is what the rule loader and `hypocenter rules check` ask: the reason a pattern
is refused (None when it is fine). `pattern_note` says when a pattern runs on the fallback.

This module does not decide what a match means; extraction and verdict do.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import re2  # type: ignore[import-untyped]

# The parser behind `re` (re._parser since 3.11; the old sre_parse name warns on import).
sre_parse: Any = importlib.import_module("re._parser")
sre_constants: Any = importlib.import_module("re._constants")

# The fallback's text cap: Python's engine on 1,024 characters costs milliseconds even when it backtracks.
FALLBACK_MAX_CHARS = 1024

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a pattern RE2 refuses is reported by us, not printed on stderr by absl


class Match(Protocol):
    def groupdict(self) -> dict[str, Any]: ...
    def group(self, *args: Any) -> Any: ...
    def span(self, group: int = 0) -> tuple[int, int]: ...
    def start(self, group: int = 0) -> int: ...
    def end(self, group: int = 0) -> int: ...


class Pattern(Protocol):
    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> Match | None: ...


@dataclass(frozen=True)
class _Bounded:
    """Python's `re` over at most FALLBACK_MAX_CHARS characters of each text."""

    regex: re.Pattern[str]

    @property
    def pattern(self) -> str:
        return self.regex.pattern

    def search(self, text: str) -> Match | None:
        return self.regex.search(text[:FALLBACK_MAX_CHARS])


class _RE2:
    """An RE2 pattern with the `search` the engine uses."""

    def __init__(self, pattern: str, compiled: Any) -> None:
        self._pattern = pattern
        self._compiled = compiled

    @property
    def pattern(self) -> str:
        return self._pattern

    def search(self, text: str) -> Match | None:
        m: Match | None = self._compiled.search(text)
        return m


def _re2(pattern: str) -> Any | None:
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error:
        return None


def compile_pattern(pattern: str) -> Pattern:
    """The pattern compiled for matching: RE2 if it can, else bounded `re` (check `pattern_problem` first)."""
    compiled = _re2(pattern)
    if compiled is not None:
        return _RE2(pattern, compiled)
    return _Bounded(re.compile(pattern))


class LazyPattern:
    """`compile_pattern(pattern)`, compiled at its first search: a run meets few of a catalog's
    patterns, and compiling all of them costs more than a small bundle's analysis."""

    __slots__ = ("pattern", "search")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.search: Callable[[str], Match | None] = self._compile_then_search

    def _compile_then_search(self, text: str) -> Match | None:
        self.search = compile_pattern(self.pattern).search
        return self.search(text)


def pattern_problem(pattern: str, *, builtin: bool = False) -> str | None:
    """Why this pattern cannot be matched in linear time (None when it can). Only the built-in
    catalog (`builtin`) may use the bounded fallback."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"regex does not compile: {exc}"
    if _re2(pattern) is not None:
        return None
    if not builtin:
        return (
            f"pattern '{pattern}' is not one RE2 can run (lookaround such as (?=…) (?!…) (?<=…), or a "
            "backreference such as \\1): rule patterns must be RE2 patterns, whose matching time is "
            "linear in the line. Hint: match the wanted text without the lookaround and exclude the "
            "rest with a narrower pattern or with the attribution's `unless:` fields"
        )
    nested = _nested_quantifier(pattern)
    if nested is not None:
        return (
            f"pattern '{pattern}' has a nested quantifier (a group repeated with {nested} that itself repeats): "
            "with lookaround or a backreference it runs on Python's backtracking engine, where that takes "
            "exponential time on some lines; flatten the repeat, or drop the lookaround so that RE2 runs it"
        )
    return None


def pattern_note(pattern: str) -> str | None:
    """A remark for `rules check`: the pattern runs on the bounded fallback (None on RE2)."""
    if _re2(pattern) is not None or pattern_problem(pattern, builtin=True) is not None:
        return None
    return (
        f"uses lookaround or a backreference, which RE2 cannot run: matched with Python's engine against "
        f"the first {FALLBACK_MAX_CHARS} characters of a text only"
    )


_REPEATS = (
    sre_constants.MAX_REPEAT,
    sre_constants.MIN_REPEAT,
    getattr(sre_constants, "POSSESSIVE_REPEAT", None),
)


def _nested_quantifier(pattern: str) -> str | None:
    """The quantifier of the first repeat that contains another repeat (`*`, `+`, `{2,}`), or None."""
    try:
        tree = sre_parse.parse(pattern)
    except re.error:
        return None
    for lo, hi, body in _repeats(tree):
        if _repeats_many(hi) and any(_repeats_many(h) for _, h, _ in _repeats(body)):
            return _render(lo, hi)
    return None


def _repeats_many(hi: Any) -> bool:
    return bool(hi is sre_constants.MAXREPEAT or hi > 1)


def _repeats(tree: Any) -> Iterator[tuple[int, Any, Any]]:
    """(min, max, body) of every repeat in a parsed pattern, outermost first."""
    for op, arg in tree:
        if op in _REPEATS:
            lo, hi, body = arg
            yield lo, hi, body
            yield from _repeats(body)
        elif op is sre_constants.SUBPATTERN:
            yield from _repeats(arg[-1])
        elif op is sre_constants.BRANCH:
            for branch in arg[1]:
                yield from _repeats(branch)
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            yield from _repeats(arg[1])
        elif op is sre_constants.GROUPREF_EXISTS:
            for branch in arg[1:]:
                if branch is not None:
                    yield from _repeats(branch)
        elif op is getattr(sre_constants, "ATOMIC_GROUP", None):
            yield from _repeats(arg)


def _render(lo: int, hi: Any) -> str:
    if hi is sre_constants.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    return f"{{{lo},{hi}}}"


def suffix_pattern(pattern: str) -> Pattern | None:
    """A pattern that finds a match in every text one of whose suffixes `pattern` finds a match in
    (and maybe in others), to run over a whole line where `pattern` runs over the message after its
    prefixes: `pattern` without the assertions that read what comes before a position (`^`, `\\A`,
    `\\b`, `\\B`), which only ever rule matches out. None when that cannot be told from the text
    (quoting) or the result is not an RE2 pattern (the bounded fallback only sees a
    text's first characters, where a suffix and the whole line differ)."""
    if "\\Q" in pattern or _re2(pattern) is None:
        return None
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if not in_class and pattern[i + 1] in "AbB":
                i += 2
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class and pattern.startswith("[:", i):  # a POSIX class, [:alpha:]
            end = pattern.find(":]", i + 2)
            if end < 0:
                return None
            out.append(pattern[i : end + 2])
            i = end + 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a first `]` is a member of the class
                out.append("]")
                i += 1
            continue
        elif c == "^":
            i += 1
            continue
        out.append(c)
        i += 1
    compiled = _re2("".join(out))
    return None if compiled is None else _RE2("".join(out), compiled)


_PER_LINE = re2.Options()
_PER_LINE.log_errors = False
_PER_LINE.never_nl = True  # a match never holds a newline: over lines joined, it lies within one


def per_line(relaxed: str) -> Any | None:
    """A `suffix_pattern` compiled to run over lines joined by newlines: each match within one line
    (`$` its end), so every line the pattern finds a match in has one — or None when a line's end
    cannot be told from the joined text's (`\\z`, a flag group that turns `(?m)` off)."""
    if "\\z" in relaxed or re.search(r"\(\?[a-zA-Z]*-[a-zA-Z]*m", relaxed):
        return None
    try:
        return re2.compile("(?m)" + relaxed, options=_PER_LINE)
    except re2.error:
        return None


__all__ = [
    "FALLBACK_MAX_CHARS",
    "Match",
    "Pattern",
    "compile_pattern",
    "pattern_note",
    "pattern_problem",
    "per_line",
    "suffix_pattern",
]
