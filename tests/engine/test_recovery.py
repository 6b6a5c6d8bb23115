"""A condition that clears (a link back ACTIVE, a Lustre reconnect) clears the job only if the job
went on after it (#20 blind spot 4); scheduler end-of-job lines follow the scheduler's own reason
(blind spot 3, scheduler side)."""

from __future__ import annotations

from hypocenter.engine import analyze
from hypocenter.model import AttemptContext, Diagnosis
from hypocenter.sources import AttemptInput, TextSource

NODES = ["gpu-b14", "gpu-b15", "gpu-b16"]
RANKS = {"gpu-b14": "0-7", "gpu-b15": "8-15", "gpu-b16": "16-23"}
INIT = "".join(
    f"{n}:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_1:1/IB ; OOB ib0:10.10.1.{n[-2:]}<0>\n" for n in NODES
)


def _flap(at: str, back: str) -> str:
    return (
        f"Nov  5 {at} gpu-b16 kernel: mlx5_core 0000:5c:00.0 mlx5_1: Port: 1 Link DOWN\n"
        f"Nov  5 {back} gpu-b16 kernel: mlx5_core 0000:5c:00.0 mlx5_1: Port: 1 Link ACTIVE\n"
    )


def _peers_lose_b16(when: str) -> str:
    lines = [
        f"{n}:2:3 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.10.1.16<49231> with "
        f"status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.10.1.{n[-2:]} remoteGids::ffff:10.10.1.16\n"
        for n in ("gpu-b14", "gpu-b15")
    ]
    return "".join(lines) + (
        f"[rank1]:[E1105 {when}.190000000 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "Process group watchdog thread terminated with exception: NCCL error: remote process exited or "
        "there was a network error, NCCL version 2.21.5\n"
    )


def _progress(times: list[str], stamped: bool = True) -> str:
    return "".join(
        (f"[2026-11-05 {t}] " if stamped else "") + f"iteration {4100 + 10 * i} | lm loss: 2.0\n"
        for i, t in enumerate(times)
    )


KEYERROR = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "/workspace/pretrain.py", line 412, in <module>\n'
    "[rank3]: KeyError: 'input_ids'\n"
)


def run(job: str, kern: str, end: str = "2026-11-05T04:20:00Z") -> Diagnosis:
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": "f1", "scheduler": "slurm", "cluster": "c"},
            "state": "FAILED",
            "nodes": NODES,
            "ranks": RANKS,
            "window": {"start": "2026-11-05T03:00:00Z", "end": end},
        }
    )
    return analyze(
        AttemptInput(
            ctx,
            [
                TextSource("logs/_job/out.log", INIT + job),
                TextSource("logs/gpu-b16/kern.log", kern, "gpu-b16"),
            ],
        )
    )


def test_a_link_back_seconds_before_the_job_dies_is_the_cause() -> None:
    # One step already in flight logs after the port is ACTIVE again; the peers' retries then run out.
    d = run(
        _progress(["04:00:50", "04:01:00", "04:01:10"]) + _peers_lose_b16("04:01:36"),
        _flap("04:01:03", "04:01:09"),
    )
    assert (d.outcome, d.root_cause and d.root_cause.subdomain, d.root_cause and d.root_cause.nodes) == (
        "attributed",
        "fabric",
        ["gpu-b16"],
    )
    assert d.root_cause is not None and d.root_cause.rule == "ib-link-down"
    assert any(ev.role == "root_cause" and "Link DOWN" in ev.text for ev in d.evidence)


def test_a_flap_the_job_trained_through_is_shown_beside_the_peer_loss_that_ended_it() -> None:
    # Seven minutes of training after the link came back, then the peers lose gpu-b16: the fabric on
    # gpu-b16 is the cause, the earlier flap its context (before, the two merged and were dropped as
    # outlived, leaving the failure unattributed).
    steps = [f"04:0{m}:{s:02d}" for m in range(1, 9) for s in (0, 30)]
    d = run(_progress(steps) + _peers_lose_b16("04:08:50"), _flap("04:01:03", "04:01:09"))
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        "network",
        "fabric",
        ["gpu-b16"],
    )
    assert any(ev.role == "context" and "Link DOWN" in ev.text for ev in d.evidence)


