"""`hypocenter config show`: each effective server setting and where it came from (file, env, flag)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hypocenter.cli.console import EXIT_OK
from hypocenter.cli.serve import setting_flags, settings_of
from hypocenter.config import describe, shown


def _cmd_config_show(args: argparse.Namespace) -> int:
    settings, origin = settings_of(args)
    rows = describe(settings, origin)
    if args.format == "json":
        values = settings.model_dump(mode="json")
        doc = {name: {"value": shown(name, values[name]), "origin": where} for name, _, where in rows}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return EXIT_OK
    width = max(len(n) for n, _, _ in rows)
    vwidth = min(40, max(len(v) for _, v, _ in rows))
    for name, value, where in rows:
        sys.stdout.write(f"{name.ljust(width)}  {value.ljust(vwidth)}  {where}\n")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="show the server's effective settings")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    show = csub.add_parser("show", help="print each effective setting and where it came from")
    setting_flags(show)
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(func=_cmd_config_show)
