"""The local-files data connector: a directory laid out like an attempt bundle (docs/design.md, contract 1),
`logs/<node>/<file>`, `logs/_job/<file>`, `metrics/<file>`, `events/<file>`, read for a scope that
comes from elsewhere (a scheduler connector, flags) instead of its attempt.yaml.

The reading is bundle.py's, file by file with the same coverage; this module only adapts it to the
DataConnector shape. It never raises: a directory that cannot be read is one failed coverage entry.
"""

from __future__ import annotations

from pathlib import Path

from hypocenter.collector.bundle import Bundle, read_data
from hypocenter.collector.connectors.base import Collected
from hypocenter.errors import HypocenterError
from hypocenter.model import AttemptContext, Coverage


class FilesConnector:
    name = "files"

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def collect(self, context: AttemptContext) -> Collected:
        if not self.root.is_dir():
            what = "does not exist" if not self.root.exists() else "is not a directory"
            return Collected(
                coverage=[
                    Coverage(
                        connector=self.name,
                        source=str(self.root),
                        status="failed",
                        observations=0,
                        reason=f"{self.root} {what}",
                    )
                ]
            )
        bundle = Bundle(root=self.root, context=context)
        try:
            read_data(bundle)
        except (OSError, HypocenterError) as exc:  # e.g. the directory became unreadable while listed
            return Collected(
                coverage=[
                    Coverage(
                        connector=self.name,
                        source=str(self.root),
                        status="failed",
                        observations=0,
                        reason=f"cannot read {self.root}: {exc}",
                    )
                ]
            )
        return Collected(sources=bundle.sources, coverage=bundle.coverage)
