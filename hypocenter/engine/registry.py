"""Every analyzer a rule can name (`analyzer:` in YAML), one explicit dict; a test checks rules name only these.

The core analyzers (engine/analyzers.py) and the hang forensics built on them (engine/flight_recorder.py)
are joined here, above both, so neither module imports the other's registry.
"""

from __future__ import annotations

from hypocenter.engine.analyzers import CORE_ANALYZERS, Analyzer
from hypocenter.engine.divergence import PROGRAM_ANALYZERS
from hypocenter.engine.flight_recorder import HANG_ANALYZERS

ANALYZERS: dict[str, Analyzer] = {**CORE_ANALYZERS, **HANG_ANALYZERS, **PROGRAM_ANALYZERS}
