"""The server pulls: Slurm says a job ended, Loki holds its logs, nothing is pushed over OTLP.

`hypocenter serve --slurm-poll-s … --pull-loki-url …` polls Slurm accounting (here the recorded
JSON of Slurm 24.05 behind the fake `sacct`/`scontrol` of examples/fake-slurm), scopes the ended
job with the Slurm connector, pulls its logs from (fake) Loki and analyses it: the verdict must be
the one `hypocenter analyze` gives on the bundle those logs came from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from observability_fakes import FakeLoki
from server_support import REPO, ServerProcess, analyze, wait_for_diagnosis

from hypocenter.collector.bundle import load_bundle
from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy
from hypocenter.collector.connectors.slurm import run_command
from hypocenter.server.pulls import ended_jobs
from hypocenter.sources import AttemptInput
from tests.e2e.test_pull_end_to_end import push_logs, verdict

pytestmark = pytest.mark.slow

FAKE_BIN = REPO / "examples" / "fake-slurm" / "bin"
FIXTURES = REPO / "tests" / "fixtures" / "slurm" / "24.05"
BUNDLE = REPO / "examples" / "nvlink-xid149"


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    # A multi-tenant Loki behind a token, as `LOKI_BEARER_TOKEN` / `LOKI_ORG_ID` (logcli's variables) say.
    fake = FakeLoki(required_headers={"Authorization": "Bearer s3cret", "X-Scope-OrgID": "team-a"}).start()
    yield fake
    fake.stop()


def _pulling_server(loki: FakeLoki, store: Path, *extra: str) -> ServerProcess:
    """`hypocenter serve` with the fake Slurm on PATH, pulling from the fake Loki (behind its token) that
    now holds BUNDLE's logs."""
    push_logs(load_bundle(BUNDLE), loki)
    env = {
        "PATH": f"{FAKE_BIN}:{os.environ.get('PATH', '')}",
        "HYPOCENTER_FAKE_SLURM": str(FIXTURES),
        "LOKI_BEARER_TOKEN": "s3cret",
        "LOKI_ORG_ID": "team-a",
    }
    return ServerProcess(
        store,
        *extra,
        "--pull-loki-url",
        loki.url,
        "--pull-loki-workload-selector",
        '{job="slurm", workload="{workload}"}',
        env=env,
    ).start()


def test_a_job_slurm_reports_ended_is_analysed_from_loki(loki: FakeLoki, tmp_path: Path) -> None:
    srv = _pulling_server(
        loki, tmp_path / "store.db", "--slurm-poll-s", "0.5", "--slurm-poll-lookback-s", str(10 * 365 * 86400)
    )
    try:
        with srv.client() as client:
            got = wait_for_diagnosis(client, "81234", timeout=60)
    finally:
        srv.stop()
    assert verdict(got) == verdict(analyze(BUNDLE))
    sources = {c["source"]: c for c in got["coverage"]}
    assert any(c["connector"] == "loki" and c["status"] == "ok" for c in got["coverage"]), got["coverage"]
    assert sources["slurm/records"]["status"] == "ok" and sources["slurm/records"]["observations"] > 0
    assert got["terminal_state"] == analyze(BUNDLE)["terminal_state"]  # Slurm's word, not a log line's
    assert got["attempt"]["scheduler"] == "slurm"


def test_the_poll_lists_ended_jobs_and_reports_a_missing_sacct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_BIN}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("HYPOCENTER_FAKE_SLURM", str(FIXTURES))
    jobs = ended_jobs(
        run_command,
        RetryPolicy(timeout_s=10),
        datetime(2020, 1, 1, tzinfo=timezone.utc),
        datetime.now(timezone.utc),
    )
    assert "81234" in jobs and any(j.startswith("90002+") for j in jobs), jobs
    no_slurm = RetryPolicy(timeout_s=5, attempts=1)
    with pytest.raises(ConnectorError, match="hypocenter-no-such-sacct not found on PATH"):
        ended_jobs(
            lambda argv, t: run_command(["hypocenter-no-such-sacct", *argv[1:]], t),
            no_slurm,
            datetime(2020, 1, 1, tzinfo=timezone.utc),
            datetime.now(timezone.utc),
        )


