"""docs/sending.md, the producer contract: every key it must name, and every recipe run as it is written.

The collector recipes are excerpts of deploy/otelcol (checked field by field and run through rotel by
tests/test_deploy_otelcol.py): here they must be excerpts, not look-alikes. The SDK recipes run against
a real `hypocenter serve`; the training-script one in tests/e2e/test_sending_torchrun.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from sending_doc import DOC, snippet, snippets
from server_support import REPO, ServerProcess, clean_env, serving, wait_for_diagnosis

from hypocenter import names
from hypocenter.resource_detector import K8S_VARIABLES, attributes

pytestmark = pytest.mark.slow


def test_every_attribute_key_is_in_the_contract() -> None:
    text = DOC.read_text()
    keys = [
        *names.NODE_KEYS,
        *names.WORKLOAD_KEYS,
        *names.ATTEMPT_KEYS,
        *names.STREAM_KEYS,
        names.LINE_KEY,
        names.UID_KEY,
        names.STATE_KEY,
        names.NODE_RANKS_KEY,
        names.RANK_KEY,
        *(key for key, _ in names.SCOPE_KEYS),
    ]
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, missing


def test_readme_links_the_contract_on_its_first_screen() -> None:
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "docs/sending.md" in first_screen


def _sub(part: Any, whole: Any, where: str) -> list[str]:
    """Where `part` is not an excerpt of `whole`: mappings may leave keys out, anything else is equal."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [where]
        return [
            miss
            for k, v in part.items()
            for miss in ([f"{where}.{k}"] if k not in whole else _sub(v, whole[k], f"{where}.{k}"))
        ]
    return [] if part == whole else [where]


COLLECTOR_RECIPES = [
    "otelcol: files, numbered (filelog receiver)",
    "otelcol: journald",
    "otelcol: Kubernetes container logs",
]


@pytest.mark.parametrize("recipe", COLLECTOR_RECIPES)
def test_collector_recipes_are_excerpts_of_the_tested_configs(recipe: str) -> None:
    blocks = snippets(recipe, "yaml")
    assert blocks
    for block in blocks:
        source = re.match(r"# (deploy/otelcol/[\w.-]+\.yaml)\n", block)
        assert source is not None, f"{recipe}: a block does not say which config it is from"
        whole = yaml.safe_load((REPO / source.group(1)).read_text())
        assert _sub(yaml.safe_load(block), whole, source.group(1)) == []


def test_the_numbered_recipe_numbers_its_records() -> None:
    for block in snippets("otelcol: files, numbered (filelog receiver)", "yaml")[:1]:
        for name, receiver in yaml.safe_load(block)["receivers"].items():
            assert receiver["include_file_path"] and receiver["include_file_record_number"], name


def test_the_pod_spec_snippet_sets_what_the_detector_reads(tmp_path: Path) -> None:
    env = yaml.safe_load(snippet("The OpenTelemetry Python SDK inside a training script", "yaml"))["env"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}
    assert fields == K8S_VARIABLES
    plain = {e["name"]: e["value"] for e in env if "value" in e}
    assert plain["OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"] == "hypocenter"
    # what the kubelet would put in a JobSet pod's environment from those references
    pod = {"K8S_NODE_NAME": "gpu-n07", "K8S_POD_NAMESPACE": "research", "JOBSET_NAME": "llama"}
    assert attributes({**pod, "JOBSET_RESTART_ATTEMPT": "2"}, "llama-w-0-0-abcde")[
        "hypocenter.workload.id"
    ] == ("research/llama")
    exe = shutil.which("kubernetes-validate")
    if exe is None:
        pytest.skip("kubernetes-validate is not installed (PyPI kubernetes-validate, in the test extra)")
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {"containers": [{"name": "train", "image": "trainer:1", "env": env}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(manifest))
    r = subprocess.run(
        [exe, "--strict", "--kubernetes-version", "1.30.0", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0 and "passed for resource" in r.stdout, r.stdout + r.stderr


def test_the_slurm_recipe_names_the_shipped_scripts() -> None:
    conf = snippet("Slurm prolog and epilog", "bash")
    for key, script in re.findall(r"^(\w+)=/etc/slurm/(\S+)$", conf, re.M):
        shipped = (REPO / "deploy" / "slurm" / script).read_text()
        assert f"{key}=/etc/slurm/{script}" in shipped, script  # the script's header says the same
    assert "PrologSlurmctld" in conf and "EpilogSlurmctld" in conf


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(tmp_path / "store.db") as s:
        yield s


def test_the_one_minute_example_gets_the_xid_attributed(server: ServerProcess, tmp_path: Path) -> None:
    """The issue's walk: a new user copies the page's first example; the kernel log's Xid is fifteen
    minutes older than the records the SDK stamps as it sends them."""
    at = datetime.now(timezone.utc) - timedelta(minutes=15)
    stamp = f"{at:%b} {at.day:2d} {at:%H:%M:%S}"
    (tmp_path / "kern.log").write_text(
        f"{stamp} gpu-n07 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-3e51c7a0-9d24-4b8f-a6e2-0c7b19f4d835\n"
        f"{stamp} gpu-n07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    )
    code = snippet("In one minute", "python").replace("http://127.0.0.1:4318", server.base)
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    with server.client() as client:
        d = wait_for_diagnosis(client, "81234")
    assert d["outcome"] == "attributed", d["quality"]["reasons"]
    assert (d["root_cause"]["domain"], d["root_cause"]["subdomain"], d["root_cause"]["nodes"]) == (
        "hardware",
        "gpu",
        ["gpu-n07"],
    )


def test_the_replay_recipe_prints_the_diagnosis(server: ServerProcess) -> None:
    command = snippet("`hypocenter replay`: a bundle on disk", "bash").strip()
    command = command.replace("127.0.0.1:4317", server.grpc).replace("http://127.0.0.1:4318", server.base)
    argv = command.split()
    assert argv[:2] == ["hypocenter", "replay"]
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *argv[1:]],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["outcome"], d["root_cause"]["subdomain"], d["root_cause"]["nodes"]) == (
        "attributed",
        "nvlink",
        ["node02"],
    )
