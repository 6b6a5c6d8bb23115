"""The error tree: one root, every class drawn in errors.py, connector errors in their category."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import hypocenter
from hypocenter import errors
from hypocenter.errors import ConnectorError, HypocenterError, InputError, TransientError


def _package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(hypocenter.__path__, "hypocenter."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[name] = obj
    return found


def test_every_error_class_is_under_the_root_and_drawn_in_the_tree() -> None:
    found = _package_exceptions()
    assert {"ConnectorError", "StoreError", "OTLPDecodeError", "Backpressure"} <= set(found)
    tree = errors.__doc__ or ""
    assert [n for n, cls in found.items() if not issubclass(cls, HypocenterError)] == []
    assert [n for n in sorted(found) if f" {n} " not in tree] == []


@pytest.mark.parametrize(
    ("kind", "category"),
    [
        ("transient", TransientError),
        ("permanent", InputError),
        ("auth", InputError),
        ("not_found", InputError),
    ],
)
def test_a_connector_error_is_caught_by_its_category(kind: str, category: type[Exception]) -> None:
    with pytest.raises(category) as caught:
        raise ConnectorError("slurmctld: no answer", kind=kind)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConnectorError)
    assert (caught.value.kind, str(caught.value), caught.value.transient) == (
        kind,
        "slurmctld: no answer",
        kind == "transient",
    )
    other = InputError if category is TransientError else TransientError
    assert not isinstance(caught.value, other)