def test_settings_show_the_pull_options() -> None:
    from hypocenter.config import Settings

    fields = Settings.model_fields
    for name in ("pull_loki_url", "pull_prometheus_url", "slurm_poll_s", "slurm_rest_url"):
        assert fields[name].description, name
    assert json.dumps(Settings().model_dump(mode="json"))  # defaults are plain values


def test_the_pull_reads_lokis_otlp_labels_when_told() -> None:
    """Behind Loki's own OTLP endpoint the node is structured metadata `host_name`: the settings say
    so, and such a pull needs a stream selector to filter it after."""
    from pydantic import ValidationError

    from hypocenter.config import Settings
    from hypocenter.engine import default_engine
    from hypocenter.server.pulls import Pulls

    with pytest.raises(ValidationError, match="needs pull_loki_selector"):
        Settings(pull_loki_url="http://loki:3100", pull_loki_node_label_kind="metadata")
    settings = Settings(
        pull_loki_url="http://loki:3100",
        pull_loki_node_label="host_name",
        pull_loki_node_label_kind="metadata",
        pull_loki_selector='service_name=~".+"',
    )
    logs = Pulls(settings, default_engine().ruleset).logs
    assert logs is not None and logs._node_selector(["node01"]) == '{service_name=~".+"}'  # type: ignore[attr-defined]
    assert logs._node_filter(["node01"]).startswith(" | host_name=~")  # type: ignore[attr-defined]


def test_rest_scope_by_slurm_job_id(loki: FakeLoki, tmp_path: Path) -> None:
    """`POST /v1/scopes {"slurm": ID}` — what a Slurm epilog would call — analyses the job now."""
    srv = _pulling_server(loki, tmp_path / "store.db")
    try:
        with srv.client() as client:
            r = client.post("/v1/scopes", json={"slurm": "81234"})
            assert r.status_code == 200, r.text
            assert verdict(r.json()) == verdict(analyze(BUNDLE))
            assert r.headers["X-Hypocenter-Provisional"] == "false"
            # coverage describes the sources used: Loki's logs, not OTLP streams nothing was sent to
            coverage = r.json()["coverage"]
            assert not [
                c for c in coverage if c["connector"] == "otlp" and c["source"].startswith("logs/")
            ], coverage
            assert {c["source"] for c in coverage if c["connector"] == "loki"} >= {
                "logs/node01",
                "logs/node02",
            }
            assert r.json()["quality"] == analyze(BUNDLE)["quality"]
            missing = client.post("/v1/scopes", json={"slurm": "4242"})
            assert missing.status_code == 404 and "4242" in missing.json()["detail"]
            both = client.post("/v1/scopes", json={"slurm": "81234", "kueue": "a/b"})
            assert both.status_code == 422 and "exactly one" in both.text
    finally:
        srv.stop()


def test_a_kubernetes_scope_is_kept_with_its_pod_logs(tmp_path: Path) -> None:
    from hypocenter.config import load_settings
    from hypocenter.engine import default_engine
    from hypocenter.server.service import Attribution
    from hypocenter.store import open_store
    from tests.collector.test_connector_kubernetes import _connector, _example_fake, _node_logs

    example = REPO / "examples" / "hbm-ecc-xid48"
    scope = _connector(_example_fake("hbm-ecc-xid48"), "ml-team/train").scope()
    sources = [*scope.collected.sources, *_node_logs(example)]
    direct = default_engine().analyze(AttemptInput(scope.context, sources, scope.collected.coverage))
    settings, _ = load_settings(
        {"store": str(tmp_path / "s.db"), "settle_s": 3600, "idle_timeout_s": 86400}, environ={}
    )
    store = open_store(settings.store)
    service = Attribution(settings, store)
    try:
        assert service.store_scope(scope.context, sources) is True
        assert service.store_scope(scope.context, sources) is False  # seen again: nothing to do
        d, provisional = service.analyze(scope.context.workload.id, scope.context.workload.attempt)
    finally:
        service.close()
        store.close()
    assert not provisional
    assert d.root_cause is not None and direct.root_cause is not None
    assert (d.outcome, d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        direct.outcome,
        direct.root_cause.domain,
        direct.root_cause.subdomain,
        direct.root_cause.nodes,
    )
    # the pod logs were kept line by line: evidence points into them as into the connector's sources
    pod_refs = {e.ref.rsplit(":", 1)[0] for e in direct.evidence if e.ref.startswith("logs/")}
    assert pod_refs and pod_refs <= {e.ref.rsplit(":", 1)[0] for e in d.evidence}


