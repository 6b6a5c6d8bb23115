"""YAML loading that refuses what PyYAML silently accepts: duplicate keys, unsafe tags, and aliases.

Every mapping comes back as a `LineDict`, a dict that remembers the line it started on, so that
validation errors can point at `file:line`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hypocenter.errors import InputError


class LineDict(dict[str, Any]):
    """A mapping loaded from YAML, with the 1-based line where it starts and the line of each key."""

    line: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}


class StrictYAMLError(InputError):
    def __init__(self, message: str, path: str, line: int | None) -> None:
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class _NoAliases(yaml.SafeLoader):
    """Refuses aliases (`*name`): a few hundred bytes of nested aliases ("billion laughs") expand to
    billions of values for whatever walks the result. Anchors alone are harmless and allowed."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                f"YAML aliases (*{event.anchor}) are not accepted: write the value out "
                "(aliases can expand a small file into billions of values)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


class DataLoader(_NoAliases):
    """PyYAML's safe loader without aliases: for documents that are data (scheduler and Kubernetes objects)."""


class _Loader(_NoAliases):
    pass


# libyaml's scanner and parser when PyYAML was built with it (the wheels are): the rule catalog, which
# every `hypocenter analyze` loads, parses several times faster. The constructors are the same. On an
# error, or a document nested deeper than rules and attempt files ever are, the pure-Python loader
# parses again, so messages and limits are exactly its own.
class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    pass


_FAST_MAX_DEPTH = 32

# libyaml's composer (PyYAML's C extension) recurses on the C stack without a limit: ~20,000 nested
# `[` (40 KB) crash the process with SIGSEGV. Only text whose nesting cannot pass this goes to it.
_FAST_SAFE_DEPTH = 4000


def _depth_bound(text: str) -> int:
    """An upper bound on the nesting of a YAML text: each flow level opens with `[` or `{`, and block
    collections nest only by moving right (a sequence may share its mapping's column, hence twice the width)."""
    widest = max(map(len, text.splitlines()), default=0)
    return 2 * (widest + 1) + text.count("[") + text.count("{")


def _plain(node: yaml.Node) -> bool:
    """No alias (a node reached twice: libyaml's composer resolves `*name` to the anchored node, and
    aliases are refused) and nothing nested deeper than _FAST_MAX_DEPTH: the fast path may construct it."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(node, 0)]
    while stack:
        n, depth = stack.pop()
        if depth > _FAST_MAX_DEPTH or id(n) in seen:
            return False
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend((x, depth + 1) for kv in n.value for x in kv)
    return True


def _fast(text: str) -> tuple[bool, Any]:
    """(True, document) from libyaml when the document is plain; (False, None) to parse it again slowly."""
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return True, None
        if not _plain(node):
            return False, None
        return True, loader.construct_document(node)
    finally:
        loader.dispose()


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not _hashable(key):  # a list, mapping or set as a key
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a scalar", key_node.start_mark
            )
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=deep)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def loads(text: str, path: str = "<string>") -> Any:
    """Parse one YAML document; errors name `path:line`."""
    try:
        if _depth_bound(text) <= _FAST_SAFE_DEPTH:
            done, doc = _fast(text)  # safe: a SafeLoader
            if done:
                return doc
    except (yaml.YAMLError, RecursionError):
        pass
    try:
        return yaml.load(text, Loader=_Loader)  # safe: _Loader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or str(exc)
        if exc.context and problem.startswith("but "):  # "expected a single document …, but found another"
            problem = f"{exc.context}, {problem}"
        raise StrictYAMLError(f"invalid YAML: {problem}", path, line) from None
    except yaml.YAMLError as exc:
        raise StrictYAMLError(f"invalid YAML: {exc}", path, None) from None
    except RecursionError:
        raise StrictYAMLError("invalid YAML: nested too deeply", path, None) from None


def load_file(path: Path, display: str | None = None) -> Any:
    """Read and parse a YAML file, with a clear error for unreadable or non-UTF-8 files."""
    name = display or str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StrictYAMLError(f"cannot read file: {exc.strerror or exc}", name, None) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise StrictYAMLError("file is not UTF-8 text", name, line) from None
    return loads(text, name)
