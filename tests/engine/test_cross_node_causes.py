"""Two independent faults on two hosts within the ambiguity window are `ambiguous`, both listed with
their evidence: a cause explains a cause on another node only through what crosses between nodes (the
job's own processes), never because its rule names the other's class."""

from __future__ import annotations

from pathlib import Path

from engine_support import analyze_bundle, write_attempt

from hypocenter.model import Diagnosis

NODES = ["gpu-a03", "gpu-a17"]
RANKS = {"gpu-a03": "0-7", "gpu-a17": "8-15"}
GPU_LOST = (
    "Nov  2 10:15:03 gpu-a03 gpu-health[4411]: Unable to determine the device handle for GPU "
    "0000:9B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
)
OOM_KILL = (
    "Nov  2 10:15:21 {node} kernel: Out of memory: Killed process 48211 (python) total-vm:1059871232kB, "
    "anon-rss:1041235968kB, file-rss:71232kB, shmem-rss:0kB, UID:1000 pgtables:2101344kB oom_score_adj:0\n"
)
LUSTRE = (
    "Nov  2 10:15:30 gpu-a17 kernel: Lustre: scratch-OST0007-osc-ffff8f1234567800: Connection to "
    "scratch-OST0007 (at 172.16.3.7@o2ib) was lost; in progress operations using this service will wait "
    "for recovery to complete\n"
)


def _timeouts() -> str:
    """The cascade: every rank's watchdog gives up on the same collective ten minutes later."""
    return "".join(
        f"[rank{r}]:[E1102 10:25:{10 + r:02d}.903881913 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n"
        for r in range(16)
    )


def _diagnose(tmp_path: Path, files: dict[str, str]) -> Diagnosis:
    for rel, text in files.items():
        path = tmp_path / "logs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    write_attempt(tmp_path, "two-faults", NODES, RANKS)
    return analyze_bundle(tmp_path)


def _cause_rules(d: Diagnosis) -> set[str]:
    return {e.rule for e in d.evidence if e.role == "root_cause"}


def test_lost_gpu_and_an_oom_kill_on_another_host_are_both_listed(tmp_path: Path) -> None:
    d = _diagnose(
        tmp_path,
        {
            "gpu-a03/syslog": GPU_LOST,
            "gpu-a17/kern.log": OOM_KILL.format(node="gpu-a17"),
            "_job/out.log": _timeouts(),
        },
    )
    assert d.outcome == "ambiguous" and d.root_cause is not None
    assert d.root_cause.nodes == NODES
    listed = {(c.domain, c.subdomain, tuple(c.nodes)) for c in d.candidates}
    assert ("hardware", "gpu", ("gpu-a03",)) in listed
    assert ("resource", "host_oom", ("gpu-a17",)) in listed
    assert {"nvidia-smi-gpu-lost", "oom-killer"} <= _cause_rules(d)
    assert {e.node for e in d.evidence if e.role == "root_cause"} == set(NODES)


def test_lost_gpu_and_a_lost_lustre_server_on_another_host_are_both_listed(tmp_path: Path) -> None:
    d = _diagnose(
        tmp_path,
        {"gpu-a03/syslog": GPU_LOST, "gpu-a17/kern.log": LUSTRE, "_job/out.log": _timeouts()},
    )
    assert d.outcome == "ambiguous"
    assert {(c.domain, c.subdomain) for c in d.candidates} >= {("hardware", "gpu"), ("storage", "filesystem")}


def test_on_its_own_host_the_lost_gpu_still_explains_the_oom_kill(tmp_path: Path) -> None:
    d = _diagnose(
        tmp_path,
        {
            "gpu-a03/syslog": GPU_LOST + OOM_KILL.format(node="gpu-a03"),
            "_job/out.log": _timeouts(),
        },
    )
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        "hardware",
        "gpu",
        ["gpu-a03"],
    )


def test_the_other_hosts_hang_is_still_the_lost_gpus_consequence(tmp_path: Path) -> None:
    """What crosses between nodes is the job: the peers' stalled collectives stay symptoms."""
    d = _diagnose(tmp_path, {"gpu-a03/syslog": GPU_LOST, "_job/out.log": _timeouts()})
    assert d.outcome == "attributed" and d.root_cause is not None
    assert (d.root_cause.subdomain, d.root_cause.nodes) == ("gpu", ["gpu-a03"])


def test_a_host_oom_kill_does_not_explain_a_cuda_oom_on_another_host(tmp_path: Path) -> None:
    """oom-killer's rule names resource/gpu_oom (a host OOM kill and its own ranks' CUDA OOM): on
    another host a CUDA OOM is a fault of its own."""
    d = _diagnose(
        tmp_path,
        {
            "gpu-a03/kern.log": OOM_KILL.format(node="gpu-a03"),
            "_job/out.log": "[rank9]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 1 has a total capacity of 79.10 GiB of which 1.12 GiB is free.\n" + _timeouts(),
        },
    )
    assert d.outcome == "ambiguous", d.root_cause
    assert {(c.subdomain, tuple(c.nodes)) for c in d.candidates} >= {
        ("host_oom", ("gpu-a03",)),
        ("gpu_oom", ("gpu-a17",)),
    }
