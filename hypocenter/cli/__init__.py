"""The `hypocenter` command.

    hypocenter analyze BUNDLE [--format text|json] [--rules PATH]...   diagnose one attempt bundle
    hypocenter analyze --slurm JOBID | --kueue NS/WL | --k8s-job NS/NAME [--logs DIR] [--loki URL]
                       [--prometheus URL] [--config FILE]              pull the attempt (hypocenter.collector.pull)
    hypocenter schema                                                  JSON Schema of the diagnosis
    hypocenter rules list | check | test [--rule ID]                   the rule catalog
    hypocenter serve | replay BUNDLE | config show                     the server (cli/serve.py, replay.py, config.py)
    hypocenter fleet [--store URL | --server URL]                      recurring culprits (cli/fleet.py)
    hypocenter rules backtest [--since 30d] [--rules DIR]              what a rule change flips (cli/backtest.py)

Exit codes: 0 a diagnosis was produced (whatever its outcome) / the command succeeded; 1 rules
check or test found problems; 2 unusable input, with a one-line reason on stderr; 70 an internal
error (a bug: one line on stderr, the traceback only with HYPOCENTER_DEBUG=1). Never a traceback
for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from hypocenter import __version__
from hypocenter.cli import analyze, config, fleet, replay, rules, schema, serve
from hypocenter.cli.console import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, EXIT_PROBLEMS, one_line
from hypocenter.errors import InputError

__all__ = ["EXIT_INPUT", "EXIT_INTERNAL", "EXIT_OK", "EXIT_PROBLEMS", "build_parser", "main"]

SUBCOMMANDS = (analyze, schema, rules, fleet, serve, replay, config)
"""One module per subcommand, each with `add_parser(subparsers)`; in the order `--help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hypocenter", description="Find where a failed distributed AI workload's failure began.")
    p.add_argument("--version", action="version", version=f"hypocenter {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        print(f"hypocenter: internal error: {type(exc).__name__}: {one_line(str(exc))} "
              "(this is a bug, please report it; HYPOCENTER_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
