"""Score the engine on a corpus of bundles with ground truth.

    python -m bench.accuracy CORPUS_DIR [--json OUT.json] [--jobs N] [--worst N]
                             [--min-exact X] [--min-node-precision X] [--min-node-recall X]
                             [--max-false-confident X] [--max-false-confident-unattributed X]

Every bundle (a directory holding `truth.yaml`) is analysed with the library call
`hypocenter.engine` (after `collector.bundle.load_bundle`), in parallel processes. A
prediction is an *exact match* when outcome, domain, subdomain and the culprit node set all equal
the truth. The report adds per-domain and per-mode precision/recall, culprit-node precision and
recall (micro, over node sets), the false-confident rate (attributed when the truth is
unattributed or ambiguous), the abstention rate, a confusion table, the worst failures and
throughput. The exit status is 0 unless a threshold given on the command line is missed.

Only the benchmark reads `truth.yaml`; nothing here changes a bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine


@dataclass(frozen=True)
class Label:
    outcome: str
    domain: str | None
    subdomain: str | None
    nodes: tuple[str, ...]

    @property
    def key(self) -> str:
        """The class a confusion table counts: `domain/subdomain`, or the outcome when there is no cause."""
        if self.domain is None:
            return f"({self.outcome})"
        if self.outcome == "ambiguous":
            return f"ambiguous:{self.domain}/{self.subdomain}"
        return f"{self.domain}/{self.subdomain}"

    @property
    def domain_key(self) -> str:
        return self.domain if self.domain is not None else f"({self.outcome})"

    def text(self, most: int = 6) -> str:
        if not self.nodes:
            return self.key
        shown = ", ".join(self.nodes[:most])
        more = f", … +{len(self.nodes) - most}" if len(self.nodes) > most else ""
        return f"{self.key} [{shown}{more}]"


@dataclass
class Result:
    bundle: str
    mode: str
    truth: Label
    pred: Label | None
    seconds: float
    error: str | None = None
    truth_components: list[tuple[str, str]] = field(default_factory=list)
    pred_components: list[tuple[str, str]] = field(default_factory=list)

    @property
    def label_ok(self) -> bool:
        p, t = self.pred, self.truth
        return p is not None and (p.outcome, p.domain, p.subdomain) == (t.outcome, t.domain, t.subdomain)

    @property
    def exact(self) -> bool:
        return self.label_ok and self.pred is not None and set(self.pred.nodes) == set(self.truth.nodes)

    @property
    def severity(self) -> int:
        """How bad a miss is, for ordering the worst failures (0 = exact)."""
        p, t = self.pred, self.truth
        if self.exact:
            return 0
        if p is None:
            return 6
        if t.outcome in ("unattributed", "ambiguous", "not_failed") and p.outcome == "attributed":
            return 5
        if p.domain != t.domain:
            return 4
        if p.subdomain != t.subdomain or p.outcome != t.outcome:
            return 3
        return 1


# ----------------------------------------------------------------------------------------------
# Running the engine


def _label_from_diagnosis(d: dict[str, Any]) -> Label:
    outcome = str(d.get("outcome"))
    rc = d.get("root_cause")
    if outcome in ("not_failed", "unattributed") or not rc:
        return Label(outcome, None, None, ())
    nodes = set(rc.get("nodes") or [])
    if outcome == "ambiguous" and not nodes:
        for cand in d.get("candidates") or []:
            nodes.update(cand.get("nodes") or [])
    return Label(outcome, rc.get("domain"), rc.get("subdomain"), tuple(sorted(nodes)))


def _components(items: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(node, id) pairs; a truth component's aliases (its other names) are joined to its id with `|`."""
    return sorted(
        {
            (
                str(c.get("node", "")),
                "|".join([str(c.get("id", "")).lower(), *(str(a).lower() for a in c.get("aliases") or [])]),
            )
            for c in items
            if c
        }
    )


def _component_hits(truth: list[tuple[str, str]], pred: list[tuple[str, str]]) -> int:
    """Truth components found: same node, and the predicted id is the truth's id or one of its aliases
    (for a filesystem named by its mount path, a directory inside it)."""

    def hit(names: list[str], pid: str) -> bool:
        return pid in names or any(m.startswith("/") and pid.startswith(m.rstrip("/") + "/") for m in names)

    return sum(1 for node, names in truth if any(n == node and hit(names.split("|"), pid) for n, pid in pred))


def _diagnose(bundle: str) -> tuple[dict[str, Any] | None, str | None, float]:
    """Analyse one bundle in this process: the diagnosis as JSON data, or an error text."""
    t0 = time.perf_counter()
    try:
        loaded = load_bundle(Path(bundle))
        diag = default_engine().analyze(loaded)
        return diag.model_dump(mode="json"), None, time.perf_counter() - t0
    except Exception as exc:  # the benchmark reports engine crashes per bundle instead of stopping
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0


