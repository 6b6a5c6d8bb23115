"""Engine behaviour a user relies on, end to end from log text to diagnosis."""

from __future__ import annotations

import gzip
from pathlib import Path

import yaml
from engine_support import analyze_bundle

from hypocenter.engine import analyze
from hypocenter.model import AttemptContext
from hypocenter.sources import AttemptInput, TextSource

WINDOW = {"start": "2026-11-02T10:00:00Z", "end": "2026-11-02T11:00:00Z"}


def ctx(nodes: list[str], **kw: object) -> AttemptContext:
    doc: dict[str, object] = {
        "workload": {"id": "t1", "scheduler": "slurm", "cluster": "c"},
        "window": WINDOW,
        "state": "FAILED",
        "nodes": nodes,
    }
    doc.update(kw)
    return AttemptContext.model_validate(doc)


XID79 = "NVRM: Xid (PCI:0000:9b:00): 79, pid=0, GPU has fallen off the bus."


def test_raw_dmesg_is_anchored_to_wall_time_by_the_nodes_kern_log() -> None:
    kern = "Nov  2 10:00:05 n1 kernel: [1000.000000] Linux version 6.5\n"
    dmesg = f"[1600.250000] {XID79}\n"
    d = analyze(
        AttemptInput(
            ctx(["n1"]),
            [TextSource("logs/n1/kern.log", kern, "n1"), TextSource("logs/n1/dmesg", dmesg, "n1")],
        )
    )
    assert d.root_cause is not None
    assert d.root_cause.first_seen == "2026-11-02T10:10:05.250000Z"
    assert not any("approximate" in r for r in d.quality.reasons)


def test_raw_dmesg_without_an_anchor_is_marked_approximate() -> None:
    dmesg = f"[1600.250000] {XID79}\n[1700.000000] something later\n"
    d = analyze(AttemptInput(ctx(["n1"]), [TextSource("logs/n1/dmesg", dmesg, "n1")]))
    assert d.outcome == "attributed"
    assert any("approximate" in r for r in d.quality.reasons)


def test_unstamped_lines_inherit_the_last_stamp_of_their_stream() -> None:
    log = (
        "[2026-11-02 10:20:00] iteration 100 | loss 2.0\n"
        "n1:1:1 [0] NCCL INFO something\n"
        "[rank3]: KeyError: 'x'\n"
    )
    d = analyze(AttemptInput(ctx(["n1"], ranks={"n1": "0-7"}), [TextSource("logs/_job/out.log", log)]))
    assert d.root_cause is not None and d.root_cause.first_seen == "2026-11-02T10:20:00Z"
    assert d.root_cause.nodes == ["n1"]


def test_node_scoped_events_of_other_nodes_and_other_times_are_out_of_scope() -> None:
    other_node = f"Nov  2 10:15:03 n9 kernel: {XID79}\n"
    before = f"Nov  2 08:15:03 n1 kernel: {XID79}\n"
    d = analyze(
        AttemptInput(
            ctx(["n1", "n2"]),
            [TextSource("logs/n9/kern.log", other_node, "n9"), TextSource("logs/n1/kern.log", before, "n1")],
        )
    )
    assert d.outcome == "unattributed"


def test_completed_attempt_is_not_failed_even_with_scary_lines() -> None:
    d = analyze(
        AttemptInput(
            ctx(["n1"], state="COMPLETED"),
            [TextSource("logs/n1/kern.log", f"Nov  2 10:15:03 n1 kernel: {XID79}\n", "n1")],
        )
    )
    assert d.outcome == "not_failed" and d.root_cause is None


def test_only_symptoms_is_unattributed_with_low_quality() -> None:
    log = (
        "[rank1]:[E1102 10:25:01.000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n"
    )
    d = analyze(AttemptInput(ctx(["n1"]), [TextSource("logs/_job/out.log", log)]))
    assert d.outcome == "unattributed" and d.root_cause is None
    assert d.quality.level == "low"
    assert [s.kind for s in d.symptoms] == ["watchdog_timeout"]


