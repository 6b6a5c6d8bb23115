"""The lint gates: scripts/check runs ruff format, ruff, mypy --strict and the import contracts, CI runs
it before the tests and pre-commit runs the same commands. The import contracts also run here, since
the layout tests and the docs lean on them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def _commands(text: str) -> list[str]:
    """The tool invocations of a shell script, comments and shell plumbing left out."""
    tools = ("ruff", "mypy", "lint-imports")
    return [line.strip() for line in text.splitlines() if line.strip().split(" ")[0] in tools]


def test_ci_runs_the_lint_gates_before_the_tests() -> None:
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "scripts/check" in ci
    assert ci.index("scripts/check") < len(ci) - 1 and ci[-1].endswith("pytest")


def test_pre_commit_runs_what_scripts_check_runs() -> None:
    check = _commands((REPO / "scripts" / "check").read_text())
    assert [c.split(" ")[0] for c in check] == ["ruff", "ruff", "mypy", "lint-imports"]
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = [h["entry"].removesuffix(" --force-exclude") for h in hooks]
    assert entries == check
    assert all(h["language"] == "system" for h in hooks)  # the installed tools: nothing fetched at hook time


@pytest.mark.slow
def test_imports_point_one_way() -> None:
    """The import-linter contracts in pyproject.toml: layers, collector/engine independence, no cycles."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
            "--no-cache",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
