"""The `hypocenter` command behaves as documented: report, JSON, schema, colour, rules, exit codes."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from engine_support import EXTRA_RULE

import hypocenter
from hypocenter import cli
from hypocenter.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "nvlink-xid149"
BUNDLES = sorted(p for p in EXAMPLES.iterdir() if (p / "attempt.yaml").is_file())
ANSI = "\x1b["

# Contract 3 (docs/design.md): the top-level keys of a diagnosis, in this order.
CONTRACT_KEYS = [
    "schema",
    "id",
    "attempt",
    "terminal_state",
    "outcome",
    "root_cause",
    "candidates",
    "affected_nodes",
    "symptoms",
    "evidence",
    "quality",
    "next_step",
    "coverage",
    "engine",
]


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = ("NO_COLOR",),
    encoding: str = "utf-8",
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        encoding=encoding,
        timeout=180,
        env=environ,
        check=False,
    )


@pytest.fixture(scope="module")
def example_json() -> dict[str, Any]:
    proc = run_cli("analyze", str(EXAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    proc = run_cli("schema")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"hypocenter {hypocenter.__version__}"


def test_usage_errors_exit_2_without_a_traceback() -> None:
    for args in ((), ("analyze",), ("frobnicate",), ("analyze", str(EXAMPLE), "--format", "xml")):
        proc = run_cli(*args)
        assert proc.returncode == 2, args
        assert "Traceback" not in proc.stderr
        assert "usage: hypocenter" in proc.stderr


# ---------------------------------------------------------------------------------------- analyze


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("hypocenter · workload 81234 attempt 0 (slurm/eos) · FAILED · 4 node(s)")
    assert lines[1].startswith("ATTRIBUTED  hardware/nvlink on node02")
    for section in ("Symptoms", "Evidence", "Quality", "Coverage"):
        assert any(line.startswith(section) for line in lines), section
    assert ANSI not in out  # not a terminal


def test_json_is_contract_3(example_json: dict[str, Any]) -> None:
    assert list(example_json) == [*CONTRACT_KEYS, "cost"]  # cost: added compatibly
    assert example_json["schema"] == "hypocenter.diagnosis/v1"
    assert example_json["outcome"] == "attributed"
    assert list(example_json["attempt"]) == [
        "workload_id",
        "attempt",
        "scheduler",
        "cluster",
        "window",
        "nodes",
    ]
    assert list(example_json["root_cause"]) == [
        "domain",
        "subdomain",
        "rule",
        "summary",
        "nodes",
        "components",
        "first_seen",
        "action",
    ]
    assert list(example_json["quality"]) == ["level", "reasons"]
    assert list(example_json["engine"]) == ["version", "ruleset"]
    for cov in example_json["coverage"]:
        assert list(cov)[:4] == ["connector", "source", "status", "observations"]


def test_json_is_byte_stable() -> None:
    first = run_cli("analyze", str(EXAMPLE), "--format", "json")
    second = run_cli("analyze", str(EXAMPLE), "--format", "json")
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout
    assert ANSI not in first.stdout


def test_json_ignores_color_always(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(EXAMPLE), "--format", "json", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert ANSI not in out
    json.loads(out)


def test_outcome_does_not_change_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    """0 whenever a diagnosis was produced: attributed, unattributed, not_failed alike."""
    outcomes = set()
    for bundle in BUNDLES:
        assert main(["analyze", str(bundle), "--format", "json"]) == 0, bundle.name
        outcomes.add(json.loads(capsys.readouterr().out)["outcome"])
    assert "attributed" in outcomes and len(outcomes) > 1


# ----------------------------------------------------------------------------------------- schema


def test_schema_is_valid_json_schema(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert set(schema["properties"]) == set(CONTRACT_KEYS) | {
        "first_failure",  # optional, unattributed only (#20)
        "cost",  # optional: added compatibly
    }
    assert set(schema["required"]) == set(CONTRACT_KEYS) - {
        "candidates",
        "next_step",
    }  # next_step: added compatibly
    assert schema["properties"]["schema"]["const"] == "hypocenter.diagnosis/v1"


def test_example_diagnosis_validates_against_the_schema(
    schema: dict[str, Any], example_json: dict[str, Any]
) -> None:
    jsonschema.Draft202012Validator(schema).validate(example_json)


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_every_example_validates(
    schema: dict[str, Any], bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(bundle), "--format", "json"]) == 0
    jsonschema.Draft202012Validator(schema).validate(json.loads(capsys.readouterr().out))


def test_schema_rejects_what_is_not_a_diagnosis(schema: dict[str, Any], example_json: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for broken in (
        {**example_json, "schema": "hypocenter.diagnosis/v2"},
        {**example_json, "outcome": "probably"},
        {k: v for k, v in example_json.items() if k != "quality"},
    ):
        assert not validator.is_valid(broken)


# ----------------------------------------------------------------------------------------- colour


def test_color_always() -> None:
    proc = run_cli("analyze", str(EXAMPLE), "--color", "always")
    assert proc.returncode == 0
    assert ANSI in proc.stdout


def test_no_color_by_default_when_not_a_terminal() -> None:
    proc = run_cli("analyze", str(EXAMPLE))
    assert proc.returncode == 0
    assert ANSI not in proc.stdout


def test_color_never_and_no_color() -> None:
    assert ANSI not in run_cli("analyze", str(EXAMPLE), "--color", "never").stdout
    assert ANSI not in run_cli("analyze", str(EXAMPLE), env={"NO_COLOR": "1"}).stdout
    # An explicit flag beats the environment (no-color.org).
    assert ANSI in run_cli("analyze", str(EXAMPLE), "--color", "always", env={"NO_COLOR": "1"}).stdout


def _on_a_terminal(*args: str, env: dict[str, str] | None = None) -> str:
    """stdout of `hypocenter ARGS` written to a pseudo-terminal (read while it runs: a pty buffer is small)."""
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypocenter.cli", *args],
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env={**environ, **(env or {})},
        )
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=180) == 0
        return b"".join(chunks).decode("utf-8", errors="replace")
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_colour_on_a_terminal() -> None:
    assert ANSI in _on_a_terminal("analyze", str(EXAMPLE))
    assert ANSI not in _on_a_terminal("analyze", str(EXAMPLE), env={"NO_COLOR": "1"})
    assert ANSI not in _on_a_terminal("analyze", str(EXAMPLE), "--color", "never")


# ----------------------------------------------------------------------------------------- output


def test_a_terminal_that_cannot_show_unicode() -> None:
    proc = run_cli("analyze", str(EXAMPLE), env={"PYTHONIOENCODING": "ascii"}, encoding="ascii")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ATTRIBUTED" in proc.stdout


def test_json_is_utf8_whatever_the_locale(example_json: dict[str, Any]) -> None:
    proc = run_cli("analyze", str(EXAMPLE), "--format", "json", env={"PYTHONIOENCODING": "latin-1"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == example_json


def test_a_closed_pipe_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hypocenter analyze B | head -1`: the reader went away; stop quietly."""

    class ClosedPipe(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["analyze", str(EXAMPLE)]) == 0
    assert capsys.readouterr().err == ""


