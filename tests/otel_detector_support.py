"""Make the package's `opentelemetry_resource_detector` entry point visible to a test's subprocess.

The package is installed in editable mode from another checkout, whose installed metadata lists the
entry points that checkout declared. A test that runs the SDK's detector loading must see the entry
points this tree's pyproject.toml declares: `entry_points_path` writes them as the metadata of a
`hypocenter` distribution in a directory that goes first on PYTHONPATH (importlib.metadata takes the
first distribution of a name on the path).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from hypocenter import __version__

REPO = Path(__file__).resolve().parent.parent


def declared_entry_points() -> dict[str, dict[str, str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups: dict[str, dict[str, str]] = project.get("entry-points", {})
    return groups


def entry_points_path(tmp: Path) -> Path:
    """A directory holding this tree's `hypocenter` metadata; put it first on PYTHONPATH."""
    info = tmp / f"hypocenter-{__version__}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hypocenter\nVersion: {__version__}\n")
    text = ""
    for group, entries in declared_entry_points().items():
        text += f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
    (info / "entry_points.txt").write_text(text)
    return tmp
