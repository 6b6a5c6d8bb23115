from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

# Servers started inside the test process read HYPOCENTER_* from the environment: never let one
# bind the fixed default /metrics port (9464), which another test run on this machine may hold.
os.environ.setdefault("HYPOCENTER_METRICS_LISTEN", "127.0.0.1:0")


def _missing_prometheus() -> str | None:
    absent = [name for name in ("prometheus", "promtool") if shutil.which(name) is None]
    return (
        f"{' and '.join(absent)} not installed (Debian package `prometheus`; .ci/run installs it)"
        if absent
        else None
    )


# Markers whose program this conftest looks for (the others are checked by the tests themselves).
MISSING = {"prometheus": _missing_prometheus}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked with a program it needs skips without it, or fails where CI installed it."""
    for name, missing in MISSING.items():
        if item.get_closest_marker(name) is not None and (reason := missing()) is not None:
            (pytest.fail if os.environ.get("HYPOCENTER_CI") else pytest.skip)(reason)


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
