"""deploy/prometheus/: recording and alerting rules pass `promtool check rules`, their unit tests pass
`promtool test rules`, every alert follows the monitoring-mixins conventions and is tested both firing
and explicitly silent, and every hypocenter_* series the rules use is one /metrics exposes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_support import needs_promtool, promtool

from hypocenter.engine.fleet import FleetView
from hypocenter.engine.fleet_cost import CostView
from hypocenter.exporter.activity import Activity
from hypocenter.exporter.prometheus import HypocenterCollector
from hypocenter.store.base import FinalDiagnoses
from hypocenter.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "prometheus"
RULE_FILES = sorted(DEPLOY.glob("*.yaml"))
TEST_FILES = sorted((DEPLOY / "tests").glob("*.yaml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"


def _rules() -> list[dict[str, Any]]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def exposed_names() -> set[str]:
    """Every sample name /metrics can expose (families and their _total/_bucket/… samples)."""
    store = SQLiteStore(":memory:")
    names: set[str] = set()
    collector = HypocenterCollector(
        Activity(), store, exporters=("loki",), fleet=FleetView(store), cost=CostView(FinalDiagnoses(store))
    )
    for fam in collector.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names.update(fam.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


@needs_promtool
def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", *map(str, RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(RULE_FILES)


@needs_promtool
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(test_file: Path) -> None:
    r = promtool("test", "rules", test_file.name, cwd=test_file.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_alerts_follow_the_conventions_and_have_runbooks() -> None:
    headings = {
        line[3:].strip().lower() for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    alerts = [r for r in _rules() if "alert" in r]
    assert len(alerts) >= 10
    for a in alerts:
        name = a["alert"]
        assert re.fullmatch(r"Hypocenter[A-Z][A-Za-z]+", name), name
        assert a["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = a["annotations"]
        assert ann["summary"] and "{{" not in ann["summary"], f"{name}: summary must be static"
        assert ann["description"].strip(), f"{name}: no description"
        path, _, anchor = ann["runbook_url"].partition("#")
        assert (REPO / path).resolve() == RUNBOOKS.resolve(), (
            f"{name}: runbook_url {ann['runbook_url']} is not a file of this repository (docs/runbooks.md)"
        )
        assert anchor == name.lower() and anchor in headings, f"{name}: no runbook section"
    for r in _rules():
        if "record" in r:
            assert re.fullmatch(r"[a-z_]+:hypocenter_[a-z0-9_]+:[a-z0-9_]+", r["record"]), r["record"]


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for f in TEST_FILES:
        for t in yaml.safe_load(f.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {r["alert"] for r in _rules() if "alert" in r}
    assert names - firing == set(), "never tested firing"
    assert names - silent == set(), "never tested silent (exp_alerts: [])"


def test_rules_use_only_series_hypocenter_exposes() -> None:
    exposed = exposed_names()
    used = {m for r in _rules() for m in re.findall(r"\bhypocenter_[a-z0-9_]+", r["expr"])}
    recorded = {r["record"].split(":")[1] for r in _rules() if "record" in r}
    assert used - exposed - recorded == set()
