"""Record real torchrun failures as fixtures: `python -m bench.realruns.record [--out DIR]`.

Runs bench/realruns/worker.py under `torchrun --standalone --nproc-per-node 4` (gloo on CPU) once per
failure mode and keeps what torchrun printed (stdout and stderr, merged as a terminal shows them) in
DIR/<mode>/out.log, with the torch version and the command in DIR/<mode>/run.yaml. Needs torch (a CPU
wheel is enough); takes about a minute. The fixtures in tests/fixtures/torchrun/ were made by this.
The worker's failing rank is rank 2 (rank 0 in the rank0-checkpoint modes); pids and temporary paths differ between runs.
"""

from __future__ import annotations

import argparse
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
}
CULPRIT = {"rank0-checkpoint": 0}  # the rank each mode makes fail (worker.py); 2 unless listed
HERE = Path(__file__).resolve().parent


def record(out: Path, modes: list[str]) -> None:
    import torch  # only needed here

    for mode in modes:
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
            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
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
