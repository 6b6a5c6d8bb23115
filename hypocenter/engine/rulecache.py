"""A cache of the loaded rule catalog, so that `analyze` does not parse and validate it every run.

The validated `Ruleset` is pickled under `$XDG_CACHE_HOME/hypocenter/`, named by a SHA-256 of
everything it was built from (rule files, the modules that give them meaning, Python, pydantic, RE2),
so it is never stale. Any cache file that cannot be trusted or read is ignored.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import tempfile
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path

from hypocenter.engine.rules import Ruleset, builtin_catalog, load_ruleset, rule_files

_FORMAT = b"hypocenter-ruleset-cache/2"  # /2: plain rule classes (no pydantic in the pickle)
# The modules whose code decides what a rule file loads into (validation, defaults, analyzer names),
# read as files: importing the schemas would import pydantic.
_MEANING = tuple(
    f"hypocenter.{name}"
    for name in (
        "engine.rules",
        "engine.rule_model",
        "engine.rule_schema",
        "engine.matching",
        "engine.analyzers",
        "engine.registry",
        "model",
        "model_schema",
        "modelbase",
        "names",
        "sources",
    )
)


def cache_dir() -> Path | None:
    base = os.environ.get("XDG_CACHE_HOME") or (
        os.path.join(os.path.expanduser("~"), ".cache") if os.path.expanduser("~") != "~" else ""
    )
    return Path(base) / "hypocenter" if base else None


def _installed(package: str) -> str:
    """Which copy of an installed package this is, without importing it (pydantic costs more start-up
    than a cache hit saves): its files' sizes and modification times."""
    spec = find_spec(package)
    where = [*(spec.submodule_search_locations or [])] if spec is not None else []
    if spec is not None and spec.origin:
        where.append(spec.origin)
    stamps = []
    for top in where:
        for path in sorted(Path(top).iterdir()) if os.path.isdir(top) else [Path(top)]:
            st = path.stat()
            stamps.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    return ",".join(stamps)


def _key(extra: Iterable[Path], builtin: bool) -> str:
    digest = hashlib.sha256(_FORMAT)
    import re2  # type: ignore[import-untyped]

    re2_lib = os.stat(re2.__file__)  # which patterns RE2 accepts decides what loads
    digest.update(f"\0{sys.version}\0{re2_lib.st_size}:{re2_lib.st_mtime_ns}\0{builtin}\0".encode())
    for package in ("pydantic", "pydantic_core"):  # validation and coercion of every rule
        digest.update(f"{package}={_installed(package)}\0".encode())
    for module in _MEANING:
        spec = find_spec(module)
        digest.update(Path(spec.origin if spec is not None and spec.origin else module).read_bytes() + b"\0")
    tops = ([builtin_catalog()] if builtin else []) + [Path(p).resolve() for p in extra]
    for top in tops:
        digest.update(str(top).encode() + b"\0")
    for path, display in rule_files(tops):
        digest.update(display.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load_ruleset_cached(extra: Iterable[Path] = (), *, builtin: bool = True) -> Ruleset:
    extra = list(extra)
    where = cache_dir()
    try:
        key = _key(extra, builtin)
    except OSError:
        where = None  # a rule path the loader will name properly
    if where is None:
        return load_ruleset(extra, builtin=builtin)
    path = where / f"ruleset-{key}.pickle"
    try:
        with path.open("rb") as f:
            if _trusted(os.fstat(f.fileno())) and _trusted(where.stat()):
                cached = pickle.load(f)
                if isinstance(cached, Ruleset):
                    return cached
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        pass
    ruleset = load_ruleset(extra, builtin=builtin)
    _store(where, path, ruleset)
    return ruleset


def _store(where: Path, path: Path, ruleset: Ruleset) -> None:
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _trusted(where.stat()):
            return
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".ruleset-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(ruleset, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, pickle.PicklingError):
        pass


__all__ = ["cache_dir", "load_ruleset_cached"]
