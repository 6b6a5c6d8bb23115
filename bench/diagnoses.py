"""The diagnosis of every shipped bundle, as `hypocenter analyze` prints it, saved or compared byte for byte.

    python -m bench.diagnoses save DIR       before a change: each bundle's JSON and text report in DIR
    python -m bench.diagnoses compare DIR    after it: exit 1 and the bundles whose output changed

A change meant to make `analyze` faster must not change a byte of any diagnosis: the shipped bundles
are examples/ and the held-out accuracy set (bench/heldout/). Each is analysed by a `hypocenter`
process, as a user runs it, with the rule catalog cache of this run (a cold and a warm start alike).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bundles() -> list[Path]:
    return sorted(
        p.parent for top in ("examples", "bench/heldout") for p in (REPO / top).glob("*/attempt.yaml")
    )


def outputs(cache: Path) -> dict[str, bytes]:
    """`<bundle>.json` and `<bundle>.txt` (with the exit code) of every shipped bundle."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env.update(
        XDG_CACHE_HOME=str(cache),
        PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH")))),
    )
    out: dict[str, bytes] = {}
    for bundle in bundles():
        for fmt in ("json", "text"):
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hypocenter.cli",
                    "analyze",
                    str(bundle),
                    "--format",
                    fmt,
                    "--color",
                    "never",
                ],
                capture_output=True,
                env=env,
                cwd=REPO,
                check=False,
            )
            out[f"{bundle.name}.{fmt[:4].replace('text', 'txt')}"] = (
                r.stdout + f"\nexit {r.returncode}\n".encode()
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("action", choices=("save", "compare"))
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hypocenter-diagnoses-") as cache:
        got = outputs(Path(cache))
    if args.action == "save":
        args.dir.mkdir(parents=True, exist_ok=True)
        for name, data in got.items():
            (args.dir / name).write_bytes(data)
        print(f"{len(got)} outputs of {len(got) // 2} bundles saved in {args.dir}")
        return 0
    saved = {p.name: p.read_bytes() for p in args.dir.iterdir()}
    changed = sorted(name for name in saved.keys() | got.keys() if saved.get(name) != got.get(name))
    for name in changed:
        print(f"changed: {name}")
    print(f"{len(got)} outputs of {len(got) // 2} bundles compared, {len(changed)} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
