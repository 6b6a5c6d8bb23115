"""An attempt's `state` is a job state: a misspelt one is refused with the nearest word, not read as a failure."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from server_support import REPO, clean_env

from hypocenter.model import AttemptContext
from hypocenter.server.attempts import context_for
from hypocenter.store.base import AttemptRow


def test_analyze_refuses_a_misspelt_state_and_suggests_the_word(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(REPO / "examples" / "nvlink-xid149", bundle)
    doc = bundle / "attempt.yaml"
    doc.write_text(doc.read_text().replace("state: FAILED", "state: FAILD"))
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "'FAILD' is not a job state (did you mean FAILED?)" in r.stderr
    assert "attempt.yaml:" in r.stderr and "Traceback" not in r.stderr


def scoped(state: str) -> tuple[AttemptContext, list[str]]:
    """The scope the server makes of an attempt whose records said `hypocenter.attempt.state`."""
    row = AttemptRow(
        id=1,
        workload="w",
        attempt=0,
        scope={"state": state},
        context=None,
        nodes=[],
        first_ns=1_700_000_000 * 10**9,
        last_ns=None,
        terminal_ns=None,
        activity=0.0,
        dirty=True,
        analyzed_at=None,
    )
    return context_for(row, datetime.now(timezone.utc))


@pytest.mark.parametrize(
    "state", ["FAILED", "failed", "Completed", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"]
)
def test_real_states_are_taken(state: str) -> None:
    ctx, notes = scoped(state)
    assert ctx.state == state.upper() and not [n for n in notes if "state" in n]


def test_a_misspelt_state_over_otlp_is_ignored_with_a_note() -> None:
    ctx, notes = scoped("FAILD")
    assert ctx.state is None
    assert any("did you mean FAILED?" in n for n in notes), notes
