"""The failure-mode registry: one module per family of modes, one explicit dict of all modes.

Each family module exports `MODES`, a tuple of `bench.scenario.Mode`; `MODES` here is the
complete registry keyed by mode id (a test checks that ids are unique and labels valid).
"""

from __future__ import annotations

from bench.scenario import Mode
from bench.scenarios import (
    external,
    gpu,
    gpu_firmware,
    gpu_memory,
    hangs,
    host,
    network,
    nvlink,
    resource,
    software,
    special,
    storage,
)

_FAMILIES = (
    gpu,
    gpu_memory,
    gpu_firmware,
    nvlink,
    host,
    network,
    storage,
    software,
    resource,
    external,
    special,
    hangs,
)

MODES: dict[str, Mode] = {m.id: m for family in _FAMILIES for m in family.MODES}

__all__ = ["MODES", "Mode"]
