"""Bad input never produces a traceback.

An unusable bundle (missing, no attempt.yaml, attempt.yaml that is not valid) → exit 2 and one line
on stderr naming the file (and line) and what to fix. A usable bundle with some bad files → the
diagnosis is still produced (exit 0), its root cause is unchanged, and every bad file is listed in
coverage with a status other than "ok" and a reason a person understands.

The bundles are copies of examples/nvlink-xid149 in tmp_path; the examples themselves are never touched.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypocenter.cli import main

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nvlink-xid149"
TIMEOUT = 180  # seconds; a FIFO read by mistake would otherwise hang the test run forever

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hypocenter ARGS…` as a user runs it, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def assert_one_line_error(code: int, out: str, err: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr starting `hypocenter:`; returns it."""
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hypocenter: "), err
    return lines[0]


def root_cause_of(diagnosis: dict[str, Any]) -> tuple[Any, ...]:
    rc = diagnosis["root_cause"]
    assert rc is not None
    return (
        diagnosis["outcome"],
        rc["domain"],
        rc["subdomain"],
        sorted(rc["nodes"]),
        sorted((c["node"], c["kind"], c["id"]) for c in rc["components"]),
        rc["action"],
    )


@pytest.fixture(scope="module")
def pristine() -> dict[str, Any]:
    """The diagnosis of the untouched example: what the damaged copies must still conclude."""
    proc = run_cli("analyze", str(EXAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    diagnosis: dict[str, Any] = json.loads(proc.stdout)
    assert diagnosis["outcome"] == "attributed"
    return diagnosis


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    dest = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, dest)
    return dest


# ------------------------------------------------------------------------------------ unusable bundles


def test_missing_bundle_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["analyze", str(tmp_path / "nope")])
    line = assert_one_line_error(code, *capsys.readouterr())
    assert "no such bundle directory" in line and "nope" in line


def test_a_file_instead_of_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bundle.tar"
    f.write_text("not a directory\n")
    line = assert_one_line_error(main(["analyze", str(f)]), *capsys.readouterr())
    assert "not a directory" in line


def test_directory_without_attempt_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "logs" / "node01").mkdir(parents=True)
    line = assert_one_line_error(main(["analyze", str(tmp_path)]), *capsys.readouterr())
    assert "no attempt.yaml" in line


