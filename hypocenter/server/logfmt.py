"""The server's own log lines, safe from the values clients send.

A workload id, node name or file path arrives from the network and ends up in log messages; a
newline in one would start a line of the attacker's choosing in the server's log ("forged" lines
that log shippers and people then trust). `SafeFormatter` escapes every control character of a
record's message (a newline becomes `\\n`), leaving the traceback the formatter appends unchanged.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def escape(text: str) -> str:
    """`text` with control characters written as escapes (`\\n`, `\\x1b`): one record stays one line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class SafeFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


__all__ = ["SafeFormatter", "escape"]
