"""Flight Recorder dumps, NCCL RAS reports and stack dumps: read safely, merged across ranks, cited.

The dumps under tests/fixtures/flight_recorder/torch-2.13.0-gloo/ were made by PyTorch itself
(make_hang.py next to them): four gloo ranks, rank 2 never issues the fourth all_reduce.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from engine_support import analyze_bundle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import flight_recorder as writer
from hypocenter.collector import flight_recorder as fr

FIXTURES = Path(__file__).parents[1] / "fixtures" / "flight_recorder" / "torch-2.13.0-gloo"
NODES = ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
_KEYS = [
    "version",
    "pg_config",
    "pg_status",
    "entries",
    "comm_lib_version",
    "process_group",
    "collective_seq_id",
    "seq_id",
    "pg_id",
    "profiling_name",
    "input_sizes",
    "state",
    "frames",
    "ranks",
    "desc",
    "name",
    "last_enqueued_collective",
    "last_completed_collective",
    "time_created_ns",
    "filename",
    "line",
    "is_p2p",
]


def _bundle(root: Path, dumps: dict[int, tuple[str, bytes]], *, layout: str = "logs") -> Path:
    """Four nodes, one rank each; the job log says only that the job hit its time limit."""
    (root / "logs" / "_job").mkdir(parents=True)
    (root / "attempt.yaml").write_text(
        'workload: {id: "4242", attempt: 0, scheduler: slurm, cluster: lab}\n'
        'window: {start: "2026-12-03T07:00:00Z", end: "2026-12-03T09:00:00Z"}\n'
        "state: TIMEOUT\n"
        f"nodes: [{', '.join(NODES)}]\n"
        "ranks: {" + ", ".join(f'{n}: "{i}"' for i, n in enumerate(NODES)) + "}\n"
    )
    (root / "logs" / "_job" / "slurm-4242.out").write_text(
        "slurmstepd: error: *** JOB 4242 ON gpu-a01 CANCELLED AT 2026-12-03T09:00:00 DUE TO TIME LIMIT ***\n"
    )
    for rank, (name, raw) in dumps.items():
        where = root / "logs" / NODES[rank] if layout == "logs" else root / "traces"
        where.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(raw)
    return root


def _real(fmt: str) -> dict[int, tuple[str, bytes]]:
    out = {}
    for r in range(4):
        name = f"nccl_trace_rank_{r}" + (".json" if fmt == "json" else "")
        out[r] = (name, (FIXTURES / fmt / name).read_bytes())
    return out


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_real_torch_dumps_are_read(fmt: str) -> None:
    assert (FIXTURES / "torch_version.txt").read_text().startswith("2.13.0")
    for rank, (name, raw) in _real(fmt).items():
        assert fr.rank_from_name(name) == rank
        dump = fr.parse(fr.load(raw), rank)
        assert dump.rank == rank and dump.version == "2.10"
        group = dump.groups["0"]
        assert group.desc == "default_pg" and group.ranks == [0, 1, 2, 3]
        assert group.last_enqueued == (3 if rank == 2 else 4)
        assert {e.op for e in dump.entries} == {"gloo:all_reduce"}
        if fmt == "pickle":  # the pickle keeps the Python stack of each collective
            assert any("make_hang.py" in e.frames for e in dump.entries)


@pytest.mark.parametrize("layout", ["logs", "traces"])
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_real_dumps_name_the_laggards_node(tmp_path: Path, fmt: str, layout: str) -> None:
    before = analyze_bundle(_bundle(tmp_path / "without", {}))
    assert before.outcome == "unattributed"  # the logs say only that the job hit its time limit
    d = analyze_bundle(_bundle(tmp_path / "with", _real(fmt), layout=layout))
    assert d.outcome == "attributed", d.quality.reasons
    rc = d.root_cause
    assert rc is not None and (rc.domain, rc.subdomain, rc.nodes) == ("software", "hang", ["gpu-a03"])
    assert rc.rule == "flight-recorder-laggard"
    where = (
        ("logs/gpu-a03/" if layout == "logs" else "traces/")
        + "nccl_trace_rank_2"
        + (".json" if fmt == "json" else "")
    )
    assert where in rc.summary and "process group 0 (default_pg)" in rc.summary
    assert "never issued 4 (gloo:all_reduce, state scheduled)" in rc.summary
    if fmt == "pickle":
        assert "make_hang.py" in rc.summary  # the laggard's last Python frames
    cause = [e for e in d.evidence if e.role == "root_cause"]
    assert cause and all(e.ref.startswith(where + ":") and e.node == "gpu-a03" for e in cause)
    assert any(
        c.connector == "flight_recorder" and c.source == where and c.status == "ok" for c in d.coverage
    )


def test_a_malicious_pickle_is_refused_and_the_rest_is_read(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps({"version": "2.10", "entries": [Exploit()], "pg_config": {}}, protocol=2)
    with pytest.raises(fr.DumpError, match="refused global"):
        fr.load(evil)
    dumps = _real("pickle")
    dumps[0] = ("nccl_trace_rank_0", evil)
    d = analyze_bundle(_bundle(tmp_path / "b", dumps))
    assert not marker.exists()
    bad = [c for c in d.coverage if c.source == "logs/gpu-a01/nccl_trace_rank_0"]
    assert bad and bad[0].status == "failed" and "refused global" in (bad[0].reason or "")
    assert d.root_cause is not None and d.root_cause.nodes == ["gpu-a03"]  # the other dumps still say it


def test_json_lines_that_mention_dump_keys_stay_logs(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b", _real("pickle"))
    (root / "logs" / "gpu-a01" / "trainer.jsonl").write_text(
        '{"msg": "profiling_name=nccl:all_reduce slow", "time": "2026-12-03T07:20:00Z"}\n{"msg": "step 10"}\n'
    )
    d = analyze_bundle(root)
    assert not any(c.source.endswith("trainer.jsonl") and c.status == "failed" for c in d.coverage)
    assert d.root_cause is not None and d.root_cause.nodes == ["gpu-a03"]


def test_persistent_ids_are_refused_too() -> None:
    raw = b"\x80\x02}q\x00X\x07\x00\x00\x00versionq\x01P0\ns."  # PERSID in place of a value
    with pytest.raises(fr.DumpError, match="persistent id"):
        fr.load(raw)


@pytest.mark.slow
def test_a_memo_bomb_is_read_within_bounds() -> None:
    """A few bytes per repetition of one memoised entry: millions of entries in a small pickle."""
    entry = {
        "collective_seq_id": 1,
        "process_group": ("0", "x"),
        "profiling_name": "nccl:all_reduce",
        "state": "started",
    }
    doc = {"version": "2.10", "pg_config": {}, "entries": [entry] * 3_000_000}
    raw = pickle.dumps(doc, protocol=2)
    assert len(raw) < 8 << 20
    with pytest.raises(fr.DumpError, match="more than"):  # refused as it is built (plain_pickle.py)
        fr.load(raw)
    doc["entries"] = [entry] * 100_000  # within the bounds: read, up to MAX_ENTRIES
    dump = fr.parse(fr.load(pickle.dumps(doc, protocol=2)), 0)
    assert len(dump.entries) == fr.MAX_ENTRIES
    assert fr.render(dump).count("\n") < 20


def test_truncated_and_oversized_dumps_are_failed_in_coverage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumps = _real("pickle")
    name, raw = dumps[1]
    dumps[1] = (name, raw[: len(raw) // 2])
    d = analyze_bundle(_bundle(tmp_path / "cut", dumps))
    cov = next(c for c in d.coverage if c.source == "logs/gpu-a02/nccl_trace_rank_1")
    assert cov.status == "failed" and "truncated" in (cov.reason or "")
    assert d.root_cause is not None and d.root_cause.nodes == ["gpu-a03"]
    monkeypatch.setattr(fr, "MAX_DUMP_BYTES", 1000)
    with pytest.raises(fr.DumpError, match="over the"):
        fr.load(b"\x80\x02" + b"x" * 2000)
    d = analyze_bundle(_bundle(tmp_path / "big", _real("pickle")))
    assert all(
        c.status == "failed" and "limit" in (c.reason or "")
        for c in d.coverage
        if c.connector == "flight_recorder"
    )


def _nccl_hang(
    version: str, fmt: str, *, laggard: int = 2, desync: int | None = None, stalled: bool = False
) -> dict[int, tuple[str, bytes]]:
    """An NCCL-style hang as `version` writes it: collectives 1-8 done, 9 started everywhere but on the laggard."""
    t0 = 1_796_282_000_000_000_000
    out = {}
    for r in range(4):
        last = 8 if (r == laggard and not stalled) else 9
        ops = [
            writer.Op(
                s,
                "nccl:all_reduce" if not (s == 9 and r == desync) else "nccl:broadcast",
                4096,
                "completed" if s < 9 else "started",
                t0 + s * 10**9,
            )
            for s in range(1, last + 1)
        ]
        doc = writer.dump_doc(
            version,
            ops,
            [0, 1, 2, 3],
            status=(last, last, 8),
            frames=[{"name": "train_step", "filename": "/w/train.py", "line": 88}],
        )
        out[r] = (f"nccl_trace_rank_{r}" + (".json" if fmt == "json" else ""), writer.encode(doc, fmt))
    return out


@pytest.mark.parametrize("version", writer.VERSIONS)
def test_every_format_version_finds_the_laggard(tmp_path: Path, version: str) -> None:
    fmts = ["pickle"] + (["json"] if tuple(map(int, version.split("."))) >= writer.JSON_FROM else [])
    for fmt in fmts:
        d = analyze_bundle(_bundle(tmp_path / f"{fmt}", _nccl_hang(version, fmt)))
        rc = d.root_cause
        assert rc is not None and (rc.rule, rc.nodes) == ("flight-recorder-laggard", ["gpu-a03"]), (
            version,
            fmt,
            rc,
        )
        assert "never issued 9" in rc.summary


def test_a_desync_is_a_program_bug_on_the_odd_rank(tmp_path: Path) -> None:
    d = analyze_bundle(_bundle(tmp_path / "b", _nccl_hang("2.10", "pickle", laggard=-1, desync=1)))
    rc = d.root_cause
    assert rc is not None and (rc.domain, rc.subdomain, rc.nodes, rc.action) == (
        "software",
        "user_code",
        ["gpu-a02"],
        "FIX_CODE",
    )
    assert "nccl:broadcast" in rc.summary


def test_a_stalled_collective_is_explained_by_the_nodes_hardware_event(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b", _nccl_hang("2.10", "pickle", stalled=True))
    d = analyze_bundle(root)
    assert (
        d.root_cause is not None
        and d.root_cause.rule == "flight-recorder-stalled"
        and d.root_cause.nodes == []
    )
    (root / "logs" / "gpu-a04" / "kern.log").write_text(
        "Dec  3 07:13:20 gpu-a04 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    )
    d = analyze_bundle(root)
    assert d.root_cause is not None and (d.root_cause.domain, d.root_cause.nodes) == ("hardware", ["gpu-a04"])


def test_ranks_with_no_dump_are_the_suspects_when_everyone_else_waits(tmp_path: Path) -> None:
    dumps = _nccl_hang("2.10", "pickle", laggard=-1)
    del dumps[3]
    d = analyze_bundle(_bundle(tmp_path / "b", dumps))
    rc = d.root_cause
    assert rc is not None and (rc.rule, rc.nodes) == ("flight-recorder-missing", ["gpu-a04"])


def test_ras_and_stack_dumps_under_traces(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b", {})
    (root / "traces").mkdir()
    (root / "traces" / "ncclras.txt").write_text(
        writer.ras_report("2.27.3", [(3478, "gpu-a02", 5)], [], 4, 4, 3)
    )
    d = analyze_bundle(root)
    assert d.root_cause is not None and (d.root_cause.rule, d.root_cause.nodes) == (
        "nccl-ras-culprit",
        ["gpu-a02"],
    )
    shutil.rmtree(root / "traces")
    for r in range(4):
        (root / "traces" / NODES[r]).mkdir(parents=True)
        frames = (
            ["    _try_get_data (torch/utils/data/dataloader.py:1133)"]
            if r == 1
            else ["    all_reduce (torch/distributed/distributed_c10d.py:2050)"]
        )
        (root / "traces" / NODES[r] / f"py-spy-rank{r}.txt").write_text(
            f'Process 100{r}: python train.py\n\nThread 0x7F3A2B1C4740 (idle): "MainThread"\n'
            + "\n".join(frames)
            + "\n    train_step (train.py:88)\n"
        )
    d = analyze_bundle(root)
    assert d.root_cause is not None and (d.root_cause.rule, d.root_cause.nodes) == (
        "stack-laggard",
        ["gpu-a02"],
    )
    assert "data loader" in d.root_cause.summary


def test_the_rendering_is_printed_by_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fr.main([str(FIXTURES / "pickle" / "nccl_trace_rank_2")]) == 0
    out = capsys.readouterr().out
    assert "FlightRecorder pg rank=2 pg=0 desc=default_pg ranks=0-3 last_enqueued=3" in out
    (tmp_path / "nccl_trace_rank_9").write_bytes(b"\x80\x02garbage")
    assert fr.main([str(tmp_path / "nccl_trace_rank_9")]) == 2


_plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=40,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=st.dictionaries(st.sampled_from(_KEYS), _plain, max_size=8), fmt=st.sampled_from(["pickle", "json"])
)
def test_any_plain_document_is_read_or_refused_with_a_reason(doc: dict[str, object], fmt: str) -> None:
    """Whatever plain values a dump holds, the reader renders it or says why not: it never crashes."""
    try:
        raw = pickle.dumps(doc, protocol=2) if fmt == "pickle" else json.dumps(doc, default=str).encode()
    except (ValueError, TypeError):
        return
    try:
        text = fr.render_file(raw, "nccl_trace_rank_7")
    except fr.DumpError as exc:
        assert str(exc)
        return
    assert "FlightRecorder dump rank=7" in text.split("\n", 1)[0]
