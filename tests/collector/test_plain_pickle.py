"""Hostile Flight Recorder dumps: small pickles that expand, and shapes the reader did not foresee.

Each dump is refused or read within a memory bound (traced allocations, not time), and a bad one is a
failed source of `analyze` (exit 0) and a 4xx of the artifacts upload, never an aborted analysis.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_support import ServerProcess

from hypocenter.collector import flight_recorder as fr
from hypocenter.collector import plain_pickle

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "flight_recorder" / "torch-2.13.0-gloo"


def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def _doc(version_value: bytes) -> bytes:
    """`{"version": <value>}` where <value> is a pickle fragment that leaves one value on the stack."""
    return b"\x80\x02}(" + _str("version") + version_value + b"u."


def memo_index_bomb() -> bytes:
    """CPython's unpickler sizes its memo array by the largest index named: 2^24 entries, 128 MiB."""
    return _doc(b"]r" + (1 << 24).to_bytes(4, "little"))


def shared_list_bomb(levels: int) -> bytes:
    """L0 = []; Lk = [Lk-1, Lk-1]: `levels` few-byte steps, 2^levels lists when printed or walked."""
    out = b"]q\x000"
    for k in range(levels):
        out += b"](h" + bytes([k]) + b"h" + bytes([k]) + b"eq" + bytes([k + 1]) + b"0"
    return _doc(out + b"h" + bytes([levels]))


def deep_nesting() -> bytes:
    return _doc(b"]" * 100_000 + b"a" * 99_999)


def build_on_dict() -> bytes:
    return _doc(_str("2.10"))[:-1] + b"}b."


def bignum_version() -> bytes:
    digits = (10**6000).to_bytes(2500, "little", signed=True)
    return _doc(b"\x8b" + len(digits).to_bytes(4, "little") + digits)


