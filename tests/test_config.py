"""Settings: defaults < YAML file < HYPOCENTER_* environment < flags, and `config show` says which."""

from __future__ import annotations

import json
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
    env = {"HYPOCENTER_IDLE_TIMEOUT_S": "30", "HYPOCENTER_STORE": "/tmp/env.db", "HYPOCENTER_RULES": '["b.yaml"]'}
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
    with pytest.raises(InputError, match=r"c.yaml:2: unknown setting 'setle_s' \(did you mean 'settle_s'\?\)"):
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
    r = subprocess.run([sys.executable, "-m", "hypocenter.cli", "config", "show", "--config", str(cfg),
                        "--grpc-listen", "127.0.0.1:9999", "--format", "json"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=True)
    doc = json.loads(r.stdout)
    assert set(doc) == set(Settings.model_fields)
    assert doc["grpc_listen"] == {"value": "127.0.0.1:9999", "origin": "flag --grpc-listen"}
    assert doc["settle_s"] == {"value": 2.5, "origin": "env HYPOCENTER_SETTLE_S"}
    assert doc["http_listen"] == {"value": "0.0.0.0:4318", "origin": f"file {cfg}:1"}
    text = subprocess.run([sys.executable, "-m", "hypocenter.cli", "config", "show"], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=60, check=True).stdout
    assert any(line.split()[:3] == ["grpc_listen", "127.0.0.1:4317", "default"] for line in text.splitlines())
    bad = subprocess.run([sys.executable, "-m", "hypocenter.cli", "config", "show", "--tick-s", "-1"],
                         capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=60, check=False)
    assert bad.returncode == 2 and "flag --tick-s" in bad.stderr and "Traceback" not in bad.stderr


def test_config_show_hides_the_store_password() -> None:
    env = {**clean_env(), "HYPOCENTER_STORE": "postgresql://hypo:s3cret@db.example:5432/hypocenter"}
    for fmt in ("text", "json"):
        r = subprocess.run([sys.executable, "-m", "hypocenter.cli", "config", "show", "--format", fmt],
                           capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=True)
        assert "s3cret" not in r.stdout and "postgresql://hypo:***@db.example:5432/hypocenter" in r.stdout
    json.loads(r.stdout)


@pytest.mark.parametrize("name", ["pull_loki_url", "pull_prometheus_url", "slurm_rest_url", "loki_url", "grafana_url"])
def test_a_url_setting_that_is_not_a_url_is_refused_at_start(name: str) -> None:
    with pytest.raises(InputError, match=rf"{name}: 'loki:3100' is not an http:// or https:// URL"):
        load_settings({name: "loki:3100"}, environ={})
    settings, _ = load_settings({name: "https://loki.example:3100"}, environ={})
    assert getattr(settings, name) == "https://loki.example:3100"
