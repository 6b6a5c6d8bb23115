"""The wheel carries the rule catalog: an installed copy analyses a bundle without the repository."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import hypocenter

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_ships_the_catalog_and_analyses_without_the_repo(tmp_path: Path) -> None:
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(out.glob("hypocenter-*.whl"))
    assert wheel.name.startswith(f"hypocenter-{hypocenter.__version__}-")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(site)
    assert "hypocenter/catalog/gpu/xid.yaml" in names
    assert "hypocenter/catalog/data/xid-catalog.yaml" in names
    # Run from an unrelated directory with only the unpacked wheel first on the path.
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); "
        "from hypocenter.engine.rules import builtin_catalog; from hypocenter.engine import default_engine; "
        "from hypocenter.collector.bundle import load_bundle; b = load_bundle(sys.argv[2]); "
        "d = default_engine().analyze(b); "
        "print(json.dumps({'catalog': str(builtin_catalog()), 'sub': d.root_cause.subdomain}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(site), str(REPO / "examples" / "nvlink-xid149")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(r.stdout)
    assert got["catalog"].startswith(str(site))
    assert got["sub"] == "nvlink"


def test_ci_runs_the_readme_test_command_as_typed() -> None:
    """README's second "Start here" command is the last line of .ci/run, so the two cannot drift."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    after = readme[readme.index("Install the test extras") :]
    command = next(line for line in after.splitlines() if line.startswith("pip install"))
    ci = [line for line in (root / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert ci[-1] == command


def test_the_version_is_written_once() -> None:
    """pyproject.toml reads the version from hypocenter/__init__.py; it writes none of its own."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hypocenter.__version__"}
