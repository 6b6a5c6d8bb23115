"""The `hypocenter` command.

    hypocenter analyze BUNDLE [--format text|json] [--rules PATH]...   diagnose one attempt bundle
    hypocenter analyze --slurm JOBID | --kueue NS/WL | --k8s-job NS/NAME [--logs DIR] [--loki URL]
                       [--prometheus URL] [--config FILE]              pull the attempt (hypocenter.collector.pull)
    hypocenter schema                                                  JSON Schema of the diagnosis
    hypocenter rules list | check | test [--rule ID]                   the rule catalog
    hypocenter serve | replay BUNDLE | config show                     the server (cli/serve.py, replay.py, config.py)
    hypocenter fleet [--store URL | --server URL]                      recurring culprits (cli/fleet.py)
    hypocenter rules backtest [--since 30d] [--rules DIR]              what a rule change flips (cli/backtest.py)
    hypocenter health [--grpc] [--ca-file PEM]                         is the server ready? (cli/health.py)

Exit codes: 0 a diagnosis was produced (whatever its outcome) / the command succeeded; 1 rules
check or test found problems; 2 unusable input, with a one-line reason on stderr; 70 an internal
error (a bug: one line on stderr, the traceback only with HYPOCENTER_DEBUG=1). Never a traceback
for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from hypocenter import __version__
from hypocenter.cli.console import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, EXIT_PROBLEMS, one_line
from hypocenter.errors import InputError

__all__ = ["EXIT_INPUT", "EXIT_INTERNAL", "EXIT_OK", "EXIT_PROBLEMS", "build_parser", "main"]

SUBCOMMANDS = ("analyze", "schema", "rules", "fleet", "serve", "replay", "config", "health")
"""One module per subcommand (hypocenter.cli.<name>), each with `add_parser(subparsers)`; in the order
`--help` lists them."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the arguments of a run, only the subcommand they name is imported
    and built in full (the others are bare names): `analyze` then never imports the server's modules."""
    p = argparse.ArgumentParser(
        prog="hypocenter", description="Find where a failed distributed AI workload's failure began."
    )
    p.add_argument("--version", action="version", version=f"hypocenter {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    named = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name in SUBCOMMANDS:
        if named is None or name == named:
            importlib.import_module(f"hypocenter.cli.{name}").add_parser(sub)
        else:
            sub.add_parser(name)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except InputError as exc:
        print(f"hypocenter: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("hypocenter: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("HYPOCENTER_DEBUG"):
            raise
        print(
            f"hypocenter: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            "(this is a bug, please report it; HYPOCENTER_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
