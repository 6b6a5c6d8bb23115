"""SlurmConnector against a real single-node Slurm: its own munged, slurmctld and slurmd on
loopback ports in a temporary directory, a batch job that fails with exit 1.

Runs where Debian's `slurm-wlm` is installed and we are root (.ci/run installs it); skipped elsewhere.
There is no slurmdbd here (it needs a MySQL server), so `sacct` answers "accounting storage is
disabled" and the connector scopes the job from slurmctld: Debian's Slurm is 22.05, whose scontrol
has no --json, so this is the squeue --json and scontrol-text path of the captured 22.05 fixtures.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.collector.connectors.slurm import SlurmConnector

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0
        or any(shutil.which(t) is None for t in NEEDED)
        or not Path("/etc/munge/munge.key").is_file(),
        reason="needs root and Debian's slurm-wlm (munge, slurmctld, slurmd); .ci/run installs them",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    sock = d / "munge" / "munge.sock"
    subprocess.run(
        [
            "munged",
            "--force",
            f"--socket={sock}",
            "--key-file=/etc/munge/munge.key",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munge.seed'}",
        ],
        check=True,
        timeout=20,
    )
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=hyptest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
NodeName={host} CPUs=1 RealMemory=500 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, timeout=30)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, timeout=30)
        script = d / "fail.sh"
        script.write_text("#!/bin/bash\necho starting\nexit 1\n")
        script.chmod(0o755)
        deadline = time.monotonic() + 60
        job = ""
        while not job and time.monotonic() < deadline:  # slurmd registers within a few seconds
            proc = subprocess.run(
                ["sbatch", "--parsable", "-o", str(d / "out-%j.txt"), str(script)],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
            )
            job = proc.stdout.strip() if proc.returncode == 0 else ""
            if not job:
                time.sleep(1)
        assert job, "sbatch did not accept the job"
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["scontrol", "show", "job", job], capture_output=True, text=True, env=env, timeout=30
            ).stdout
            if "JobState=FAILED" in out:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"job {job} did not fail in time: {out}")
        yield {"job": job, "conf": str(conf), "host": host}
    finally:
        for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            _stop(d / name)


def test_a_real_failed_job(slurm: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["conf"])
    scope = SlurmConnector(slurm["job"], policy=RetryPolicy(timeout_s=20, attempts=2, backoff_s=0.2)).scope()
    ctx = scope.context
    assert (ctx.state, ctx.exit_code, ctx.reason) == ("FAILED", 1, "NonZeroExitCode")
    assert ctx.nodes == [slurm["host"]] and ctx.workload.cluster == "hyptest" and ctx.workload.attempt == 0
    sacct = next(c for c in scope.collected.coverage if c.source.startswith("slurm/sacct-"))
    assert sacct.status == "failed" and "accounting storage is disabled" in (sacct.reason or "").lower()
    texts = [r.text for s in scope.collected.sources for r in getattr(s, "records", [])]
    assert (
        f"slurm job {slurm['job']} state=FAILED reason=NonZeroExitCode exit_code=1:0 nodes={slurm['host']}"
        in texts
    )
    assert any(t.startswith(f"slurm node {slurm['host']} state=") for t in texts)
