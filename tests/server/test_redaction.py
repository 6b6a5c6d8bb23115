"""Secrets stay out of what the server prints: `config show`, one-line errors and log lines show URLs
with their credentials replaced by ***; `/v1/scopes` takes only well-formed scheduler ids, so no `..`
or `?` reaches a Kubernetes API path."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_support import REPO, clean_env

from hypocenter.api.http import build_app
from hypocenter.cli.assembly import RedactingFormatter
from hypocenter.collector.connectors.base import ConnectorError
from hypocenter.collector.connectors.kubernetes import split_ref
from hypocenter.config import redact_text, redact_url
from hypocenter.server.service import Attribution
from hypocenter.store.sqlite import SQLiteStore
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

SECRETS = ("hunter2", "s3cr3t-token", "pgpass", "AKIAKEY")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_config_show_hides_credentials_in_every_url(fmt: str) -> None:
    r = _cli(
        "config",
        "show",
        "--format",
        fmt,
        "--store",
        "postgresql://hypo:pgpass@db:5432/hypocenter",
        "--loki-url",
        "http://loki:hunter2@loki:3100",
        "--grafana-url",
        "https://grafana:3000/?token=s3cr3t-token",
        "--pull-prometheus-url",
        "https://s3cr3t-token@prometheus:9090/?x-amz-credential=AKIAKEY&step=15",
    )
    assert r.returncode == 0, r.stderr
    assert not [s for s in SECRETS if s in r.stdout], r.stdout
    for shown in (
        "postgresql://hypo:***@db:5432/hypocenter",
        "http://loki:***@loki:3100",
        "https://grafana:3000/?token=***",
        "https://***@prometheus:9090/?x-amz-credential=***&step=15",
    ):
        assert shown in r.stdout
    if fmt == "json":
        assert json.loads(r.stdout)["loki_url"]["value"] == "http://loki:***@loki:3100"


def test_an_error_quoting_a_url_hides_its_password() -> None:
    r = _cli("serve", "--loki-url", "ftp://loki:hunter2@loki:3100")
    assert r.returncode == 2
    assert "hunter2" not in r.stderr and "ftp://loki:***@loki:3100" in r.stderr


def test_log_lines_hide_credentials() -> None:
    record = logging.LogRecord(
        "hypocenter.export",
        logging.ERROR,
        __file__,
        1,
        "loki push failed: %s",
        ("Client error for url 'http://u:hunter2@loki/push?token=x'",),
        None,
    )
    line = RedactingFormatter("%(message)s").format(record)
    assert line == "loki push failed: Client error for url 'http://u:***@loki/push?token=***'"


def test_urls_without_credentials_are_unchanged() -> None:
    for url in ("http://loki:3100/loki/api/v1/push", "https://h/x?step=15&query=up", "hypocenter.db"):
        assert redact_url(url) == url
        assert redact_text(f"see {url} now") == f"see {url} now"


@pytest.mark.parametrize(
    "body",
    [
        {"kueue": "../kube-system/x"},
        {"kueue": "team-a/.."},
        {"k8s_job": "team-a/job?watch=1"},
        {"k8s_job": "team-a/jobset/../../secrets"},
        {"k8s_job": "Team_A/x"},
        {"kueue": "a/" + "x" * 254},
        {"slurm": "81234; scancel 1"},
        {"slurm": "../81234"},
        {"slurm": "81234_"},
    ],
)
def test_scope_requests_take_only_well_formed_ids(tmp_path: Path, body: dict[str, str]) -> None:
    store = SQLiteStore(":memory:")
    service = Attribution(settings(tmp_path), store)
    try:
        app = build_app(service)

        async def post() -> httpx.Response:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://test"
            ) as client:
                return await client.post("/v1/scopes", json=body)

        r = asyncio.run(post())
        assert r.status_code == 422, r.text
        assert "NAMESPACE/NAME" in r.text or "Slurm job id" in r.text
    finally:
        service.close()
        store.close()


def test_kubernetes_refs_are_dns_names_on_the_cli_too() -> None:
    assert split_ref("team-a/jobset/llama.pretrain-7", "--k8s-job") == (
        "team-a",
        "JobSet",
        "llama.pretrain-7",
    )
    for bad in ("../x", "team-a/..", "ns/a?b", "ns/a%2F..", "ns/job/x/y"):
        with pytest.raises(ConnectorError):
            split_ref(bad, "--k8s-job")