def _peak_of(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    except fr.DumpError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize(
    "make", [memo_index_bomb, lambda: shared_list_bomb(24)], ids=["memo-index", "shared-lists-24"]
)
def test_small_pickles_do_not_expand(make: Callable[[], bytes]) -> None:
    raw = make()
    assert len(raw) < 400
    peak = _peak_of(lambda: fr.render_file(raw, "nccl_trace_rank_0"))
    assert peak < 8 << 20, f"reading {len(raw)} bytes allocated {peak >> 20} MiB"


def test_a_shared_reference_bomb_is_refused_as_it_is_built() -> None:
    raw = shared_list_bomb(60)  # 2^60 lists if walked
    with pytest.raises(fr.DumpError, match="expands to more than"):
        fr.load(raw)
    peak = _peak_of(lambda: fr.load(raw))
    assert peak < 1 << 20


def test_values_and_memo_entries_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = pickle.dumps({"version": "2.10", "entries": [[None] * 200_000]}, protocol=2)
    monkeypatch.setattr(
        fr, "PICKLE_BOUNDS", plain_pickle.Bounds(objects=100_000, opcodes=10**7, expanded=10**9)
    )
    with pytest.raises(fr.DumpError, match="more than 100,000 values"):
        fr.load(raw)
    memo = b"\x80\x02]" + b"".join(b"r" + i.to_bytes(4, "little") for i in range(200_000)) + b"."
    with pytest.raises(fr.DumpError, match="memoises more than 100,000"):
        fr.load(memo)


def test_a_long_rank_string_shared_by_every_group_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One 300 KB `ranks` string named by 512 process groups: literal_eval'd once, not 512 times."""
    ranks = "[" + ", ".join(["0"] * 100_000) + "]"
    doc = {"version": "2.10", "pg_config": {str(i): {"name": str(i), "ranks": ranks} for i in range(512)}}
    raw = pickle.dumps(doc, protocol=2)
    read: list[int] = []
    real = ast.literal_eval

    def counted(text: str) -> object:
        read.append(len(text))
        assert sum(read) < 4 * len(ranks), "the same rank string parsed again and again"
        return real(text)

    monkeypatch.setattr(ast, "literal_eval", counted)
    text = fr.render_file(raw, "nccl_trace_rank_0")
    assert "FlightRecorder pg rank=0 pg=511 desc=- ranks=0 " in text


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (deep_nesting, "nests deeper than 64"),
        (build_on_dict, "refused state (BUILD)"),
        (lambda: shared_list_bomb(60), "expands to more than"),
    ],
    ids=["deep", "build-on-dict", "shared-lists-60"],
)
def test_bad_dumps_are_failed_sources_of_analyze(
    tmp_path: Path, make: Callable[[], bytes], reason: str
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(REPO / "examples" / "nvlink-xid149", bundle)
    node = sorted(p.name for p in (bundle / "logs").iterdir() if p.name != "_job")[0]
    (bundle / "logs" / node / "nccl_trace_rank_0").write_bytes(make())
    out = subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", "analyze", str(bundle), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    cov = [c for c in d["coverage"] if c["source"] == f"logs/{node}/nccl_trace_rank_0"]
    assert cov and cov[0]["status"] == "failed" and reason in cov[0]["reason"], cov
    assert d["outcome"] == "attributed"  # the rest of the bundle still says what it says


def test_a_bignum_version_is_read_without_it() -> None:
    text = fr.render_file(bignum_version(), "nccl_trace_rank_0")
    assert text.startswith("FlightRecorder dump rank=0 version=? ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("bombs") / "store.db").start()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    "make",
    [memo_index_bomb, deep_nesting, build_on_dict, bignum_version, lambda: shared_list_bomb(60)],
    ids=["memo-index", "deep", "build-on-dict", "bignum", "shared-lists-60"],
)
def test_the_artifacts_upload_answers_4xx_and_the_server_stays_up(
    server: ServerProcess, make: Callable[[], bytes]
) -> None:
    with server.client() as client:
        resp = client.post(
            "/v1/attempts/bomb/0/artifacts", params={"name": "nccl_trace_rank_0"}, content=make()
        )
        assert resp.status_code in (201, 400, 413, 422), resp.text
        if resp.status_code == 201:  # read without the part it could not use
            assert resp.json()["kind"] == "flight_recorder"
        assert httpx.get(f"{server.base}/healthz", timeout=10).status_code == 200


_fragments = st.lists(
    st.sampled_from(
        [
            b"]",
            b"}",
            b"(",
            b"e",
            b"u",
            b"a",
            b"s",
            b"t",
            b"N",
            b"\x88",
            b"\x85",
            b"\x86",
            b"h\x00",
            b"q\x00",
            b"0",
            b"2",
            b"K\x07",
            b"b",
            b"R",
            b"\x8a\x09" + b"\xff" * 9,
            _str("version"),
        ]
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_fragments)
def test_any_opcode_soup_is_read_or_refused_with_a_reason(body: list[bytes]) -> None:
    raw = b"\x80\x02}(" + _str("version") + b"".join(body) + b"u."
    try:
        text = fr.render_file(raw, "nccl_trace_rank_3")
    except fr.DumpError as exc:
        assert str(exc)
        return
    assert "FlightRecorder dump rank=3 " in text.split("\n", 1)[0]


def test_real_dumps_still_load() -> None:
    for fmt in ("pickle", "json"):
        for r in range(4):
            name = f"nccl_trace_rank_{r}" + (".json" if fmt == "json" else "")
            first = fr.render_file((FIXTURES / fmt / name).read_bytes(), name).split("\n", 1)[0]
            assert f"FlightRecorder dump rank={r} version=2.10 entries=" in first
    one = (FIXTURES / "pickle" / "nccl_trace_rank_2").read_bytes()
    assert fr.load(one) == pickle.loads(one)


def _values(binary: bool) -> st.SearchStrategy[object]:
    scalar = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False)
        | st.text(max_size=300)
    )
    return st.recursive(
        scalar | st.binary(max_size=300) if binary else scalar,  # protocol 2 pickles bytes by a global
        lambda inner: (
            st.lists(inner, max_size=300)
            | st.tuples(inner, inner, inner)
            | st.tuples(inner)
            | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=8)
        ),
        max_leaves=400,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), protocol=st.sampled_from([2, 3, 4, 5]))
def test_the_bounded_reader_builds_what_pickle_builds(data: st.DataObject, protocol: int) -> None:
    value = data.draw(_values(binary=protocol > 2))
    raw = pickle.dumps(value, protocol=protocol)
    assert plain_pickle.load(raw, fr.PICKLE_BOUNDS) == pickle.loads(raw)
