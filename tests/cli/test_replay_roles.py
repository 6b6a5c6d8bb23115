"""`hypocenter replay` with a token that may send but not trigger: it says so before sending anything,
sends, and leaves the analysis to the attempt's terminal state."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_support import REPO, clean_env, serving

from tests.api.test_auth import TOKENS, tokens_file

pytestmark = pytest.mark.slow

BUNDLE = REPO / "examples" / "nvlink-xid149"


def _replay(server_base: str, endpoint: str, token: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    secret = tmp / f"token-{token[:5]}"
    secret.write_text(token)
    return subprocess.run(
        [
            sys.executable, "-m", "hypocenter.cli", "replay", str(BUNDLE), "--http", "--endpoint", endpoint,
            "--rest", server_base, "--token-file", str(secret), "--timeout", "10",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(),
        check=False,
    )  # fmt: skip


def test_an_ingest_token_is_told_before_sending_that_the_trigger_needs_admin(tmp_path: Path) -> None:
    with serving(tmp_path / "store.db", "--auth-tokens-file", str(tokens_file(tmp_path))) as server:
        r = _replay(server.base, server.http, TOKENS["ingest"], tmp_path)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        assert "triggering an analysis needs the admin role" in lines[0], r.stderr
        assert lines[1].startswith("replayed "), r.stderr  # said before the records went out
        assert r.stdout == ""
        with server.client() as client:
            headers = {"Authorization": f"Bearer {TOKENS['read']}"}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the terminal state it sent makes the server analyse it
                rows = client.get("/v1/diagnoses", params={"workload": "81234"}, headers=headers).json()
                if rows["diagnoses"]:
                    break
                time.sleep(0.1)
            assert rows["diagnoses"], rows
        admin = _replay(server.base, server.http, TOKENS["admin"], tmp_path)
        assert admin.returncode == 0 and "admin role" not in admin.stderr, admin.stderr
        assert json.loads(admin.stdout)["root_cause"]["nodes"] == ["node02"]
