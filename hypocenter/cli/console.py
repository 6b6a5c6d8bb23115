"""How every subcommand talks to the person running it: exit codes, stdout that never crashes on
an encoding, one-line messages, colour only on a terminal."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE


class Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text


def color_wanted(stream: TextIO, mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


def emit(text: str, *, utf8: bool = False) -> None:
    """Write to stdout. JSON is UTF-8 whatever the locale; a report on a terminal that cannot show
    some character (PYTHONIOENCODING=ascii, a Latin-1 locale) gets '?' instead of a crash."""
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower().replace("-", "").replace("_", "")
    if encoding == "utf8":
        sys.stdout.write(text)
    elif utf8 and hasattr(sys.stdout, "buffer"):
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(text.encode(sys.stdout.encoding, errors="replace").decode(sys.stdout.encoding))


def one_line(text: str) -> str:
    from hypocenter.config import redact_text  # an error may quote a URL with credentials in it

    text = redact_text(text)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def rule_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="extra rule file or directory (repeatable); added to the built-in catalog",
    )
    sp.add_argument("--no-builtin-rules", action="store_true", help="use only the --rules given")
