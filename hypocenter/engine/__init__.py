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

from hypocenter.engine.cost import CostSettings, gpu_inventory
from hypocenter.engine.extract import Extractor
from hypocenter.engine.forked import cores
from hypocenter.engine.rules import Ruleset
from hypocenter.engine.verdict import Verdict
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext, Diagnosis
from hypocenter.sources import AttemptInput, FileTextSource, Record, RecordSource, Source

__all__ = ["CostSettings", "Engine", "analyze", "auto_workers", "default_engine"]


class Engine:
    """A loaded ruleset with its compiled extractor and verdict; reusable across attempts."""

    def __init__(self, ruleset: Ruleset, cost: CostSettings | None = None) -> None:
        self.ruleset = ruleset
        self.extractor = Extractor(ruleset)
        self.verdict = Verdict(ruleset, cost)

    def analyze(self, attempt: AttemptInput, *, workers: int | None = 1) -> Diagnosis:
        """The diagnosis of one attempt. `workers`: processes that extract its text streams (None:
        as many as pay for themselves, see `auto_workers`); the diagnosis is the same for any number."""
        context = attempt.context
        tctx = time_context(context)
        n = auto_workers(attempt.sources) if workers is None else workers
        result = self.extractor.extract(
            chain(attempt.sources, [_attempt_record(context)]), context, tctx, workers=n
        )
        return self.verdict.decide(
            context,
            result.events,
            sorted(attempt.coverage, key=lambda c: (c.source, c.connector)),
            gpu_inventory(attempt.sources),
        )


# Below this much text, forking workers costs more than it saves: a fork costs ~10 ms (engine/forked.py);
# measured on 2 cores, 16 MB extracts as fast in one process as in two, 50 MB in 2/3 of the time.
PARALLEL_BYTES = 32 << 20


def auto_workers(sources: Sequence[Source]) -> int:
    """How many processes to extract these sources with: one per available core (at most 4) when
    there are files of at least PARALLEL_BYTES in all, else 1."""
    size = sum(s.nbytes or 0 for s in sources if isinstance(s, FileTextSource))
    return 1 if size < PARALLEL_BYTES else cores()


def _attempt_record(ctx: AttemptContext) -> RecordSource:
    """The scope's own terminal state, as a scheduler record rules can match."""
    text = (
        f"attempt {ctx.workload.id} state={ctx.state or 'UNKNOWN'} reason={ctx.reason or '-'} "
        f"exit_code={ctx.exit_code if ctx.exit_code is not None else '-'} scheduler={ctx.workload.scheduler or '-'}"
    )
    return RecordSource(
        name="attempt.yaml",
        records=[Record(ref="attempt.yaml#state", time=ctx.window.end, node=None, text=text)],
    )


@lru_cache(maxsize=4)
def _cached(extra: tuple[str, ...], builtin: bool, cost: CostSettings) -> Engine:
    from hypocenter.engine.rulecache import load_ruleset_cached

    return Engine(load_ruleset_cached([Path(p) for p in extra], builtin=builtin), cost)


def default_engine(
    extra_rules: Sequence[Path | str] = (), *, builtin: bool = True, cost: CostSettings | None = None
) -> Engine:
    return _cached(tuple(str(p) for p in extra_rules), builtin, cost or CostSettings())


def analyze(attempt: AttemptInput) -> Diagnosis:
    return default_engine().analyze(attempt)
