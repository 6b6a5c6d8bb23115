"""The cost of one failed attempt on its diagnosis (engine/cost.py): GPUs x (lost work + time to
detect + restart overhead), each figure with its method and uncertainty, unknown parts left unknown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hypocenter.engine import CostSettings, default_engine
from hypocenter.model import Diagnosis
from tests.engine_support import analyze_bundle

ATTEMPT = """\
workload: {{id: "5150", attempt: 1, scheduler: slurm, cluster: eos}}
window: {{start: "2026-11-02T10:00:00Z", end: "2026-11-02T11:00:00Z"}}
state: FAILED
exit_code: 1
nodes: [gpu01, gpu02]
{ranks}
"""


# Megatron-LM rank 0: steps every 30 s from 10:02:00, a checkpoint saved at iteration 200, an Xid 79 at 10:40:00.
def _megatron(checkpoint: bool) -> str:
    lines = []
    for i in range(0, 70):
        t = 2 * 60 + i * 30
        stamp = f"2026-11-02 10:{t // 60:02d}:{t % 60:02d}"
        it = 100 + i * 10
        lines.append(
            f"[{stamp}] iteration {it:>8}/  100000 | consumed samples: {it * 512:>10} | lm loss: 2.1E+00 |"
        )
        if checkpoint and it == 200:
            lines.append(f"[{stamp}]   successfully saved checkpoint from iteration      200 to /ckpt/run")
    return "\n".join(lines) + "\n"


KERN = "Nov  2 10:40:00 gpu02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def _bundle(tmp: Path, *, ranks: bool = True, checkpoint: bool = True, dcgm: bool = False) -> Path:
    (tmp / "logs" / "_job").mkdir(parents=True)
    (tmp / "logs" / "gpu02").mkdir()
    rank_map = 'ranks: {gpu01: "0-7", gpu02: "8-15"}' if ranks else ""
    (tmp / "attempt.yaml").write_text(ATTEMPT.format(ranks=rank_map))
    (tmp / "logs" / "_job" / "out.log").write_text(_megatron(checkpoint))
    (tmp / "logs" / "gpu02" / "kern.log").write_text(KERN)
    if dcgm:
        (tmp / "metrics").mkdir()
        series = [
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="{n}"}} 40 1793613600000'
            for n in ("gpu01", "gpu02")
            for g in range(4)
        ]
        (tmp / "metrics" / "dcgm.prom").write_text("\n".join(series) + "\n")
    return tmp


def test_lost_gpu_hours_from_a_megatron_checkpoint_line(tmp_path: Path) -> None:
    d = analyze_bundle(_bundle(tmp_path))
    assert d.outcome == "attributed" and d.cost is not None
    c = d.cost
    # checkpoint of iteration 200 at 10:07:00; Xid at 10:40:00; terminal at 11:00:00.
    assert c.gpus.value == 16 and "rank map" in c.gpus.method
    assert c.lost_work_s.value == 33 * 60 and c.lost_work_s.ref == "logs/_job/out.log:12"
    assert "megatron, step 200" in c.lost_work_s.method
    assert c.time_to_detect_s.value == 20 * 60 and c.time_to_detect_s.ref == "logs/gpu02/kern.log:1"
    assert c.restart_overhead_s.value is None and c.unknown == ["restart_overhead_s"]
    assert c.startup_s.value == 120  # 10:00:00 → the first iteration line at 10:02:00
    assert c.gpu_hours_lost == round(16 * (33 * 60 + 20 * 60) / 3600, 4)
    assert c.gpu_hours_uncertainty is not None and 0 < c.gpu_hours_uncertainty < 0.05


def test_unknown_parts_are_unknown_not_zero(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ranks=False, checkpoint=False)
    (bundle / "logs" / "_job" / "out.log").write_text("starting\n")  # no step line, no checkpoint line
    d = analyze_bundle(bundle)
    c = d.cost
    assert c is not None
    assert c.gpus.value is None and c.lost_work_s.value is None
    assert c.gpu_hours_lost is None and c.gpu_hours_uncertainty is None
    assert c.unknown == ["gpus", "lost_work_s", "restart_overhead_s"]
    assert c.startup_s.value is None
    assert c.time_to_detect_s.value == 20 * 60  # what is known is still given


def test_without_a_checkpoint_all_the_attempt_trained_is_lost(tmp_path: Path) -> None:
    d = analyze_bundle(_bundle(tmp_path, checkpoint=False))
    c = d.cost
    assert c is not None and c.unknown == ["restart_overhead_s"]
    # the first step line is at 10:02:00, the Xid at 10:40:00; a logging interval is 30 s.
    assert c.lost_work_s.value == 38 * 60 and c.lost_work_s.uncertainty == 30
    assert "first step line" in c.lost_work_s.method


def test_a_save_in_unknown_words_counts_from_where_it_began(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, checkpoint=False)
    log = bundle / "logs" / "_job" / "out.log"
    lines = log.read_text().splitlines()
    lines.insert(
        40, "2026-11-02 10:21:40,000 INFO train.py:88 -- Saving checkpoint step_490 to /ckpt/step_490"
    )
    log.write_text("\n".join(lines) + "\n")
    c = analyze_bundle(bundle).cost
    assert c is not None and c.lost_work_s.value == 18 * 60 + 20
    assert "begun at 2026-11-02T10:21:40Z" in c.lost_work_s.method


def test_settings_fill_what_the_logs_do_not_say(tmp_path: Path) -> None:
    engine = default_engine(cost=CostSettings(gpus_per_node=8, checkpoint_interval_steps=250))
    d = analyze_bundle(_bundle(tmp_path, ranks=False, checkpoint=False), engine)
    c = d.cost
    assert c is not None
    assert c.gpus.value == 16 and "setting gpus_per_node" in c.gpus.method
    # the last step line is 790 (10:36:30); the checkpoint is at 750, reported at 10:34:30.
    assert c.lost_work_s.value == 330 and "step 750" in c.lost_work_s.method
    assert c.lost_work_s.uncertainty == 3  # a step takes 3 s
    assert c.unknown == ["restart_overhead_s"]


def test_gpus_from_dcgm_series(tmp_path: Path) -> None:
    d = analyze_bundle(_bundle(tmp_path, ranks=False, dcgm=True))
    assert d.cost is not None and d.cost.gpus.value == 8 and "DCGM" in d.cost.gpus.method


def test_a_completed_attempt_lost_nothing_but_says_its_startup(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    (bundle / "attempt.yaml").write_text(
        (bundle / "attempt.yaml")
        .read_text()
        .replace("FAILED", "COMPLETED")
        .replace("exit_code: 1", "exit_code: 0")
    )
    (bundle / "logs" / "gpu02" / "kern.log").write_text("")
    d = analyze_bundle(bundle)
    c = d.cost
    assert d.outcome == "not_failed" and c is not None
    assert c.gpu_hours_lost == 0 and c.unknown == [] and c.lost_work_s.value == 0
    assert c.startup_s.value == 120


def test_cost_round_trips_through_the_schema(tmp_path: Path) -> None:
    d = analyze_bundle(_bundle(tmp_path))
    assert Diagnosis.model_validate(json.loads(d.to_json())).to_json() == d.to_json()


def test_analyze_prints_cost_and_takes_the_settings(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ranks=False, checkpoint=False)
    run = [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle)]
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "GPU-hours lost: unknown" in text
    out = subprocess.run(
        [*run, "--gpus-per-node", "8", "--checkpoint-interval", "250", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["cost"]["gpu_hours_lost"] == round(16 * (330 + 20 * 60) / 3600, 4)
    bad = subprocess.run([*run, "--gpus-per-node", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--gpus-per-node: must be at least 1" in bad.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_cost_is_byte_identical_run_to_run(tmp_path: Path, workers: int) -> None:
    from hypocenter.collector.bundle import load_bundle

    bundle = _bundle(tmp_path, dcgm=True)
    a = default_engine().analyze(load_bundle(bundle), workers=workers).to_json()
    b = default_engine().analyze(load_bundle(bundle), workers=1).to_json()
    assert a == b and '"cost"' in a


def test_an_interval_checkpoint_without_its_own_step_line_is_timed_back(tmp_path: Path) -> None:
    """Steps logged every 10, checkpoints every 25: step 775 has no line; at 3 s a step it was 45 s
    before step 790's line (10:36:30), 3 min 15 s before the Xid... plus the minutes after it."""
    engine = default_engine(cost=CostSettings(checkpoint_interval_steps=25))
    c = analyze_bundle(_bundle(tmp_path, checkpoint=False), engine).cost
    assert c is not None
    assert c.lost_work_s.value == (40 * 60 - (36 * 60 + 30)) + 15 * 3
    assert "step 775" in c.lost_work_s.method and "timed back from step 790" in c.lost_work_s.method
    assert c.lost_work_s.uncertainty == 30  # one logging interval


def test_a_save_the_failure_interrupted_is_no_checkpoint(tmp_path: Path) -> None:
    """A save begun after the last step line, then the fault (ENOSPC, a filesystem stall): not durable."""
    bundle = _bundle(tmp_path, checkpoint=False)
    log = bundle / "logs" / "_job" / "out.log"
    log.write_text(
        log.read_text() + "2026-11-02 10:37:00,000 INFO train.py:88 -- Saving checkpoint step_790\n"
    )
    c = analyze_bundle(bundle).cost
    assert c is not None and "first step line" in c.lost_work_s.method and c.lost_work_s.value == 38 * 60


def test_gpus_from_the_scope(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, ranks=False)
    (bundle / "attempt.yaml").write_text((bundle / "attempt.yaml").read_text() + "gpus_per_node: 4\n")
    c = analyze_bundle(bundle, default_engine(cost=CostSettings(gpus_per_node=8))).cost
    assert c is not None and c.gpus.value == 8 and c.gpus.method.startswith("scope: 2 node(s) × 4")
