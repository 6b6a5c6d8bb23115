"""Coverage-guided fuzzing (bench/fuzz.py, atheris) of the parsers hostile input reaches, for a few
seconds per target in every test run, and a replay of every input that ever crashed one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bench.fuzz import REGRESSIONS, TARGETS, seeds, target_function
from hypocenter.collector import otlp_wire

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SECONDS = 3


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzing_finds_no_crash(target: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fuzz", "--worker", "--target", target, "--seconds", str(SECONDS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
    assert runs and int(runs[0].split()[1]) > 10, proc.stderr[-2000:]  # it really ran inputs


def _saved() -> list[tuple[str, Path]]:
    return [(t, p) for t in TARGETS for p in sorted((REGRESSIONS / t).glob("*")) if p.is_file()]


@pytest.mark.parametrize("target", TARGETS)
def test_the_seeds_pass(target: str) -> None:
    fn = target_function(target)
    for seed in seeds(target):
        fn(seed)


@pytest.mark.parametrize(("target", "path"), _saved(), ids=[f"{t}/{p.name}" for t, p in _saved()])
def test_inputs_that_once_crashed_a_target_no_longer_do(target: str, path: Path) -> None:
    target_function(target)(path.read_bytes())


@st.composite
def _requests(draw: st.DrawFn) -> bytes:
    req = ExportLogsServiceRequest()
    for scopes in draw(st.lists(st.lists(st.integers(0, 5), max_size=4), max_size=4)):
        rl = req.resource_logs.add()
        for n in scopes:
            sl = rl.scope_logs.add()
            sl.scope.name = draw(st.text(max_size=3))
            for _ in range(n):
                sl.log_records.add().body.string_value = draw(st.text(max_size=200))
    return req.SerializeToString()


@given(_requests(), st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_the_wire_count_agrees_with_the_decoder(body: bytes, bound: int) -> None:
    msg = ExportLogsServiceRequest.FromString(body)
    real = sum(len(sl.log_records) for rl in msg.resource_logs for sl in rl.scope_logs)
    groups = sum(len(rl.scope_logs) for rl in msg.resource_logs)
    counted = otlp_wire.count_log_records(body, bound)
    if real <= bound and groups <= bound:
        assert counted == real
    else:
        assert counted > bound
