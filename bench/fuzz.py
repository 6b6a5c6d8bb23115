"""Coverage-guided fuzzing (atheris / libFuzzer) of what parses hostile input.

    python -m bench.fuzz --seconds 300                 every target, 300 s each
    python -m bench.fuzz --target otlp --seconds 60    one target
    python -m bench.fuzz --list

Targets, and what counts as a crash (anything else raised, a hang past 10 s, or memory past 2 GiB):

    otlp       OTLP/HTTP bodies (protobuf and JSON, logs and metrics) through `otlp.receive`; only
               InputError may come out, and the wire-format record count must agree with the
               decoded message
    bundle     uploaded archives through `load_archive_bundle` under small bounds; only
               InputError (BundleError, LimitExceeded) may come out
    rules      rule files through the loader and the engine's compilation; only InputError
    lineformat log lines through `parse_line` / `parse_iso`: nothing may be raised
    events     events/ documents (scontrol text, JSON, YAML) through `event_records`: only ValueError
    metrics    metrics files (Prometheus JSON, OpenMetrics text) through `parse_metrics`: only
               MetricFormatError / ValueError

Each target runs in its own process (libFuzzer ends the process when done). Seeds come from
the examples and the built-in catalog; an input that crashes is written to
tests/fuzz_regressions/<target>/, where tests/test_fuzz.py replays every file on each test run:
keep it there (and fix the bug) to make it a regression test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REGRESSIONS = REPO / "tests" / "fuzz_regressions"
EXAMPLE = REPO / "examples" / "nvlink-xid149"
TARGETS = ("otlp", "bundle", "rules", "lineformat", "events", "metrics")


def _tar(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname=path.name)
    return buf.getvalue()


def seeds(target: str) -> list[bytes]:
    """A few valid inputs for the target to start from."""
    if target == "otlp":
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        for k, v in (("host.name", "n1"), ("slurm.job.id", "7"), ("hypocenter.attempt.ranks", "n1=0-7")):
            rl.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
        rec = rl.scope_logs.add().log_records.add()
        rec.time_unix_nano = 1_793_000_000_000_000_000
        rec.body.string_value = "NVRM: Xid (PCI:0000:3b:00): 149, pid=1, name=python"
        json_doc = (
            b'{"resourceLogs":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"n1"}}]},'
            b'"scopeLogs":[{"logRecords":[{"timeUnixNano":"1","body":{"stringValue":"x"}}]}]}]}'
        )
        return [b"P" + req.SerializeToString(), b"J" + json_doc]
    if target == "bundle":
        return [_tar(EXAMPLE)]
    if target == "rules":
        return [(REPO / "rules" / "storage" / "filesystem.yaml").read_bytes()[:4000]]
    if target == "lineformat":
        return [
            line.encode() for line in (EXAMPLE / "logs" / "node02" / "kern.log").read_text().splitlines()[:20]
        ]
    if target == "events":
        return [p.read_bytes() for p in sorted((EXAMPLE / "events").iterdir())][:3] or [b"{}"]
    if target == "metrics":
        return [p.read_bytes()[:20000] for p in sorted((EXAMPLE / "metrics").iterdir())][:3] or [b"# EOF\n"]
    raise ValueError(target)


def target_function(target: str) -> Callable[[bytes], None]:
    """The function that must not crash on any input of the target."""
    from hypocenter.errors import InputError

    if target == "otlp":
        from hypocenter.collector import otlp, otlp_wire

        def fuzz_otlp(data: bytes) -> None:
            media = "application/json" if data[:1] == b"J" else "application/x-protobuf"
            body = data[1:]
            for signal in ("logs", "metrics"):
                try:
                    otlp.receive(signal, body, media)
                except InputError:
                    continue
                if media != "application/json" and signal == "logs":
                    # The columnar path reads only the fields it needs: a request whose records it took
                    # may hold a malformed field elsewhere, which the whole decode refuses.
                    try:
                        msg, _ = otlp.decode_logs(body, media)
                    except InputError:
                        continue
                    decoded = sum(len(sl.log_records) for rl in msg.resource_logs for sl in rl.scope_logs)
                    counted = otlp_wire.count_log_records(body, 1 << 30)
                    assert counted == decoded, (counted, decoded)

        return fuzz_otlp
    if target == "bundle":
        from hypocenter.collector.archive import load_archive_bundle
        from hypocenter.limits import Limits

        small = Limits(bundle_max_members=200, bundle_max_member_bytes=1 << 20, bundle_max_bytes=4 << 20)

        def fuzz_bundle(data: bytes) -> None:
            with contextlib.suppress(InputError):
                load_archive_bundle(data, small)

        return fuzz_bundle
    if target == "rules":
        from hypocenter.engine import Engine
        from hypocenter.engine.rules import load_ruleset

        scratch = Path(tempfile.mkdtemp(prefix="hypocenter-fuzz-rules-")) / "fuzz.yaml"

        def fuzz_rules(data: bytes) -> None:
            scratch.write_bytes(data)
            with contextlib.suppress(InputError):
                Engine(load_ruleset([scratch], builtin=False))

        return fuzz_rules
    if target == "lineformat":
        from hypocenter.lineformat import TimeContext, parse_iso, parse_line

        ctx = TimeContext(
            tz=timezone.utc,
            start=datetime(2026, 11, 2, 10, tzinfo=timezone.utc),
            end=datetime(2026, 11, 2, 11, tzinfo=timezone.utc),
        )

        def fuzz_lines(data: bytes) -> None:
            text = data.decode("utf-8", "replace")
            parse_line(text, ctx)
            parse_iso(text, ctx)

        return fuzz_lines
    if target == "events":
        from hypocenter.collector.bundle import event_records
        from hypocenter.lineformat import TimeContext

        ctx = TimeContext(
            tz=timezone.utc,
            start=datetime(2026, 11, 2, 10, tzinfo=timezone.utc),
            end=datetime(2026, 11, 2, 11, tzinfo=timezone.utc),
        )

        def fuzz_events(data: bytes) -> None:
            with contextlib.suppress(ValueError):
                event_records(data.decode("utf-8", "replace"), "events/fuzz", ctx)

        return fuzz_events
    if target == "metrics":
        from hypocenter.collector.metrics import MetricFormatError, parse_metrics

        def fuzz_metrics(data: bytes) -> None:
            with contextlib.suppress(MetricFormatError, ValueError):
                parse_metrics(
                    data.decode("utf-8", "replace"), default_time=datetime(2026, 11, 2, tzinfo=timezone.utc)
                )

        return fuzz_metrics
    raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")


def _worker(target: str, seconds: int, runs: int | None) -> None:
    """Inside the fuzzing process: instrument, seed a corpus, hand over to libFuzzer (which exits)."""
    import atheris

    with atheris.instrument_imports(include=["hypocenter"]):
        fn = target_function(target)
    corpus = Path(tempfile.mkdtemp(prefix=f"hypocenter-fuzz-{target}-"))
    for i, seed in enumerate(seeds(target)):
        (corpus / f"seed{i}").write_bytes(seed)
    out = REGRESSIONS / target
    out.mkdir(parents=True, exist_ok=True)
    args = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={seconds}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-max_len=262144",
        f"-artifact_prefix={out}/",
        "-print_final_stats=1",
    ]
    if runs is not None:
        args.append(f"-runs={runs}")
    atheris.Setup(args, fn)
    atheris.Fuzz()


def run(target: str, seconds: int, runs: int | None = None) -> int:
    """Fuzz one target in a child process; its exit status (0: no crash found)."""
    cmd = [sys.executable, "-m", "bench.fuzz", "--worker", "--target", target, "--seconds", str(seconds)]
    if runs is not None:
        cmd += ["--runs", str(runs)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="coverage-guided fuzzing of hypocenter's parsers (atheris)")
    ap.add_argument("--target", choices=TARGETS, help="one target (default: all, one after the other)")
    ap.add_argument("--seconds", type=int, default=60, help="time budget per target")
    ap.add_argument("--runs", type=int, default=None, help="stop a target after this many inputs")
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(TARGETS))
        return 0
    if args.worker:
        _worker(args.target, args.seconds, args.runs)
        return 0
    failed = [t for t in ([args.target] if args.target else TARGETS) if run(t, args.seconds, args.runs) != 0]
    if failed:
        print(f"crashes found in: {', '.join(failed)} (inputs saved under {REGRESSIONS})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