TRUTH_FILES = ("truth.yaml", "expected.yaml")
"""The label of a bundle: the generator's truth.yaml, or the expected.yaml of hand-written bundles
(examples/, bench/heldout/: the same outcome, domain, subdomain, nodes and components keys)."""


def _truth_file(bundle: Path) -> Path | None:
    return next((bundle / n for n in TRUTH_FILES if (bundle / n).is_file()), None)


def find_bundles(corpus: Path) -> list[Path]:
    """Bundle directories under `corpus` (any directory with a truth.yaml or expected.yaml), sorted by path."""
    if _truth_file(corpus) is not None:
        return [corpus]
    return (
        sorted(p for p in corpus.iterdir() if p.is_dir() and _truth_file(p) is not None)
        if corpus.is_dir()
        else []
    )


def load_truth(bundle: Path) -> tuple[str, Label, list[tuple[str, str]]]:
    path = _truth_file(bundle)
    assert path is not None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    label = Label(
        str(data["outcome"]),
        data.get("domain"),
        data.get("subdomain"),
        tuple(sorted(data.get("nodes") or [])),
    )
    return str(data.get("mode", bundle.name)), label, _components(data.get("components") or [])


def run(corpus: Path, jobs: int | None = None) -> tuple[list[Result], float]:
    """Analyse every bundle of `corpus`; returns the results (in bundle order) and the wall time."""
    bundles = find_bundles(corpus)
    jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    t0 = time.perf_counter()
    paths = [str(b) for b in bundles]
    if jobs == 1 or len(paths) < 2:
        raw = [_diagnose(p) for p in paths]
    else:
        # spawn: never fork a process that may hold threads (and warnings-as-errors test runs)
        with ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=get_context("spawn")) as pool:
            raw = list(pool.map(_diagnose, paths, chunksize=max(1, len(paths) // (jobs * 8))))
    wall = time.perf_counter() - t0
    results: list[Result] = []
    for bundle, (diag, error, secs) in zip(bundles, raw, strict=True):
        mode, truth, tcomp = load_truth(bundle)
        pred = _label_from_diagnosis(diag) if diag is not None else None
        pcomp = _components((diag.get("root_cause") or {}).get("components") or []) if diag else []
        results.append(Result(bundle.name, mode, truth, pred, secs, error, tcomp, pcomp))
    return results, wall


# ----------------------------------------------------------------------------------------------
# Scoring


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def _prf(pairs: Sequence[tuple[str, str | None]]) -> dict[str, dict[str, Any]]:
    """Per-class precision and recall from (truth class, predicted class) pairs."""
    truth_n: Counter[str] = Counter(t for t, _ in pairs)
    pred_n: Counter[str] = Counter(p for _, p in pairs if p is not None)
    hit: Counter[str] = Counter(t for t, p in pairs if t == p)
    out = {}
    for cls in sorted(set(truth_n) | set(pred_n)):
        out[cls] = {
            "truth": truth_n[cls],
            "predicted": pred_n[cls],
            "correct": hit[cls],
            "precision": _ratio(hit[cls], pred_n[cls]),
            "recall": _ratio(hit[cls], truth_n[cls]),
        }
    return out


def _nodes_pr(results: Sequence[Result]) -> tuple[float | None, float | None, int, int, int]:
    inter = pred = true = 0
    for r in results:
        p = set(r.pred.nodes) if r.pred else set()
        t = set(r.truth.nodes)
        inter += len(p & t)
        pred += len(p)
        true += len(t)
    return _ratio(inter, pred), _ratio(inter, true), inter, pred, true


def score(results: Sequence[Result], wall: float, *, worst: int = 20) -> dict[str, Any]:
    """The summary of a run (what `--json` writes, minus the per-bundle list)."""
    n = len(results)
    exact = sum(r.exact for r in results)
    node_p, node_r, inter, npred, ntrue = _nodes_pr(results)
    hedged = [r for r in results if r.truth.outcome in ("unattributed", "ambiguous")]
    unattr = [r for r in results if r.truth.outcome == "unattributed"]
    ambig = [r for r in results if r.truth.outcome == "ambiguous"]
    attributed_truth = [r for r in results if r.truth.outcome == "attributed"]

    def confident(rs: Sequence[Result]) -> int:
        return sum(1 for r in rs if r.pred is not None and r.pred.outcome == "attributed")

    abstained = sum(1 for r in results if r.pred is not None and r.pred.outcome == "unattributed")
    over_abstained = sum(
        1 for r in attributed_truth if r.pred is not None and r.pred.outcome == "unattributed"
    )
    by_mode: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_mode[r.mode].append(r)
    per_label = _prf([(r.truth.key, r.pred.key if r.pred else None) for r in results])
    per_mode = {}
    for mode, rs in sorted(by_mode.items()):
        mp, mr, *_ = _nodes_pr(rs)
        wrong = Counter(r.pred.key if r.pred else "(error)" for r in rs if not r.label_ok)
        per_mode[mode] = {
            "n": len(rs),
            "truth": rs[0].truth.key,
            "exact": _ratio(sum(x.exact for x in rs), len(rs)),
            "label_recall": _ratio(sum(x.label_ok for x in rs), len(rs)),
            "label_precision": per_label[rs[0].truth.key]["precision"],
            "node_precision": mp,
            "node_recall": mr,
            "top_wrong": wrong.most_common(1)[0][0] if wrong else None,
        }
    confusion: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        confusion[r.truth.key][r.pred.key if r.pred else "(error)"] += 1
    with_comp = [r for r in results if r.truth_components]
    comp_hit = sum(_component_hits(r.truth_components, r.pred_components) for r in with_comp)
    comp_all = sum(len(r.truth_components) for r in with_comp)
    latencies = sorted(r.seconds for r in results)
    failing = sorted((r for r in results if not r.exact), key=lambda r: (-r.severity, r.mode, r.bundle))
    return {
        "scenarios": n,
        "exact_match": _ratio(exact, n),
        "label_accuracy": _ratio(sum(r.label_ok for r in results), n),
        "node_precision": node_p,
        "node_recall": node_r,
        "node_counts": {"correct": inter, "predicted": npred, "truth": ntrue},
        "false_confident_rate": _ratio(confident(hedged), len(hedged)),
        "false_confident_rate_unattributed": _ratio(confident(unattr), len(unattr)),
        "false_confident_rate_ambiguous": _ratio(confident(ambig), len(ambig)),
        "abstention_rate": _ratio(abstained, n),
        "over_abstention_rate": _ratio(over_abstained, len(attributed_truth)),
        "component_recall": _ratio(comp_hit, comp_all),
        "errors": sum(1 for r in results if r.error),
        "per_domain": _prf([(r.truth.domain_key, r.pred.domain_key if r.pred else None) for r in results]),
        "per_label": per_label,
        "per_mode": per_mode,
        "confusion": {t: dict(sorted(row.items())) for t, row in sorted(confusion.items())},
        "worst": [
            {
                "bundle": r.bundle,
                "mode": r.mode,
                "truth": r.truth.text(),
                "predicted": r.pred.text() if r.pred else None,
                "error": r.error,
            }
            for r in failing[:worst]
        ],
        "throughput": {
            "wall_seconds": round(wall, 3),
            "scenarios_per_second": _ratio(n, wall) if wall > 0 else None,
            "mean_seconds": round(sum(latencies) / n, 4) if n else None,
            "p95_seconds": round(latencies[min(n - 1, int(n * 0.95))], 4) if n else None,
        },
    }


# ----------------------------------------------------------------------------------------------
# Report


def _fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def format_report(s: dict[str, Any]) -> str:
    out: list[str] = []
    tp = s["throughput"]
    out.append(
        f"scenarios {s['scenarios']}  exact match {_fmt(s['exact_match'])}  label accuracy {_fmt(s['label_accuracy'])}  "
        f"engine errors {s['errors']}"
    )
    out.append(
        f"culprit nodes: precision {_fmt(s['node_precision'])}  recall {_fmt(s['node_recall'])}  "
        f"({s['node_counts']['correct']} correct / {s['node_counts']['predicted']} predicted / {s['node_counts']['truth']} true)"
    )
    out.append(
        f"false-confident {_fmt(s['false_confident_rate'])} (unattributed truth {_fmt(s['false_confident_rate_unattributed'])}, "
        f"ambiguous truth {_fmt(s['false_confident_rate_ambiguous'])})  abstention {_fmt(s['abstention_rate'])}  "
        f"over-abstention {_fmt(s['over_abstention_rate'])}  component recall {_fmt(s['component_recall'])}"
    )
    out.append(
        f"throughput {_fmt(tp['scenarios_per_second'])} scenarios/s  (wall {tp['wall_seconds']}s, mean {tp['mean_seconds']}s, "
        f"p95 {tp['p95_seconds']}s per bundle)"
    )
    out.append("")
    out.append(f"{'domain':24s} {'n':>5s} {'pred':>5s} {'prec':>6s} {'recall':>6s}")
    for cls, v in s["per_domain"].items():
        out.append(
            f"{cls:24s} {v['truth']:5d} {v['predicted']:5d} {_fmt(v['precision']):>6s} {_fmt(v['recall']):>6s}"
        )
    out.append("")
    out.append(
        f"{'mode':40s} {'n':>4s} {'exact':>6s} {'labelP':>6s} {'labelR':>6s} {'nodeP':>6s} {'nodeR':>6s}  most common wrong label"
    )
    for mode, v in s["per_mode"].items():
        out.append(
            f"{mode:40s} {v['n']:4d} {_fmt(v['exact']):>6s} {_fmt(v['label_precision']):>6s} {_fmt(v['label_recall']):>6s} "
            f"{_fmt(v['node_precision']):>6s} {_fmt(v['node_recall']):>6s}  {v['top_wrong'] or ''}"
        )
    out.append("")
    cols = sorted({c for row in s["confusion"].values() for c in row})
    idx = {c: i for i, c in enumerate(cols)}
    out.append("confusion (rows: truth, columns: predicted)")
    out.append(" " * 34 + "".join(f"{i:>5d}" for i in range(len(cols))))
    for t, row in s["confusion"].items():
        out.append(f"{t[:33]:33s} " + "".join(f"{row.get(c, 0) or '.':>5}" for c in cols))
    out.append("columns: " + "  ".join(f"{idx[c]}={c}" for c in cols))
    if s["worst"]:
        out.append("")
        out.append("worst failures")
        for w in s["worst"]:
            got = w["predicted"] if w["predicted"] is not None else f"ERROR {w['error']}"
            out.append(f"  {w['bundle']}: truth {w['truth']}  →  {got}")
    return "\n".join(out)


@dataclass
class Thresholds:
    min_exact: float | None = None
    min_node_precision: float | None = None
    min_node_recall: float | None = None
    max_false_confident: float | None = None
    max_false_confident_unattributed: float | None = None

    def missed(self, s: dict[str, Any]) -> list[str]:
        checks = [
            ("exact match", s["exact_match"], self.min_exact, "--min-exact", True),
            (
                "culprit-node precision",
                s["node_precision"],
                self.min_node_precision,
                "--min-node-precision",
                True,
            ),
            ("culprit-node recall", s["node_recall"], self.min_node_recall, "--min-node-recall", True),
            (
                "false-confident rate",
                s["false_confident_rate"],
                self.max_false_confident,
                "--max-false-confident",
                False,
            ),
            (
                "false-confident rate on unattributed truth",
                s["false_confident_rate_unattributed"],
                self.max_false_confident_unattributed,
                "--max-false-confident-unattributed",
                False,
            ),
        ]
        out = []
        for name, value, limit, flag, at_least in checks:
            if limit is None or value is None:
                continue
            if (at_least and value < limit) or (not at_least and value > limit):
                out.append(f"FAIL: {name} {value:.4f} {'<' if at_least else '>'} {flag} {limit}")
        return out


def evaluate(
    corpus: Path, jobs: int | None = None, *, worst: int = 20
) -> tuple[dict[str, Any], list[Result]]:
    """Run and score; the library entry point tests use."""
    results, wall = run(corpus, jobs)
    return score(results, wall, worst=worst), results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.accuracy",
        description="Score hypocenter on a corpus of bundles with truth.yaml.",
    )
    parser.add_argument(
        "corpus", type=Path, help="corpus directory written by bench.generate (or one bundle)"
    )
    parser.add_argument("--json", type=Path, help="write the summary and per-bundle results as JSON")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPU count)"
    )
    parser.add_argument(
        "--worst", type=int, default=20, help="how many failing bundles to list (default %(default)s)"
    )
    parser.add_argument("--min-exact", type=float)
    parser.add_argument("--min-node-precision", type=float)
    parser.add_argument("--min-node-recall", type=float)
    parser.add_argument("--max-false-confident", type=float)
    parser.add_argument("--max-false-confident-unattributed", type=float)
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        parser.error(f"{args.corpus} is not a directory")
    if not find_bundles(args.corpus):
        parser.error(f"no bundle with a truth.yaml or expected.yaml under {args.corpus}")
    summary, results = evaluate(args.corpus, args.jobs, worst=args.worst)
    print(format_report(summary))
    if args.json:
        doc = {
            "summary": summary,
            "results": [
                {
                    "bundle": r.bundle,
                    "mode": r.mode,
                    "exact": r.exact,
                    "truth": asdict(r.truth),
                    "predicted": asdict(r.pred) if r.pred else None,
                    "error": r.error,
                    "seconds": round(r.seconds, 4),
                }
                for r in results
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    missed = Thresholds(
        args.min_exact,
        args.min_node_precision,
        args.min_node_recall,
        args.max_false_confident,
        args.max_false_confident_unattributed,
    ).missed(summary)
    for line in missed:
        print(line)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
