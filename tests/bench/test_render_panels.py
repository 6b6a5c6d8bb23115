"""bench/render_panels.py: the README's dashboard pictures.

The panels it picks must exist in grafana/dashboards/ (a renamed panel fails here, not in a picture),
its Grafana interval arithmetic matches Grafana's, its OpenMetrics history is what promtool backfills,
and the whole pipeline — hypocenter serve, real Prometheus, headless Chromium with uPlot — on a tiny
corpus writes one valid PNG per dashboard in which every panel was drawn from data. That last test
needs /usr/bin/chromium, node and `npm ci --prefix docs/panels`, which .ci/run installs: under CI
(HYPOCENTER_CI set) a missing one fails the test instead of skipping it."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from prometheus_support import needs_promtool, promtool

from bench.panel_history import LokiRecord, Plan, openmetrics
from bench.render_panels import (
    CHROMIUM,
    PAGES,
    PLAYWRIGHT,
    UPLOT,
    find_panel,
    intervals,
    load_dashboard,
    logql_keeps,
    logql_matchers,
    render,
    round_interval_ms,
    substitute,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


GRAFANA_VARIABLES = {"__interval", "__rate_interval", "__range"}  # the ones render_panels substitutes itself


def test_every_picked_panel_is_in_its_dashboard() -> None:
    for page in PAGES:
        dashboard = load_dashboard(page.uid)
        declared = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_VARIABLES
        for pick in page.picks:
            panel = find_panel(dashboard, pick)
            assert panel["targets"], f"{page.uid}: {pick.title} has no queries"
            for target in panel["targets"]:
                used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
                assert used <= declared, f"{page.uid}: {pick.title} uses undeclared {used - declared}"


def test_a_renamed_panel_is_reported() -> None:
    dashboard = load_dashboard("hypocenter-fleet")
    with pytest.raises(KeyError, match="Top culprit nodes"):
        find_panel(
            {**dashboard, "panels": [p for p in dashboard["panels"] if p["title"] != "Top culprit nodes"]},
            PAGES[0].picks[6],
        )


def test_intervals_are_grafanas() -> None:
    assert round_interval_ms(86_400_000 / 650) == 120_000  # 24 h over 650 px: 2m
    assert round_interval_ms(21_600_000 / 1000) == 20_000  # 6 h over 1000 px: 20s
    # $__interval never below the scrape interval; $__rate_interval = max(interval + scrape, 4 × scrape)
    assert intervals(86_400, 650, 60) == (120, 240)
    assert intervals(21_600, 1000, 60) == (60, 240)
    assert intervals(86_400, 200, 15) == (300, 315)  # 432 s rounds to 5m
    assert intervals(86_400, 650, 60, 3600) == (
        3600,
        3660,
    )  # a panel's "interval": "1h" raises $__interval only
    assert (
        substitute(
            'rate(x{c=~"$cluster"}[$__rate_interval]) $__interval ${cluster}',
            {"cluster": ".*", "__interval": "1m", "__rate_interval": "4m"},
        )
        == 'rate(x{c=~".*"}[4m]) 1m .*'
    )


def test_logql_filters_as_the_panels_use_them() -> None:
    rec = LokiRecord(
        {"service_name": "hypocenter", "cluster": "eos"},
        1,
        "{}",
        {"record": "diagnosis", "workload_id": "81234", "attempt": "0", "nodes": "node02,node03"},
    )
    keep = lambda expr: logql_keeps(logql_matchers(expr), rec)  # noqa: E731
    assert keep(
        '{service_name="hypocenter", cluster=~".*"} | record="diagnosis" | nodes=~".*node02.*" | json summary'
    )
    assert not keep('{service_name="hypocenter", cluster=~"eo"} | record="diagnosis"')
    assert not keep('{service_name="hypocenter"} | record="evidence"')
    assert keep('{service_name="hypocenter"} | workload_id=~"812.*" | attempt=~".+" | record!="evidence"')


@needs_promtool
def test_history_is_openmetrics_that_promtool_backfills(tmp_path: Path) -> None:
    scrape = (
        "# TYPE hypocenter_diagnoses counter\n# HELP hypocenter_diagnoses Final diagnoses\n"
        'hypocenter_diagnoses_total{cluster="eos",outcome="attributed"} %d.0 # {diagnosis_id="dx-1"} 1.0 1.0\n'
        "# TYPE hypocenter_analysis_duration_seconds histogram\n"
        'hypocenter_analysis_duration_seconds_bucket{le="0.1"} %d.0\n'
        'hypocenter_analysis_duration_seconds_bucket{le="+Inf"} %d.0\n'
        "hypocenter_analysis_duration_seconds_count %d.0\nhypocenter_analysis_duration_seconds_sum 0.5\n# EOF\n"
    )
    text = openmetrics(
        [(0.0, scrape % (1, 1, 1, 1)), (60.0, scrape % (2, 2, 2, 2))],
        start=1_700_000_000,
        instance="127.0.0.1:9464",
    )
    assert text.endswith("# EOF\n") and "# {" not in text, "exemplars are left out"
    assert 'up{job="hypocenter",instance="127.0.0.1:9464"} 1.0 1700000060.000' in text
    (tmp_path / "h.om").write_text(text)
    r = promtool("tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "h.om"), str(tmp_path / "tsdb"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((tmp_path / "tsdb").iterdir())


def test_the_day_puts_its_events_in_the_last_six_hours() -> None:
    plan = Plan.draw(50, 1, 86_400, 60)
    assert len(plan.arrivals) == 50 and plan.arrivals == sorted(plan.arrivals)
    assert all(t >= 86_400 - 6 * 3600 for t in (*plan.outage, *plan.malformed, *plan.unscoped))


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0], f"{path.name}: bad IHDR checksum"
    return width, height


def pipeline_missing() -> str | None:
    """What the whole pipeline lacks on this machine, if anything."""
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} is missing (Debian package `chromium`)"
    if not (UPLOT / "uPlot.iife.min.js").is_file() or not PLAYWRIGHT.is_dir() or shutil.which("node") is None:
        return "node, uPlot or playwright-core is missing: npm ci --prefix docs/panels"
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        return "prometheus or promtool is not installed (Debian package `prometheus`)"
    return None


def test_ci_installs_what_the_pipeline_needs() -> None:
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert re.search(r"^apt-get install .*\bchromium\b", ci, re.MULTILINE), (
        ".ci/run does not install chromium"
    )
    assert "npm ci --prefix docs/panels" in ci and "export HYPOCENTER_CI=1" in ci


@pytest.mark.chromium
@pytest.mark.slow
def test_pipeline_draws_every_panel_from_data(tmp_path: Path) -> None:
    missing = pipeline_missing()
    if missing:
        (pytest.fail if os.environ.get("HYPOCENTER_CI") else pytest.skip)(missing + " (.ci/run installs it)")
    # 3 simulated hours: the hourly bar panels need a whole hour bin with data, whatever the minute now
    report = render(
        tmp_path / "img", count=8, seed=3, hours=3.0, workdir=tmp_path / "work", log=lambda _: None
    )
    assert [p.name for p in report.pngs] == [page.png for page in PAGES]
    for png in report.pngs:
        assert _png_size(png) == report.sizes[png.name]
    picked = {(page.uid, pick.title, pick.kind) for page in PAGES for pick in page.picks}
    assert {(r.dashboard, r.title, r.kind) for r in report.rendered} == picked
    empty = [
        f"{r.dashboard}: {r.title} ({r.queries})" for r in report.rendered if r.series == 0 or r.points == 0
    ]
    assert not empty, "panels drawn without data: " + "; ".join(empty)
    spec = json.loads((tmp_path / "work" / "hypocenter-fleet.report.json").read_text())
    assert all("$" not in q for r in spec for q in r["queries"]), "every variable substituted"
