from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

# Servers started inside the test process read HYPOCENTER_* from the environment: never let one
# bind the fixed default /metrics port (9464), which another test run on this machine may hold.
os.environ.setdefault("HYPOCENTER_METRICS_LISTEN", "127.0.0.1:0")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium driven by Playwright (never a downloaded browser); skipped when either is missing."""
    from bench.ui_screenshots import CHROMIUM, launch_chromium

    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing (Debian package `chromium`; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    with sync_api.sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()