def test_an_internal_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hypocenter.engine import Engine

    def boom(self: Engine, *args: object, **kwargs: object) -> None:
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(Engine, "analyze", boom)
    monkeypatch.delenv("HYPOCENTER_DEBUG", raising=False)
    assert main(["analyze", str(EXAMPLE)]) == cli.EXIT_INTERNAL
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "hypocenter: internal error: RuntimeError: something broke (this is a bug, please report it; "
        "HYPOCENTER_DEBUG=1 shows the traceback)"
    ]
    monkeypatch.setenv("HYPOCENTER_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["analyze", str(EXAMPLE)])


# ------------------------------------------------------------------------------------------ rules


def test_rules_check_builtin_catalog() -> None:
    proc = run_cli("rules", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].endswith(" 0 problem(s)")


def test_rules_test_builtin_catalog() -> None:
    proc = run_cli("rules", "test")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout.splitlines()[-1]


def test_rules_list() -> None:
    proc = run_cli("rules", "list")
    assert proc.returncode == 0, proc.stderr
    assert "xid-nvlink-fatal" in proc.stdout


RULE = EXTRA_RULE


def _rule_error(tmp_path: Path, text: str, *extra: str) -> str:
    path = tmp_path / "my-rules.yaml"
    path.write_text(text, encoding="utf-8")
    proc = run_cli("rules", "check", "--rules", str(path), *extra)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hypocenter: "), proc.stderr
    return lines[0]


def test_rule_file_with_a_misspelt_field(tmp_path: Path) -> None:
    line = _rule_error(tmp_path, RULE.replace("    extract:", "    extarct:"))
    assert "my-rules.yaml:6:" in line  # the misspelt key itself
    assert "unknown field 'extarct'" in line and "did you mean 'extract'?" in line


def test_rule_file_with_a_misspelt_nested_field(tmp_path: Path) -> None:
    line = _rule_error(tmp_path, RULE.replace("      tokens:", "      tokns:"))
    assert "my-rules.yaml:" in line and "did you mean 'tokens'?" in line


def test_rule_file_with_a_duplicate_rule_id(tmp_path: Path) -> None:
    line = _rule_error(tmp_path, RULE + RULE.removeprefix("rules:\n"))
    assert "frobnicator-exploded" in line
    assert "my-rules.yaml:11:" in line and "my-rules.yaml:2" in line  # both places


def test_rule_id_that_is_already_builtin(tmp_path: Path) -> None:
    line = _rule_error(tmp_path, RULE.replace("frobnicator-exploded\n", "xid-nvlink-fatal\n", 1))
    assert "my-rules.yaml:2:" in line and "xid-nvlink-fatal" in line and "already defined at" in line


def test_rule_ids_clash_across_two_files(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "first.yaml").write_text(RULE, encoding="utf-8")
    line = _rule_error(tmp_path, RULE, "--rules", str(other / "first.yaml"))
    assert "first.yaml:2" in line and "my-rules.yaml:2" in line


def test_rule_with_a_regex_that_does_not_compile(tmp_path: Path) -> None:
    line = _rule_error(
        tmp_path, RULE.replace("pattern: 'frobnicator exploded'", "pattern: 'frob(nicator exploded'")
    )
    assert "does not compile" in line
    assert "my-rules.yaml:" in line
    lineno = int(line.split("my-rules.yaml:")[1].split(":")[0])
    assert 2 <= lineno <= 9  # within the rule, at the extract block or its pattern


def test_rule_file_with_a_duplicate_key(tmp_path: Path) -> None:
    line = _rule_error(
        tmp_path, RULE.replace("    status: experimental\n", "    status: experimental\n    status: stable\n")
    )
    assert "my-rules.yaml:5:" in line and "duplicate key 'status'" in line


def test_rule_file_that_is_not_yaml_or_not_utf8(tmp_path: Path) -> None:
    assert "invalid YAML" in _rule_error(tmp_path, "rules: [\n")
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"rules: []\n# caf\xe9\n")
    proc = run_cli("rules", "check", "--rules", str(path))
    assert proc.returncode == 2 and "latin1.yaml:2: file is not UTF-8 text" in proc.stderr


