"""`hypocenter fleet`: recurring culprits across workloads (engine/fleet.py), from a store or a server.

    hypocenter fleet [--store URL | --server URL] [--kind K]... [--limit N] [--format text|json]
                     [--topology PATH]... [--window-s S] [--half-life-s S] [--min-workloads N] [--now TIME]
    hypocenter fleet --cost [--store URL | --server URL] [--limit N] [--format text|json] [--window-s S]
                     (what failures cost: engine/fleet_cost.py, `GET /v1/fleet/cost`)

`--store` reads the store file or PostgreSQL URL directly (read-only use); `--server` asks a running
server's REST API (`GET /v1/fleet/suspects`, token from --token-file or $HYPOCENTER_TOKEN; read role).
Against a server, the server's own settings (window, half-life, topology) apply.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypocenter.engine.fleet import DEFAULT_HALF_LIFE_S, DEFAULT_MIN_WORKLOADS, SUSPECT_KINDS, FleetView
from hypocenter.engine.topology import load_topology
from hypocenter.errors import InputError

EXIT_OK = 0


def _now(text: str | None) -> float:
    if not text:
        return time.time()
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"--now {text!r}: not an RFC 3339 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _from_server(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from hypocenter.cli.replay import client_token

    token = client_token(args.token_file)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params: list[tuple[str, str | int | float | bool | None]] = [
        ("limit", args.limit),
        *(("kind", k) for k in args.kind),
    ]
    path = "/v1/fleet/cost" if args.cost else "/v1/fleet/suspects"
    if args.cost:
        params = [("limit", args.limit)]
    try:
        r = httpx.get(args.server.rstrip("/") + path, params=params, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        raise InputError(f"--server {args.server}: {exc}") from None
    if r.status_code != 200:
        raise InputError(f"--server {args.server}: HTTP {r.status_code}: {r.text.strip()[:200]}")
    doc: dict[str, Any] = r.json()
    return doc


def open_existing_store(url: str) -> Any:
    """A store that must already exist: a mistyped path is an error, not a new empty store."""
    from hypocenter.store import open_store

    if not url.startswith(("postgres://", "postgresql://")):
        path = Path(url.removeprefix("sqlite:///").removeprefix("sqlite://"))
        if not path.is_file():
            raise InputError(f"--store {url}: no such store file")
    return open_store(url)


def _from_store(args: argparse.Namespace) -> dict[str, Any]:
    store = open_existing_store(args.store)
    try:
        topology = load_topology([Path(p) for p in args.topology]) if args.topology else None
        if args.cost:
            from hypocenter.engine.fleet_cost import CostView
            from hypocenter.store.base import FinalDiagnoses

            return CostView(FinalDiagnoses(store), window_s=args.window_s, topology=topology).report(
                _now(args.now), limit=args.limit
            )
        view = FleetView(
            store,
            window_s=args.window_s,
            half_life_s=args.half_life_s,
            min_workloads=args.min_workloads,
            topology=topology,
        )
        return view.report(_now(args.now), kinds=args.kind or SUSPECT_KINDS, limit=args.limit)
    finally:
        store.close()


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def render_table(doc: dict[str, Any]) -> str:
    rows = doc["suspects"]
    found = {(s["kind"], s["name"]) for s in doc["findings"]}
    head = (
        f"fleet memory · {len(rows)} suspect(s), {len(doc['findings'])} finding(s) · window "
        f"{doc['window_s'] / 86400:g} d · half-life {doc['half_life_s'] / 86400:g} d · "
        f"{doc['topology_links']} topology link(s)"
    )
    if not rows:
        return head + "\n  no node, GPU or port is behind a failure in the window\n"
    width = max(24, *(len(s["name"]) for s in rows))
    out = [
        head,
        f"  {'':1} {'kind':<11} {'suspect':<{width}} {'score':>6} {'wl':>3} {'att':>4}  {'last':<10}  verdict",
    ]
    for s in rows:
        mark = "!" if (s["kind"], s["name"]) in found else " "
        out.append(
            f"  {mark} {s['kind']:<11} {s['name']:<{width}} {s['score']:>6.2f} {s['workloads']:>3} "
            f"{s['attempts']:>4}  {_day(s['last_seen_s']):<10}  {s['verdict']}"
        )
    out.append(
        f"  ! = finding (behind at least {doc['min_workloads']} workloads; a switch, switch port or cable "
        "on several hosts)"
    )
    return "\n".join(out) + "\n"


def render_cost(doc: dict[str, Any]) -> str:
    """The cost roll-up as text: the total, the Pareto of causes, the worst components, MTTF, ETTR."""
    t = doc["total"]
    out = [
        f"what failures cost · {t['gpu_hours_lost']:g} ± {t['gpu_hours_uncertainty']:g} GPU-hours lost over "
        f"{t['failed_attempts']} failed attempt(s) ({t['attempts_without_cost']} without a cost estimate; "
        f"{t['restart_gpu_hours']:g} of it restart overhead) · window {doc['window_s'] / 86400:g} d"
    ]
    out.append("  causes (Pareto)")
    for c in doc["causes"]:
        ttd = c["median_time_to_detect_s"]
        out.append(
            f"    {c['domain'] + '/' + c['subdomain']:<28} {c['gpu_hours_lost']:>10.2f} GPU-h "
            f"{c['share'] * 100:>5.1f}%  cum {c['cumulative_share'] * 100:>5.1f}%  {c['attempts']:>4} att  "
            f"detect {'?' if ttd is None else f'{ttd:g} s'}"
        )
    if doc["components"]:
        out.append("  worst components")
        for c in doc["components"]:
            out.append(
                f"    {c['kind']:<11} {c['name']:<32} {c['gpu_hours_lost']:>10.2f} GPU-h  "
                f"{c['attempts']} att, {c['workloads']} workload(s)"
            )
    if doc["domains"]:
        out.append("  MTTF per domain")
        for d in doc["domains"]:
            out.append(
                f"    {d['domain']:<14} {d['failures']:>4} failure(s)  MTTF {d['mttf_s'] / 3600:.1f} h"
            )
    if doc["workloads"]:
        out.append("  lowest ETTR")
        for w in doc["workloads"]:
            out.append(
                f"    {w['cluster'] + '/' + w['workload']:<32} ETTR {w['ettr']:.3f}  {w['attempts']} att"
            )
    return "\n".join(out) + "\n"


def _cmd_fleet(args: argparse.Namespace) -> int:
    from hypocenter.cli.console import emit as _emit

    if bool(args.store) == bool(args.server):
        args.parser.error("give exactly one of --store or --server")
    bad = sorted(set(args.kind) - set(SUSPECT_KINDS))
    if bad:
        args.parser.error(f"--kind: unknown {', '.join(bad)} (expected {', '.join(SUSPECT_KINDS)})")
    doc = _from_server(args) if args.server else _from_store(args)
    text = render_cost(doc) if args.cost else render_table(doc)
    _emit(json.dumps(doc, indent=2, sort_keys=True) + "\n" if args.format == "json" else text, utf8=True)
    return EXIT_OK


def add_parser(sub: Any) -> None:
    f = sub.add_parser(
        "fleet",
        help="recurring culprits across workloads: nodes, GPUs, ports, switch ports",
        description="Recurring culprits across workloads: the nodes, GPUs and ports behind the failures of "
        "several workloads, from a store or a running server.",
    )
    where = f.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="URL", help="a store file (SQLite) or postgresql:// URL")
    where.add_argument("--server", metavar="URL", help="a running server's REST base URL (http://host:4318)")
    f.add_argument(
        "--token-file", metavar="PATH", help="bearer token for --server (default: $HYPOCENTER_TOKEN)"
    )
    f.add_argument(
        "--kind", action="append", default=[], help=f"only these kinds ({', '.join(SUSPECT_KINDS)})"
    )
    f.add_argument("--limit", type=int, default=20, help="suspects shown (default %(default)s)")
    f.add_argument("--format", choices=("text", "json"), default="text")
    f.add_argument(
        "--topology",
        action="append",
        default=[],
        metavar="PATH",
        help="topology YAML, ibnetdiscover output or lldpctl -f json <host>.json (file or directory)",
    )
    f.add_argument(
        "--window-s", type=float, default=30 * 86400.0, help="look back this far (default 30 days)"
    )
    f.add_argument(
        "--half-life-s", type=float, default=DEFAULT_HALF_LIFE_S, help="score half-life (default 7 days)"
    )
    f.add_argument(
        "--min-workloads", type=int, default=DEFAULT_MIN_WORKLOADS, help="workloads behind a finding"
    )
    f.add_argument("--now", metavar="TIME", help="score as of this RFC 3339 time (default: now)")
    f.add_argument(
        "--cost",
        action="store_true",
        help="what failures cost: lost GPU-hours per cause, component, domain (MTTF) and workload (ETTR)",
    )
    f.set_defaults(func=_cmd_fleet, parser=f)


__all__ = ["add_parser", "open_existing_store", "render_cost", "render_table"]
