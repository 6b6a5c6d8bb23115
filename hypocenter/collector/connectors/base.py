"""What every pull connector is: the shapes it returns, how it fails, how it retries.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

# Re-exported: connectors and their callers import the connector errors from here.
from hypocenter.errors import ConnectorError as ConnectorError
from hypocenter.errors import ErrorKind as ErrorKind
from hypocenter.model import AttemptContext, Coverage
from hypocenter.sources import Source

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Every connector call has a timeout; transient failures are retried with jittered backoff."""

    timeout_s: float = 30.0  # one call (HTTP request, scheduler command)
    attempts: int = 4  # calls in all, the first included
    backoff_s: float = 0.5  # first wait; doubles each time, capped at max_backoff_s
    max_backoff_s: float = 8.0

    def delays(self) -> list[float]:
        return [min(self.max_backoff_s, self.backoff_s * 2**i) for i in range(max(0, self.attempts - 1))]


def with_retries(
    call: Callable[[], T], policy: RetryPolicy, *, what: str, sleep: Callable[[float], None] = time.sleep
) -> T:
    """Run `call`; retry a transient ConnectorError per `policy`; re-raise the last error with the
    number of tries in its message. Non-transient errors are raised at once."""
    delays = policy.delays()
    for i in range(len(delays) + 1):
        try:
            return call()
        except ConnectorError as exc:
            if not exc.transient or i == len(delays):
                if exc.transient and i:
                    # connectors' messages mostly begin with `what` already: name it once
                    said = str(exc) if str(exc).startswith(what) else f"{what}: {exc}"
                    raise ConnectorError(f"{said} (gave up after {i + 1} tries)", kind=exc.kind) from None
                raise
            # full jitter would make runs differ in timing only, never in results
            sleep(delays[i] * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")


@dataclass(slots=True)
class Collected:
    """What a data connector gathered for one attempt."""

    sources: list[Source] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)


@dataclass(slots=True)
class Scope:
    """What a scope connector found for one job id: the attempt and the scheduler's own account."""

    context: AttemptContext
    collected: Collected = field(default_factory=Collected)
    notes: list[str] = field(default_factory=list)  # e.g. "attempt 2 of 3 (requeued twice)"
    tasks: dict[str, list[int]] = field(
        default_factory=dict
    )  # node → task numbers of the job's main step (rankmap.py)


class ScopeConnector(Protocol):
    name: str

    def scope(self) -> Scope: ...


class DataConnector(Protocol):
    name: str

    def collect(self, context: AttemptContext) -> Collected: ...


def merge(parts: Sequence[Collected]) -> Collected:
    out = Collected()
    for p in parts:
        out.sources.extend(p.sources)
        out.coverage.extend(p.coverage)
    out.coverage.sort(key=lambda c: (c.source, c.connector))
    return out
