"""The Slurm connector says how many GPUs per node the job was allocated (what the cost of a failure
multiplies by): from sacct's `tres.allocated` gres entries, else the controller's `tres_alloc_str`;
nothing when Slurm names no GPUs or they do not divide evenly over the nodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hypocenter.collector.connectors.slurm import SlurmConnector
from tests.collector.test_connector_slurm import FAST, FIXTURES, NOW, Replay


def _release(tmp: Path, sacct_tres: list[dict[str, Any]] | None, alloc: str | None) -> Path:
    """The 24.05 fixtures of job 81234 (4 nodes), sacct's job given `sacct_tres` as its allocated
    TRES and the controller's job `alloc` as its tres_alloc_str (None: left out)."""
    root = tmp / "24.05"
    shutil.copytree(FIXTURES / "24.05", root)
    sacct = root / "sacct-81234.json"
    doc = json.loads(sacct.read_text())
    if sacct_tres is not None:
        doc["jobs"][0]["tres"] = {"allocated": sacct_tres, "requested": []}
    sacct.write_text(json.dumps(doc))
    ctl = root / "scontrol-job-81234.json"
    doc = json.loads(ctl.read_text())
    if alloc is not None:
        doc["jobs"][0]["tres_alloc_str"] = alloc
    ctl.write_text(json.dumps(doc))
    return root


def _gpus(root: Path) -> int | None:
    connector = SlurmConnector(
        "81234", runner=Replay(root), policy=FAST, sleep=lambda s: None, now=lambda: NOW
    )
    return connector.scope().context.gpus_per_node


def _gres(name: str, count: int) -> dict[str, Any]:
    return {"type": "gres", "name": name, "id": 1001, "count": count}


@pytest.mark.parametrize(
    ("sacct_tres", "alloc", "want"),
    [
        ([{"type": "cpu", "name": "", "id": 1, "count": 896}, _gres("gpu", 32)], None, 8),
        ([_gres("gpu:h100", 32), _gres("gpu", 32)], None, 8),  # typed and plain: the plain one
        ([_gres("gpu:h100", 16)], None, 4),  # typed only
        (None, "cpu=896,mem=7600000M,node=4,billing=896,gres/gpu=32", 8),  # the controller's
        ([_gres("gpu", 30)], None, None),  # 30 over 4 nodes: not what any node had
        ([{"type": "cpu", "name": "", "id": 1, "count": 896}], "cpu=896,node=4", None),  # no GPUs
    ],
)
def test_gpus_per_node_from_the_allocation(
    tmp_path: Path, sacct_tres: list[dict[str, Any]] | None, alloc: str | None, want: int | None
) -> None:
    assert _gpus(_release(tmp_path, sacct_tres, alloc)) == want


def test_the_releases_as_recorded_name_no_gpus() -> None:
    assert _gpus(FIXTURES / "24.05") is None