def test_missing_rule_path() -> None:
    proc = run_cli("rules", "check", "--rules", "/nonexistent/rules.yaml")
    assert proc.returncode == 2 and proc.stderr.startswith("hypocenter: ") and "Traceback" not in proc.stderr


def test_analyze_with_a_broken_rule_file(tmp_path: Path) -> None:
    path = tmp_path / "my-rules.yaml"
    path.write_text(RULE.replace("    extract:", "    extarct:"), encoding="utf-8")
    proc = run_cli("analyze", str(EXAMPLE), "--rules", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "did you mean 'extract'?" in proc.stderr


def test_analyze_with_an_extra_rule_file(tmp_path: Path) -> None:
    """The extra rule reads its line next to the catalog's, and the catalog's verdict stands."""
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    with (bundle / "logs/node01/kern.log").open("a", encoding="utf-8") as f:
        f.write("Nov  2 10:20:00 node01 kernel: frobnicator exploded\n")
    path = tmp_path / "my-rules.yaml"
    path.write_text(
        RULE + "    attribute:\n      when: {kind: frobnicator_exploded}\n      role: symptom\n"
        "      symptom: frobnicator_exploded\n",
        encoding="utf-8",
    )
    proc = run_cli("analyze", str(bundle), "--rules", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["root_cause"]["subdomain"] == "nvlink"
    assert [(s["rule"], s["nodes"]) for s in doc["symptoms"] if s["kind"] == "frobnicator_exploded"] == [
        ("frobnicator-exploded", ["node01"])
    ]


def test_rules_test_for_an_unknown_rule() -> None:
    proc = run_cli("rules", "test", "--rule", "no-such-rule")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hypocenter: no cases for rule 'no-such-rule'"


TIED_RULE = """\
rules:
  - id: my-nvlink
    title: NVLink error as our team files it
    status: stable
    emitter: "PyTorch C10_CUDA_CHECK (events of cuda-error)"
    runbook: https://wiki.example.org/nvlink
    attribute:
      when: {kind: cuda_error, text: 'NVLink'}
      role: root_cause
      domain: hardware
      subdomain: nvlink
      precedence: PRECEDENCE
      action: RESET_GPU
      summary: "NVLink failure on {nodes}"
    cases:
      - name: NVLink error on a rank
        expect: fire
        attempt: {nodes: [tray07], ranks: {tray07: "0-3"}}
        logs:
          _job/out.log: |
            [rank1]: RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution
      - name: ECC is not NVLink
        expect: no_fire
        logs:
          _job/out.log: |
            [rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered
"""


def test_a_user_rule_that_ties_a_builtin_is_explained_and_warned_about(tmp_path: Path) -> None:
    """cuda-nvlink-error (built in, precedence 60) sorts before my-nvlink: a tie silently goes to it."""
    rules = tmp_path / "my-rules.yaml"
    rules.write_text(TIED_RULE.replace("PRECEDENCE", "60"))
    test = run_cli("rules", "test", "--rules", str(rules), "--rule", "my-nvlink")
    assert test.returncode == 1
    line = next(x for x in test.stdout.splitlines() if x.startswith("FAIL my-nvlink"))
    assert "did not fire: logs/_job/out.log:1 went to rule cuda-nvlink-error (" in line
    assert "both have precedence 60" in line and "give my-nvlink a precedence above 60" in line
    check = run_cli("rules", "check", "--rules", str(rules))
    warning = next(x for x in check.stdout.splitlines() if "warning" in x)
    assert warning.startswith(
        "my-rules.yaml:2: my-nvlink: warning: ties rule cuda-nvlink-error (workload/exceptions.yaml"
    )
    assert check.stdout.splitlines()[-1].endswith("0 problem(s), 1 warning(s)")
    lower = tmp_path / "lower.yaml"
    lower.write_text(TIED_RULE.replace("PRECEDENCE", "40"))
    line = next(
        x
        for x in run_cli("rules", "test", "--rules", str(lower), "--rule", "my-nvlink").stdout.splitlines()
        if x.startswith("FAIL")
    )
    assert "went to rule cuda-nvlink-error" in line and "precedence 60 > 40" in line
    assert "warning" not in run_cli("rules", "check", "--rules", str(lower)).stdout
    higher = tmp_path / "higher.yaml"
    higher.write_text(TIED_RULE.replace("PRECEDENCE", "61"))
    assert run_cli("rules", "test", "--rules", str(higher), "--rule", "my-nvlink").returncode == 0


_IMPORTS_OF_ANALYZE = """
import sys
from hypocenter.cli import main
code = main(["analyze", sys.argv[1], "--format", "json"])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "pydantic_core")), code, file=sys.stderr)
"""


def test_analyze_imports_no_pydantic(tmp_path: Path) -> None:
    """`analyze` validates attempt.yaml and prints a diagnosis without pydantic (its import costs more
    than reading a small bundle); once the rule catalog is cached, no pydantic module is loaded at all.
    (Every example's attempt.yaml takes that path: tests/test_model_schema.py.)"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first, again = (
        subprocess.run(
            [sys.executable, "-c", _IMPORTS_OF_ANALYZE, str(EXAMPLE)],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            check=False,
        )
        for _ in range(2)
    )
    assert again.stdout == first.stdout and json.loads(again.stdout)["schema"] == "hypocenter.diagnosis/v1"
    assert again.stderr.splitlines()[-1] == "[] 0", again.stderr
