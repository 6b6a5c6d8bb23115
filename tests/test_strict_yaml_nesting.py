"""Deeply nested YAML is refused with a message, never parsed by libyaml's composer, which recurses on
the C stack without a limit: a 60 KB attempt.yaml of nested `[` crashed `hypocenter analyze` (and
`PUT /v1/attempts/…`, i.e. the whole server) with SIGSEGV. Run in subprocesses, so that a crash
fails the test instead of ending the test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypocenter import strict_yaml

DEPTH = 30_000

NESTED = {
    "flow": "[" * DEPTH + "]" * DEPTH,
    "flow-mapping": '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "block": "- " * DEPTH + "x",
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


@pytest.mark.parametrize("shape", sorted(NESTED))
def test_analyze_refuses_a_deeply_nested_attempt_yaml(tmp_path: Path, shape: str) -> None:
    (tmp_path / "attempt.yaml").write_text(NESTED[shape])
    run = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode != -11 and run.returncode != 139, "analyze crashed (SIGSEGV)"
    assert "nested too deeply" in run.stderr, run.stderr[-2000:]


def test_loads_in_a_thread_refuses_deep_nesting() -> None:
    code = (
        "import threading\n"
        "from hypocenter import strict_yaml\n"
        f"text = {NESTED['flow']!r}\n"
        "def parse():\n"
        "    try:\n"
        "        strict_yaml.loads(text)\n"
        "    except strict_yaml.StrictYAMLError as exc:\n"
        "        print(exc)\n"
        "t = threading.Thread(target=parse)\n"
        "t.start()\n"
        "t.join()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert "nested too deeply" in run.stdout


def test_shallow_documents_still_parse() -> None:
    assert strict_yaml.loads("a: [1, {b: [2, 3]}]\nc:\n  - d\n") == {"a": [1, {"b": [2, 3]}], "c": ["d"]}
