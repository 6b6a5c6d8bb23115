"""The connector registry is explicit and complete; third parties come in through entry points."""

from __future__ import annotations

import pkgutil
from importlib.metadata import EntryPoint
from typing import Any

import pytest

import hypocenter.collector.connectors as connectors
from hypocenter.collector.connectors import CONNECTORS, SUPPORT_MODULES, available, connector_class
from hypocenter.collector.connectors.base import ConnectorError


def test_every_module_is_registered_or_declared_support() -> None:
    modules = {m.name for m in pkgutil.iter_modules(connectors.__path__)}
    registered = {target.split(":")[0].rsplit(".", 1)[1] for target in CONNECTORS.values()}
    assert modules - SUPPORT_MODULES == registered & modules, (
        "register the new connector module in CONNECTORS"
    )
    assert not SUPPORT_MODULES & registered


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_every_registered_connector_resolves(name: str) -> None:
    module = CONNECTORS[name].split(":")[0].rsplit(".", 1)[1]
    if module not in {m.name for m in pkgutil.iter_modules(connectors.__path__)}:
        pytest.skip(f"{module}.py is not in this tree yet")
    cls = connector_class(name)
    assert cls.name == name
    assert callable(getattr(cls, "scope", None)) or callable(getattr(cls, "collect", None))


def test_entry_points_add_third_party_connectors(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        EntryPoint("lsf", "hypocenter.collector.connectors.slurm:SlurmConnector", "hypocenter.connectors"),
        EntryPoint("slurm", "elsewhere:Other", "hypocenter.connectors"),
    ]

    def fake(group: str) -> list[EntryPoint]:
        return eps if group == "hypocenter.connectors" else []

    monkeypatch.setattr(connectors, "entry_points", fake)
    assert connector_class("lsf").__name__ == "SlurmConnector"
    assert available()["slurm"] == CONNECTORS["slurm"]  # built-ins win
    with pytest.raises(ConnectorError, match="no connector named 'pbs'"):
        connector_class("pbs")


def test_a_broken_plugin_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(group: str) -> list[Any]:
        return [EntryPoint("broken", "no_such_module_xyz:C", "hypocenter.connectors")]

    monkeypatch.setattr(connectors, "entry_points", fake)
    with pytest.raises(ConnectorError, match="connector 'broken' is not available"):
        connector_class("broken")
