"""`hypocenter analyze` in pull mode: --slurm with fake client commands on PATH, --logs, --config,
the Loki and Prometheus options (flags, config, secrets from files and the environment), and the
one-line errors of bad combinations."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import QUERIES
from observability_fakes import FakeLoki

from hypocenter.cli import main
from hypocenter.collector import pull
from hypocenter.collector.bundle import load_bundle
from hypocenter.collector.connectors.base import RetryPolicy
from tests.e2e.test_pull_end_to_end import push_logs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAKE_BIN = ROOT / "examples" / "fake-slurm" / "bin"
EXAMPLE = ROOT / "examples" / "nvlink-xid149"


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HYPOCENTER_FAKE_SLURM", str(ROOT / "tests" / "fixtures" / "slurm" / "24.05"))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["analyze", "--format", "json", *argv]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


SLURM_VERSIONS = sorted(p.name for p in (ROOT / "tests" / "fixtures" / "slurm").iterdir() if p.is_dir())


def test_the_slurm_versions_are_the_ones_readme_lists() -> None:
    assert f"Slurm {SLURM_VERSIONS[0]} to {SLURM_VERSIONS[-1]}" in (ROOT / "README.md").read_text()


@pytest.mark.usefixtures("fake_slurm")
@pytest.mark.parametrize("version", SLURM_VERSIONS)
def test_slurm_plus_logs_is_the_bundles_diagnosis(
    version: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README: the pulled diagnosis equals the bundle's. All of it but coverage (which names other
    sources): the rank map rebuilt from Slurm's task layout puts the job log's [rankN] lines on their nodes."""
    monkeypatch.setenv("HYPOCENTER_FAKE_SLURM", str(ROOT / "tests" / "fixtures" / "slurm" / version))
    # only the logs: the scheduler's account now comes from Slurm itself
    (tmp_path / "logs").symlink_to(EXAMPLE / "logs")
    pulled = _json(capsys, "--slurm", "81234", "--logs", str(tmp_path))
    bundle = _json(capsys, str(EXAMPLE))
    assert pulled["outcome"] == "attributed"
    sources = {(c["connector"], c["source"]) for c in pulled.pop("coverage")}  # type: ignore[union-attr,index]
    assert ("slurm", "slurm/sacct-81234.json") in sources and ("files", "logs/node02") in sources
    bundle.pop("coverage")
    assert pulled == bundle


