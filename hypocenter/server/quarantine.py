"""Poison attempts: an analysis that fails is recorded with its reason, never retried into a crash.

One record can make an analysis impossible: a rank map naming a trillion ranks, a hostlist
naming millions of hosts, a bug the input reaches. Because records are stored before they are
analysed, such an attempt would be analysed again at every tick and after every restart. So:

    an analysis raises        the attempt is failed with the reason (`attempts.failure`), not due
                              again until new data arrives for it; the explicit trigger answers
                              422 / FAILED_PRECONDITION with the reason; `/metrics` counts it in
                              hypocenter_analysis_failures_total{reason="limit"|"error"}
    the process dies in one   (out of memory, killed) the store still has the attempt marked as
                              being analysed at the next start: counted, and after
                              QUARANTINE_AFTER_INTERRUPTIONS in a row it is failed the same way
                              (reason="interrupted"); one interruption alone is retried, since
                              a SIGKILL during a healthy analysis must not lose its diagnosis

`GET /v1/attempts/{workload}/{attempt}` shows `failure` and `failed_at`; `GET /v1/failures`
lists the quarantined attempts. A successful analysis clears the failure.
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
