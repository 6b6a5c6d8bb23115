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


def test_an_otlp_record_with_a_misspelt_state_is_refused_with_the_word(tmp_path: Path) -> None:
    """Over OTLP the refusal is the response's partial success (the record's reason), and the
    attempt is not ended by a typo; the rest of the request is kept."""
    import httpx
    from server_support import serving

    def record(attrs: dict[str, str], body: str) -> dict[str, object]:
        return {
            "timeUnixNano": "1793613600000000000",
            "body": {"stringValue": body},
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
        }

    request = {
        "resourceLogs": [
            {
                "resource": {
                    "attributes": [
                        {"key": "host.name", "value": {"stringValue": "gpu-n07"}},
                        {"key": "hypocenter.workload.id", "value": {"stringValue": "typo-1"}},
                    ]
                },
                "scopeLogs": [
                    {
                        "logRecords": [
                            record({"log.file.path": "/var/log/app.log"}, "step 12 loss 1.9"),
                            record({"hypocenter.attempt.state": "FAILD"}, "job ended"),
                        ]
                    }
                ],
            }
        ]
    }
    with serving(tmp_path / "store.db") as server, server.client() as client:
        answer = client.post("/v1/logs", json=request)
        assert answer.status_code == 200, answer.text
        partial = answer.json()["partialSuccess"]
        assert partial["rejectedLogRecords"] == "1"
        assert "'FAILD' is not a job state (did you mean FAILED?)" in partial["errorMessage"]
        attempt = client.get("/v1/attempts/typo-1/0").json()
        assert attempt["log_records"] == 1 and "state" not in attempt["scope"]
        metrics = httpx.get(f"http://{server.metrics}/metrics", timeout=10).text
        assert 'hypocenter_rejected_records_total{reason="unknown_state",signal="logs"} 1.0' in metrics
