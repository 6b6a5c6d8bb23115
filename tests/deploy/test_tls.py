"""TLS deployments that stay healthy: the systemd drop-in, checked by `systemd-analyze verify`, and the
optional Kubernetes components (cert-manager, a TLS ServiceMonitor, a NetworkPolicy, pod logs read in
one namespace), rendered by `kubectl kustomize` (deploy/kubernetes/overlays/sqlite-tls), the core
objects checked by `kubernetes-validate --strict`, the custom resources field by field against their
projects' API definitions (the source of each list is given beside it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_kubernetes import KUBE, _validate

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "hypocenter.service"
DROPIN = REPO / "deploy" / "systemd" / "hypocenter.service.d" / "tls.conf"
ANALYZE = shutil.which("systemd-analyze")
KUBECTL = shutil.which("kubectl")


# ------------------------------------------------------------------------------------------ systemd


def _verify(unit_dir: Path) -> str:
    """`systemd-analyze verify` of the unit with its drop-ins (found on the unit path); its output."""
    assert ANALYZE is not None
    r = subprocess.run(
        [ANALYZE, "verify", "hypocenter.service"],
        cwd=unit_dir,
        env={"PATH": "/usr/bin:/bin", "SYSTEMD_UNIT_PATH": f"{unit_dir}:"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return r.stdout + r.stderr + ("" if r.returncode == 0 else f"exit {r.returncode}")


def _install(tmp: Path, dropin: str) -> Path:
    exe = shutil.which("hypocenter") or str(Path(sys.executable).with_name("hypocenter"))
    (tmp / "hypocenter.service.d").mkdir(parents=True, exist_ok=True)
    (tmp / "hypocenter.service").write_text(UNIT.read_text().replace("/opt/hypocenter/bin/hypocenter", exe))
    (tmp / "hypocenter.service.d" / "tls.conf").write_text(dropin)
    return tmp


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian package systemd)")
def test_the_tls_drop_in_verifies_and_its_specifiers_resolve(tmp_path: Path) -> None:
    text = DROPIN.read_text()
    assert _verify(_install(tmp_path / "ok", text)) == ""
    # verify reads the drop-in (a misspelt directive there is reported) and resolves its specifiers
    # (an unknown one is reported): so %d above was expanded where it stands
    misspelt = _verify(
        _install(tmp_path / "misspelt", text.replace("LoadCredential=tls.key", "LoadCredentials=tls.key"))
    )
    assert "Unknown key 'LoadCredentials'" in misspelt
    unknown = _verify(_install(tmp_path / "specifier", text.replace("%d/tls.crt", "%Q/tls.crt")))
    assert "Failed to resolve specifiers" in unknown
    # the credentials and the variables naming them: %d only in Environment=, never an EnvironmentFile
    service = [line for line in text.splitlines() if not line.startswith("#")]
    creds = {line.split("=", 1)[1].split(":", 1)[0] for line in service if line.startswith("LoadCredential=")}
    env = next(line for line in service if line.startswith("Environment="))
    assert creds == {"tls.crt", "tls.key"} and all(f"%d/{c}" in env for c in creds)
    assert "%d" not in "".join(line for line in UNIT.read_text().splitlines() if not line.startswith("#"))
    assert "EnvironmentFile" not in "\n".join(service)


# --------------------------------------------------------------------------------------- Kubernetes

# cert-manager.io/v1 (cert-manager/cert-manager deploy/crds/cert-manager.io_certificates.yaml and
# cert-manager.io_issuers.yaml): the spec fields used here, and the enums they are checked against.
CERTIFICATE_SPEC = {
    "commonName", "dnsNames", "duration", "emailAddresses", "ipAddresses", "isCA", "issuerRef",
    "privateKey", "renewBefore", "secretName", "subject", "uris", "usages",
}  # fmt: skip
ISSUER_REF = {"name", "kind", "group"}
PRIVATE_KEY = {"algorithm": {"RSA", "ECDSA", "Ed25519"}, "size": None, "rotationPolicy": {"Never", "Always"}}
USAGES = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign"}
ISSUER_SPEC = {"selfSigned": {"crlDistributionPoints"}, "ca": {"secretName", "crlDistributionPoints"}}
# monitoring.coreos.com/v1 ServiceMonitor Endpoint (prometheus-operator Documentation/api-reference:
# Endpoint, SafeTLSConfig, SafeAuthorization, SecretOrConfigMap, SecretKeySelector)
ENDPOINT = {"port", "path", "interval", "scheme", "tlsConfig", "authorization"}
TLS_CONFIG = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}
CRD_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def tls_docs() -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (kubectl ships kustomize)")
    r = subprocess.run(
        [KUBECTL, "kustomize", str(KUBE / "overlays" / "sqlite-tls")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_tls_overlay_validates(tls_docs: list[dict[str, Any]], tmp_path: Path) -> None:
    core = [d for d in tls_docs if d["kind"] not in CRD_KINDS]
    path = tmp_path / "tls.yaml"
    path.write_text(yaml.safe_dump_all(core))
    r = _validate(path)
    assert r.returncode == 0 and "WARN" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("passed for resource") == len(core), r.stdout


def test_cert_manager_objects_use_only_fields_cert_manager_defines(tls_docs: list[dict[str, Any]]) -> None:
    certs = [d for d in tls_docs if d["kind"] == "Certificate"]
    issuers = {d["metadata"]["name"]: d for d in tls_docs if d["kind"] == "Issuer"}
    assert len(certs) == 2 and len(issuers) == 2
    for c in certs:
        assert c["apiVersion"] == "cert-manager.io/v1"
        spec = c["spec"]
        assert set(spec) <= CERTIFICATE_SPEC and {"issuerRef", "secretName"} <= set(spec), set(spec)
        assert set(spec["issuerRef"]) <= ISSUER_REF and spec["issuerRef"]["name"] in issuers
        for key, value in spec.get("privateKey", {}).items():
            allowed = PRIVATE_KEY[key]
            assert allowed is None or value in allowed, (key, value)
        assert set(spec.get("usages", [])) <= USAGES
    for issuer in issuers.values():
        ((kind, body),) = issuer["spec"].items()
        assert set(body) <= ISSUER_SPEC[kind], issuer
    # the CA Issuer signs with the CA certificate's Secret, which the self-signed Issuer made
    ca = _one(tls_docs, "Certificate", "hypocenter-ca")
    assert (
        ca["spec"]["isCA"]
        and issuers["hypocenter-ca"]["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    )


def test_the_server_gets_the_certificate_and_https_probes(tls_docs: list[dict[str, Any]]) -> None:
    server = _one(tls_docs, "Certificate", "hypocenter-tls")
    dep = _one(tls_docs, "Deployment", "hypocenter")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    cert_dir = str(Path(env["HYPOCENTER_TLS_CERT_FILE"]).parent)
    assert env["HYPOCENTER_TLS_KEY_FILE"] == f"{cert_dir}/tls.key"  # the Secret's keys: tls.crt, tls.key
    assert volumes[mounts[cert_dir]]["secret"]["secretName"] == server["spec"]["secretName"]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS" and c[probe]["httpGet"]["path"] == path, probe
        assert "grpc" not in c[probe]  # the kubelet's gRPC probe cannot speak TLS
    service = _one(tls_docs, "Service", "hypocenter")
    ns = dep["metadata"]["namespace"]
    assert f"{service['metadata']['name']}.{ns}.svc" in server["spec"]["dnsNames"]
    assert all(d["metadata"]["namespace"] == ns for d in tls_docs if d["kind"] in ("Certificate", "Issuer"))


def test_the_service_monitor_scrapes_https_with_the_ca_and_a_token(tls_docs: list[dict[str, Any]]) -> None:
    sm = _one(tls_docs, "ServiceMonitor", "hypocenter")
    (ep,) = sm["spec"]["endpoints"]
    assert set(ep) <= ENDPOINT and set(ep["tlsConfig"]) <= TLS_CONFIG
    assert ep["scheme"] == "https"
    ca = _one(tls_docs, "Certificate", "hypocenter-ca")
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": ca["spec"]["secretName"], "key": "ca.crt"}
    assert (
        ep["tlsConfig"]["serverName"] in _one(tls_docs, "Certificate", "hypocenter-tls")["spec"]["dnsNames"]
    )
    assert ep["authorization"]["type"] == "Bearer" and set(ep["authorization"]["credentials"]) == {
        "name",
        "key",
    }


def test_the_network_policy_keeps_metrics_to_monitoring(tls_docs: list[dict[str, Any]]) -> None:
    policy = _one(tls_docs, "NetworkPolicy", "hypocenter")
    dep = _one(tls_docs, "Deployment", "hypocenter")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    by_port = {p["port"]: rule.get("from") for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert set(by_port) == ports
    assert by_port["otlp-grpc"] is None and by_port["otlp-http"] is None  # collectors anywhere
    assert by_port["metrics"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_pod_logs_are_read_in_one_namespace_only(tls_docs: list[dict[str, Any]]) -> None:
    cluster = _one(tls_docs, "ClusterRole", "hypocenter-reader")
    assert not any("pods/log" in r["resources"] for r in cluster["rules"])
    assert any(
        "pods" in r["resources"] and "list" in r["verbs"] for r in cluster["rules"]
    )  # finding the pods
    role = _one(tls_docs, "Role", "hypocenter-pod-logs")
    binding = _one(tls_docs, "RoleBinding", "hypocenter-pod-logs")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "training"
    sa = _one(tls_docs, "ServiceAccount", "hypocenter")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hypocenter", "namespace": sa["metadata"]["namespace"]}
    ]
