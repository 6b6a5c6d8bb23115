"""The exceptions hypocenter raises, all under one root.

    HypocenterError                 root: catch this to handle anything we raise on purpose
    ├── InputError                  unusable input a person must fix (permanent)
    │   ├── BundleError             an attempt bundle that cannot be analysed (missing, no attempt.yaml, …)
    │   └── RuleError               a rule file that does not load (carries file:line and a hint)
    └── TransientError              worth retrying: a source that did not answer this time

A CLI turns an `InputError` into a one-line message and exit code 2, never a traceback. Problems
with one file inside an otherwise usable bundle are not raised at all: they are reported in the
diagnosis' coverage and the rest is analysed.
"""

from __future__ import annotations


class HypocenterError(Exception):
    """Root of every error hypocenter raises on purpose."""


class InputError(HypocenterError):
    """Input that cannot be used as given; retrying will not help."""


class BundleError(InputError):
    """An attempt bundle that cannot be analysed at all."""


class RuleError(InputError):
    """A rule or rule file that fails to load; the message names file:line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class TransientError(HypocenterError):
    """A failure that may go away if the same call is made again later."""
