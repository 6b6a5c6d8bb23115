"""deploy/compose, checked without a Docker engine: Debian's docker-compose renders it (`config`), it
validates against the compose specification's JSON Schema, every path it mounts exists in the
repository, images are pinned, Prometheus scrapes hypocenter as job="hypocenter" with the repository's
rules (promtool), Alertmanager's config is valid (amtool), and Grafana's mounts are where the
provisioning files say."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose"


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed ({hint})")
    return path


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """`docker-compose config`: the file as Compose itself reads it, relative paths resolved."""
    exe = _tool("docker-compose", "Debian package docker-compose; .ci/run installs it")
    r = subprocess.run(
        [exe, "--project-directory", str(COMPOSE), "-f", str(COMPOSE / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=COMPOSE,
    )
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = yaml.safe_load(r.stdout)
    return doc


def test_the_compose_spec_schema_accepts_it() -> None:
    exe = _tool("check-jsonschema", "PyPI check-jsonschema, in the test extra")
    r = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE / "compose.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_services_images_and_mounts(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    assert set(services) == {"hypocenter", "otel-collector", "loki", "prometheus", "alertmanager", "grafana"}
    assert services["hypocenter"]["build"]["context"] == str(REPO)
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    for name, svc in services.items():
        if name != "hypocenter":
            tag = svc["image"].rpartition(":")[2]
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: image {svc['image']} is not pinned"
        for port in svc.get("ports", []):
            assert (port["host_ip"] if isinstance(port, dict) else port.split(":")[0]) == "127.0.0.1", (
                name,
                port,
            )
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else vol.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name} mounts {source}, which does not exist"
                assert Path(source).resolve().is_relative_to(REPO)
    # the dashboards and provisioning are the repository's own, mounted where the provisioning expects them
    mounts = {
        (v["source"] if isinstance(v, dict) else v.split(":")[0]): (
            v["target"] if isinstance(v, dict) else v.split(":")[1]
        )
        for v in services["grafana"]["volumes"]
    }
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/hypocenter.yaml").read_text())
    assert mounts[str(REPO / "grafana" / "dashboards")] == provider["providers"][0]["options"]["path"]
    assert (
        mounts[str(REPO / "deploy/grafana/provisioning/datasources")]
        == "/etc/grafana/provisioning/datasources"
    )
    env = services["grafana"]["environment"]
    assert (env["PROMETHEUS_URL"], env["LOKI_URL"]) == ("http://prometheus:9090", "http://loki:3100")
    hyp = services["hypocenter"]["environment"]
    assert (
        hyp["HYPOCENTER_LOKI_URL"] == env["LOKI_URL"]
        and hyp["HYPOCENTER_GRAFANA_URL"] == "http://grafana:3000"
    )


def test_prometheus_scrapes_hypocenter_with_the_rules(rendered: dict[str, Any], tmp_path: Path) -> None:
    promtool = _tool("promtool", "Debian package prometheus; .ci/run installs it")
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "hypocenter")
    # the image's metrics listener (Dockerfile ENV) on the compose service name
    dockerfile = (REPO / "Dockerfile").read_text()
    port = re.search(r"HYPOCENTER_METRICS_LISTEN=0\.0\.0\.0:(\d+)", dockerfile)
    assert port is not None and job["static_configs"][0]["targets"] == [f"hypocenter:{port.group(1)}"]
    # rule files: the container paths map, through the mount, onto deploy/prometheus' files
    mount = next(
        v
        for v in rendered["services"]["prometheus"]["volumes"]
        if (v["source"] if isinstance(v, dict) else v.split(":")[0]) == str(REPO / "deploy" / "prometheus")
    )
    target = mount["target"] if isinstance(mount, dict) else mount.split(":")[1]
    local = [REPO / "deploy" / "prometheus" / Path(f).relative_to(target) for f in config["rule_files"]]
    assert sorted(local) == sorted((REPO / "deploy" / "prometheus").glob("*.yaml"))
    # promtool on a copy whose rule paths point at the repository's files
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump({**config, "rule_files": [str(p) for p in local]}))
    r = subprocess.run(
        [promtool, "check", "config", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and "SUCCESS: 2 rule files found" in r.stdout + r.stderr, r.stdout + r.stderr


def test_alertmanager_config_is_valid() -> None:
    amtool = _tool("amtool", "Debian package prometheus-alertmanager; .ci/run installs it")
    r = subprocess.run(
        [amtool, "check-config", str(COMPOSE / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
