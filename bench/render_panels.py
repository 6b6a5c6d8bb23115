"""Render the Grafana dashboards' key panels as PNGs for the README, from real data, without Grafana.

    python -m bench.render_panels --out docs/img [--count 240] [--seed 11] [--hours 24] [--workdir DIR]

End to end, in a temporary directory:

 1. generate a corpus (bench.generate, prior `real`, at most 16 nodes a job);
 2. run `hypocenter serve` and feed it the corpus over a simulated day, scraping its real `/metrics`
    every simulated minute (bench/panel_history.py);
 3. write the snapshots as OpenMetrics, backfill them with `promtool tsdb create-blocks-from
    openmetrics`, and start a real `prometheus` on that TSDB, also scraping the live server;
 4. read each picked panel from grafana/dashboards/*.json — its PromQL with the dashboard's variables,
    `$__interval` and `$__rate_interval` substituted the way Grafana does, its title, type, unit, legend
    and layout — and run the queries against that Prometheus (`query_range` / `query`);
 5. draw the panels with uPlot (docs/panels/, vendored with npm) in headless Chromium driven by
    playwright-core, styled like Grafana's dark theme, and screenshot one PNG per dashboard
    (quantized by pngquant when it is installed, which keeps each well under 200 KB).

Loki-backed panels (the recent-diagnoses table, the verdict, the evidence, the root-cause annotation)
come from the entries hypocenter pushed to the loopback Loki stand-in, filtered in Python the way the
panel's LogQL filters them; no Loki runs. Not drawn: annotations from Grafana's annotations API,
stat sparklines, and panels of other exporters' series (the drill-down's dcgm-exporter Xid panel).

Needs the Debian packages `prometheus` and `chromium` (optionally `pngquant`), node, and
`npm ci --prefix docs/panels`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.generate import generate
from bench.panel_history import (
    JOB,
    Day,
    ExportSink,
    LokiRecord,
    Plan,
    Server,
    loki_in_sim_time,
    openmetrics,
    run_day,
    stop_process,
)

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "grafana" / "dashboards"
PANELS_DIR = REPO / "docs" / "panels"
UPLOT = PANELS_DIR / "node_modules" / "uplot" / "dist"
PLAYWRIGHT = PANELS_DIR / "node_modules" / "playwright-core"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCRAPE_S = 60.0
PAGE_WIDTH = 1400
GRID_ROW_PX = 30  # Grafana's grid: 24 columns, 30 px rows, 8 px gutters
GUTTER_PX = 8
HEADER_PX = 64
FOOTER_PX = 24  # the line saying what drew the picture


@dataclass(frozen=True)
class Pick:
    """One panel to draw, found by title and type; `w` widens it when its neighbour is left out."""

    title: str
    kind: str
    w: int | None = None


@dataclass(frozen=True)
class Page:
    uid: str
    png: str
    picks: tuple[Pick, ...]
    range_from: str = ""  # default: the dashboard's own time range


PAGES = (
    Page(
        "hypocenter-fleet",
        "fleet-overview.png",
        (
            Pick("Failed attempts diagnosed", "stat"),
            Pick("Unattributed share", "stat"),
            Pick("Hardware and network causes", "stat"),
            Pick("Attempts awaiting a verdict", "stat"),
            Pick("Diagnoses over time, by domain", "timeseries"),
            Pick("Unattributed share", "timeseries"),
            Pick("Top culprit nodes", "bargauge"),
            Pick("Top culprit GPUs", "bargauge"),
            Pick("Top culprit fabric ports", "bargauge"),
            Pick("Recent diagnoses", "table"),
        ),
    ),
    # Reached from the fleet table's link, which carries the fleet's time range.
    Page(
        "hypocenter-attempt",
        "attempt-drill-down.png",
        (
            Pick("Verdict", "logs"),
            Pick("Culprit and affected nodes", "table"),
            Pick("Evidence", "logs"),
            Pick("Diagnoses in this cluster", "timeseries", w=24),
        ),
        range_from="now-24h",
    ),
    Page(
        "hypocenter-self",
        "service-health.png",
        (
            Pick("Instances up", "stat"),
            Pick("Store", "stat"),
            Pick("Attempts awaiting a verdict", "stat"),
            Pick("Diagnoses waiting to export", "stat"),
            Pick("Ingest: records/s", "timeseries"),
            Pick("Ingest: bytes/s", "timeseries"),
            Pick("Refused requests/s and rejected records/s", "timeseries"),
            Pick("Analysis time", "timeseries"),
            Pick("Exports/s", "timeseries"),
            Pick("Oldest diagnosis waiting to export", "timeseries"),
            Pick("Build", "table"),
        ),
    ),
    Page(
        "hypocenter-cost",
        "cost-of-failures.png",
        (
            Pick("GPU-hours lost", "stat"),
            Pick("Share of the top cause", "stat"),
            Pick("Worst component's GPU-hours", "stat"),
            Pick("Lost GPU-hours over time, by domain", "timeseries"),
            Pick("Pareto of causes (GPU-hours lost)", "bargauge"),
            Pick("Worst components (GPU-hours lost)", "bargauge"),
            Pick("Time to detect (median, by cause)", "bargauge"),
            Pick("MTTF per domain", "bargauge"),
            Pick("Lowest ETTR (workloads)", "bargauge"),
        ),
        range_from="now-24h",
    ),
)


def load_dashboard(uid: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DASHBOARDS / f"{uid}.json").read_text())
    return doc


def find_panel(dashboard: dict[str, Any], pick: Pick) -> dict[str, Any]:
    """The dashboard's panel with the pick's title and type; KeyError names what is missing."""
    for p in dashboard["panels"]:
        if p.get("title") == pick.title and p.get("type") == pick.kind:
            return dict(p)
    raise KeyError(f"dashboard {dashboard['uid']} has no {pick.kind} panel titled {pick.title!r}")


# ----------------------------------------------------------------------------------------- Grafana's arithmetic

_ROUND = [
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (1050000, 600000),
    (1500000, 900000),
    (2700000, 1200000),
    (5400000, 1800000),
    (9000000, 3600000),
    (16200000, 7200000),
    (32400000, 10800000),
    (86400000, 21600000),
    (604800000, 86400000),
]


def round_interval_ms(ms: float) -> int:
    """Grafana's rangeutil.roundInterval: the "nice" interval near `ms`."""
    for below, nice in _ROUND:
        if ms < below:
            return nice
    return 604800000