def test_attempt_yaml_is_a_directory(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (bundle / "attempt.yaml").unlink()
    (bundle / "attempt.yaml").mkdir()
    line = assert_one_line_error(main(["analyze", str(bundle)]), *capsys.readouterr())
    assert "attempt.yaml: a directory, not a readable file" in line


def test_attempt_yaml_is_a_dangling_symlink(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (bundle / "attempt.yaml").unlink()
    (bundle / "attempt.yaml").symlink_to(bundle / "gone.yaml")
    line = assert_one_line_error(main(["analyze", str(bundle)]), *capsys.readouterr())
    assert "attempt.yaml: broken symbolic link" in line


@needs_fifo
def test_attempt_yaml_is_a_fifo_and_nothing_hangs(bundle: Path) -> None:
    (bundle / "attempt.yaml").unlink()
    os.mkfifo(bundle / "attempt.yaml")
    proc = run_cli("analyze", str(bundle))
    line = assert_one_line_error(proc.returncode, proc.stdout, proc.stderr)
    assert "FIFO" in line


# A valid attempt.yaml whose line numbers the cases below rely on.
BASE = """\
workload:
  id: "81234"
  attempt: 0
  scheduler: slurm
window:
  start: "2026-11-02T10:00:00Z"
  end: "2026-11-02T11:02:00Z"
state: FAILED
exit_code: 1
nodes: [node01, node02, node03, node04]
ranks:
  node01: "0-7"
  node02: "8-15"
timezone: UTC
"""


def _edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


BAD_ATTEMPTS: list[tuple[str, str | bytes, str]] = [
    (
        "invalid YAML",
        _edit("state: FAILED", "state: FAILED: now"),
        r"attempt\.yaml:8: invalid YAML: mapping values are not allowed here",
    ),
    (
        "duplicate key",
        _edit("  attempt: 0\n", "  attempt: 0\n  attempt: 1\n"),
        r"attempt\.yaml:4: invalid YAML: duplicate key 'attempt'",
    ),
    (
        "misspelt top-level field",
        _edit("workload:", "worklaod:"),
        r"attempt\.yaml:1: unknown field 'worklaod' \(did you mean 'workload'\?\)",
    ),
    (
        "misspelt nested field",
        _edit("  start:", "  strat:"),
        r"attempt\.yaml:6: unknown field 'window\.strat' \(did you mean 'start'\?\)",
    ),
    (
        "misspelt field in a flow mapping",
        _edit(
            'window:\n  start: "2026-11-02T10:00:00Z"\n  end: "2026-11-02T11:02:00Z"\n',
            'window: {strat: "2026-11-02T10:00:00Z", end: "2026-11-02T11:02:00Z"}\n\n\n',
        ),
        r"attempt\.yaml:5: unknown field 'window\.strat' \(did you mean 'start'\?\)",
    ),
    (
        "missing required field",
        _edit('  start: "2026-11-02T10:00:00Z"\n', ""),
        r"attempt\.yaml:5: window\.start: required field is missing",
    ),
    (
        "missing workload",
        _edit('workload:\n  id: "81234"\n  attempt: 0\n  scheduler: slurm\n', ""),
        r"attempt\.yaml:1: workload: required field is missing",
    ),
    (
        "end before start",
        _edit('end: "2026-11-02T11:02:00Z"', 'end: "2026-11-02T09:00:00Z"'),
        r"attempt\.yaml:5: window: window\.end is before window\.start",
    ),
    (
        "unparseable time",
        _edit('start: "2026-11-02T10:00:00Z"', "start: yesterday"),
        r"attempt\.yaml:6: window\.start: Input should be a valid datetime",
    ),
    (
        "unknown timezone",
        _edit("timezone: UTC", "timezone: Mars/Olympus"),
        r"attempt\.yaml:14: timezone: unknown timezone 'Mars/Olympus' \(use an IANA name",
    ),
    (
        "offset out of range",
        _edit("timezone: UTC", 'timezone: "+25:00"'),
        r"attempt\.yaml:14: timezone: invalid timezone '\+25:00': a UTC offset must lie between",
    ),
    (
        "wrong type",
        _edit("exit_code: 1", "exit_code: one"),
        r"attempt\.yaml:9: exit_code: Input should be a valid integer",
    ),
    (
        "nodes not a list",
        _edit("nodes: [node01, node02, node03, node04]", "nodes: node01"),
        r"attempt\.yaml:10: nodes: Input should be a valid list",
    ),
    (
        "bad rank range",
        _edit('node02: "8-15"', 'node02: "15-8"'),
        r"attempt\.yaml:11: invalid rank range '15-8': end is before start",
    ),
    (
        "ranks on an unknown node",
        _edit('node02: "8-15"', 'node09: "8-15"'),
        r"attempt\.yaml:11: ranks: node 'node09' is not in nodes",
    ),
    (
        "non-UTF-8",
        _edit('  id: "81234"\n', '  id: "81234"\n  name: caf\udce9\n').encode("utf-8", "surrogateescape"),
        r"attempt\.yaml:3: file is not UTF-8 text",
    ),
    ("empty file", "", r"attempt\.yaml: empty file \(expected a mapping"),
    ("comments only", "# nothing yet\n", r"attempt\.yaml: empty file"),
    (
        "a list, not a mapping",
        "- node01\n- node02\n",
        r"attempt\.yaml: expected a mapping with .*, not a list",
    ),
    (
        "unsafe tag",
        "workload: !!python/object/apply:os.system [id]\n",
        r"attempt\.yaml:1: invalid YAML: could not determine a constructor",
    ),
    (
        "two documents",
        BASE + "---\nstate: COMPLETED\n",
        r"attempt\.yaml:15: invalid YAML: expected a single document in the stream, but found another",
    ),
    (
        "nested too deeply",
        BASE + "extra: " + "[" * 5000 + "]" * 5000 + "\n",
        r"attempt\.yaml: invalid YAML: nested too deeply",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [(t, m) for _, t, m in BAD_ATTEMPTS], ids=[name for name, _, _ in BAD_ATTEMPTS]
)
def test_bad_attempt_yaml(
    bundle: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, message: str
) -> None:
    path = bundle / "attempt.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    line = assert_one_line_error(main(["analyze", str(bundle)]), *capsys.readouterr())
    assert re.search(message, line), line
    assert str(path) in line  # the message names the file a person has to open


def test_the_base_attempt_yaml_is_valid(
    bundle: Path, pristine: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The cases above fail because of their one edit, not because BASE is wrong."""
    (bundle / "attempt.yaml").write_text(BASE, encoding="utf-8")
    assert main(["analyze", str(bundle), "--format", "json"]) == 0
    assert root_cause_of(json.loads(capsys.readouterr().out)) == root_cause_of(pristine)


def test_a_bad_attempt_yaml_through_the_real_command(bundle: Path) -> None:
    (bundle / "attempt.yaml").write_text(_edit("workload:", "worklaod:"), encoding="utf-8")
    proc = run_cli("analyze", str(bundle), "--format", "json")
    line = assert_one_line_error(proc.returncode, proc.stdout, proc.stderr)
    assert "did you mean 'workload'" in line


# ------------------------------------------------------------------------ usable bundles, some bad files

# path in the bundle → (status, what the reason must say)
BAD_FILES: dict[str, tuple[str, str]] = {
    "logs/node01/core.bin": ("skipped", r"binary file"),
    "logs/node01/latin1.log": ("partial", r"not valid UTF-8: 2 undecodable byte sequences replaced"),
    "logs/node03/empty.log": ("skipped", r"^empty file$"),
    "logs/node04/one-huge-line.log": ("partial", r"1 line longer than 64 KiB"),
    "logs/node01/old.log.2.gz": ("failed", r"corrupt gzip file: not gzip data"),
    "logs/node01/cut.log.3.gz": ("failed", r"corrupt gzip file: truncated"),
    "logs/node01/kern.log.4.xz": ("skipped", r"xz-compressed .*decompress it"),
    "logs/node02/dangling.log": (
        "failed",
        r"broken symbolic link \(its target '.*gone\.log' does not exist\)",
    ),
    "logs/node02/pipe.log": ("skipped", r"not a regular file: a FIFO"),
    "logs/stray.log": ("skipped", r"logs go in logs/<node>/"),
    "metrics/truncated.json": ("failed", r"invalid JSON"),
    "metrics/garbage.txt": (
        "failed",
        r"not a Prometheus API response or metrics text: line 1: .*'garbage text here'",
    ),
    "metrics/far-future.prom": ("failed", r"line 1: bad timestamp"),
    "metrics/empty.prom": ("skipped", r"^empty file$"),
    "events/truncated.json": ("failed", r"invalid JSON"),
    "events/broken.yaml": ("failed", r"invalid YAML at line 2"),
    "events/deep.json": ("failed", r"nested too deeply"),
    "events/unknown.json": ("failed", r"no scheduler or Kubernetes records recognised"),
}
if not hasattr(os, "mkfifo"):
    del BAD_FILES["logs/node02/pipe.log"]


def _damage(b: Path) -> None:
    """Add one bad file of every kind to a copy of the example."""
    (b / "logs/node01/core.bin").write_bytes(bytes(range(256)) * 64)
    (b / "logs/node01/latin1.log").write_bytes(
        b"Nov  2 10:40:00 node01 kernel: caf\xe9 cr\xe8me: a line written in Latin-1\n"
    )
    (b / "logs/node03/empty.log").write_bytes(b"")
    (b / "logs/node04/one-huge-line.log").write_bytes(b"x" * 10_000_000 + b"\n")
    (b / "logs/node01/old.log.2.gz").write_bytes(b"this file was never compressed\n")
    (b / "logs/node01/cut.log.3.gz").write_bytes(
        gzip.compress(b"Nov  2 10:00:00 node01 kernel: hello\n" * 200)[:40]
    )
    (b / "logs/node01/kern.log.4.xz").write_bytes(
        lzma.compress((EXAMPLE / "logs/node01/kern.log").read_bytes())
    )
    (b / "logs/node02/dangling.log").symlink_to(b / "logs/node02/gone.log")
    if hasattr(os, "mkfifo"):
        os.mkfifo(b / "logs/node02/pipe.log")
    (b / "logs/stray.log").write_text("a log not in a node directory\n")
    (b / "metrics/truncated.json").write_text('{"status": "success", "data": ')
    (b / "metrics/garbage.txt").write_text("garbage text here\n")
    (b / "metrics/far-future.prom").write_text("DCGM_FI_DEV_XID_ERRORS 1 1e30\n")
    (b / "metrics/empty.prom").write_text("")
    (b / "events/truncated.json").write_text('{"kind": ')
    (b / "events/broken.yaml").write_text("kind: [Event\n")
    (b / "events/deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (b / "events/unknown.json").write_text('{"hello": "world"}\n')
    # Odd but parseable documents: read what can be read, never crash.
    (b / "events/odd-event.json").write_text(
        json.dumps(
            {
                "kind": "Event",
                "involvedObject": "node02",
                "source": "kubelet",
                "reason": "Odd",
                "lastTimestamp": "2026-11-02T10:00:00+99:00",
            }
        )
    )
    (b / "events/odd-pod.json").write_text(
        json.dumps(
            {
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {"nodeName": 7},
                "status": {"containerStatuses": [{"state": "gone"}], "conditions": 5},
            }
        )
    )
    (b / "events/odd-sacct.json").write_text(
        json.dumps(
            {"jobs": [{"job_id": 1, "time": {"end": 1e30}, "steps": 5, "state": {"current": ["FAILED"]}}]}
        )
    )


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = tmp_path_factory.mktemp("damaged") / "bundle"
    shutil.copytree(EXAMPLE, b)
    _damage(b)
    return b


@pytest.fixture(scope="module")
def damaged_json(damaged: Path) -> dict[str, Any]:
    proc = run_cli("analyze", str(damaged), "--format", "json")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    diagnosis: dict[str, Any] = json.loads(proc.stdout)
    return diagnosis


def test_damaged_bundle_keeps_its_root_cause(damaged_json: dict[str, Any], pristine: dict[str, Any]) -> None:
    assert root_cause_of(damaged_json) == root_cause_of(pristine)
    assert any(
        e["role"] == "root_cause" and e["ref"].startswith("logs/node02/kern.log:")
        for e in damaged_json["evidence"]
    )


@pytest.mark.parametrize("source", sorted(BAD_FILES))
def test_each_bad_file_is_in_coverage(damaged_json: dict[str, Any], source: str) -> None:
    status, reason = BAD_FILES[source]
    entries = [c for c in damaged_json["coverage"] if c["source"] == source]
    assert len(entries) == 1, f"{source} not in coverage: {[c['source'] for c in damaged_json['coverage']]}"
    entry = entries[0]
    assert entry["status"] == status, entry
    assert entry["reason"] and re.search(reason, entry["reason"]), entry


def test_good_files_next_to_bad_ones_are_read(damaged_json: dict[str, Any]) -> None:
    cov = {c["source"]: c for c in damaged_json["coverage"]}
    # The node directories that hold bad files are partly read, not lost.
    for node in ("logs/node01", "logs/node02", "logs/node03", "logs/node04"):
        assert cov[node]["status"] == "partial", cov[node]
        assert cov[node]["observations"] > 0
    assert cov["metrics/dcgm_xid_errors.json"]["status"] == "ok"
    assert cov["events/sacct-81234.json"]["status"] == "ok"
    for odd in ("events/odd-event.json", "events/odd-pod.json", "events/odd-sacct.json"):
        assert cov[odd]["status"] == "ok" and cov[odd]["observations"] >= 1, cov[odd]
    # Only the files listed above are bad; every other entry is a readable source.
    bad = {c["source"] for c in damaged_json["coverage"] if c["status"] != "ok"}
    assert bad == set(BAD_FILES) | {"logs/node01", "logs/node02", "logs/node03", "logs/node04"}


def test_damaged_bundle_text_report_lists_the_bad_files(damaged: Path) -> None:
    proc = run_cli("analyze", str(damaged))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "ATTRIBUTED" in proc.stdout
    coverage = proc.stdout[proc.stdout.index("Coverage") :]
    for source in BAD_FILES:
        assert source in coverage


def test_gzip_rotated_kernel_log_is_read(bundle: Path, pristine: dict[str, Any]) -> None:
    """The only copy of the culprit's kernel log is a rotated, compressed kern.log.1.gz."""
    kern = bundle / "logs/node02/kern.log"
    (bundle / "logs/node02/kern.log.1.gz").write_bytes(gzip.compress(kern.read_bytes()))
    kern.unlink()
    proc = run_cli("analyze", str(bundle), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert root_cause_of(d) == root_cause_of(pristine)
    assert any(
        e["role"] == "root_cause" and e["ref"].startswith("logs/node02/kern.log.1.gz:") for e in d["evidence"]
    )
    assert all(c["status"] == "ok" for c in d["coverage"] if c["source"].startswith("logs/node02"))


def test_kernel_log_cut_by_a_crash_is_still_read(bundle: Path, pristine: dict[str, Any]) -> None:
    """A hard reset leaves runs of NUL bytes in kern.log; the lines around them are the evidence."""
    kern = bundle / "logs/node02/kern.log"
    kern.write_bytes(b"\x00" * 4096 + kern.read_bytes() + b"\x00" * 8192)
    proc = run_cli("analyze", str(bundle), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert root_cause_of(d) == root_cause_of(pristine)
    assert any(
        e["role"] == "root_cause" and e["ref"].startswith("logs/node02/kern.log:") for e in d["evidence"]
    )
    entry = next(c for c in d["coverage"] if c["source"] == "logs/node02/kern.log")
    assert entry["status"] == "partial" and "12288 NUL bytes dropped" in (entry["reason"] or "")


def test_undecodable_file_name(bundle: Path) -> None:
    """A file name that is not UTF-8 must not break the JSON (or the report) written about it."""
    name = os.fsdecode(b"caf\xe9.log")
    if os.fsencode(name) != b"caf\xe9.log":
        pytest.skip("file system encoding cannot hold this name")
    shutil.copy(bundle / "logs/node02/kern.log", bundle / "logs/node02" / name)
    proc = run_cli("analyze", str(bundle), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert any(e["ref"].startswith("logs/node02/caf\ufffd.log:") for e in d["evidence"])
    text = run_cli("analyze", str(bundle))
    assert text.returncode == 0 and "Traceback" not in text.stderr


def test_a_node_directory_without_files_is_missing_not_ok(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(bundle / "logs/node04")
    (bundle / "logs/node04").mkdir()
    assert main(["analyze", str(bundle), "--format", "json"]) == 0
    cov = {c["source"]: c for c in json.loads(capsys.readouterr().out)["coverage"]}
    assert cov["logs/node04"]["status"] == "missing"
    assert cov["logs/node04"]["reason"] == "no log files in logs/node04"


def test_logs_is_a_file(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(bundle / "logs")
    (bundle / "logs").write_text("oops\n")
    assert main(["analyze", str(bundle), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    cov = {c["source"]: c for c in json.loads(out)["coverage"]}
    assert cov["logs"]["status"] == "failed"
    assert "expected a directory" in (cov["logs"]["reason"] or "")
    assert all(cov[f"logs/node0{i}"]["status"] == "missing" for i in range(1, 5))


def test_a_log_line_with_an_impossible_offset(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (bundle / "logs/node02/kern.log").open("a") as f:
        f.write(
            "2026-11-02T10:51:03+99:00 node02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        )
    assert main(["analyze", str(bundle)]) == 0, capsys.readouterr().err


def test_a_job_banner_with_an_impossible_time(
    bundle: Path, pristine: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Slurm's end-of-job banner states its own time; an impossible one is ignored, not a crash."""
    with (bundle / "logs/_job/slurm-81234.out").open("a") as f:
        f.write(
            "slurmstepd: error: *** JOB 81234 ON node01 CANCELLED AT 2026-11-02T11:00:00+99:00 "
            "DUE TO TIME LIMIT ***\n"
        )
    assert main(["analyze", str(bundle), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert root_cause_of(out) == root_cause_of(pristine)
