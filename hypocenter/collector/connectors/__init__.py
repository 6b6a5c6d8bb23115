"""Pull connectors: scope an attempt from a scheduler and collect its evidence (see base.py).

The registry is an explicit dict, name → "module:Class", resolved lazily so that importing the
package never imports httpx clients or subprocess code it will not use. Third parties register
through the `hypocenter.connectors` entry-point group (a value `package.module:Class`); a built-in
name cannot be overridden. tests/collector/test_connector_registry.py checks every module of this package is
either registered here or listed in SUPPORT_MODULES.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from hypocenter.collector.connectors.base import ConnectorError

ENTRY_POINT_GROUP = "hypocenter.connectors"

CONNECTORS: dict[str, str] = {
    # scope connectors: a job id → Scope
    "slurm": "hypocenter.collector.connectors.slurm:SlurmConnector",
    "kubernetes": "hypocenter.collector.connectors.kubernetes:KubernetesConnector",
    # data connectors: AttemptContext → Collected
    "files": "hypocenter.collector.connectors.files:FilesConnector",
    "loki": "hypocenter.collector.connectors.loki:LokiConnector",
    "prometheus": "hypocenter.collector.connectors.prometheus:PrometheusConnector",
}

SUPPORT_MODULES = frozenset({"base", "http_api", "kube_api", "kube_credentials", "scope"})
"""Modules of this package that are shared machinery, not connectors."""


def _load(target: str, name: str) -> Any:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConnectorError(f"connector {name!r} is not available: {exc}", kind="permanent") from None


def connector_class(name: str) -> Any:
    """The class registered as `name` (built-in first, then entry points); ConnectorError if none."""
    if name in CONNECTORS:
        return _load(CONNECTORS[name], name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _load(ep.value, name)
    known = ", ".join(sorted(available()))
    raise ConnectorError(f"no connector named {name!r} (known: {known})", kind="permanent")


def available() -> dict[str, str]:
    """Every connector name → where it comes from, entry points included."""
    out = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    out.update(CONNECTORS)
    return out