def intervals(span_s: float, width_px: int, scrape_s: float, min_interval_s: float = 0.0) -> tuple[int, int]:
    """($__interval, $__rate_interval) in seconds for a panel `width_px` wide.

    $__interval = roundInterval(range / maxDataPoints) but at least the datasource's scrape interval
    and the panel's own minimum interval; $__rate_interval = max($__interval + scrape interval,
    4 x scrape interval) (Grafana's docs)."""
    interval = max(round_interval_ms(span_s * 1000 / max(width_px, 1)) / 1000, scrape_s, min_interval_s)
    return int(interval), int(max(interval + scrape_s, 4 * scrape_s))


def _duration(seconds: int) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace `${name}` and `$name` (longest names first, so `$__rate_interval` is not `$__r…`)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def legend(fmt: str, labels: dict[str, str], expr: str) -> str:
    if not fmt or fmt == "__auto":
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        return ", ".join(f"{k}={v}" for k, v in shown.items()) if shown else expr
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


# ----------------------------------------------------------------------------------------- Prometheus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """A real `prometheus` on the backfilled TSDB, scraping the live hypocenter as job="hypocenter"."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.workdir = workdir
        self.config = workdir / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "5s"},
                    "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (Debian package `prometheus`)")
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        with (self.workdir / "prometheus.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=15d",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            "prometheus did not start: " + (self.workdir / "prometheus.log").read_text()[-2000:]
        )

    def api(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        r = httpx.post(f"{self.url}/api/v1/{path}", data=params, timeout=60.0)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(
                f"prometheus {path} {params.get('query')!r}: {body.get('error', r.text[:300])}"
            )
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for_live_scrape(self, after: float, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.api("query", {"query": f'timestamp(up{{job="{JOB}"}}) > {after}'})
            if rows:
                return
            time.sleep(0.5)
        raise RuntimeError("prometheus did not scrape the live hypocenter")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


# ----------------------------------------------------------------------------------------- panels → data


@dataclass
class Rendered:
    """What one panel was drawn from, for the report and the test."""

    dashboard: str
    title: str
    kind: str
    source: str
    queries: list[str]
    series: int
    points: int


@dataclass
class PageData:
    page: Page
    spec: dict[str, Any]
    rendered: list[Rendered] = field(default_factory=list)


def _panel_px(grid: dict[str, int]) -> tuple[int, int]:
    col = (PAGE_WIDTH - GUTTER_PX) / 24
    return int(grid["w"] * col - GUTTER_PX), grid["h"] * GRID_ROW_PX + (grid["h"] - 1) * GUTTER_PX


def _time_range(dashboard: dict[str, Any], page: Page, now: float) -> tuple[float, float]:
    text = page.range_from or dashboard["time"]["from"]
    m = re.fullmatch(r"now-(\d+)([hd])", text)
    if not m:
        raise ValueError(f"unsupported time range {text!r}")
    return now - int(m.group(1)) * {"h": 3600, "d": 86400}[m.group(2)], now


def prometheus_panel(
    prom: Prometheus, panel: dict[str, Any], values: dict[str, str], t0: float, t1: float, out: dict[str, Any]
) -> Rendered:
    width, _ = _panel_px(panel["gridPos"])
    legend_opts = (panel.get("options") or {}).get("legend") or {}
    plot_width = width - (300 if legend_opts.get("placement") == "right" else 0)
    # A panel's own minimum interval ("interval": "1h") raises $__interval, as in Grafana.
    min_interval_s = 0
    if m := re.fullmatch(r"(\d+)([smhd])", str(panel.get("interval", ""))):
        min_interval_s = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    interval, rate_interval = intervals(t1 - t0, plot_width, SCRAPE_S, min_interval_s)
    scoped = {
        **values,
        "__interval": _duration(interval),
        "__rate_interval": _duration(rate_interval),
        "__range": _duration(int(t1 - t0)),
    }
    queries: list[str] = []
    series: list[dict[str, Any]] = []
    start, end = math.floor(t0 / interval) * interval, math.floor(t1 / interval) * interval
    xs = [float(t) for t in range(int(start), int(end) + 1, interval)]
    for target in panel["targets"]:
        expr = substitute(target["expr"], scoped)
        queries.append(expr)
        if target.get("instant"):
            for row in prom.api("query", {"query": expr, "time": f"{t1:.3f}"}):
                series.append(
                    {
                        "name": legend(target.get("legendFormat", ""), row["metric"], expr),
                        "labels": row["metric"],
                        "value": float(row["value"][1]),
                    }
                )
        else:
            for row in prom.api(
                "query_range", {"query": expr, "start": str(start), "end": str(end), "step": str(interval)}
            ):
                by_t = {float(t): float(v) for t, v in row["values"]}
                ys = [by_t.get(x) for x in xs]
                series.append(
                    {
                        "name": legend(target.get("legendFormat", ""), row["metric"], expr),
                        "labels": row["metric"],
                        "y": [None if y is None or math.isnan(y) else y for y in ys],
                    }
                )
    out["series"] = series
    out["x"] = xs
    out["interval"] = f"$__interval={_duration(interval)}, $__rate_interval={_duration(rate_interval)}"
    if panel.get("type") == "table":
        excluded = set(
            ((panel.get("transformations") or [{}])[0].get("options") or {}).get("excludeByName", {})
        )
        columns = sorted({k for s in series for k in s["labels"]} - excluded - {"__name__"})
        out["table"] = {
            "columns": columns,
            "rows": [[s["labels"].get(c, "") for c in columns] for s in series],
        }
    points = sum(len([y for y in s.get("y", [s.get("value")]) if y is not None]) for s in series)
    return Rendered("", panel["title"], panel["type"], "prometheus", queries, len(series), points)


_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def logql_matchers(expr: str) -> list[tuple[str, str, str]]:
    """The label matchers and label filters of a LogQL query (`{a="b"} | c=~"d" | json …`), in order."""
    return [(k, op, v.replace("\\\\", "\\")) for k, op, v in _MATCHER.findall(expr)]


def logql_keeps(matchers: list[tuple[str, str, str]], rec: LokiRecord) -> bool:
    """Whether an entry passes every matcher, over its stream labels and structured metadata."""
    fields = {**rec.labels, **rec.metadata}
    for key, op, value in matchers:
        have = fields.get(key, "")
        hit = have == value if op in ("=", "!=") else re.fullmatch(value, have) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


def _utc(ts_ns: int) -> str:
    return datetime.fromtimestamp(ts_ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def loki_panel(
    records: list[LokiRecord],
    panel: dict[str, Any],
    values: dict[str, str],
    t0: float,
    t1: float,
    out: dict[str, Any],
) -> Rendered:
    target = panel["targets"][0]
    expr = substitute(target["expr"], values)
    matchers = logql_matchers(expr)
    rows = [r for r in records if logql_keeps(matchers, r) and t0 * 1e9 <= r.ts_ns <= t1 * 1e9]
    ascending = (panel.get("options") or {}).get("sortOrder") == "Ascending"
    rows = sorted(rows, key=lambda r: r.ts_ns, reverse=not ascending)[: int(target.get("maxLines", 1000))]
    if panel["type"] == "table":
        organize = next(t["options"] for t in panel.get("transformations", []) if t["id"] == "organize")
        columns = sorted(organize["indexByName"], key=lambda c: organize["indexByName"][c])
        table = []
        for r in rows:
            fields = {**r.labels, **r.metadata, **json.loads(r.line), "Time": _utc(r.ts_ns)}
            table.append([_cell(fields.get(c)) for c in columns])
        out["table"] = {"columns": columns, "rows": table}
    else:
        out["logs"] = [
            {"time": _utc(r.ts_ns), "line": r.line, "role": r.metadata.get("role", "")} for r in rows
        ]
    return Rendered("", panel["title"], panel["type"], "loki-sink", [expr], len(rows), len(rows))


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


def loki_annotations(
    dashboard: dict[str, Any], records: list[LokiRecord], values: dict[str, str]
) -> list[dict[str, Any]]:
    """The dashboard's Loki annotation query ("Root cause (Loki)"), titled with its titleFormat."""
    out = []
    for ann in dashboard.get("annotations", {}).get("list", []):
        if (ann.get("datasource") or {}).get("type") != "loki":
            continue
        matchers = logql_matchers(substitute(ann["expr"], values))
        for r in records:
            if logql_keeps(matchers, r):
                title = legend(ann["titleFormat"], {**r.labels, **r.metadata}, "")
                out.append({"time": r.ts_ns / 1e9, "title": title, "name": ann["name"]})
    return out


def page_data(
    page: Page, prom: Prometheus, records: list[LokiRecord], values: dict[str, str], now: float
) -> PageData:
    dashboard = load_dashboard(page.uid)
    t0, t1 = _time_range(dashboard, page, now)
    data = PageData(
        page,
        {
            "title": dashboard["title"],
            "uid": page.uid,
            "from": t0,
            "to": t1,
            "width": PAGE_WIDTH,
            "variables": {v["name"]: values.get(v["name"], "") for v in dashboard["templating"]["list"]},
            "panels": [],
        },
    )
    anns = loki_annotations(dashboard, records, values)
    for pick in page.picks:
        panel = find_panel(dashboard, pick)
        grid = dict(panel["gridPos"])
        if pick.w is not None:
            grid["w"] = pick.w
        panel["gridPos"] = grid
        width, height = _panel_px(grid)
        defaults = (panel.get("fieldConfig") or {}).get("defaults") or {}
        out: dict[str, Any] = {
            "type": panel["type"],
            "title": panel["title"],
            "grid": grid,
            "width": width,
            "height": height,
            "unit": defaults.get("unit", ""),
            "custom": defaults.get("custom", {}),
            "options": panel.get("options", {}),
            "from": t0,
            "to": t1,
        }
        if (panel.get("datasource") or {}).get("type") == "loki":
            rendered = loki_panel(records, panel, values, t0, t1, out)
        else:
            rendered = prometheus_panel(prom, panel, values, t0, t1, out)
            if panel["type"] == "timeseries":
                out["annotations"] = anns
        rendered.dashboard = page.uid
        data.rendered.append(rendered)
        data.spec["panels"].append(out)
    return data


# ----------------------------------------------------------------------------------------- Chromium


def page_height(spec: dict[str, Any]) -> int:
    rows = int(max(p["grid"]["y"] + p["grid"]["h"] for p in spec["panels"]))
    return HEADER_PX + rows * (GRID_ROW_PX + GUTTER_PX) + FOOTER_PX


def layout(spec: dict[str, Any]) -> None:
    """Close the vertical gaps left by panels that were not picked (Grafana's grid floats panels up)."""
    used = sorted({y for p in spec["panels"] for y in range(p["grid"]["y"], p["grid"]["y"] + p["grid"]["h"])})
    remap = {y: i for i, y in enumerate(used)}
    for p in spec["panels"]:
        p["grid"]["y"] = remap[p["grid"]["y"]]


def screenshot(spec: dict[str, Any], workdir: Path, png: Path) -> tuple[int, int]:
    """Draw the page in headless Chromium (playwright-core, docs/panels/screenshot.mjs); returns its size."""
    layout(spec)
    html = workdir / f"{spec['uid']}.html"
    page = (PANELS_DIR / "panels.html").read_text()
    for name, path in (
        ("UPLOT_CSS", UPLOT / "uPlot.min.css"),
        ("UPLOT_JS", UPLOT / "uPlot.iife.min.js"),
        ("PANELS_JS", PANELS_DIR / "panels.js"),
        ("PANELS_CSS", PANELS_DIR / "panels.css"),
    ):
        page = page.replace(name, path.as_uri())
    html.write_text(page.replace("/*SPEC*/null", json.dumps(spec)))
    size = (PAGE_WIDTH, page_height(spec))
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not installed")
    proc = subprocess.Popen(
        [node, str(PANELS_DIR / "screenshot.mjs"), str(html), str(png), *map(str, size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "CHROMIUM": CHROMIUM},
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        proc.communicate()
        raise RuntimeError("chromium did not finish the screenshot in 120 s") from None
    if proc.returncode != 0 or not png.is_file():
        raise RuntimeError(f"screenshot of {spec['uid']} failed: {err.decode(errors='replace')[-2000:]}")
    shrink(png)
    return size


def shrink(png: Path) -> None:
    """Quantize to a 256-colour palette with pngquant (Debian package) when it is installed: a third of the size."""
    pngquant = shutil.which("pngquant")
    if pngquant is None:
        return
    r = subprocess.run(
        [
            pngquant,
            "--quality",
            "80-100",
            "--speed",
            "1",
            "--strip",
            "--force",
            "--output",
            str(png),
            str(png),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if r.returncode not in (0, 99):  # 99: the quality floor was not met; the original stays
        raise RuntimeError(f"pngquant failed: {r.stderr.decode(errors='replace')[-500:]}")


# ----------------------------------------------------------------------------------------- the pipeline


@dataclass
class Report:
    pngs: list[Path]
    rendered: list[Rendered]
    attempts: int
    timings: dict[str, float]
    sizes: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # PNG name → (width, height) asked of Chromium


def _drill_target(day: Day) -> dict[str, Any]:
    """The attempt the drill-down shows: the latest root cause naming a GPU in the busiest cluster, so that
    the cluster's time panel has history around its annotation; else the latest diagnosis."""
    busy: dict[str, int] = {}
    for f in day.fed:
        busy[f.diagnosis["attempt"]["cluster"] or ""] = (
            busy.get(f.diagnosis["attempt"]["cluster"] or "", 0) + 1
        )
    gpu = [
        f.diagnosis
        for f in day.fed
        if f.diagnosis["outcome"] == "attributed"
        and any(c["kind"] == "gpu" for c in f.diagnosis["root_cause"]["components"])
    ]
    if not gpu:
        return day.fed[-1].diagnosis
    return max(reversed(gpu), key=lambda d: busy[d["attempt"]["cluster"] or ""])


def render(
    out: Path,
    *,
    count: int = 240,
    seed: int = 11,
    hours: float = 24.0,
    workdir: Path | None = None,
    log: Callable[[str], None] = print,
) -> Report:
    """Run the whole pipeline; PNGs land in `out`."""
    if not Path(CHROMIUM).is_file():
        raise RuntimeError(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    if not (UPLOT / "uPlot.iife.min.js").is_file() or not PLAYWRIGHT.is_dir():
        raise RuntimeError(
            f"uPlot or playwright-core is missing: npm ci --prefix {PANELS_DIR.relative_to(REPO)}"
        )
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool is not installed (Debian package `prometheus`)")
    timings: dict[str, float] = {}
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="hypocenter-panels-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sink = ExportSink().start()
    server: Server | None = None
    prom: Prometheus | None = None
    try:
        t = time.monotonic()
        bundles = generate(work / "corpus", count, seed, "real", 16)
        server = Server(work, sink.url).start()
        plan = Plan.draw(count, seed, hours * 3600, SCRAPE_S)
        log(
            f"feeding {count} attempts over a simulated {hours:g} h, scraping /metrics every {SCRAPE_S:g} s of it"
        )
        day = run_day(server, sink, bundles, plan, progress=log)
        time.sleep(1.0)  # let the outbox deliver the last diagnoses
        timings["feed_and_scrape_s"] = time.monotonic() - t

        t = time.monotonic()
        end = math.floor(time.time() / SCRAPE_S) * SCRAPE_S
        start = end - plan.span_s
        history = work / "history.om"
        history.write_text(openmetrics(day.snapshots, start=start, instance=day.instance))
        r = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(history), str(work / "tsdb")],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"promtool backfill failed: {r.stderr[-2000:]}")
        prom = Prometheus(work, server.metrics).start()
        prom.wait_for_live_scrape(after=end)
        timings["backfill_s"] = time.monotonic() - t

        t = time.monotonic()
        records = loki_in_sim_time(sink, day.fed, start)
        now = time.time()
        target = _drill_target(day)
        everything = {
            "datasource": "prometheus",
            "loki": "loki",
            "cluster": ".*",
            "node": "",
            "job": JOB,
            "instance": ".*",
        }
        drill = {
            **everything,
            "cluster": target["attempt"]["cluster"] or "",
            "workload": target["attempt"]["workload_id"],
            "attempt": str(target["attempt"]["attempt"]),
            "diagnosis": target["id"],
            "node": ".*",
        }
        pngs: list[Path] = []
        rendered: list[Rendered] = []
        sizes: dict[str, tuple[int, int]] = {}
        for page in PAGES:
            data = page_data(
                page, prom, records, drill if page.uid == "hypocenter-attempt" else everything, now
            )
            png = out / page.png
            sizes[png.name] = screenshot(data.spec, work, png)
            pngs.append(png)
            rendered += data.rendered
            (work / f"{page.uid}.report.json").write_text(
                json.dumps([r.__dict__ for r in data.rendered], indent=1)
            )
        timings["render_s"] = time.monotonic() - t
        return Report(pngs, rendered, len(day.fed), timings, sizes)
    finally:
        if prom is not None:
            prom.stop()
        if server is not None:
            server.stop()
        sink.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.render_panels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go (default docs/img)"
    )
    parser.add_argument(
        "--count", type=int, default=240, help="attempts fed over the simulated span (default 240)"
    )
    parser.add_argument("--seed", type=int, default=11, help="corpus and timeline seed (default 11)")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated span, hours (default 24)")
    parser.add_argument(
        "--workdir", type=Path, help="keep the corpus, TSDB, pages and logs here (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    try:
        report = render(
            args.out,
            count=args.count,
            seed=args.seed,
            hours=args.hours,
            workdir=args.workdir,
            log=lambda s: print(s, file=sys.stderr),
        )
    except RuntimeError as exc:
        print(f"render_panels: {exc}", file=sys.stderr)
        return 1
    for r in report.rendered:
        print(
            f"{r.dashboard:20} {r.kind:10} {r.title:45} {r.source:10} {r.series:3} series {r.points:6} points"
        )
    for png in report.pngs:
        print(f"wrote {png} ({png.stat().st_size // 1024} KB)")
    print("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in report.timings.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
