"""Write a reproducible corpus of synthetic attempt bundles with ground truth.

    python -m bench.generate --out DIR --count N --seed S --prior real|uniform [--nodes-max K]

Bundle `i` lands in `DIR/<NNNN>-<mode>/` (bundle layout (contract 1 of docs/design.md) plus `truth.yaml`). Its content is a
function of (seed, i, prior, nodes-max) only: every random choice comes from a `random.Random`
seeded from those, never from global state or the clock, so a corpus is byte-for-byte
reproducible. `--prior real` samples modes by published failure frequencies of large training clusters
(real-cluster prior); `--prior uniform` deals every mode in turn (shuffled blocks) so rare modes get scored.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from random import Random

from bench import noise
from bench.scenario import Mode, Scenario
from bench.scenarios import MODES
from bench.scenarios.hangs import LATE as LATE_HANGS
from bench.scenarios.special import LATE as LATE_SPECIAL
from bench.world import draw_world

LATE = LATE_HANGS | LATE_SPECIAL
PRIORS = ("real", "uniform")
DEFAULT_NODES_MAX = 512


def scenario_seed(seed: int, index: int) -> int:
    """The seed of bundle `index` in a corpus seeded with `seed` (stable across Python versions)."""
    return int.from_bytes(hashlib.sha256(f"hypocenter-bench:{seed}:{index}".encode()).digest()[:6], "big")


def choose_modes(count: int, seed: int, prior: str, modes: Sequence[Mode] | None = None) -> list[Mode]:
    pool = sorted(modes if modes is not None else MODES.values(), key=lambda m: m.id)
    # Modes added later (LATE) are dealt so that every other bundle of a corpus stays what it was
    # before they existed: under "real" they replace a share of the picks equal to their weight
    # (drawn apart), under "uniform" they take the last places.
    base = [m for m in pool if m.id not in LATE]
    late = [m for m in pool if m.id in LATE]
    rng = Random(f"modes:{seed}:{prior}")
    if prior == "uniform":
        # The late modes take the last places, in turn too: the first places are the corpus as it was.
        n_late = round(count * len(late) / len(pool))
        return _in_turn(base, count - n_late, rng) + _in_turn(
            late, n_late, Random(f"late-modes:{seed}:{prior}")
        )
    if prior == "real":
        picks = rng.choices(base, weights=[m.weight for m in base], k=count)
        share = sum(m.weight for m in late) / sum(m.weight for m in pool) if late else 0.0
        return _late(picks, late, share, Random(f"late-modes:{seed}"))
    raise ValueError(f"unknown prior {prior!r} (expected one of {', '.join(PRIORS)})")


def _in_turn(modes: list[Mode], count: int, rng: Random) -> list[Mode]:
    out: list[Mode] = []
    while modes and len(out) < count:
        block = list(modes)
        rng.shuffle(block)
        out.extend(block)
    return out[:count]


def _late(picks: list[Mode], late: list[Mode], share: float, rng: Random) -> list[Mode]:
    if not late:
        return picks
    return [
        rng.choices(late, weights=[x.weight for x in late])[0] if rng.random() < share else m for m in picks
    ]


def build(
    mode: Mode, seed: int, nodes_max: int = DEFAULT_NODES_MAX, *, nodes: int | None = None
) -> dict[str, str | bytes]:
    """All files of one bundle, by relative path; `nodes` pins the job size (tests of large jobs)."""
    rng = Random(seed)
    cap = min(nodes_max, mode.max_nodes) if nodes is None else nodes
    world = draw_world(
        rng,
        seed,
        nodes_max=cap,
        schedulers=mode.schedulers,
        platforms=mode.platforms,
        min_torch=mode.min_torch,
        min_nodes=nodes or 2,
        max_nodes=nodes or 4096,
    )
    sc = Scenario(mode.id, mode.outcome, mode.domain, mode.subdomain, world, seed)
    mode.build(sc)
    noise.background(sc)
    noise.distract(sc)
    return sc.files()


def write_bundle(directory: Path, files: dict[str, str | bytes]) -> None:
    for rel in sorted(files):
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        content = files[rel]
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def generate(
    out: Path,
    count: int,
    seed: int,
    prior: str = "uniform",
    nodes_max: int = DEFAULT_NODES_MAX,
    jobs: int = 1,
) -> list[Path]:
    """Write `count` bundles under `out`; returns their directories in order."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if nodes_max < 2:
        raise ValueError("--nodes-max must be at least 2")
    out.mkdir(parents=True, exist_ok=True)
    modes = choose_modes(count, seed, prior)
    width = max(4, len(str(max(count - 1, 0))))
    dirs = [out / f"{i:0{width}d}-{m.id}" for i, m in enumerate(modes)]
    work = [
        (d, m.id, scenario_seed(seed, i), nodes_max) for i, (d, m) in enumerate(zip(dirs, modes, strict=True))
    ]
    if jobs > 1 and count > 8:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_write_one, work, chunksize=4))
    else:
        for job in work:
            _write_one(job)
    return dirs


def _write_one(job: tuple[Path, str, int, int]) -> None:
    directory, mode_id, seed, nodes_max = job
    write_bundle(directory, build(MODES[mode_id], seed, nodes_max))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.generate", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--out", type=Path, help="corpus directory (created)")
    parser.add_argument("--count", type=int, help="number of bundles")
    parser.add_argument("--seed", type=int, help="corpus seed")
    parser.add_argument(
        "--prior",
        choices=PRIORS,
        default="real",
        help="mode mix: real-world frequencies or every mode equally",
    )
    parser.add_argument(
        "--nodes-max", type=int, default=DEFAULT_NODES_MAX, help="largest job, in nodes (default %(default)s)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes (output is identical for any value)"
    )
    parser.add_argument("--list-modes", action="store_true", help="print the failure modes and exit")
    args = parser.parse_args(argv)
    if args.list_modes:
        for m in sorted(MODES.values(), key=lambda m: m.id):
            label = f"{m.outcome}" if m.domain is None else f"{m.domain}/{m.subdomain}"
            print(f"{m.id:40s} {label:28s} {m.summary}")
        return 0
    if args.out is None or args.count is None or args.seed is None:
        parser.error("--out, --count and --seed are required")
    if args.count < 0 or args.nodes_max < 2:
        parser.error("--count must be >= 0 and --nodes-max >= 2")
    t0 = time.perf_counter()
    dirs = generate(
        args.out,
        args.count,
        args.seed,
        args.prior,
        args.nodes_max,
        jobs=max(1, args.jobs or os.cpu_count() or 1),
    )
    dt = time.perf_counter() - t0
    modes = {d.name.split("-", 1)[1] for d in dirs}
    print(
        f"wrote {len(dirs)} bundles ({len(modes)} modes, prior={args.prior}, seed={args.seed}) to {args.out} "
        f"in {dt:.1f}s ({len(dirs) / dt if dt > 0 else 0:.0f} bundles/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
