"""The Grafana dashboards of grafana/dashboards/, generated from code so that they stay consistent.

    python -m hypocenter.exporter.dashboards grafana/dashboards     (re)write the JSON files

    hypocenter-fleet     fleet overview: diagnoses over time by domain, unattributed share, top
                         culprit nodes, GPUs and ports, recent diagnoses linking to the drill-down
    hypocenter-attempt   one attempt: cluster / workload / attempt variables, the root cause as an
                         annotation (from the Loki stream) on every time panel, the verdict, the
                         evidence log lines, culprit and affected nodes
    hypocenter-self      hypocenter itself: up, ingest, refusals and drops, analysis latency, exports
    hypocenter-cost      what failures cost: lost GPU-hours over time, the Pareto of causes, the
                         worst components, time to detect, MTTF per domain, the lowest ETTR

Classic dashboard JSON (the provisioning format), schemaVersion 39 so that Grafana 11 and later load
it; datasources are `${datasource}` (Prometheus) and `${loki}` template variables, defaulting to the
uids deploy/grafana/provisioning/datasources provisions. tests/exporter/test_dashboards.py validates every
dashboard against the JSON Schema of `@grafana/schema`, checks the PromQL with promtool and the
series against /metrics, and that these files equal this module's output.

Why plain dicts and not grafana-foundation-sdk (measured for issue #11, the PyPI release
1769699998!10.1.0): that release models Grafana 10.1 (schemaVersion 36 by default, where these target
39); a two-panel dashboard built with its builders fails the @grafana/schema JSON Schema the tests
validate against (a panel whose options were not set is written `"options": null`), and carries
targets with an empty `refId` and the deprecated `style`, so panels would need patching after the
builder; and its builder chains are no
shorter than the `panel()` / `prom()` / `Layout` helpers here (~100 lines), which emit exactly what
Grafana 11 provisions and what the checked-in files and deploy/kubernetes' ConfigMap hold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 39
PROM = {"type": "prometheus", "uid": "${datasource}"}
LOKI = {"type": "loki", "uid": "${loki}"}
DEDUP = "max without (instance, pod)"  # the recent_* gauges: every replica reports the same store
ATTEMPT_LINK = (
    "/d/hypocenter-attempt/hypocenter-attempt?var-cluster=${__data.fields.cluster}"
    "&var-workload=${__data.fields.workload_id}&var-attempt=${__data.fields.attempt}&${__url_time_range}"
)


class Layout:
    """Panels placed left to right on Grafana's 24-column grid, wrapping to a new row."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def prom(
    expr: str, legend: str = "", *, instant: bool = False, ref: str = "A", table: bool = False
) -> dict[str, Any]:
    t: dict[str, Any] = {
        "datasource": PROM,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
    }
    if table:
        t["format"] = "table"
    return t


def loki(expr: str, ref: str = "A", max_lines: int = 1000) -> dict[str, Any]:
    return {"datasource": LOKI, "refId": ref, "expr": expr, "queryType": "range", "maxLines": max_lines}


def panel(
    kind: str,
    title: str,
    targets: list[dict[str, Any]],
    *,
    description: str = "",
    unit: str = "",
    options: dict[str, Any] | None = None,
    custom: dict[str, Any] | None = None,
    links: list[dict[str, Any]] | None = None,
    transformations: list[dict[str, Any]] | None = None,
    overrides: list[dict[str, Any]] | None = None,
    datasource: dict[str, str] = PROM,
    interval: str = "",
) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if unit:
        defaults["unit"] = unit
    if custom:
        defaults["custom"] = custom
    if links:
        defaults["links"] = links
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "datasource": datasource,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    if description:
        p["description"] = description
    if transformations:
        p["transformations"] = transformations
    if (
        interval
    ):  # the panel's minimum interval: with increase(…[$__interval]) one bar per interval, no overlap
        p["interval"] = interval
    return p


