"""Poison attempts: an analysis that fails is recorded with its reason, never retried into a crash.

Records are stored before they are analysed, so an input that breaks analysis would otherwise be
retried at every tick and restart. A failed or repeatedly interrupted analysis marks the attempt
failed until new data arrives for it.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from hypocenter.errors import InputError
from hypocenter.limits import LimitExceeded

QUARANTINE_AFTER_INTERRUPTIONS = 2
FAILURE_KINDS = ("limit", "error", "interrupted")
_MAX_REASON = 2000


class AnalysisFailed(InputError):
    """The analysis of an attempt failed; it is quarantined with `reason` (422 / FAILED_PRECONDITION)."""

    def __init__(self, workload: str, attempt: int, reason: str) -> None:
        super().__init__(f"analysis of workload {workload!r} attempt {attempt} failed: {reason}")
        self.reason = reason


def failure_kind(exc: BaseException) -> str:
    return "limit" if isinstance(exc, LimitExceeded) else "error"


def describe(exc: BaseException) -> str:
    """The reason stored and shown for a failed analysis: what hit which bound, or the error."""
    if isinstance(exc, LimitExceeded):
        text = str(exc)
    elif isinstance(exc, MemoryError):
        text = "out of memory"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON] + "…"


__all__ = ["FAILURE_KINDS", "QUARANTINE_AFTER_INTERRUPTIONS", "AnalysisFailed", "describe", "failure_kind"]