@pytest.mark.usefixtures("fake_slurm")
def test_config_file_names_the_sources(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "collected").mkdir()
    (tmp_path / "collected" / "logs").symlink_to(EXAMPLE / "logs")
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("slurm: 81234\nlogs: collected\ntimeout: 5\n")
    d = _json(capsys, "--config", str(cfg))
    assert d["root_cause"]["subdomain"] == "nvlink"  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slurm: 1\nslurmm: 2\n", "pull.yaml:2: unknown key 'slurmm'"),
        ("slurm: 1\nslurm: 2\n", "duplicate key 'slurm'"),
        ("timeout: -1\n", "timeout: Input should be greater than 0"),
        ("- slurm\n", "expected a mapping"),
    ],
)
def test_bad_config_is_one_line(
    text: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text(text)
    assert main(["analyze", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("hypocenter: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give exactly one attempt to analyse"),
        ([str(EXAMPLE), "--slurm", "1"], "(given: BUNDLE, --slurm)"),
        (["--slurm", "1", "--kueue", "a/b"], "(given: --slurm, --kueue)"),
        (["--k8s-job", "a/b", "--slurm-rest", "http://x"], "--slurm-rest goes with --slurm"),
        (["--slurm", "1", "--kubeconfig", "k"], "--kubeconfig and --context go with --kueue or --k8s-job"),
        (["--slurm", "1", "--timeout", "0"], "--timeout must be a positive number"),
        (["--slurm", "81234x"], "slurm: '81234x' is not a Slurm job id"),
        (["--k8s-job", "justaname"], "kubernetes: --k8s-job 'justaname': expected NAMESPACE/NAME"),
    ],
)
def test_bad_combinations_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if message.startswith(("slurm:", "kubernetes:")):  # the connector's own refusal: one line
        assert main(["analyze", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        return
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: hypocenter analyze" in err and message in err and "Traceback" not in err


def test_missing_slurm_commands_are_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["analyze", "--slurm", "81234"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "hypocenter: slurm: Slurm job 81234: sacct not found on PATH: install Slurm's client"
    )
    assert err.count("\n") == 1


@pytest.mark.usefixtures("fake_slurm")
def test_unknown_job_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--slurm", "4242"]) == 2
    assert "Slurm job 4242 not found" in capsys.readouterr().err


@pytest.mark.usefixtures("fake_slurm")
def test_a_failing_data_source_lowers_quality_but_gives_a_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = _json(capsys, "--slurm", "81234", "--logs", str(tmp_path / "nowhere"), "--timeout", "2")
    failed = [c for c in d["coverage"] if c["status"] == "failed"]  # type: ignore[union-attr]
    assert failed and failed[0]["connector"] == "files"  # type: ignore[index]
    assert d["outcome"] in ("unattributed", "attributed", "ambiguous")


# ------------------------------------------------------------------------------ Loki and Prometheus options


@pytest.fixture
def loki_hostname_labels() -> Iterator[FakeLoki]:
    """The example's logs in a Loki behind auth and tenancy, node streams labelled `hostname` (not
    the default `host`), the job's stdout in {job="slurm", workload="81234"}."""
    fake = FakeLoki(required_headers={"Authorization": "Bearer s3cret", "X-Scope-OrgID": "team-a"}).start()
    push_logs(load_bundle(EXAMPLE), fake)
    for entry in fake.entries:
        if "host" in entry.labels:
            entry.labels["hostname"] = entry.labels.pop("host")
    yield fake
    fake.stop()


def _loki_coverage(d: dict[str, object]) -> dict[str, str]:
    return {c["source"]: c["status"] for c in d["coverage"] if c["connector"] == "loki"}  # type: ignore[union-attr,index]


@pytest.mark.usefixtures("fake_slurm")
def test_loki_options_from_flags_and_a_token_file(
    loki_hostname_labels: FakeLoki, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "loki-token").write_text("s3cret\n")
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("loki:\n  tenant: team-a\n  token_file: loki-token\n")  # relative to the file
    d = _json(
        capsys,
        "--slurm",
        "81234",
        "--config",
        str(cfg),
        "--loki",
        loki_hostname_labels.url,
        "--loki-node-label",
        "hostname",
        "--loki-workload-selector",
        'job="slurm", workload="{workload}"',
    )
    assert d["root_cause"] == _json(capsys, str(EXAMPLE))["root_cause"]
    assert _loki_coverage(d) == dict.fromkeys(
        ["logs/_job", "logs/node01", "logs/node02", "logs/node03", "logs/node04"], "ok"
    )
    # the flags' defaults: node streams looked for under `host`, and no job-level query at all
    d = _json(capsys, "--slurm", "81234", "--config", str(cfg), "--loki", loki_hostname_labels.url)
    assert set(_loki_coverage(d).values()) == {"missing"} and "logs/_job" not in _loki_coverage(d)


@pytest.mark.usefixtures("fake_slurm")
def test_loki_options_from_the_config_and_the_token_from_the_environment(
    loki_hostname_labels: FakeLoki,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text(
        f"slurm: 81234\nloki:\n  url: {loki_hostname_labels.url}\n  tenant: team-a\n  node_label: hostname\n"
        '  workload_selector: \'{job="slurm", workload="{workload}"}\'\n'
    )
    monkeypatch.setenv("LOKI_BEARER_TOKEN", "s3cret")  # logcli's variable, as the file names no token
    d = _json(capsys, "--config", str(cfg))
    assert set(_loki_coverage(d).values()) == {"ok"} and "logs/_job" in _loki_coverage(d)
    monkeypatch.setenv("LOKI_BEARER_TOKEN", "wrong")
    d = _json(capsys, "--config", str(cfg))  # refused: a failed source, still a verdict
    assert set(_loki_coverage(d).values()) == {"failed"}


def test_prometheus_options_and_basic_auth(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("hunter2\n")
    cfg = tmp_path / "pull.yaml"
    cfg.write_text(
        "slurm: 1\nprometheus:\n  url: http://prometheus:9090\n  node_labels: [Hostname, node]\n"
        "  resolution_s: 30\n  username: ops\n  password_file: pw\n"
    )
    ((_name, make),) = pull._data_connectors(pull.load_config(cfg), RetryPolicy(), QUERIES, env={})
    prometheus = make()
    assert (prometheus.node_labels, prometheus.resolution_s) == (["Hostname", "node"], 30)
    assert prometheus.api._headers["Authorization"] == "Basic " + base64.b64encode(b"ops:hunter2").decode()
    ((_name, make),) = pull._data_connectors(
        pull.load_config(cfg), RetryPolicy(), QUERIES, env={"PROMETHEUS_BEARER_TOKEN": "t0k"}
    )
    assert make().api._headers["Authorization"] == "Bearer t0k"


@pytest.mark.parametrize(
    ("tenant", "env", "header"),
    [
        (None, {"LOKI_ORG_ID": "team-a"}, "team-a"),  # logcli's variable, when the file names none
        ("team-b", {}, "team-b"),
        (
            "team-b",
            {"LOKI_ORG_ID": "team-a"},
            "team-b",
        ),  # the file beats the ambient variable, as logcli's --org-id
        (None, {}, None),
    ],
)
def test_the_loki_tenant_from_the_config_or_the_environment(
    tenant: str | None, env: dict[str, str], header: str | None, tmp_path: Path
) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("slurm: 1\nloki:\n  url: http://loki:3100\n" + (f"  tenant: {tenant}\n" if tenant else ""))
    ((_name, make),) = pull._data_connectors(pull.load_config(cfg), RetryPolicy(), QUERIES, env=env)
    assert make().api._headers.get("X-Scope-OrgID") == header


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "loki:\n  url: http://l\n  token: abc\n",
            "loki.token: secrets are not read from the config file: use token_file",
        ),
        ("prometheus:\n  url: http://p\n  password: x\n", "set $PROMETHEUS_PASSWORD"),
        ("loki:\n  url: http://l\n  nodelabel: h\n", "unknown key 'loki.nodelabel' (known: url, headers,"),
        (
            "loki:\n  url: http://l\n  node_label_kind: metadata\n",
            "node_label_kind: metadata needs a selector",
        ),
        ("loki:\n  url: http://l\n  node_label_kind: label\n", "Input should be 'index' or 'metadata'"),
        ("prometheus:\n  url: http://p\n  resolution_s: 0\n", "resolution_s: Input should be greater than 0"),
    ],
)
def test_bad_source_options_are_one_line(
    text: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("slurm: 1\n" + text)
    assert main(["analyze", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("hypocenter: "), err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slurm", "1", "--loki-node-label", "hostname"], "--loki-node-label goes with --loki URL"),
        (
            ["--slurm", "1", "--loki-workload-selector", 'a="b"'],
            "--loki-workload-selector goes with --loki URL",
        ),
    ],
)
def test_loki_flags_need_a_loki(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["analyze", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slurm", "1", "--loki", "notaurl"], "'notaurl' is not an http:// or https:// URL (--loki,"),
        (
            ["--slurm", "1", "--prometheus", "ftp://p"],
            "'ftp://p' is not an http:// or https:// URL (--prometheus,",
        ),
        (
            ["--slurm", "1", "--slurm-rest", "http://[::1"],
            "'http://[::1' is not an http:// or https:// URL (--slurm-rest,",
        ),
    ],
)
def test_a_source_url_that_is_no_http_url_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(
            ["analyze", *argv]
        )  # before any query: each would fail alike, retried as if the server were down
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_unreadable_secret_file_stops_before_the_pull(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("slurm: 1\nloki: {url: 'http://l', token_file: missing}\n")
    assert main(["analyze", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert (
        f"loki.token_file: cannot read {tmp_path / 'missing'}: No such file" in err and err.count("\n") == 1
    )
