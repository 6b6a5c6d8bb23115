"""Correlate events and decide: which event began the failure, which are its symptoms.

Three steps run in order by `Verdict.decide`: classify events (classify.py), find the candidate
causes still standing (candidates.py), report a diagnosis (report.py). Deterministic by
construction: same events and rules, same diagnosis.

Details and reasons: docs/modules.md.
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
