"""deploy/kubernetes: each overlay renders with `kubectl kustomize`, validates strictly against the
Kubernetes schemas (PyPI kubernetes-validate), and says what the issue asks; the generated
PrometheusRule and dashboard ConfigMaps equal their sources (deploy/kubernetes/generate.py --check);
the PrometheusRule's groups pass promtool (the Prometheus Operator CRDs' schemas are not available
offline, so ServiceMonitor and PrometheusRule are checked this way instead); the ClusterRole grants
exactly what the Kubernetes connector and the Kueue poll call."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hypocenter.collector.connectors import kubernetes as connector
from hypocenter.server import pulls

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
OVERLAYS = ("sqlite", "postgresql", "postgresql-without-operator")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed ({hint})")
    return path


def _render(overlay: str) -> str:
    kubectl = _tool("kubectl", "kubectl ships kustomize: `kubectl kustomize`")
    r = subprocess.run(
        [kubectl, "kustomize", str(KUBE / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, str, list[dict[str, Any]]]:
    text = _render(request.param)
    return request.param, text, [d for d in yaml.safe_load_all(text) if d]


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    exe = _tool("kubernetes-validate", "PyPI kubernetes-validate, in the test extra")
    return subprocess.run(
        [exe, "--strict", "--kubernetes-version", "1.30.0", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_overlays_validate_against_the_kubernetes_schemas(
    rendered: tuple[str, str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    overlay, _, docs = rendered
    core = [d for d in docs if d["kind"] not in CRD_KINDS]
    if overlay.endswith("without-operator"):  # a cluster without the CRDs takes every object
        assert core == docs
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(yaml.safe_dump_all(core))
    r = _validate(path)
    assert r.returncode == 0 and "WARN" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("passed for resource") == len(core), r.stdout
    # strict means strict: a misspelt field is refused (so the pass above means something)
    bad = [*core]
    dep = next(i for i, d in enumerate(bad) if d["kind"] == "Deployment")
    bad[dep] = yaml.safe_load(yaml.safe_dump(bad[dep]).replace("readinessProbe:", "readinesProbe:"))
    path.write_text(yaml.safe_dump_all(bad))
    assert _validate(path).returncode != 0


def test_the_deployment_has_probes_resources_and_a_locked_down_container(
    rendered: tuple[str, str, list[dict[str, Any]]],
) -> None:
    overlay, _, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "PodDisruptionBudget",
    } <= kinds
    operator = not overlay.endswith("without-operator")
    assert (kinds >= CRD_KINDS) if operator else not (CRD_KINDS & kinds)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    # a drain evicts one replica at a time, and never hangs on the single SQLite one
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # replicas spread over nodes and zones, preferred (a small cluster still schedules them)
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread.keys() == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in spread.values():
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert c["labelSelector"]["matchLabels"].items() <= labels.items()
    (c,) = pod["containers"]
    assert c["livenessProbe"]["grpc"]["port"] == 4317 and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    sc = c["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"]
        and not sc["allowPrivilegeEscalation"]
        and sc["capabilities"]["drop"] == ["ALL"]
    )
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    for e in c["env"]:
        assert ("value" in e) != ("valueFrom" in e), e  # Kubernetes refuses both (the schema does not say)
    env = {e["name"]: e for e in c["env"]}
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hypocenter")
    assert sorted(p["port"] for p in service["spec"]["ports"]) == [4317, 4318, 9464]
    volumes = {v["name"]: v for v in pod["volumes"]}
    cms = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    assert (
        volumes["rules"]["configMap"]["name"] in cms
        and env["HYPOCENTER_RULES"]["value"] == '["/etc/hypocenter/rules"]'
    )
    if overlay == "sqlite":
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
        claim = volumes["data"]["persistentVolumeClaim"]["claimName"]
        assert claim in {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
        assert env["HYPOCENTER_STORE"]["value"].startswith("/var/lib/hypocenter/")
    else:
        assert dep["spec"]["replicas"] > 1 and "persistentVolumeClaim" not in volumes["data"]
        assert env["HYPOCENTER_STORE"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    # the binding names the service account the pods run as, in their namespace
    crb = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert crb["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": pod["serviceAccountName"],
            "namespace": dep["metadata"]["namespace"],
        }
    ]
    if operator:
        # the ServiceMonitor scrapes the Service's metrics port and names the job "hypocenter"
        sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
        assert sm["spec"]["endpoints"][0]["port"] == "metrics" and "metrics" in {
            p["name"] for p in service["spec"]["ports"]
        }
        assert service["metadata"]["labels"][sm["spec"]["jobLabel"]] == "hypocenter"
        assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


def test_the_generated_objects_equal_their_sources() -> None:
    r = subprocess.run(
        [sys.executable, str(KUBE / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rendered = [d for d in yaml.safe_load_all(_render("sqlite")) if d]
    boards = {
        k: v
        for d in rendered
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
        for k, v in d["data"].items()
    }
    assert boards == {p.name: p.read_text() for p in (REPO / "grafana" / "dashboards").glob("*.json")}
    rule = next(d for d in rendered if d["kind"] == "PrometheusRule")
    groups = [
        g
        for p in sorted((REPO / "deploy" / "prometheus").glob("*.yaml"))
        for g in yaml.safe_load(p.read_text())["groups"]
    ]
    assert rule["spec"]["groups"] == groups


def test_the_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = _tool("promtool", "Debian package prometheus; .ci/run installs it")
    rule = next(d for d in yaml.safe_load_all(_render("postgresql")) if d and d["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    r = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _resource(path: str) -> tuple[str, str, bool]:
    """(API group, resource, named) of an API path such as /apis/G/V/namespaces/{ns}/R/{name}/SUB."""
    parts = [p for p in path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"]:
        rest = rest[2:]
    return group, rest[0] + (f"/{rest[2]}" if len(rest) > 2 else ""), len(rest) > 1


def _called() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) for every request the connector and the Kueue poll make, read from
    their source: a collection constant followed by `/{name}` is a get, passed bare to api.get a list."""
    calls: set[tuple[str, str, str]] = set()
    src = Path(connector.__file__).read_text()
    for expr, path in [("KINDS[kind][0]", p) for p, _ in connector.KINDS.values()] + [
        ("WORKLOADS", connector.WORKLOADS)
    ]:
        group, resource, _ = _resource(path)
        if re.search(rf"\{{{re.escape(expr)}\.format\(ns=[^)]*\)\}}/\{{", src):
            calls.add((group, resource, "get"))
        if re.search(rf"api\.get\({re.escape(expr)}\.format\(", src):
            calls.add((group, resource, "list"))
    for path in re.findall(r'f"(/api/v1/[^"]+)"', src):
        group, resource, named = _resource(path)
        calls.add((group, resource, "get" if named else "list"))
    if "api.get(KUEUE_WORKLOADS" in Path(pulls.__file__).read_text():
        group, resource, _ = _resource(pulls.KUEUE_WORKLOADS)
        calls.add((group, resource, "list"))
    return calls


def test_the_cluster_role_grants_exactly_what_the_connector_reads() -> None:
    role = yaml.safe_load_all((KUBE / "base" / "rbac.yaml").read_text())
    granted = {
        (g, r, v)
        for d in role
        if d["kind"] == "ClusterRole"
        for rule in d["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    called = _called()
    assert {v for _, _, v in granted} <= {"get", "list"}
    missing = called - granted
    assert not missing, f"the connector calls {sorted(missing)}, which the ClusterRole does not grant"
    unused = granted - called
    assert not unused, f"granted but never used: {sorted(unused)}"
