"""Correlate events and decide: which event began the failure, which are its symptoms.

Three steps, one object each, run in this order by `Verdict.decide`:

1. Classify (`classify.Classifier`): node-scoped events (kernel, metrics) count only for the
   attempt's nodes and window (with a clock-skew allowance); workload-scoped events (app,
   scheduler) always count. Each event takes the role of the highest-precedence attribution rule
   that matches it: root cause, symptom or context.
2. Candidates (`candidates.CandidateSearch`): group root-cause evidence into candidates, add the
   Python analyzers' findings, merge the same cause seen on several nodes at about the same time,
   and drop every candidate that another one explains (by class, locality, time).
3. Report (`report.Decision`, `report.Report`): one candidate left → attributed; several starting
   within the ambiguity window → ambiguous (all listed); none → unattributed. A completed attempt
   is not_failed. Then quality, symptoms, evidence and the next step make the `Diagnosis`.

Deterministic by construction: inputs are sorted by a total order before any decision, and ties
break on rule id and node name, never on arrival order.
"""

from __future__ import annotations

from datetime import datetime

from hypocenter.engine.candidates import CandidateSearch
from hypocenter.engine.classify import Classifier, Role
from hypocenter.engine.cost import CostSettings
from hypocenter.engine.report import Decision, Report
from hypocenter.engine.rules import Rule, Ruleset
from hypocenter.model import AttemptContext, Coverage, Diagnosis, Event


class Verdict:
    """A ruleset's classifier, candidate search and report, applied to one attempt at a time."""

    def __init__(self, ruleset: Ruleset, cost: CostSettings | None = None) -> None:
        self.ruleset = ruleset
        self.classifier = Classifier(ruleset)
        self.search = CandidateSearch(self.classifier.analyzer_rules)
        self.report = Report(ruleset.fingerprint, cost)

    def decide(
        self,
        ctx: AttemptContext,
        events: list[Event],
        coverage: list[Coverage],
        gpus: dict[str, int] | None = None,
    ) -> Diagnosis:
        """The diagnosis; `gpus`: GPUs per node seen in the attempt's DCGM series (engine/cost.py)."""
        classified = self.classifier.attempt(ctx, events)
        causes = self.search.find(classified)
        return self.report.diagnosis(classified, causes, Decision.of(classified, causes), coverage, gpus)

    def classify(self, events: list[Event], end: datetime | None = None) -> list[Role]:
        """Each in-scope event with the attribution rule that gives it its role (unclassified ones dropped);
        `end` is when the attempt ended, if known."""
        return self.classifier.roles(events, end)

    def analyzer_rules_sorted(self) -> list[Rule]:
        return self.search.analyzer_rules
