"""The server-side subcommands of `hypocenter`: serve, replay, config show.

    hypocenter serve [--config FILE] [--<setting> VALUE]...     run the attribution server
    hypocenter replay BUNDLE [--endpoint HOST:PORT] [--http] [--rest URL]
    hypocenter config show [--config FILE] [--<setting> VALUE]... [--format text|json]

Every setting of `hypocenter.config.Settings` is a flag of `serve` and `config show`, named after
the field (`settle_s` → `--settle-s`). Heavy imports (grpc, FastAPI, the OTel SDK) happen inside
the commands so that `hypocenter analyze` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hypocenter.config import Settings, describe, field_help, load_settings, shown
from hypocenter.errors import InputError, TransientError

EXIT_OK = 0
EXIT_FAILED = 1


def _setting_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML settings file (default: $HYPOCENTER_CONFIG)")
    g = p.add_argument_group("settings (flags beat HYPOCENTER_* environment, which beats the file)")
    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if info.annotation is bool:
            g.add_argument(flag, dest=f"set_{name}", action="store_const", const=True, default=None, help=field_help(name))
        elif name in ("rules", "topology"):
            g.add_argument(flag, dest=f"set_{name}", action="append", default=None, metavar="PATH", help=field_help(name))
        else:
            g.add_argument(flag, dest=f"set_{name}", default=None, metavar="VALUE", help=field_help(name))


def _settings(args: argparse.Namespace) -> tuple[Settings, dict[str, str]]:
    flags = {k.removeprefix("set_"): v for k, v in vars(args).items() if k.startswith("set_") and v is not None}
    return load_settings(flags, config=args.config)


def _cmd_serve(args: argparse.Namespace) -> int:
    from hypocenter.server.assembly import run

    settings, _ = _settings(args)
    return run(settings)


def _cmd_config_show(args: argparse.Namespace) -> int:
    settings, origin = _settings(args)
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


TOKEN_ENV = "HYPOCENTER_TOKEN"


def client_token(token_file: str | None) -> str | None:
    """A client's bearer token: from --token-file, else $HYPOCENTER_TOKEN (never a flag value, which
    `ps` would show to every user of the machine)."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InputError(f"--token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise InputError(f"--token-file {token_file}: the file is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _cmd_replay(args: argparse.Namespace) -> int:
    from hypocenter.cli.replay import replay, trigger

    endpoint = args.endpoint or ("127.0.0.1:4318" if args.http else "127.0.0.1:4317")
    token = client_token(args.token_file)
    try:
        ctx, report = replay(Path(args.bundle), endpoint, http=args.http, timeout=args.timeout, token=token,
                             ca_file=args.ca_file)
    except TransientError as exc:
        print(f"hypocenter: replay to {endpoint} stopped: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"replayed {args.bundle} to {endpoint} ({'OTLP/HTTP' if args.http else 'OTLP/gRPC'}): "
          f"{report.log_records} log records, {report.metric_points} metric points in {report.requests} requests; "
          f"workload {ctx.workload.id} attempt {ctx.workload.attempt} state {ctx.state or 'UNKNOWN'} sent last",
          file=sys.stderr)
    rest = args.rest or (endpoint if args.http else None)
    if rest is None:
        print("the terminal state triggers analysis on the server; pass --rest URL to wait for the diagnosis",
              file=sys.stderr)
        return EXIT_OK
    try:
        status, body = trigger(rest, ctx, token=token, ca_file=args.ca_file)
    except TransientError as exc:
        print(f"hypocenter: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if status != 200:
        print(f"hypocenter: analysis request failed: HTTP {status}: {body.strip()[:300]}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(body)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register serve, replay and config on the `hypocenter` subparsers."""
    s = sub.add_parser("serve", help="run the attribution server (OTLP/gRPC :4317, OTLP/HTTP + REST :4318)")
    _setting_flags(s)
    s.set_defaults(func=_cmd_serve)

    r = sub.add_parser("replay", help="send an attempt bundle to a server as OTLP, then trigger its analysis")
    r.add_argument("bundle", help="path to the attempt bundle directory")
    r.add_argument("--endpoint", help="OTLP endpoint host:port (default 127.0.0.1:4317, or :4318 with --http)")
    r.add_argument("--http", action="store_true", help="use OTLP/HTTP (protobuf) instead of OTLP/gRPC")
    r.add_argument("--rest", metavar="URL",
                   help="REST base URL to trigger the analysis and print the diagnosis (default: the --http endpoint)")
    r.add_argument("--timeout", type=float, default=30.0, help="exporter timeout per request, seconds (default 30)")
    r.add_argument("--token-file", metavar="PATH", help=f"file holding a bearer token (default: ${TOKEN_ENV}); "
                   "OTLP needs the ingest role, the analysis trigger admin")
    r.add_argument("--ca-file", metavar="PATH", help="CA certificate(s) to verify a TLS server with (turns on TLS)")
    r.set_defaults(func=_cmd_replay)

    c = sub.add_parser("config", help="show the server's effective settings")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    show = csub.add_parser("show", help="print each effective setting and where it came from")
    _setting_flags(show)
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(func=_cmd_config_show)
