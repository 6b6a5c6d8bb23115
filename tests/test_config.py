"""Settings: defaults < YAML file < HYPOCENTER_* environment < flags, and `config show` says which."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from server_support import REPO, clean_env

from hypocenter.config import Settings, load_settings
from hypocenter.errors import InputError


def test_defaults_bind_loopback() -> None:
    s, origin = load_settings({}, environ={})
    assert s.grpc_listen == "127.0.0.1:4317" and s.http_listen == "127.0.0.1:4318"
    assert s.max_message_bytes == 64 << 20
    assert set(origin.values()) == {"default"}


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "hypocenter.yaml"
    cfg.write_text("settle_s: 1\nidle_timeout_s: 60\nstore: /tmp/x.db\nrules: [a.yaml]\n")
    env = {
        "HYPOCENTER_IDLE_TIMEOUT_S": "30",
        "HYPOCENTER_STORE": "/tmp/env.db",
        "HYPOCENTER_RULES": '["b.yaml"]',
    }
    s, origin = load_settings({"store": "/tmp/flag.db"}, config=cfg, environ=env)
    assert s.settle_s == 1.0 and origin["settle_s"] == f"file {cfg}:1"
    assert s.idle_timeout_s == 30.0 and origin["idle_timeout_s"] == "env HYPOCENTER_IDLE_TIMEOUT_S"
    assert s.store == "/tmp/flag.db" and origin["store"] == "flag --store"
    assert s.rules == ["b.yaml"]
    assert origin["tick_s"] == "default"
    # the file can also come from HYPOCENTER_CONFIG
    s2, origin2 = load_settings({}, environ={"HYPOCENTER_CONFIG": str(cfg)})
    assert s2.settle_s == 1.0 and origin2["settle_s"].startswith("file ")


def test_errors_name_their_origin(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("settle_s: 1\nsetle_s: 2\n")
    with pytest.raises(
        InputError, match=r"c.yaml:2: unknown setting 'setle_s' \(did you mean 'settle_s'\?\)"
    ):
        load_settings({}, config=cfg, environ={})
    with pytest.raises(InputError, match="HYPOCENTER_SETTLE_S: settle_s"):
        load_settings({}, environ={"HYPOCENTER_SETTLE_S": "soon"})
    with pytest.raises(InputError, match="flag --grpc-workers"):
        load_settings({"grpc_workers": "0"}, environ={})
    cfg.write_text("settle_s: 1\nsettle_s: 2\n")
    with pytest.raises(InputError, match="duplicate key"):
        load_settings({}, config=cfg, environ={})
    with pytest.raises(InputError, match="no such config file"):
        load_settings({}, config=tmp_path / "missing.yaml", environ={})


def test_config_show_prints_values_and_origins(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("http_listen: 0.0.0.0:4318\n")
    env = {**clean_env(), "HYPOCENTER_SETTLE_S": "2.5"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "config",
            "show",
            "--config",
            str(cfg),
            "--grpc-listen",
            "127.0.0.1:9999",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    doc = json.loads(r.stdout)
    assert set(doc) == set(Settings.model_fields)
    assert doc["grpc_listen"] == {"value": "127.0.0.1:9999", "origin": "flag --grpc-listen"}
    assert doc["settle_s"] == {"value": 2.5, "origin": "env HYPOCENTER_SETTLE_S"}
    assert doc["http_listen"] == {"value": "0.0.0.0:4318", "origin": f"file {cfg}:1"}
    text = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "config", "show"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=60,
        check=True,
    ).stdout
    assert any(line.split()[:3] == ["grpc_listen", "127.0.0.1:4317", "default"] for line in text.splitlines())
    bad = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "config", "show", "--tick-s", "-1"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "flag --tick-s" in bad.stderr and "Traceback" not in bad.stderr


def test_config_show_hides_the_store_password() -> None:
    env = {**clean_env(), "HYPOCENTER_STORE": "postgresql://hypo:s3cret@db.example:5432/hypocenter"}
    for fmt in ("text", "json"):
        r = subprocess.run(
            [sys.executable, "-m", "hypocenter.cli", "config", "show", "--format", fmt],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
            check=True,
        )
        assert "s3cret" not in r.stdout and "postgresql://hypo:***@db.example:5432/hypocenter" in r.stdout
    json.loads(r.stdout)


@pytest.mark.parametrize(
    "name", ["pull_loki_url", "pull_prometheus_url", "slurm_rest_url", "loki_url", "grafana_url"]
)
def test_a_url_setting_that_is_not_a_url_is_refused_at_start(name: str) -> None:
    with pytest.raises(InputError, match=rf"{name}: 'loki:3100' is not an http:// or https:// URL"):
        load_settings({name: "loki:3100"}, environ={})
    settings, _ = load_settings({name: "https://loki.example:3100"}, environ={})
    assert getattr(settings, name) == "https://loki.example:3100"


def _serve_help() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**clean_env(), "COLUMNS": "200"},
        check=True,
    ).stdout
    return out


def _section(text: str, title: str) -> str:
    """The lines of one argparse group, from its title to the next title."""
    lines = text.splitlines()
    start = lines.index(f"{title}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines)
    )
    return "\n".join(lines[start:end])


def test_serve_help_groups_every_setting_with_its_default_and_choices() -> None:
    from hypocenter.cli.settings_help import GROUPS, group_of

    assert [n for n in Settings.model_fields if group_of(n) is None] == []
    text = _serve_help()
    assert not re.search(r"\bVALUE\b", text.split("\n\n", 1)[1])  # every option says what it takes
    assert "--settle-s SECONDS" in text and "(default: 10.0)" in text and "[HYPOCENTER_SETTLE_S]" in text
    assert (
        "--loki-encoding {protobuf,json}" in text
        and "--tls-client-default-role {ingest,read,admin,none}" in text
    )
    push, pull = _section(text, "push exports (diagnoses out)"), _section(text, "pulls (evidence in)")
    assert "--loki-url URL" in push and "--pull-loki-url URL" not in push
    assert "--pull-loki-url URL" in pull and "--loki-url URL" not in pull.replace("--pull-loki-url", "")
    assert "analyze --loki" in pull and "not where it reads logs from" in push
    for title, _, _ in GROUPS:
        assert f"\n{title}:\n" in text


@pytest.mark.parametrize(
    ("flag", "instead"),
    [
        ("--grafana-token", "--grafana-token-file PATH or HYPOCENTER_GRAFANA_TOKEN"),
        ("--loki-basic-auth", "--loki-basic-auth-file PATH or HYPOCENTER_LOKI_BASIC_AUTH"),
    ],
)
def test_secret_flags_are_refused_with_what_to_use(flag: str, instead: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "serve", flag, "s3cret"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and instead in proc.stderr
    assert f"{flag} " not in _serve_help()


def test_secrets_come_from_their_file_or_the_environment_never_the_settings_file(tmp_path: Path) -> None:
    from hypocenter.config import secret

    token = tmp_path / "grafana-token"
    token.write_text("glsa_from_file\n")
    settings, _ = load_settings({"grafana_token_file": str(token)}, environ={})
    assert secret(settings, "grafana_token") == "glsa_from_file"
    settings, _ = load_settings(
        {"grafana_token_file": str(token)}, environ={"HYPOCENTER_GRAFANA_TOKEN": "from_env"}
    )
    assert secret(settings, "grafana_token") == "from_env"
    settings, _ = load_settings({"loki_basic_auth_file": str(tmp_path / "nope")}, environ={})
    with pytest.raises(InputError, match=r"loki_basic_auth_file .*nope: No such file"):
        secret(settings, "loki_basic_auth")
    cfg = tmp_path / "s.yaml"
    cfg.write_text("settle_s: 2\ngrafana_token: glsa_in_file\n")
    with pytest.raises(
        InputError, match=r"s.yaml:2: grafana_token: no secrets in the settings file: use grafana_token_file"
    ):
        load_settings(config=cfg, environ={})


def test_deploy_docs_pass_no_secret_as_a_flag() -> None:
    text = (REPO / "deploy" / "README.md").read_text()
    assert "--grafana-token " not in text and "--loki-basic-auth " not in text
