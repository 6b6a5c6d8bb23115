"""Record real torchrun failures as fixtures: `python -m bench.realruns.record [--out DIR]`.

Runs bench/realruns/worker.py under `torchrun --standalone --nproc-per-node 4` (gloo on CPU) once per
failure mode and keeps what torchrun printed (stdout and stderr, merged as a terminal shows them) in
DIR/<mode>/out.log, with the torch version and the command in DIR/<mode>/run.yaml. Needs torch (a CPU
wheel is enough); takes about a minute. The fixtures in tests/fixtures/torchrun/ were made by this.
The worker's failing rank is rank 2 (rank 0 in the rank0-checkpoint modes); pids and temporary paths differ between runs.
The wrong-port mode starts two agents instead (`--nnodes 2`, c10d rendezvous, two local ranks each, as
two nodes would): node1's agent is given another port than node0's, whose store it never reaches; each
agent's output is kept in DIR/wrong-port/<node>.log.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import yaml

MODES = {
    "sigkill": [],
    "sigkill-tee": ["--tee", "3"],
    "sigsegv": [],
    "sigabrt": [],
    "exception": [],
    "collective-timeout": [],
    "dataloader-killed": [],
    "rank0-checkpoint": [],
    "rank0-checkpoint-tee": ["--tee", "3"],
    "cpu-alloc": [],
    "memory-error": [],
    "desync": ["--tee", "3"],
    "early-exit": ["--tee", "3"],
    "wrong-port": [],  # two agents: record_wrong_port
}
CULPRIT = {"rank0-checkpoint": 0}  # the rank each mode makes fail (worker.py); 2 unless listed
HERE = Path(__file__).resolve().parent


ENV = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record_wrong_port(out: Path, version: str) -> None:
    """Two agents of one job whose rendezvous endpoints differ in the port (node1's is wrong)."""
    good, wrong = _free_port(), _free_port()
    agents = {
        "node0": (good, "join_timeout=30"),
        "node1": (wrong, "is_host=false,join_timeout=30,read_timeout=20"),
    }
    procs = {}
    for node, (port, conf) in agents.items():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-id", "realrun", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        cmd += ["--rdzv-conf", conf, str(HERE / "worker.py"), "wrong-port"]
        procs[node] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV)
    target = out / "wrong-port"
    target.mkdir(parents=True, exist_ok=True)
    codes = {}
    for node, proc in procs.items():
        stdout, _ = proc.communicate(timeout=300)
        (target / f"{node}.log").write_bytes(stdout)
        codes[node] = proc.returncode
    meta = {
        "torch": version,
        "python": sys.version.split()[0],
        "exit_code": codes,
        "command": "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT "
        "bench/realruns/worker.py wrong-port (node1: another PORT, --rdzv-conf is_host=false)",
        "culprit_rank": 2,
        "culprit_node": "node1",
    }
    (target / "run.yaml").write_text(yaml.safe_dump(meta, sort_keys=True), encoding="utf-8")
    print(f"wrong-port: exit {codes}")


def record(out: Path, modes: list[str]) -> None:
    import torch  # only needed here

    for mode in modes:
        if mode == "wrong-port":
            record_wrong_port(out, str(torch.__version__))
            continue
        worker_mode = mode.removesuffix("-tee")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            *MODES[mode],
            str(HERE / "worker.py"),
            worker_mode,
        ]
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=300,
            check=False,
            env=ENV,
        )
        target = out / mode
        target.mkdir(parents=True, exist_ok=True)
        (target / "out.log").write_bytes(proc.stdout)
        meta = {
            "torch": str(torch.__version__),
            "python": sys.version.split()[0],
            "exit_code": proc.returncode,
            "command": "torchrun --standalone --nproc-per-node 4 "
            + " ".join(MODES[mode])
            + f" bench/realruns/worker.py {worker_mode}",
            "culprit_rank": CULPRIT.get(worker_mode, 2),
        }
        (target / "run.yaml").write_text(yaml.safe_dump(meta, sort_keys=True), encoding="utf-8")
        lines = proc.stdout.count(b"\n")
        print(f"{mode}: exit {proc.returncode}, {lines} lines")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/torchrun"))
    ap.add_argument(
        "modes", nargs="*", default=list(MODES), help=f"modes to record (default all: {', '.join(MODES)})"
    )
    args = ap.parse_args(argv)
    record(args.out, args.modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
