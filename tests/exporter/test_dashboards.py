"""grafana/dashboards/: valid against the JSON Schema of Grafana's dashboard model (generated from the
npm package @grafana/schema with ts-json-schema-generator, as Grafana's own
schema tooling does), stable uids, PromQL that promtool parses, only series hypocenter exposes, Loki queries on
hypocenter's stream, provisioning files that point at them, and equal to their generator's output."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from prometheus_support import needs_promtool, promtool

from hypocenter.exporter.dashboards import DASHBOARDS, render
from hypocenter.exporter.loki import LABELS
from tests.deploy.test_alert_rules import exposed_names

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
SCHEMA_PKG = REPO / "grafana" / "schema"
FILES = sorted(DASHBOARD_DIR.glob("*.json"))
NPM = shutil.which("npm")
NODE = shutil.which("node")


@pytest.fixture(scope="session")
def dashboard_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if NPM is None or NODE is None:
        pytest.skip(
            "node/npm are not installed: cannot generate the dashboard JSON Schema from @grafana/schema"
        )
    if not (
        SCHEMA_PKG / "node_modules" / "@grafana" / "schema"
    ).is_dir():  # .ci/run installs it; do it here too
        r = subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=SCHEMA_PKG,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path_factory.mktemp("schema") / "dashboard.schema.json"
    types = SCHEMA_PKG / "node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts"
    r = subprocess.run(
        [
            NPM,
            "exec",
            "--no",
            "--",
            "ts-json-schema-generator",
            "--path",
            str(types),
            "--type",
            "Dashboard",
            "--no-type-check",
            "--additional-properties",
            "-o",
            str(out),
        ],
        cwd=SCHEMA_PKG,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    schema: dict[str, Any] = json.loads(out.read_text())
    return schema


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _targets(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = [t for p in d["panels"] for t in p.get("targets", [])]
    out += [a for a in d["annotations"]["list"] if "expr" in a]
    return out


def test_files_are_the_generators_output() -> None:
    assert [p.stem for p in FILES] == sorted(DASHBOARDS)
    for path in FILES:
        assert path.read_text() == render(path.stem), (
            f"{path.name} is stale: python -m hypocenter.exporter.dashboards"
        )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_dashboard_is_valid_against_grafana_schema(path: Path, dashboard_schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft7Validator(dashboard_schema)
    doc = _load(path)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []
    broken = copy.deepcopy(doc)  # the schema is strict enough to catch a malformed panel
    broken["panels"][0]["gridPos"] = {"h": "tall", "w": 6}
    assert list(validator.iter_errors(broken))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_uids_ids_and_datasources_are_stable(path: Path) -> None:
    d = _load(path)
    assert d["uid"] == path.stem and len(d["uid"]) <= 40
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["datasource"]["uid"] in ("${datasource}", "${loki}"), p["title"]
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]


def _promql(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in _targets(d) if t["datasource"]["type"] == "prometheus"]


def _concrete(expr: str) -> str:
    """Grafana's variables replaced by values promtool can parse."""
    for var, value in (
        ("$__rate_interval", "5m"),
        ("$__interval", "1m"),
        ("$cluster", ".*"),
        ("$instance", ".*"),
        ("$job", "hypocenter"),
        ("$node", ".*"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


@needs_promtool
def test_promql_parses(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query:{i}", "expr": _concrete(e)}
        for i, e in enumerate(e for path in FILES for e in _promql(_load(path)))
    ]
    f = tmp_path / "queries.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    r = promtool("check", "rules", str(f))
    assert r.returncode == 0, r.stdout + r.stderr


def test_queries_use_what_hypocenter_publishes() -> None:
    exposed = exposed_names()
    for path in FILES:
        d = _load(path)
        used = {m for e in _promql(d) for m in re.findall(r"\bhypocenter_[a-z0-9_]+", e)}
        assert used - exposed == set(), path.name
        for t in _targets(d):
            if t["datasource"]["type"] != "loki":
                continue
            selector = re.match(r"\{([^}]*)\}", t["expr"])
            assert selector, t["expr"]
            names = {m.group(1) for m in re.finditer(r"(\w+)\s*=~?", selector.group(1))}
            assert names <= set(LABELS) and 'service_name="hypocenter"' in selector.group(1), t["expr"]


def test_attempt_dashboard_has_the_root_cause_annotation_and_variables() -> None:
    d = _load(DASHBOARD_DIR / "hypocenter-attempt.json")
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"cluster", "workload", "attempt"} <= names
    loki_annotations = [a for a in d["annotations"]["list"] if a.get("datasource", {}).get("type") == "loki"]
    assert loki_annotations and 'record="diagnosis"' in loki_annotations[0]["expr"]
    assert {p["title"] for p in d["panels"]} >= {"Evidence", "Culprit and affected nodes"}


def test_provisioning_points_at_the_dashboards() -> None:
    ds = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/hypocenter.yaml").read_text())
    uids = {d["uid"]: d["type"] for d in ds["datasources"]}
    assert uids == {"prometheus": "prometheus", "loki": "loki"}
    for path in FILES:
        for v in _load(path)["templating"]["list"]:
            if v["type"] == "datasource":
                assert uids[v["current"]["value"]] == v["query"]
    prov = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/hypocenter.yaml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"


def test_loki_tables_fill_their_columns_on_lokis_answer(tmp_path: Path) -> None:
    """Each Loki table's columns come from the labels, structured metadata and parsed fields of its
    query's answer. Loki's json parser renames a field that is also a label or metadata to
    `<name>_extracted` (logql/log/parser.go): a query that parses `outcome` out of the line leaves
    the `outcome` column to the label and adds a column nobody shows. The fake Loki does the same."""
    from observability_fakes import FakeLoki
    from server_support import analyze

    from hypocenter.exporter.loki import LokiExporter
    from hypocenter.store.sqlite import SQLiteStore
    from tests.exporter.test_prometheus import NVLINK, store_diagnosis

    doc = analyze(NVLINK)
    store = SQLiteStore(":memory:")
    store_diagnosis(store, doc)
    row = store.get_diagnosis(doc["id"])
    assert row is not None
    loki = FakeLoki().start()
    exporter = LokiExporter(loki.url)
    try:
        exporter.send([row])
        checked = 0
        for path in FILES:
            for p in _load(path)["panels"]:
                if p["type"] != "table" or p["datasource"]["uid"] != "${loki}":
                    continue
                columns = set(
                    next(
                        t["options"]["indexByName"]
                        for t in p["transformations"]
                        if "indexByName" in t.get("options", {})
                    )
                ) - {"Time"}
                [target] = p["targets"]
                expr = target["expr"]
                for var, value in (
                    ("$cluster", ".*"),
                    ("$node", ""),
                    ("$workload", ".*"),
                    ("$attempt", ".*"),
                    ("$diagnosis", ".*"),
                ):
                    expr = expr.replace(var, value)
                r = httpx.get(
                    f"{loki.url}/loki/api/v1/query_range",
                    timeout=10,
                    headers={"X-Loki-Response-Encoding-Flags": "categorize-labels"},
                    params={"query": expr, "start": str(time.time_ns() - 86400 * 10**9), "limit": "10"},
                )
                assert r.status_code == 200, r.text
                [stream] = r.json()["data"]["result"]
                [value] = stream["values"]
                fields = {
                    **stream["stream"],
                    **value[2].get("structuredMetadata", {}),
                    **value[2].get("parsed", {}),
                }
                assert not [f for f in fields if f.endswith("_extracted")], (p["title"], expr)
                assert {c for c in columns if not fields.get(c)} == set(), (p["title"], fields)
                checked += 1
        assert checked == 2
    finally:
        exporter.close()
        loki.stop()
