"""hypocenter: find where a failed distributed AI workload's failure began."""

from __future__ import annotations

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it from here