def test_two_independent_faults_at_once_are_ambiguous() -> None:
    d = analyze(
        AttemptInput(
            ctx(["n1", "n2"]),
            [
                TextSource("logs/n1/kern.log", f"Nov  2 10:15:03 n1 kernel: {XID79}\n", "n1"),
                TextSource(
                    "logs/n2/kern.log",
                    "Nov  2 10:15:05 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit error (DBE)\n",
                    "n2",
                ),
            ],
        )
    )
    assert d.outcome == "ambiguous"
    assert (
        d.root_cause is not None
        and d.root_cause.subdomain == "ambiguous"
        and d.root_cause.nodes == ["n1", "n2"]
    )
    assert {(c.subdomain, tuple(c.nodes)) for c in d.candidates} == {
        ("gpu", ("n1",)),
        ("gpu_memory", ("n2",)),
    }


def test_a_fault_well_before_another_wins_and_the_other_is_listed() -> None:
    d = analyze(
        AttemptInput(
            ctx(["n1", "n2"]),
            [
                TextSource("logs/n1/kern.log", f"Nov  2 10:15:03 n1 kernel: {XID79}\n", "n1"),
                TextSource(
                    "logs/n2/kern.log",
                    "Nov  2 10:25:05 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit error (DBE)\n",
                    "n2",
                ),
            ],
        )
    )
    assert d.outcome == "attributed" and d.root_cause is not None and d.root_cause.nodes == ["n1"]
    assert [c.nodes for c in d.candidates] == [["n2"]]
    assert d.quality.level == "medium"


def test_the_same_link_fault_on_several_nodes_is_one_cause() -> None:
    srcs = [
        TextSource(
            f"logs/{n}/kern.log",
            f"Nov  2 10:15:0{i} {n} kernel: mlx5_core 0000:5c:00.0 mlx5_3: Port: 1 Link DOWN\n",
            n,
        )
        for i, n in enumerate(["n1", "n2", "n3"])
    ]
    d = analyze(AttemptInput(ctx(["n1", "n2", "n3", "n4"]), srcs))
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        "network",
        "fabric",
        ["n1", "n2", "n3"],
    )


def test_a_signal_the_job_outlived_is_not_the_cause() -> None:
    log = "".join(f"[2026-11-02 10:{m:02d}:00] iteration {m} | loss 1.0\n" for m in range(5, 45))
    log += "[rank2]: KeyError: 'x'\n"
    lustre = "Nov  2 10:06:00 n1 kernel: Lustre: fs-OST0001-osc-ffff: Connection to fs-OST0001 (at 1.2.3.4@o2ib) was lost; in progress operations using this service will wait for recovery to complete\n"
    d = analyze(
        AttemptInput(
            ctx(["n1"], ranks={"n1": "0-7"}),
            [TextSource("logs/_job/out.log", log), TextSource("logs/n1/kern.log", lustre, "n1")],
        )
    )
    assert d.root_cause is not None and d.root_cause.subdomain == "user_code"


def test_gzip_and_json_lines_logs_in_a_bundle(tmp_path: Path) -> None:
    b = tmp_path / "b"
    (b / "logs" / "n1").mkdir(parents=True)
    (b / "logs" / "_job").mkdir(parents=True)
    (b / "attempt.yaml").write_text(
        yaml.safe_dump(
            {
                "workload": {"id": "7"},
                "window": WINDOW,
                "state": "FAILED",
                "nodes": ["n1"],
                "ranks": {"n1": "0-7"},
            }
        )
    )
    (b / "logs" / "n1" / "kern.log.1.gz").write_bytes(
        gzip.compress(f"Nov  2 10:15:03 n1 kernel: {XID79}\n".encode())
    )
    (b / "logs" / "_job" / "app.jsonl").write_text(
        '{"time": "2026-11-02T10:15:09Z", "rank": 3, "msg": "RuntimeError: CUDA error: unspecified launch failure"}\n'
    )
    d = analyze_bundle(b)
    assert d.root_cause is not None and d.root_cause.subdomain == "gpu" and d.root_cause.nodes == ["n1"]
    assert any(e.ref == "logs/n1/kern.log.1.gz:1" for e in d.evidence)
    assert any(s.kind == "cuda_error" and s.nodes == ["n1"] for s in d.symptoms)
