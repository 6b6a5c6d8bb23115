"""What connector tests use to see that a call leaves nothing open (base.py, "Resources"): the
httpx clients a connector opened, and a caller's transport that records whether it was closed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest


class CallersTransport(httpx.MockTransport):
    """A transport the test owns and lends to a connector: it must come back open."""

    closed = False

    def close(self) -> None:
        self.closed = True


def record_clients(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Client]:
    """Every httpx.Client opened from now on until the test ends, in order."""
    opened: list[httpx.Client] = []

    class Recorded(httpx.Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(httpx, "Client", Recorded)
    return opened
