"""The deterministic attribution engine: extract events, correlate, decide.

    Engine.analyze(attempt)  → Diagnosis   (an AttemptInput: from a bundle, a pull or the server's store)

The engine never sees a connector type, only `Source`s and `Coverage`, and never imports the
collector: callers load a bundle (`hypocenter.collector.bundle.load_bundle`) or pull, then analyze.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain
from pathlib import Path

from hypocenter.engine.extract import Extractor
from hypocenter.engine.rules import Ruleset, load_ruleset
from hypocenter.engine.verdict import Verdict
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Diagnosis
from hypocenter.sources import AttemptInput, Record, RecordSource

__all__ = ["Engine", "analyze", "default_engine"]


class Engine:
    """A loaded ruleset with its compiled extractor and verdict; reusable across attempts."""

    def __init__(self, ruleset: Ruleset) -> None:
        self.ruleset = ruleset
        self.extractor = Extractor(ruleset)
        self.verdict = Verdict(ruleset)

    def analyze(self, attempt: AttemptInput) -> Diagnosis:
        context = attempt.context
        tctx = time_context(context)
        result = self.extractor.extract(chain(attempt.sources, [_attempt_record(context)]), context, tctx)
        return self.verdict.decide(context, result.events,
                                   sorted(attempt.coverage, key=lambda c: (c.source, c.connector)))


def _attempt_record(ctx: AttemptContext) -> RecordSource:
    """The scope's own terminal state, as a scheduler record rules can match."""
    text = (f"attempt {ctx.workload.id} state={ctx.state or 'UNKNOWN'} reason={ctx.reason or '-'} "
            f"exit_code={ctx.exit_code if ctx.exit_code is not None else '-'} scheduler={ctx.workload.scheduler or '-'}")
    return RecordSource(name="attempt.yaml", records=[Record(ref="attempt.yaml#state", time=ctx.window.end, node=None, text=text)])


@lru_cache(maxsize=4)
def _cached(extra: tuple[str, ...], builtin: bool) -> Engine:
    return Engine(load_ruleset([Path(p) for p in extra], builtin=builtin))


def default_engine(extra_rules: Sequence[Path | str] = (), *, builtin: bool = True) -> Engine:
    return _cached(tuple(str(p) for p in extra_rules), builtin)


def analyze(attempt: AttemptInput) -> Diagnosis:
    return default_engine().analyze(attempt)