def test_a_down_link_the_job_trained_past_does_not_carry_away_the_later_loss() -> None:
    # No ACTIVE line at all: the job outlived the DOWN (judged on its own), not the peers' loss 10 min on.
    steps = [f"04:{m:02d}:00" for m in range(1, 12)]
    kern = "Nov  5 04:01:03 gpu-b16 kernel: mlx5_core 0000:5c:00.0 mlx5_1: Port: 1 Link DOWN\n"
    d = run(_progress(steps) + _peers_lose_b16("04:11:40"), kern)
    assert d.root_cause is not None and (d.root_cause.subdomain, d.root_cause.nodes) == (
        "fabric",
        ["gpu-b16"],
    )


def test_a_flap_followed_by_training_does_not_explain_a_later_exception() -> None:
    steps = ["04:01:00", "04:01:30", "04:02:00", "04:02:30", "04:03:00"]
    d = run(_progress(steps) + KEYERROR, _flap("04:01:03", "04:01:09"))
    assert d.root_cause is not None and (d.root_cause.domain, d.root_cause.subdomain) == (
        "software",
        "user_code",
    )


def test_without_timed_progress_a_job_that_ran_on_long_after_the_link_came_back_outlived_the_flap() -> None:
    # tqdm-style progress carries no time; the job ended 50 minutes after the flap, far longer than a
    # collective stuck on the link could have lasted.
    job = "[2026-11-05 03:10:00] starting\n" + _progress(["-"] * 5, stamped=False) + KEYERROR
    d = run(job, _flap("03:30:03", "03:30:09"))
    assert d.root_cause is not None and d.root_cause.subdomain == "user_code"


def test_without_timed_progress_a_job_that_ended_seconds_after_the_link_came_back_did_not_recover() -> None:
    job = (
        "[2026-11-05 03:10:00] starting\n" + _progress(["-"] * 5, stamped=False) + _peers_lose_b16("03:30:40")
    )
    d = run(job, _flap("03:30:03", "03:30:09"), end="2026-11-05T03:31:30Z")
    assert d.root_cause is not None and (d.root_cause.rule, d.root_cause.nodes) == (
        "ib-link-down",
        ["gpu-b16"],
    )


def test_a_task_killed_with_no_reason_from_the_scheduler_is_not_attributed_and_says_so() -> None:
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": "s1", "scheduler": "slurm", "cluster": "c"},
            "state": "FAILED",
            "nodes": ["gpu-a01", "gpu-a02"],
            "ranks": {"gpu-a01": "0-7", "gpu-a02": "8-15"},
            "window": {"start": "2026-11-02T08:00:00Z", "end": "2026-11-02T10:00:00Z"},
        }
    )
    log = (
        "[2026-11-02 09:55:00] iteration 1550 | lm loss: 2.1\n"
        "slurmstepd: error: *** STEP 81234.0 ON gpu-a01 CANCELLED AT 2026-11-02T09:59:30 ***\n"
        "srun: error: gpu-a02: task 9: Killed\n"
    )
    d = analyze(AttemptInput(ctx, [TextSource("logs/_job/out.log", log)]))
    assert d.outcome == "unattributed" and d.quality.level == "low"
    assert (
        d.first_failure is not None
        and d.first_failure.node == "gpu-a02"
        and d.first_failure.signal == "SIGKILL"
    )
    assert "scheduler states no reason" in d.first_failure.next_step
    assert "cancelled with none" in d.first_failure.next_step
    # With the scheduler's OUT_OF_MEMORY state the same lines are host memory on the killed task's node.
    oom = analyze(
        AttemptInput(
            ctx.model_copy(update={"state": "OUT_OF_MEMORY"}), [TextSource("logs/_job/out.log", log)]
        )
    )
    assert oom.root_cause is not None
    assert (oom.root_cause.subdomain, oom.root_cause.nodes) == ("host_oom", ["gpu-a02"])
