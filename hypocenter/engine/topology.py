"""Where each host port is cabled: host port -> switch, switch port (and cable), read from what sites have.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypocenter import strict_yaml
from hypocenter.errors import InputError


@dataclass(frozen=True, slots=True)
class Link:
    node: str
    port: str
    switch: str
    switch_port: str
    cable: str = ""


class Topology:
    """Host port -> `Link`. Lookups try the port as named, then without its `/1` (a single-port HCA)."""

    def __init__(self, links: Iterable[Link] = ()) -> None:
        self._links: dict[tuple[str, str], Link] = {}
        for link in links:
            self._links[(link.node, link.port)] = link

    def link(self, node: str, port: str) -> Link | None:
        found = self._links.get((node, port))
        if found is None and "/" not in port:
            found = self._links.get((node, f"{port}/1"))
        if found is None and port.endswith("/1"):
            found = self._links.get((node, port[:-2]))
        return found

    def links(self) -> list[Link]:
        return sorted(self._links.values(), key=lambda k: (k.node, k.port))

    def __len__(self) -> int:
        return len(self._links)


# ibnetdiscover: `Ca\t2 "H-0002c9030001e3f2"\t\t# "node01 mlx5_0"` and its port lines.
_IB_NODE = re.compile(r'^(?P<type>Ca|Switch|Rt)\s+\d+\s+"(?P<name>[^"]+)"\s+#\s+"(?P<desc>[^"]*)"')
_IB_CA_PORT = re.compile(
    r'^\[(?P<port>\d+)\](?:\([0-9a-fA-F]+\))?\s+"(?P<remote>S-[^"]+)"\[(?P<rport>\d+)\](?:\[ext (?P<ext>\d+)\])?'
    r'.*?#\s+lid \d+ lmc \d+ "(?P<rdesc>[^"]*)"'
)


def parse_ibnetdiscover(text: str) -> list[Link]:
    """The host-to-switch links of an `ibnetdiscover` topology dump (switch-to-switch links are skipped).
    A switch port behind a chassis' external numbering (`[ext N]`, with -g) is named by that number."""
    links: list[Link] = []
    host = device = ""
    for raw in text.splitlines():
        line = raw.strip()
        node = _IB_NODE.match(line)
        if node:
            host = device = ""
            if node["type"] == "Ca":
                parts = node["desc"].split()
                host, device = (parts[0], parts[1]) if len(parts) >= 2 else (node["desc"], node["name"])
            continue
        if not host:
            continue
        port = _IB_CA_PORT.match(line)
        if port:
            switch = port["rdesc"].strip() or port["remote"]
            links.append(
                Link(
                    node=host,
                    port=f"{device}/{port['port']}",
                    switch=switch,
                    switch_port=port["ext"] or port["rport"],
                )
            )
    return links


def parse_lldp(document: Mapping[str, Any], host: str) -> list[Link]:
    """The neighbours in `lldpctl -f json` output taken on `host`. lldpctl writes a one-element list
    as the element itself, so `interface`, and a chassis's name mapping, take either shape."""
    lldp = document.get("lldp")
    if not isinstance(lldp, Mapping):
        raise InputError('not lldpctl -f json output (no top-level "lldp")')
    interfaces = lldp.get("interface") or []
    items: list[tuple[str, Any]] = []
    for entry in interfaces if isinstance(interfaces, list) else [interfaces]:
        if isinstance(entry, Mapping):
            items.extend(entry.items())
    links: list[Link] = []
    for ifname, info in items:
        if not isinstance(info, Mapping):
            continue
        chassis = info.get("chassis") or {}
        switch = ""
        if isinstance(chassis, Mapping):
            names = [k for k in chassis if k not in ("id", "descr", "mgmt-ip", "capability", "name")]
            switch = (
                str(names[0])
                if names
                else str(
                    (chassis.get("name") or {}).get("value", "")
                    if isinstance(chassis.get("name"), Mapping)
                    else chassis.get("name") or ""
                )
            )
            if not switch and isinstance(chassis.get("id"), Mapping):
                switch = str(chassis["id"].get("value", ""))
        port = info.get("port") or {}
        port_id = port.get("id") if isinstance(port, Mapping) else None
        switch_port = str(port_id.get("value", "")) if isinstance(port_id, Mapping) else str(port_id or "")
        if switch and switch_port:
            links.append(Link(node=host, port=str(ifname), switch=switch, switch_port=switch_port))
    return links


def parse_topology_yaml(text: str, name: str) -> list[Link]:
    doc = strict_yaml.loads(text, name) if text.strip() else {}
    if not isinstance(doc, Mapping) or not isinstance(doc.get("links"), list):
        raise InputError(f"{name}: a topology file is a mapping with a `links:` list")
    links: list[Link] = []
    for i, item in enumerate(doc["links"]):
        if not isinstance(item, Mapping):
            raise InputError(f"{name}: links[{i}] is not a mapping")
        unknown = sorted(set(item) - {"node", "port", "switch", "switch_port", "cable"})
        missing = [k for k in ("node", "port", "switch", "switch_port") if not item.get(k)]
        if unknown or missing:
            raise InputError(
                f"{name}: links[{i}]: "
                + "; ".join(
                    ([f"unknown keys {', '.join(unknown)}"] if unknown else [])
                    + ([f"missing {', '.join(missing)}"] if missing else [])
                )
            )
        links.append(
            Link(
                node=str(item["node"]),
                port=str(item["port"]),
                switch=str(item["switch"]),
                switch_port=str(item["switch_port"]),
                cable=str(item.get("cable") or ""),
            )
        )
    return links


def parse_topology(text: str, name: str) -> list[Link]:
    """One file's links, its format recognised by content; `name`'s stem is the host of an LLDP dump."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}: not valid JSON: {exc}") from exc
        return parse_lldp(doc, Path(name).stem)
    if re.search(r"^(Ca|Switch)\s+\d+\s+\"", text, re.M):
        return parse_ibnetdiscover(text)
    try:
        return parse_topology_yaml(text, name)
    except InputError as exc:
        raise InputError(f"{exc} (nor is it ibnetdiscover output or lldpctl -f json)") from None


def load_topology(paths: Iterable[str | Path]) -> Topology:
    """Every link in the given files and directories (a directory: its files, sorted)."""
    links: list[Link] = []
    for p in paths:
        path = Path(p)
        files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot read topology file {f}: {exc.strerror or exc}") from exc
            links.extend(parse_topology(text, str(f)))
    return Topology(links)


__all__ = ["Link", "Topology", "load_topology", "parse_ibnetdiscover", "parse_lldp", "parse_topology"]
