"""deploy/slurm/hypocenter-prolog.sh, run the way slurmctld runs a PrologSlurmctld: the server then
knows the attempt's start and its whole allocation before any of its nodes logged a line, and the
diagnosis carries them; bad input is a line on stderr and exit 0 (a prolog must not hold a job back).
The epilog's own test is in tests/server/test_pulls.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from server_support import REPO, ServerProcess

from hypocenter.config import Settings

PROLOG = REPO / "deploy" / "slurm" / "hypocenter-prolog.sh"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (.ci/run installs it)"),
]


def _prolog(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # slurmctld gives a prolog no search path of its own: the test gives it this one and nothing else
    return subprocess.run(
        [str(PROLOG)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_prolog_records_the_attempt_start_and_its_nodes(tmp_path: Path) -> None:
    extra: list[str] = []
    env: dict[str, str] = {}
    if "auth_tokens_file" in Settings.model_fields:  # the server takes tokens: the prolog sends one
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text("admin: [admin-token-0123456789abcdef]\n")
        (tmp_path / "token").write_text("admin-token-0123456789abcdef\n")
        extra, env = ["--auth-tokens-file", str(tokens)], {"HYPOCENTER_TOKEN_FILE": str(tmp_path / "token")}
    srv = ServerProcess(tmp_path / "store.db", *extra).start()
    try:
        before = datetime.now(timezone.utc).replace(microsecond=0)
        run = _prolog(
            {
                "HYPOCENTER_URL": srv.base,
                "SLURM_JOB_ID": "81234",
                "SLURM_JOB_NODELIST": "node[01-04]",
                "SLURM_CLUSTER_NAME": "eos",
                "SLURM_JOB_NAME": 'llama "pretrain"\\v2',
                **env,
            }
        )
        assert run.returncode == 0 and run.stderr == "", run.stderr
        after = datetime.now(timezone.utc)
        headers = {"Authorization": "Bearer admin-token-0123456789abcdef"} if extra else {}
        with srv.client() as client:
            row = client.get("/v1/attempts/81234/0", headers=headers).json()
            d = client.post("/v1/attempts/81234/0/analyze", headers=headers).json()
        assert row["scope"]["nodes"] == "node[01-04]" and row["scope"]["cluster"] == "eos"
        assert row["scope"]["name"] == 'llama "pretrain"\\v2'
        start = datetime.fromisoformat(d["attempt"]["window"]["start"].replace("Z", "+00:00"))
        assert before <= start <= after
        assert d["attempt"]["nodes"] == ["node01", "node02", "node03", "node04"]
        assert (d["attempt"]["scheduler"], d["attempt"]["cluster"]) == ("slurm", "eos")
        # a requeued job is the next attempt
        assert (
            _prolog(
                {
                    "HYPOCENTER_URL": srv.base,
                    "SLURM_JOB_ID": "81234",
                    "SLURM_RESTART_COUNT": "1",
                    "SLURM_JOB_NODELIST": "node[02-05]",
                    **env,
                }
            ).stderr
            == ""
        )
        with srv.client() as client:
            assert (
                client.get("/v1/attempts/81234/1", headers=headers).json()["scope"]["nodes"] == "node[02-05]"
            )
        # bad input, or no server: one line on stderr, exit 0
        for bad in (
            {},
            {"SLURM_JOB_ID": "1;rm"},
            {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": 'n1"]}'},
            {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "x"},
            {"SLURM_JOB_ID": "7", "HYPOCENTER_URL": "http://127.0.0.1:9", "HYPOCENTER_TIMEOUT": "2"},
        ):
            r = _prolog({"HYPOCENTER_URL": srv.base, **bad})
            assert r.returncode == 0 and r.stderr.startswith("hypocenter-prolog: "), (bad, r.stderr)
    finally:
        srv.stop()
