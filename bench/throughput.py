"""Extraction throughput: hypocenter's scan-then-parse against grep/ripgrep on the same bytes.

    python -m bench.throughput [--mb 200] [--seed 1]

Writes a synthetic node log of healthy-looking lines (NCCL INFO, kernel audit noise, training
progress, one candidate line in ~20,000) and times, in the same run and on the same file:

- `hypocenter` extraction (prefilter + parse of candidates + rule patterns), single process;
- the prefilter alone (Aho-Corasick over the raw bytes);
- the server's compaction pass (which lines keep their text: `Extractor.evidence_lines`);
- `grep -c -F -f tokens` (GNU grep's multi-literal search over the same rule tokens), and
  `rg -c -F -f tokens` when ripgrep is installed.

Figures are MB/s of input; the machine is shared and noisy, so compare rows of one run only.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hypocenter.engine import default_engine
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext
from hypocenter.sources import TextSource

_CANDIDATES = (
    "Nov  2 10:{m:02d}:{s:02d} n1 kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=python3, Ch 00000001",
    "n1:1234:5678 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.10.0.3<43012> "
    "with status=12 opcode=0 len=0 vendor err 129 (Recv)",
)


def write_log(path: Path, megabytes: int, seed: int) -> int:
    rnd = random.Random(seed)
    target = megabytes * 1_000_000
    size = 0
    with path.open("w", encoding="utf-8") as f:
        i = 0
        while size < target:
            r = rnd.random()
            m, s = rnd.randrange(60), rnd.randrange(60)
            if r < 0.00005:
                line = rnd.choice(_CANDIDATES).format(m=m, s=s)
            elif r < 0.5:
                line = (
                    f"n{rnd.randint(1, 64):02d}:{rnd.randint(1000, 99999)}:{rnd.randint(1000, 99999)} "
                    f"[{rnd.randint(0, 7)}] NCCL INFO Channel {rnd.randint(0, 31):02d}/0 : {rnd.randint(0, 511)}"
                    f"[{rnd.randint(0, 7)}] -> {rnd.randint(0, 511)}[{rnd.randint(0, 7)}] [send] via NET/IB/"
                    f"{rnd.randint(0, 7)}/GDRDMA"
                )
            elif r < 0.8:
                line = (
                    f"Nov  2 10:{m:02d}:{s:02d} n1 kernel: [{rnd.randint(1, 999999)}.{rnd.randint(0, 999999):06d}] "
                    f'audit: type=1400 apparmor="STATUS" operation="profile_replace" '
                    f'profile="unconfined" name="docker-default" pid={rnd.randint(1, 99999)}'
                )
            else:
                line = (
                    f"[2026-11-02 10:{m:02d}:{s:02d}] some benign application message {i} with payload "
                    f"{rnd.random():.6f}"
                )
            f.write(line + "\n")
            size += len(line) + 1
            i += 1
    return size


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 1e6 / seconds:8.1f} MB/s  ({seconds:6.2f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of the synthetic log (default 200 MB)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    engine = default_engine()
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": "bench"},
            "nodes": ["n1"],
            "window": {"start": "2026-11-02T00:00:00Z", "end": "2026-11-03T00:00:00Z"},
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "node.log"
        nbytes = write_log(log, args.mb, args.seed)
        tokens = Path(tmp) / "tokens.txt"
        tokens.write_text("\n".join(engine.extractor.tokens) + "\n", encoding="utf-8")
        data = log.read_bytes()
        lines = data.count(b"\n")
        print(f"input: {nbytes / 1e6:.0f} MB, {lines} lines, {len(engine.extractor.tokens)} rule tokens")

        t = time.perf_counter()
        hits = engine.extractor.scan(data)
        print(
            f"hypocenter prefilter only     {_rate(nbytes, time.perf_counter() - t)}  {len(hits)} token hits"
        )

        t = time.perf_counter()
        result = engine.extractor.extract(
            [TextSource("logs/n1/node.log", data, "n1")], ctx, time_context(ctx)
        )
        print(
            f"hypocenter extraction         {_rate(nbytes, time.perf_counter() - t)}  "
            f"{result.candidates} candidate lines, {len(result.events)} events"
        )

        # The server's compaction pass over the same stream: which lines keep their text.
        text = data.decode("utf-8", "surrogateescape").split("\n")
        t = time.perf_counter()
        keep = engine.extractor.evidence_lines(list(enumerate(text, 1)), time_context(ctx))
        kept = sum(len(text[i]) + 1 for i in keep)
        print(
            f"hypocenter compaction pass    {_rate(nbytes, time.perf_counter() - t)}  "
            f"{len(keep)} lines ({kept / 1e3:.1f} KB) keep their text"
        )

        for tool in ("grep", "rg"):
            exe = shutil.which(tool)
            if exe is None:
                print(f"{tool:<29} not installed")
                continue
            t = time.perf_counter()
            out = subprocess.run(
                [exe, "-c", "-F", "-f", str(tokens), str(log)], capture_output=True, text=True, check=False
            )
            print(
                f"{tool + ' -c -F -f tokens':<29} {_rate(nbytes, time.perf_counter() - t)}  "
                f"{out.stdout.strip() or '0'} matching lines"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
