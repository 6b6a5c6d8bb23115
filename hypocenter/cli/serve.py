"""`hypocenter serve`: run the attribution server.

    hypocenter serve [--config FILE] [--<setting> VALUE]...

Every setting of `hypocenter.config.Settings` is a flag of `serve` and `config show`, named after
the field (`settle_s` → `--settle-s`). Heavy imports (grpc, FastAPI, the OTel SDK) happen inside
the commands so that `hypocenter analyze` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from hypocenter.cli.settings_help import add_setting_flags
from hypocenter.config import Settings, load_settings


def setting_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML settings file (default: $HYPOCENTER_CONFIG); "
        "flags beat HYPOCENTER_* environment, which beats the file",
    )
    add_setting_flags(p)


def settings_of(args: argparse.Namespace) -> tuple[Settings, dict[str, str]]:
    flags = {
        k.removeprefix("set_"): v for k, v in vars(args).items() if k.startswith("set_") and v is not None
    }
    return load_settings(flags, config=args.config)


def _cmd_serve(args: argparse.Namespace) -> int:
    from hypocenter.cli.assembly import run

    settings, _ = settings_of(args)
    return run(settings)


def add_parser(sub: Any) -> None:
    s = sub.add_parser(
        "serve",
        help="run the attribution server (OTLP/gRPC :4317, OTLP/HTTP + REST :4318)",
        usage="hypocenter serve [--config FILE] [--SETTING VALUE]...",
    )
    setting_flags(s)
    s.set_defaults(func=_cmd_serve)
