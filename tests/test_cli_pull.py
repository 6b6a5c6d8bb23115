"""`hypocenter analyze` in pull mode: --slurm with fake client commands on PATH, --logs, --config,
and the one-line errors of bad combinations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hypocenter.cli import main

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.usefixtures("fake_slurm")
@pytest.mark.parametrize("version", ["23.02", "23.11", "24.05", "25.05"])
def test_slurm_plus_logs_gives_the_bundles_root_cause(version: str, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYPOCENTER_FAKE_SLURM", str(ROOT / "tests" / "fixtures" / "slurm" / version))
    # only the logs: the scheduler's account now comes from Slurm itself
    (tmp_path / "logs").symlink_to(EXAMPLE / "logs")
    pulled = _json(capsys, "--slurm", "81234", "--logs", str(tmp_path))
    bundle = _json(capsys, str(EXAMPLE))
    assert pulled["root_cause"] == bundle["root_cause"]
    assert pulled["outcome"] == bundle["outcome"] == "attributed"
    assert pulled["attempt"] == bundle["attempt"]
    sources = {(c["connector"], c["source"]) for c in pulled["coverage"]}  # type: ignore[union-attr,index]
    assert ("slurm", "slurm/sacct-81234.json") in sources and ("files", "logs/node02") in sources


@pytest.mark.usefixtures("fake_slurm")
def test_config_file_names_the_sources(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "collected").mkdir()
    (tmp_path / "collected" / "logs").symlink_to(EXAMPLE / "logs")
    cfg = tmp_path / "pull.yaml"
    cfg.write_text("slurm: 81234\nlogs: collected\ntimeout: 5\n")
    d = _json(capsys, "--config", str(cfg))
    assert d["root_cause"]["subdomain"] == "nvlink"  # type: ignore[index]


@pytest.mark.parametrize(("text", "message"), [
    ("slurm: 1\nslurmm: 2\n", "pull.yaml:2: unknown key 'slurmm'"),
    ("slurm: 1\nslurm: 2\n", "duplicate key 'slurm'"),
    ("timeout: -1\n", "timeout: Input should be greater than 0"),
    ("- slurm\n", "expected a mapping"),
])
def test_bad_config_is_one_line(text: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "pull.yaml"
    cfg.write_text(text)
    assert main(["analyze", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("hypocenter: ")


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give exactly one attempt to analyse"),
    ([str(EXAMPLE), "--slurm", "1"], "(given: BUNDLE, --slurm)"),
    (["--slurm", "1", "--kueue", "a/b"], "(given: --slurm, --kueue)"),
    (["--k8s-job", "a/b", "--slurm-rest", "http://x"], "--slurm-rest goes with --slurm"),
    (["--slurm", "1", "--kubeconfig", "k"], "--kubeconfig and --context go with --kueue or --k8s-job"),
    (["--slurm", "1", "--timeout", "0"], "--timeout must be a positive number"),
    (["--slurm", "81234x"], "slurm: '81234x' is not a Slurm job id"),
    (["--k8s-job", "justaname"], "kubernetes: --k8s-job 'justaname': expected NAMESPACE/NAME"),
])
def test_bad_combinations_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
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


def test_missing_slurm_commands_are_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["analyze", "--slurm", "81234"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hypocenter: slurm: Slurm job 81234: sacct not found on PATH: install Slurm's client")
    assert err.count("\n") == 1


@pytest.mark.usefixtures("fake_slurm")
def test_unknown_job_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--slurm", "4242"]) == 2
    assert "Slurm job 4242 not found" in capsys.readouterr().err


@pytest.mark.usefixtures("fake_slurm")
def test_a_failing_data_source_lowers_quality_but_gives_a_verdict(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    d = _json(capsys, "--slurm", "81234", "--logs", str(tmp_path / "nowhere"), "--timeout", "2")
    failed = [c for c in d["coverage"] if c["status"] == "failed"]  # type: ignore[union-attr]
    assert failed and failed[0]["connector"] == "files"  # type: ignore[index]
    assert d["outcome"] in ("unattributed", "attributed", "ambiguous")
