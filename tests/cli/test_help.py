"""What `--help` and `schema` show a newcomer: no source paths, a description for every command, and a
schema `$id` that names no domain the project does not hold."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

from server_support import clean_env

from hypocenter.cli import SUBCOMMANDS, build_parser

SOURCE_PATH = re.compile(r"[\w./-]+\.py\b|\bhypocenter/(?:collector|engine|server|api|cli|store|exporter)\b")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command and nested subcommand, each built in full."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(f"{name} {sub}".strip(), child)

    for command in SUBCOMMANDS:
        top = build_parser([command])
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        walk(command, sub.choices[command])
    return found


def test_no_help_names_a_source_file() -> None:
    offenders = {
        name: SOURCE_PATH.findall(p.format_help())
        for name, p in _parsers().items()
        if SOURCE_PATH.search(p.format_help())
    }
    assert not offenders, offenders


def test_every_command_describes_itself() -> None:
    bare = [name for name, p in _parsers().items() if not (p.description or "").strip()]
    assert "schema" not in bare, bare
    schema_help = _parsers()["schema"].format_help()
    assert "JSON Schema" in schema_help and "hypocenter.diagnosis/v1" in schema_help


def test_the_schema_id_is_a_name_not_someone_elses_domain() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=True,
    )
    schema_id = json.loads(r.stdout)["$id"]
    assert schema_id.startswith("urn:hypocenter:") and "diagnosis" in schema_id
