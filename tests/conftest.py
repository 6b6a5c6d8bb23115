from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

# Servers started inside the test process read HYPOCENTER_* from the environment: never let one
# bind the fixed default /metrics port (9464), which another test run on this machine may hold.
os.environ.setdefault("HYPOCENTER_METRICS_LISTEN", "127.0.0.1:0")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
