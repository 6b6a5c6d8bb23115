"""The markers say what a test needs; scripts/test-fast leaves out every one of them, and a plain
`pytest` (README's command, CI's last line) still selects everything."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pytest_ini() -> dict[str, object]:
    ini: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]
    return ini


def test_the_fast_subset_leaves_out_every_marker() -> None:
    markers = {str(line).split(":", 1)[0] for line in _pytest_ini()["markers"]}  # type: ignore[attr-defined]
    expression = re.search(r'-m "([^"]+)"', (REPO / "scripts" / "test-fast").read_text())
    assert expression is not None
    assert set(re.findall(r"not (\w+)", expression.group(1))) == markers
    assert {"slow", "chromium", "slurm", "postgresql", "torch", "prometheus"} <= markers


def test_plain_pytest_selects_everything() -> None:
    addopts = str(_pytest_ini()["addopts"])
    assert "-m" not in addopts.split() and "--strict-markers" in addopts.split()
