"""collector/metrics.py's exposition parser beside prometheus_client's two, on the text inputs bundles
hold, printed side by side:

    python -m bench.metrics_parser [--rounds 5]

Inputs: the text files under examples/*/metrics (the generated corpus writes only Prometheus JSON,
which prometheus_client does not read), a /metrics scrape made by prometheus_client (Prometheus
text format), a large file (the example's series over 2,000 instances) for speed, and two
hand-assembled files Prometheus itself scrapes (two scrapes joined with `cat`; a counter sample
without `_total`).

Parsers: ours (`parse_exposition`: Prometheus text, or OpenMetrics when `# EOF` is present);
prometheus_client's Prometheus text parser; its OpenMetrics parser; and the two chosen the way ours
chooses (`# EOF`), which is what switching would mean. For each input and parser: whether it is accepted,
its samples, whether they are ours (name, labels, value, time), and the best round's MB/s. An
accepted parse that disagrees is marked `≠`. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families

from hypocenter.collector.metrics import MetricFormatError, parse_exposition

REPO = Path(__file__).resolve().parent.parent
DEFAULT = datetime(2026, 11, 2, tzinfo=timezone.utc)
# (name, sorted labels, value, time in seconds): a sample as each parser sees it.
Sample = tuple[str, tuple[tuple[str, str], ...], float, float]


def ours(text: str) -> list[Sample]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), v, when.timestamp())
        for s in parse_exposition(text, DEFAULT)
        for when, v in s.samples
    )


def _theirs(families: Callable[[str], object], text: str, openmetrics: bool) -> list[Sample]:
    out = []
    for family in families(text):  # type: ignore[attr-defined]
        for s in family.samples:
            if math.isnan(s.value):
                continue
            ts = s.timestamp
            if ts is None:
                when = DEFAULT.timestamp()
            elif openmetrics:
                when = float(ts.sec) + ts.nsec / 1e9 if hasattr(ts, "sec") else float(ts)
            else:
                when = float(ts)  # the Prometheus text parser already turned ms into s
            out.append((s.name, tuple(sorted(s.labels.items())), float(s.value), when))
    return sorted(out)


def prometheus_text(text: str) -> list[Sample]:
    return _theirs(prometheus_families, text, openmetrics=False)


def openmetrics(text: str) -> list[Sample]:
    return _theirs(openmetrics_families, text, openmetrics=True)


def either(text: str) -> list[Sample]:
    return openmetrics(text) if "# EOF" in text else prometheus_text(text)


PARSERS: dict[str, Callable[[str], list[Sample]]] = {
    "ours": ours,
    "client text": prometheus_text,
    "client openmetrics": openmetrics,
    "client by # EOF": either,
}


def inputs() -> dict[str, str]:
    found: dict[str, str] = {}
    for f in sorted(REPO.glob("examples/*/metrics/*")):
        if f.suffix != ".json":
            found[str(f.relative_to(REPO))] = f.read_text()
    registry = CollectorRegistry()
    from prometheus_client import Counter, Gauge, Histogram

    Counter("hypocenter_diagnoses", "diagnoses", ["outcome"], registry=registry).labels("attributed").inc(3)
    Gauge("hypocenter_store_rows", "rows", ["table"], registry=registry).labels("attempt_logs").set(12)
    Histogram("hypocenter_analysis_seconds", "latency", registry=registry).observe(0.3)
    found["a /metrics scrape (Prometheus text)"] = generate_latest(registry).decode()
    example = (REPO / "examples/host-oom/metrics/node_memory.om").read_text()
    families: list[tuple[list[str], list[str]]] = []
    for line in example.splitlines():
        if line.startswith("# HELP") or (line.startswith("# TYPE") and not families[-1][1]):
            if not families or families[-1][1]:
                families.append(([], []))
            families[-1][0].append(line)
        elif line and not line.startswith("#"):
            families[-1][1].append(line)
    big: list[str] = []  # a family's lines together, a series' samples together: as OpenMetrics asks
    for header, body in families:
        big += header
        big += [
            re.sub(r'instance="([^"]*)"', rf'instance="\1-{i:04d}"', line)
            for i in range(2000)
            for line in body
        ]
    found["example x 2,000 instances (OpenMetrics)"] = "\n".join([*big, "# EOF"]) + "\n"
    found["two scrapes joined by cat (Prometheus text)"] = (
        "# TYPE a gauge\na 1 1794948000000\n# TYPE b gauge\nb 2 1794948000000\n"
        "# TYPE a gauge\na 3 1794948060000\n# TYPE b gauge\nb 4 1794948060000\n"
    )
    found["counter sample without _total (OpenMetrics)"] = (
        '# TYPE nccl_errors counter\nnccl_errors{node="n1"} 3 1794948000\n# EOF\n'
    )
    return found


def measure(
    parse: Callable[[str], list[Sample]], text: str, rounds: int
) -> tuple[str, list[Sample] | None, float]:
    try:
        got = parse(text)
    except (MetricFormatError, ValueError, TypeError, KeyError) as exc:
        return f"refused: {str(exc)[:60]}", None, 0.0
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        parse(text)
        best = min(best, time.perf_counter() - t0)
    return "", got, len(text.encode()) / best / 1e6 if best > 0 else math.inf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.metrics_parser", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"{'input':<46} {'bytes':>9}  " + "  ".join(f"{name:>26}" for name in PARSERS))
    for label, text in inputs().items():
        cells = []
        reference: list[Sample] | None = None
        for name, parse in PARSERS.items():
            error, got, rate = measure(parse, text, args.rounds)
            if name == "ours":
                reference = got
            if got is None:
                cells.append(error[:26])
                continue
            same = "=" if got == reference else "≠"
            cells.append(f"{len(got)} {same} {rate:6.1f} MB/s")
        print(f"{label[:46]:<46} {len(text.encode()):>9}  " + "  ".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