def datasource_var(name: str, kind: str, label: str, default_uid: str) -> dict[str, Any]:
    return {
        "type": "datasource",
        "name": name,
        "label": label,
        "query": kind,
        "refresh": 1,
        "hide": 0,
        "current": {"text": default_uid, "value": default_uid},
        "options": [],
        "regex": "",
        "skipUrlSync": False,
    }


def query_var(name: str, label: str, expr: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": PROM,
        "query": {"query": expr, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
        "definition": expr,
        "refresh": 2,
        "multi": multi,
        "includeAll": multi,
        "allValue": ".*" if multi else None,
        "current": {"text": "All", "value": "$__all"} if multi else {},
        "options": [],
        "sort": 1,
        "hide": 0,
        "regex": "",
        "skipUrlSync": False,
    }


def textbox_var(name: str, label: str, default: str = "") -> dict[str, Any]:
    return {
        "type": "textbox",
        "name": name,
        "label": label,
        "query": default,
        "hide": 0,
        "skipUrlSync": False,
        "current": {"text": default, "value": default},
        "options": [{"selected": True, "text": default, "value": default}],
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    layout: Layout,
    variables: list[dict[str, Any]],
    *,
    annotations: list[dict[str, Any]] | None = None,
    time_from: str = "now-24h",
) -> dict[str, Any]:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    api = {
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "name": "hypocenter (annotations API)",
        "target": {"type": "tags", "tags": ["hypocenter"], "matchAny": False, "limit": 100},
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["hypocenter"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "time": {"from": time_from, "to": "now"},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {
                "title": "hypocenter",
                "type": "dashboards",
                "tags": ["hypocenter"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "annotations": {"list": [builtin, api, *(annotations or [])]},
        "templating": {"list": variables},
        "panels": layout.panels,
    }


TIMESERIES_BARS = {
    "drawStyle": "bars",
    "fillOpacity": 80,
    "stacking": {"mode": "normal", "group": "A"},
    "lineWidth": 1,
}
TABLE_ORGANIZE = "organize"


# ------------------------------------------------------------------------------------------------ fleet


def fleet() -> dict[str, Any]:
    c = 'cluster=~"$cluster"'
    failed = f'sum({DEDUP} (hypocenter_recent_diagnoses{{{c}, outcome!="not_failed"}}))'
    unattributed = f'sum({DEDUP} (hypocenter_recent_diagnoses{{{c}, outcome="unattributed"}}))'
    lay = Layout()
    lay.add(
        panel(
            "stat",
            "Failed attempts diagnosed",
            [prom(failed, instant=True)],
            description="Final diagnoses of failed attempts within hypocenter's window (metrics_window_s).",
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "none",
                "graphMode": "none",
            },
        ),
        6,
        5,
    )
    lay.add(
        panel(
            "stat",
            "Unattributed share",
            [prom(f"({unattributed} or vector(0)) / {failed}", instant=True)],
            description="Failed attempts hypocenter found no root cause for: missing telemetry, or an unknown failure mode.",
            unit="percentunit",
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "none",
            },
        ),
        6,
        5,
    )
    lay.add(
        panel(
            "stat",
            "Hardware and network causes",
            [
                prom(
                    f'sum({DEDUP} (hypocenter_recent_diagnoses{{{c}, domain=~"hardware|network"}}))',
                    instant=True,
                )
            ],
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "none",
                "graphMode": "none",
            },
        ),
        6,
        5,
    )
    lay.add(
        panel(
            "stat",
            "Attempts awaiting a verdict",
            [prom("sum(hypocenter_attempts_open)", instant=True)],
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "none",
                "graphMode": "area",
            },
        ),
        6,
        5,
    )
    by_domain = (
        "sum by (domain) (label_replace(increase(hypocenter_diagnoses_total{"
        + c
        + ', outcome!="not_failed"}[$__interval]), "domain", "unattributed", "domain", ""))'
    )
    lay.add(
        panel(
            "timeseries",
            "Diagnoses over time, by domain",
            [prom(by_domain, "{{domain}}")],
            custom=TIMESERIES_BARS,
            interval="1h",
            options={
                "legend": {
                    "displayMode": "table",
                    "placement": "right",
                    "calcs": ["sum"],
                    "showLegend": True,
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
        ),
        16,
        9,
    )
    lay.add(
        panel(
            "timeseries",
            "Unattributed share",
            [prom(f"({unattributed} or {failed} * 0) / {failed}", "unattributed")],
            unit="percentunit",
            custom={"drawStyle": "line", "fillOpacity": 10, "lineWidth": 2},
            options={
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "single", "sort": "none"},
            },
        ),
        8,
        9,
    )
    node_link = [
        {
            "title": "Diagnoses naming ${__field.labels.node}",
            "targetBlank": False,
            "url": "/d/hypocenter-fleet/hypocenter-fleet-overview?var-cluster=${__field.labels.cluster}"
            "&var-node=${__field.labels.node}&${__url_time_range}",
        }
    ]
    lay.add(
        panel(
            "bargauge",
            "Top culprit nodes",
            [
                prom(
                    f'topk(10, {DEDUP} (hypocenter_recent_node_root_causes{{{c}, node!="other"}}))',
                    "{{cluster}} {{node}}",
                    instant=True,
                )
            ],
            links=node_link,
            description="Nodes named as (a candidate) root cause most often within the window.",
            options={
                "orientation": "horizontal",
                "displayMode": "gradient",
                "showUnfilled": True,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
        ),
        8,
        9,
    )
    lay.add(
        panel(
            "bargauge",
            "Top culprit GPUs",
            [
                prom(
                    f'topk(10, {DEDUP} (hypocenter_recent_component_root_causes{{{c}, component_kind="gpu", component!="other"}}))',
                    "{{node}} {{component}}",
                    instant=True,
                )
            ],
            options={
                "orientation": "horizontal",
                "displayMode": "gradient",
                "showUnfilled": True,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
        ),
        8,
        9,
    )
    lay.add(
        panel(
            "bargauge",
            "Top culprit fabric ports",
            [
                prom(
                    f'topk(10, {DEDUP} (hypocenter_recent_component_root_causes{{{c}, component_kind="port", component!="other"}}))',
                    "{{node}} {{component}}",
                    instant=True,
                )
            ],
            options={
                "orientation": "horizontal",
                "displayMode": "gradient",
                "showUnfilled": True,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
        ),
        8,
        9,
    )
    # Only `summary` is parsed from the line: outcome and domain are stream labels, subdomain is
    # structured metadata, and Loki's json parser names a field that is already one of those
    # `<name>_extracted` (logql/log/parser.go), which would leave the columns empty.
    recent = (
        '{service_name="hypocenter", cluster=~"$cluster"} | record="diagnosis" | nodes=~".*$node.*"'
        " | json summary"
    )
    lay.add(
        panel(
            "table",
            "Recent diagnoses",
            [loki(recent, max_lines=200)],
            datasource=LOKI,
            description="One row per diagnosis (Loki stream of hypocenter); the workload opens the attempt drill-down.",
            transformations=[
                {"id": "extractFields", "options": {"source": "labels", "replace": False}},
                {
                    "id": TABLE_ORGANIZE,
                    "options": {
                        "excludeByName": {
                            "labels": True,
                            "Line": True,
                            "id": True,
                            "tsNs": True,
                            "labelTypes": True,
                            "service_name": True,
                            "record": True,
                        },
                        "indexByName": {
                            "Time": 0,
                            "cluster": 1,
                            "workload_id": 2,
                            "attempt": 3,
                            "outcome": 4,
                            "domain": 5,
                            "subdomain": 6,
                            "nodes": 7,
                            "summary": 8,
                        },
                    },
                },
            ],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "workload_id"},
                    "properties": [
                        {"id": "links", "value": [{"title": "Open the attempt", "url": ATTEMPT_LINK}]}
                    ],
                }
            ],
            options={
                "showHeader": True,
                "cellHeight": "sm",
                "footer": {"show": False, "reducer": ["sum"], "fields": ""},
            },
        ),
        24,
        10,
    )
    variables = [
        datasource_var("datasource", "prometheus", "Prometheus", "prometheus"),
        datasource_var("loki", "loki", "Loki", "loki"),
        query_var("cluster", "Cluster", "label_values(hypocenter_recent_diagnoses, cluster)"),
        textbox_var("node", "Culprit node (regex)", ""),
    ]
    return dashboard(
        "hypocenter-fleet",
        "hypocenter · fleet overview",
        "Where failed training jobs began, across the fleet: hypocenter's diagnoses by domain, "
        "culprit nodes, GPUs and ports, and the share it could not attribute.",
        lay,
        variables,
    )


# ------------------------------------------------------------------------------------------------ attempt


def attempt() -> dict[str, Any]:
    sel = (
        '{service_name="hypocenter", cluster=~"$cluster"} | workload_id=~"$workload" | attempt=~"$attempt"'
        ' | diagnosis_id=~"$diagnosis"'
    )
    lay = Layout()
    lay.add(
        panel(
            "logs",
            "Verdict",
            [loki(f'{sel} | record="diagnosis"', max_lines=20)],
            datasource=LOKI,
            description="The diagnosis of the attempt as hypocenter pushed it to Loki (one JSON line per analysis).",
            options={
                "showTime": True,
                "wrapLogMessage": True,
                "prettifyLogMessage": True,
                "enableLogDetails": True,
                "sortOrder": "Descending",
                "dedupStrategy": "none",
                "showLabels": False,
                "showCommonLabels": False,
            },
        ),
        24,
        8,
    )
    lay.add(
        panel(
            "table",
            "Culprit and affected nodes",
            [loki(f'{sel} | record="diagnosis"', max_lines=20)],
            datasource=LOKI,
            transformations=[
                {"id": "extractFields", "options": {"source": "labels", "replace": False}},
                {
                    "id": TABLE_ORGANIZE,
                    "options": {
                        "excludeByName": {
                            "labels": True,
                            "Line": True,
                            "id": True,
                            "tsNs": True,
                            "labelTypes": True,
                            "service_name": True,
                            "record": True,
                            "diagnosis_id": True,
                            "workload_id": True,
                        },
                        "indexByName": {
                            "Time": 0,
                            "outcome": 1,
                            "domain": 2,
                            "subdomain": 3,
                            "nodes": 4,
                            "components": 5,
                            "affected_nodes": 6,
                            "action": 7,
                            "quality": 8,
                        },
                    },
                },
            ],
            options={
                "showHeader": True,
                "cellHeight": "sm",
                "footer": {"show": False, "reducer": ["sum"], "fields": ""},
            },
        ),
        24,
        6,
    )
    lay.add(
        panel(
            "logs",
            "Evidence",
            [loki(f'{sel} | record="evidence"', max_lines=200)],
            datasource=LOKI,
            description="The evidence trail: root-cause lines first, then one line per symptom; each names its "
            "source file and line (or OTLP stream and record) and the time it was written.",
            options={
                "showTime": False,
                "wrapLogMessage": True,
                "prettifyLogMessage": False,
                "enableLogDetails": True,
                "sortOrder": "Ascending",
                "dedupStrategy": "none",
                "showLabels": False,
                "showCommonLabels": False,
            },
        ),
        24,
        12,
    )
    lay.add(
        panel(
            "timeseries",
            "Diagnoses in this cluster",
            [
                prom(
                    'sum by (outcome) (increase(hypocenter_diagnoses_total{cluster=~"$cluster"}[$__interval]))',
                    "{{outcome}}",
                )
            ],
            custom=TIMESERIES_BARS,
            interval="1h",
            description="Root-cause annotations of the attempt appear on every time panel.",
            options={
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "GPU Xid errors on the culprit node (dcgm-exporter)",
            [
                prom(
                    'max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS{Hostname=~"$node"})',
                    "{{Hostname}} GPU {{gpu}}",
                )
            ],
            description="The last Xid dcgm-exporter saw per GPU of the node typed in `node`; empty without dcgm-exporter.",
            custom={"drawStyle": "points", "pointSize": 6},
            options={
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "none"},
            },
        ),
        12,
        8,
    )
    # One mark per attempt: Loki keeps every verdict it was sent, so only final ones mark the time
    # line (a provisional one is superseded by the final verdict; the Grafana annotation the outbox
    # keeps per attempt, updated in place, shows a provisional verdict until then).
    root_causes = {
        "datasource": LOKI,
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "name": "Root cause (Loki)",
        "expr": f'{sel} | record="diagnosis" | provisional="false"',
        "queryType": "range",
        "maxLines": 100,
        "titleFormat": "{{outcome}} {{domain}}/{{subdomain}} on {{nodes}}",
        "textFormat": "{{rule}} · action {{action}} · diagnosis {{diagnosis_id}}",
        "tagKeys": "cluster,domain,subdomain,outcome",
    }
    variables = [
        datasource_var("datasource", "prometheus", "Prometheus", "prometheus"),
        datasource_var("loki", "loki", "Loki", "loki"),
        query_var("cluster", "Cluster", "label_values(hypocenter_recent_diagnoses, cluster)"),
        textbox_var("workload", "Workload id", ".+"),
        textbox_var("attempt", "Attempt", ".+"),
        textbox_var("diagnosis", "Diagnosis id (from an exemplar)", ".+"),
        textbox_var("node", "Node (for node panels)", ".*"),
    ]
    return dashboard(
        "hypocenter-attempt",
        "hypocenter · attempt drill-down",
        "One workload attempt: hypocenter's verdict, the evidence, the culprit and affected nodes, and the "
        "root cause as an annotation on every time panel.",
        lay,
        variables,
        annotations=[root_causes],
        time_from="now-7d",
    )


# ------------------------------------------------------------------------------------------------ self


def service() -> dict[str, Any]:
    i = 'instance=~"$instance"'
    lay = Layout()
    stat = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "none",
    }
    lay.add(
        panel("stat", "Instances up", [prom(f'sum(up{{job=~"$job", {i}}})', instant=True)], options=stat),
        6,
        4,
    )
    lay.add(
        panel(
            "stat",
            "Store",
            [prom(f"min(hypocenter_store_up{{{i}}})", instant=True)],
            options=stat,
            overrides=[],
            custom=None,
        ),
        6,
        4,
    )
    lay.add(
        panel(
            "stat",
            "Attempts awaiting a verdict",
            [prom(f"sum(hypocenter_attempts_open{{{i}}})", instant=True)],
            options={**stat, "colorMode": "none", "graphMode": "area"},
        ),
        6,
        4,
    )
    lay.add(
        panel(
            "stat",
            "Diagnoses waiting to export",
            [prom(f"max by (exporter) (hypocenter_export_pending{{{i}}})", "{{exporter}}", instant=True)],
            options={**stat, "colorMode": "none"},
        ),
        6,
        4,
    )
    line = {"drawStyle": "line", "fillOpacity": 10, "lineWidth": 1}
    legend = {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    lay.add(
        panel(
            "timeseries",
            "Ingest: records/s",
            [
                prom(
                    f"sum by (signal, source) (rate(hypocenter_ingest_records_total{{{i}}}[$__rate_interval]))",
                    "{{signal}} via {{source}}",
                )
            ],
            unit="short",
            custom=line,
            options=legend,
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "Ingest: bytes/s",
            [
                prom(
                    f"sum by (signal, source) (rate(hypocenter_ingest_bytes_total{{{i}}}[$__rate_interval]))",
                    "{{signal}} via {{source}}",
                )
            ],
            unit="Bps",
            custom=line,
            options=legend,
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "Refused requests/s and rejected records/s",
            [
                prom(
                    f"sum by (reason) (rate(hypocenter_refused_requests_total{{{i}}}[$__rate_interval]))",
                    "requests: {{reason}}",
                ),
                prom(
                    f"sum by (reason) (rate(hypocenter_rejected_records_total{{{i}}}[$__rate_interval]))",
                    "records: {{reason}}",
                    ref="B",
                ),
            ],
            custom=line,
            options=legend,
            description="Back-pressure is retried by OTLP senders; malformed / too large requests and rejected records are lost.",
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "Analysis time",
            [
                prom(
                    f"histogram_quantile(0.5, sum by (le) (rate(hypocenter_analysis_duration_seconds_bucket{{{i}}}"
                    "[$__rate_interval])))",
                    "p50",
                ),
                prom(
                    f"histogram_quantile(0.99, sum by (le) (rate(hypocenter_analysis_duration_seconds_bucket{{{i}}}"
                    "[$__rate_interval])))",
                    "p99",
                    ref="B",
                ),
            ],
            unit="s",
            custom=line,
            options=legend,
            description="Exemplars link each bucket to a diagnosis id.",
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "Exports/s",
            [
                prom(
                    f"sum by (exporter) (rate(hypocenter_exported_diagnoses_total{{{i}}}[$__rate_interval]))",
                    "{{exporter}} delivered",
                ),
                prom(
                    f"sum by (exporter, kind) (rate(hypocenter_export_failures_total{{{i}}}[$__rate_interval]))",
                    "{{exporter}} {{kind}} failures",
                    ref="B",
                ),
                prom(
                    f"sum by (exporter, reason) (rate(hypocenter_export_dropped_total{{{i}}}[$__rate_interval]))",
                    "{{exporter}} dropped ({{reason}})",
                    ref="C",
                ),
            ],
            custom=line,
            options=legend,
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "timeseries",
            "Oldest diagnosis waiting to export",
            [
                prom(
                    f"max by (exporter) (hypocenter_export_oldest_pending_age_seconds{{{i}}})", "{{exporter}}"
                )
            ],
            unit="s",
            custom=line,
            options=legend,
        ),
        12,
        8,
    )
    lay.add(
        panel(
            "table",
            "Build",
            [prom(f"hypocenter_build_info{{{i}}}", instant=True, table=True)],
            transformations=[
                {
                    "id": TABLE_ORGANIZE,
                    "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}},
                }
            ],
            options={
                "showHeader": True,
                "cellHeight": "sm",
                "footer": {"show": False, "reducer": ["sum"], "fields": ""},
            },
        ),
        24,
        5,
    )
    variables = [
        datasource_var("datasource", "prometheus", "Prometheus", "prometheus"),
        datasource_var("loki", "loki", "Loki", "loki"),
        {**textbox_var("job", "Scrape job", "hypocenter")},
        query_var("instance", "Instance", 'label_values(hypocenter_build_info{job=~"$job"}, instance)'),
    ]
    return dashboard(
        "hypocenter-self",
        "hypocenter · service health",
        "hypocenter itself: instances, ingest, refusals and drops, analysis time, exports to Loki and Grafana.",
        lay,
        variables,
        time_from="now-6h",
    )


# ------------------------------------------------------------------------------------------------ cost

BARS_H = {
    "orientation": "horizontal",
    "displayMode": "gradient",
    "showUnfilled": True,
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
}


def cost() -> dict[str, Any]:
    """What failures cost (engine/fleet_cost.py): the gauges are the cost window's roll-up, the same
    numbers as GET /v1/fleet/cost; the time series is the process counter."""
    lay = Layout()
    stat = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "none",
        "graphMode": "none",
    }
    lay.add(
        panel(
            "stat",
            "GPU-hours lost",
            [prom(f"sum({DEDUP} (hypocenter_cost_gpu_hours_lost))", instant=True)],
            description="Lost work + time to detect + restart overhead, times the GPUs in scope, over the "
            "failures whose attempts ended in the cost window (cost_window_s).",
            options=stat,
        ),
        8,
        5,
    )
    lay.add(
        panel(
            "stat",
            "Share of the top cause",
            [
                prom(
                    f"max({DEDUP} (hypocenter_cost_gpu_hours_lost)) / sum({DEDUP} (hypocenter_cost_gpu_hours_lost))",
                    instant=True,
                )
            ],
            unit="percentunit",
            options=stat,
        ),
        8,
        5,
    )
    lay.add(
        panel(
            "stat",
            "Worst component's GPU-hours",
            [prom(f"max({DEDUP} (hypocenter_cost_component_gpu_hours_lost))", instant=True)],
            description="The node, GPU or port behind the most lost GPU-hours (the worst components panel).",
            options=stat,
        ),
        8,
        5,
    )
    over_time = (
        'sum by (domain) (increase(hypocenter_gpu_hours_lost_total{cluster=~"$cluster"}[$__interval]))'
    )
    lay.add(
        panel(
            "timeseries",
            "Lost GPU-hours over time, by domain",
            [prom(over_time, "{{domain}}")],
            description="GPU-hours of the failures diagnosed in each interval (hypocenter_gpu_hours_lost_total).",
            custom=TIMESERIES_BARS,
            interval="1h",
            options={
                "legend": {
                    "displayMode": "table",
                    "placement": "right",
                    "calcs": ["sum"],
                    "showLegend": True,
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
        ),
        24,
        9,
    )
    lay.add(
        panel(
            "bargauge",
            "Pareto of causes (GPU-hours lost)",
            [
                prom(
                    f"sort_desc({DEDUP} (hypocenter_cost_gpu_hours_lost))",
                    "{{domain}}/{{subdomain}}",
                    instant=True,
                )
            ],
            description="Lost GPU-hours per cause in the cost window, largest first: fix the top ones first.",
            options=BARS_H,
        ),
        12,
        10,
    )
    lay.add(
        panel(
            "bargauge",
            "Worst components (GPU-hours lost)",
            [
                prom(
                    f"topk(15, {DEDUP} (hypocenter_cost_component_gpu_hours_lost))",
                    "{{kind}} {{component}}",
                    instant=True,
                )
            ],
            description="Nodes, GPUs, host ports and switch ports behind the failures that cost most.",
            options=BARS_H,
        ),
        12,
        10,
    )
    lay.add(
        panel(
            "bargauge",
            "Time to detect (median, by cause)",
            [
                prom(
                    f"sort_desc({DEDUP} (hypocenter_cost_time_to_detect_seconds))",
                    "{{domain}}/{{subdomain}}",
                    instant=True,
                )
            ],
            description="First cause line to terminal state: how long the job hung before it ended.",
            unit="s",
            options=BARS_H,
        ),
        8,
        9,
    )
    lay.add(
        panel(
            "bargauge",
            "MTTF per domain",
            [prom(f"sort({DEDUP} (hypocenter_cost_mttf_seconds))", "{{domain}}", instant=True)],
            description="Attempts' run time in the window divided by the failures of each domain.",
            unit="s",
            options=BARS_H,
        ),
        8,
        9,
    )
    lay.add(
        panel(
            "bargauge",
            "Lowest ETTR (workloads)",
            [
                prom(
                    f'bottomk(10, {DEDUP} (hypocenter_cost_workload_ettr{{cluster=~"$cluster"}}))',
                    "{{cluster}} {{workload}}",
                    instant=True,
                )
            ],
            description="Effective training time ratio: productive time / run time over a workload's attempts.",
            unit="percentunit",
            options=BARS_H,
        ),
        8,
        9,
    )
    variables = [
        datasource_var("datasource", "prometheus", "Prometheus", "prometheus"),
        query_var("cluster", "Cluster", "label_values(hypocenter_gpu_hours_lost_total, cluster)"),
    ]
    return dashboard(
        "hypocenter-cost",
        "hypocenter · cost of failures",
        "What failures cost in GPU-hours: per cause (a Pareto), per node, GPU and port, time to detect, "
        "MTTF and ETTR. How each figure is estimated: docs/cost.md.",
        lay,
        variables,
        time_from="now-30d",
    )


DASHBOARDS = {
    "hypocenter-fleet": fleet,
    "hypocenter-attempt": attempt,
    "hypocenter-self": service,
    "hypocenter-cost": cost,
}


def render(uid: str) -> str:
    return json.dumps(DASHBOARDS[uid](), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "grafana/dashboards")
    out.mkdir(parents=True, exist_ok=True)
    for uid in DASHBOARDS:
        (out / f"{uid}.json").write_text(render(uid), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
