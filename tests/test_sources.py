"""One model of a pull data source: `hypocenter serve` (its `pull_loki_*` / `pull_prometheus_*`
settings) and `hypocenter analyze` (`--config` file) resolve the same inputs, environment included,
to the same connector arguments — and explicit configuration beats logcli's ambient variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_support import QUERIES

from hypocenter.collector import pull
from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.config import LokiSource, load_settings
from hypocenter.engine import default_engine
from hypocenter.errors import InputError
from hypocenter.server import pulls

WINDOW_AND_POLICY = {"policy", "queries", "lookback_s", "slack_s"}  # the server's window; not the source's


class Recorded:
    """Stands in for a connector class: keeps what it was built with."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self.url = url
        self.kwargs = kwargs


def _server(monkeypatch: pytest.MonkeyPatch, flags: dict[str, Any], env: dict[str, str]) -> pulls.Pulls:
    monkeypatch.setattr(pulls, "connector_class", lambda name: Recorded)
    for name in (
        "LOKI_ORG_ID",
        "LOKI_BEARER_TOKEN",
        "LOKI_BEARER_TOKEN_FILE",
        "LOKI_USERNAME",
        "LOKI_PASSWORD",
        "PROMETHEUS_BEARER_TOKEN",
        "PROMETHEUS_BEARER_TOKEN_FILE",
        "PROMETHEUS_USERNAME",
        "PROMETHEUS_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings, _ = load_settings(flags, environ=env)
    return pulls.Pulls(settings, default_engine().ruleset)


def _cli(monkeypatch: pytest.MonkeyPatch, config: str, env: dict[str, str], tmp_path: Path) -> list[Recorded]:
    monkeypatch.setattr(pull, "connector_class", lambda name: Recorded)
    path = tmp_path / "pull.yaml"
    path.write_text("slurm: 1\n" + config)
    return [
        make()
        for _name, make in pull._data_connectors(pull.load_config(path), RetryPolicy(), QUERIES, env=env)
    ]


def _source_arguments(connector: object) -> tuple[str, dict[str, Any]]:
    assert isinstance(connector, Recorded)
    return connector.url, {k: v for k, v in connector.kwargs.items() if k not in WINDOW_AND_POLICY}


LOKI_CASES = [
    pytest.param(
        {"pull_loki_tenant": "team-b"},
        "  tenant: team-b\n",
        {"LOKI_ORG_ID": "team-a"},
        "team-b",
        id="configured tenant beats LOKI_ORG_ID",
    ),
    pytest.param({}, "", {"LOKI_ORG_ID": "team-a"}, "team-a", id="LOKI_ORG_ID fills in"),
    pytest.param({}, "", {}, None, id="no tenant"),
    pytest.param(
        {
            "pull_loki_node_label": "host_name",
            "pull_loki_node_label_kind": "metadata",
            "pull_loki_selector": 'service_name=~".+"',
            "pull_loki_workload_selector": 'wl="{workload}"',
        },
        '  node_label: host_name\n  node_label_kind: metadata\n  selector: service_name=~".+"\n'
        '  workload_selector: wl="{workload}"\n',
        {"LOKI_BEARER_TOKEN": "t0k", "LOKI_USERNAME": "ops", "LOKI_PASSWORD": "pw"},
        None,
        id="metadata labels, a token beats basic auth",
    ),
    pytest.param({}, "", {"LOKI_USERNAME": "ops", "LOKI_PASSWORD": "pw"}, None, id="basic auth"),
]


@pytest.mark.parametrize(("flags", "config", "env", "tenant"), LOKI_CASES)
def test_serve_and_analyze_build_the_same_loki_connector(
    flags: dict[str, Any],
    config: str,
    env: dict[str, str],
    tenant: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server = _server(monkeypatch, {"pull_loki_url": "http://loki:3100", **flags}, env).logs
    (cli,) = _cli(monkeypatch, "loki:\n  url: http://loki:3100\n" + config, env, tmp_path)
    assert _source_arguments(server) == _source_arguments(cli)
    assert _source_arguments(cli)[1]["tenant"] == tenant


def test_the_tenant_setting_from_the_environment_also_beats_loki_org_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"HYPOCENTER_PULL_LOKI_TENANT": "team-b", "LOKI_ORG_ID": "team-a"}
    server = _server(monkeypatch, {"pull_loki_url": "http://loki:3100"}, env).logs
    assert _source_arguments(server)[1]["tenant"] == "team-b"


@pytest.mark.parametrize(
    "env",
    [{}, {"PROMETHEUS_USERNAME": "ops", "PROMETHEUS_PASSWORD": "pw"}, {"PROMETHEUS_BEARER_TOKEN": "t0k"}],
)
def test_serve_and_analyze_build_the_same_prometheus_connector(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = _server(monkeypatch, {"pull_prometheus_url": "http://prometheus:9090"}, env).metrics
    (cli,) = _cli(monkeypatch, "prometheus: http://prometheus:9090\n", env, tmp_path)
    assert _source_arguments(server) == _source_arguments(cli)


def test_a_token_file_beats_the_ambient_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    source = LokiSource(url="http://loki:3100", token_file=str(tmp_path / "token"))
    assert source.connector_arguments({"LOKI_BEARER_TOKEN": "ambient"})["token"] == "from-file"
    assert (
        LokiSource(url="http://loki:3100").connector_arguments({"LOKI_BEARER_TOKEN": "ambient"})["token"]
        == "ambient"
    )
    with pytest.raises(InputError, match=r"loki.token_file: cannot read .*nowhere"):
        LokiSource(url="http://loki:3100", token_file=str(tmp_path / "nowhere")).connector_arguments(
            {"LOKI_BEARER_TOKEN": "ambient"}
        )


def test_the_settings_describe_their_sources_as_the_pull_config_does() -> None:
    settings, _ = load_settings(
        {
            "pull_loki_url": "http://loki:3100",
            "pull_loki_selector": 'job="x"',
            "pull_prometheus_url": "http://prometheus:9090",
        },
        environ={},
    )
    assert settings.pull_loki == LokiSource(url="http://loki:3100", selector='job="x"')
    assert settings.pull_prometheus is not None and settings.pull_prometheus.url == "http://prometheus:9090"
    assert load_settings({}, environ={})[0].pull_loki is None