def test_the_kueue_poll_scopes_workloads_that_ended(tmp_path: Path) -> None:
    """`--kube-poll-s`: Workloads whose Finished or Evicted condition turned true since the last look
    are scoped with the Kubernetes connector and kept; a second look keeps nothing new."""
    from hypocenter.collector.connectors.kube_api import KubeAPI
    from hypocenter.collector.connectors.kube_credentials import Credentials
    from hypocenter.config import load_settings
    from hypocenter.server.pulls import KueuePoller, ended_workloads
    from hypocenter.server.service import Attribution
    from hypocenter.store import open_store
    from tests.collector.test_connector_kubernetes import FAST, _example_fake

    fake = _example_fake("kueue-preemption")
    api = KubeAPI(
        Credentials(server="https://k8s.test", headers={"Authorization": "Bearer fake-token"}),
        policy=FAST,
        transport=fake.transport,
        sleep=lambda s: None,
    )
    assert "team-b/jobset-llm-sft-5f2a1" in ended_workloads(api, datetime(2026, 11, 1, tzinfo=timezone.utc))
    assert ended_workloads(api, datetime(2026, 12, 1, tzinfo=timezone.utc)) == []  # nothing ended since
    settings, _ = load_settings(
        {
            "store": str(tmp_path / "s.db"),
            "settle_s": 3600,
            "idle_timeout_s": 86400,
            "kube_poll_s": 60,
            "kube_poll_lookback_s": 90 * 86400,
        },
        environ={},
    )
    store = open_store(settings.store)
    service = Attribution(settings, store)
    try:
        poller = KueuePoller(settings, service.store_scope, api=api)
        assert poller.poll(now=datetime(2026, 12, 2, tzinfo=timezone.utc)) >= 1
        row = store.attempt("team-b/llm-sft", 0)
        assert row is not None and row.context is not None and row.context["state"] == "PREEMPTED"
        assert poller.poll(now=datetime(2026, 12, 2, 0, 1, tzinfo=timezone.utc)) == 0
        d, provisional = service.analyze("team-b/llm-sft", 0)
    finally:
        service.close()
        store.close()
    assert not provisional and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain) == ("external", "preemption")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_slurm_epilog_script_gets_the_job_analysed(loki: FakeLoki, tmp_path: Path) -> None:
    """deploy/slurm/hypocenter-epilog.sh, run the way slurmctld runs an EpilogSlurmctld."""
    srv = _pulling_server(loki, tmp_path / "store.db")
    script = REPO / "deploy" / "slurm" / "hypocenter-epilog.sh"
    try:
        run = subprocess.run(
            [str(script)],
            env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "81234", "HYPOCENTER_URL": srv.base},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0 and run.stderr == ""
        with srv.client() as client:
            got = wait_for_diagnosis(client, "81234", timeout=30)
        assert verdict(got) == verdict(analyze(BUNDLE))
        # an unknown job, or no job id at all: a line on stderr, and still exit 0 (never fail the epilog)
        for extra in ({"SLURM_JOB_ID": "4242"}, {}):
            bad = subprocess.run(
                [str(script)],
                env={"PATH": os.environ["PATH"], "HYPOCENTER_URL": srv.base, **extra},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert bad.returncode == 0 and bad.stderr.startswith("hypocenter-epilog: "), bad.stderr
    finally:
        srv.stop()
