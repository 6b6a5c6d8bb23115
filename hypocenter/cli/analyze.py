"""`hypocenter analyze`: diagnose one attempt, from a bundle directory or pulled from the scheduler.

hypocenter analyze BUNDLE [--format text|json] [--rules PATH]...
hypocenter analyze --slurm JOBID | --kueue NS/WL | --k8s-job NS/NAME [--logs DIR] [--loki URL]
                   [--prometheus URL] [--config FILE]      (hypocenter.collector.pull)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypocenter.cli.console import EXIT_OK, Style, color_wanted, emit, rule_options

if TYPE_CHECKING:
    from hypocenter.collector.pull import PullConfig
    from hypocenter.engine import Engine
    from hypocenter.model import Cost, Diagnosis

_OUTCOME_STYLE = {"attributed": "1;32", "ambiguous": "1;33", "unattributed": "1;35", "not_failed": "1;36"}
_QUALITY_STYLE = {"high": "32", "medium": "33", "low": "31"}


def render_text(d: Diagnosis, style: Style) -> str:
    from hypocenter.engine.extract import cut

    a = d.attempt
    out: list[str] = []
    sched = "/".join(x for x in (a.scheduler, a.cluster) if x)
    out.append(
        f"hypocenter · workload {a.workload_id} attempt {a.attempt}"
        + (f" ({sched})" if sched else "")
        + f" · {d.terminal_state or 'state unknown'} · {len(a.nodes)} node(s)"
    )
    head = style(d.outcome.upper().replace("_", " "), _OUTCOME_STYLE[d.outcome])
    rc = d.root_cause
    if rc is not None:
        where = ", ".join(rc.nodes) or "the job"
        out.append(
            f"{head}  {style(f'{rc.domain}/{rc.subdomain}', '1')} on {where}   "
            f"[quality: {style(d.quality.level, _QUALITY_STYLE[d.quality.level])}]"
        )
        out.append(f"  {rc.summary}")
        comps = ", ".join(f"{c.node} {c.kind} {c.id}" for c in rc.components)
        out.append(
            f"  first seen {rc.first_seen or 'unknown'} · action {style(rc.action, '1')} · rule {rc.rule}"
            + (f" · components: {comps}" if comps else "")
        )
    else:
        text = {
            "unattributed": "no root cause can be attributed from the evidence available",
            "not_failed": "the attempt did not fail",
        }.get(d.outcome, "")
        out.append(f"{head}  {text}   [quality: {style(d.quality.level, _QUALITY_STYLE[d.quality.level])}]")
        ff = d.first_failure
        if ff is not None:
            how = ff.signal or (f"exit code {ff.exit_code}" if ff.exit_code is not None else "failed")
            who = f"rank {ff.rank}" if ff.rank is not None else "a process"
            out.append(f"  first failure: {who} on {ff.node or '?'} · {how} · {ff.time or '?'} · {ff.ref}")
            out.append(f"  next step ({style(ff.action, '1')}): {ff.next_step}")
        if d.next_step is not None and d.next_step.look_at:
            out.append(f"  action {style(d.next_step.action, '1')} · look at:")
            out.extend(f"    - {item}" for item in d.next_step.look_at)
    if d.candidates and d.outcome == "unattributed":
        out.append("")
        out.append(style("Candidates", "1") + " (the causes weighed, most likely first; none attributed)")
        out.extend(_weighed(d, style))
    elif d.candidates:
        out.append("")
        out.append(style("Candidates", "1"))
        for c in d.candidates:
            out.append(
                f"  {c.domain}/{c.subdomain} on {', '.join(c.nodes) or 'the job'} — {c.summary} "
                f"(first seen {c.first_seen or '?'}, rule {c.rule})"
            )
    if d.symptoms:
        out.append("")
        out.append(style("Symptoms" + (" (consequences, not causes)" if rc else ""), "1"))
        width = max(len(s.kind) for s in d.symptoms)
        for s in d.symptoms:
            nodes = ", ".join(s.nodes[:6]) + (f" +{len(s.nodes) - 6}" if len(s.nodes) > 6 else "")
            out.append(f"  {s.kind.ljust(width)}  ×{s.count:<5} {nodes or '-'}  from {s.first_seen or '?'}")
    if d.evidence:
        out.append("")
        out.append(style("Evidence", "1") + " (cause and context first; one example per symptom)")
        shown_kinds: set[str] = set()
        order = {"root_cause": 0, "context": 1, "symptom": 2}
        first_ref = d.first_failure.ref if d.first_failure else None
        for e in sorted(d.evidence, key=lambda v: (order[v.role], v.ref != first_ref)):
            if e.role == "symptom":
                if e.rule in shown_kinds:
                    continue
                shown_kinds.add(e.rule)
            tag = {"root_cause": style("cause  ", "1;31"), "symptom": "symptom", "context": "context"}[e.role]
            when = e.time or "?"
            if e.inherited:  # no stamp of its own: between the stamps around it
                when = f"{e.time} .. {e.time_max}" if e.time_max else f">= {e.time}"
            out.append(f"  {tag} {when:<27} {e.node or '-':<12} {e.ref}")
            out.append(f"          {cut(e.text, 160)}")
    if d.cost is not None:
        out.append("")
        out.extend(render_cost(d.cost, style))
    out.append("")
    out.append(style("Quality", "1") + f": {d.quality.level}")
    for r in d.quality.reasons:
        out.append(f"  - {r}")
    bad = [c for c in d.coverage if c.status != "ok"]
    ok = len(d.coverage) - len(bad)
    out.append(
        style("Coverage", "1") + f": {ok} source(s) read" + (f", {len(bad)} with problems:" if bad else "")
    )
    for cov in bad:
        inner = sum(1 for b in bad if b.source.startswith(cov.source + "/"))
        if inner:  # a node directory: its files are listed one by one right after it
            out.append(f"  - {cov.source}: {cov.status}, {inner} file(s) with problems:")
            continue
        indent = "    " if any(cov.source.startswith(b.source + "/") for b in bad) else "  "
        out.append(f"{indent}- {cov.source}: {cov.status}" + (f" ({cov.reason})" if cov.reason else ""))
    out.append(f"diagnosis {d.id} · engine {d.engine.version} · ruleset {d.engine.ruleset[:19]}")
    return "\n".join(out) + "\n"


def render_cost(cost: Cost, style: Style) -> list[str]:
    """The cost block of the text report: the total, then each figure with how it was obtained."""
    total = (
        f"{cost.gpu_hours_lost:g} ± {cost.gpu_hours_uncertainty or 0:g} GPU-hours lost"
        if cost.gpu_hours_lost is not None
        else "GPU-hours lost: unknown"
    )
    if cost.unknown and cost.gpu_hours_lost is not None:
        total += f" (at least: {', '.join(cost.unknown)} unknown)"
    out = [style("Cost", "1") + f": {total}"]
    for name, f in (
        ("GPUs", cost.gpus),
        ("lost work", cost.lost_work_s),
        ("time to detect", cost.time_to_detect_s),
        ("restart overhead", cost.restart_overhead_s),
        ("startup", cost.startup_s),
    ):
        unit = "" if f is cost.gpus else " s"
        value = "unknown" if f.value is None else f"{f.value:g}{unit} ± {f.uncertainty or 0:g}{unit}"
        out.append(f"  {name:<17} {value:<22} {f.method}" + (f" ({f.ref})" if f.ref else ""))
    return out


# How the engine words a candidate's shortfall at the end of its summary: "(it falls short: …)",
# "(2 line(s); it falls short: …)", "(fell short: …)".
_SHORT = re.compile(r"\s*\((?:(?P<lines>\d+ line\(s\)); )?(?:it )?f(?:alls|ell) short(?:: (?P<why>.*))?\)$")


def _weighed(d: Diagnosis, style: Style) -> list[str]:
    """An abstention's candidates, one block each: the class and where, what the lines suggest and why it
    falls short (the lines they rest on are in the evidence, as context)."""
    out: list[str] = []
    for i, c in enumerate(d.candidates, 1):
        out.append(
            f"  {i}. {style(f'{c.domain}/{c.subdomain}', '1')} on {', '.join(c.nodes) or 'the job'}"
            f" · first seen {c.first_seen or '?'} · rule {c.rule}"
        )
        m = _SHORT.search(c.summary)
        says = c.summary[: m.start()] if m else c.summary
        if m and m.group("lines"):
            says += f" ({m.group('lines')})"
        out.append(f"     {says}")
        if m:
            out.append(f"     why it falls short: {m.group('why') or 'not stated'}")
    return out


# The flags that make `analyze` pull (collector/pull.py); without any, BUNDLE is read directly.
_PULL_FLAGS = (
    "config",
    "slurm",
    "slurm_rest",
    "kueue",
    "k8s_job",
    "kubeconfig",
    "context",
    "logs",
    "loki",
    "loki_node_label",
    "loki_workload_selector",
    "prometheus",
    "timeout",
)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from hypocenter.engine import CostSettings, default_engine

    for flag in ("gpus_per_node", "checkpoint_interval"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            args.parser.error(f"--{flag.replace('_', '-')}: must be at least 1")
    cost = CostSettings(gpus_per_node=args.gpus_per_node, checkpoint_interval_steps=args.checkpoint_interval)

    if args.bundle and all(getattr(args, name, None) in (None, []) for name in _PULL_FLAGS):
        # Only a bundle: the pull machinery (its settings and connectors) is not even imported.
        from hypocenter.collector.bundle import load_bundle

        engine = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules, cost=cost)
        diagnosis = engine.analyze(load_bundle(Path(args.bundle), read_once=True), workers=None)
    else:
        from hypocenter.collector import pull

        try:
            cfg = pull.merged(args)  # bad combinations fail before the rules are loaded
        except pull.UsageError as exc:
            args.parser.error(str(exc))  # usage and the message, exit 2
        engine = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules, cost=cost)
        if cfg.bundle and not (cfg.logs or cfg.loki or cfg.prometheus):
            from hypocenter.collector.bundle import load_bundle

            diagnosis = engine.analyze(load_bundle(Path(cfg.bundle)), workers=None)
        else:
            diagnosis = _pull_and_analyze(cfg, engine, pull.tty_progress)
    if args.format == "json":
        emit(diagnosis.to_json(), utf8=True)
    else:
        emit(render_text(diagnosis, Style(color_wanted(sys.stdout, args.color))))
    return EXIT_OK


def add_parser(sub: Any) -> None:
    a = sub.add_parser(
        "analyze",
        help="diagnose one attempt: a bundle directory, or a job pulled from the scheduler",
        description="Diagnose one attempt. Give exactly one of BUNDLE, --slurm, --kueue, --k8s-job; "
        "--logs, --loki and --prometheus add evidence from a log directory, Loki and Prometheus.",
    )
    a.add_argument("bundle", nargs="?", help="path to an attempt bundle directory (attempt.yaml, logs/, …)")
    pa = a.add_argument_group("pull from the scheduler (instead of BUNDLE)")
    pa.add_argument(
        "--slurm", metavar="JOBID", help="a Slurm job: 81234, array task 81234_7, het component 81234+1"
    )
    pa.add_argument(
        "--slurm-rest",
        metavar="URL",
        help="ask slurmrestd at URL instead of sacct/scontrol (token: $SLURM_JWT)",
    )
    pa.add_argument("--kueue", metavar="NS/WORKLOAD", help="a Kueue Workload")
    pa.add_argument(
        "--k8s-job",
        metavar="NS/NAME",
        help="a JobSet, PyTorchJob or batch Job (NS/KIND/NAME to name the kind)",
    )
    pa.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)",
    )
    pa.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current-context)")
    pa.add_argument(
        "--logs",
        metavar="DIR",
        action="append",
        default=[],
        help="a bundle-like directory: logs/<node>/<file>, metrics/, events/ (repeatable)",
    )
    pa.add_argument(
        "--loki",
        metavar="URL",
        help="pull the attempt's log lines from Loki (auth: $LOKI_BEARER_TOKEN, "
        "$LOKI_USERNAME/$LOKI_PASSWORD, or token_file in --config)",
    )
    pa.add_argument(
        "--loki-node-label", metavar="LABEL", help="the Loki stream label naming a node (default: host)"
    )
    pa.add_argument(
        "--loki-workload-selector",
        metavar="SELECTOR",
        help='LogQL matchers of the job\'s own logs, e.g. \'job="slurm", slurm_job_id="{workload}"\' '
        "({workload}, {attempt} filled in); without it job-level logs (stdout) are not pulled",
    )
    pa.add_argument(
        "--prometheus",
        metavar="URL",
        help="pull the rules' metric series from Prometheus (auth: "
        "$PROMETHEUS_BEARER_TOKEN, $PROMETHEUS_USERNAME/$PROMETHEUS_PASSWORD, or token_file in --config)",
    )
    pa.add_argument("--config", metavar="FILE", help="YAML naming the scope and sources; flags win over it")
    pa.add_argument("--timeout", metavar="S", type=float, help="seconds per connector call (default 30)")
    a.add_argument(
        "--format", choices=("text", "json"), default="text", help="text report (default) or diagnosis JSON"
    )
    a.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text report (auto: on a terminal)",
    )
    c = a.add_argument_group("cost of the failure (docs/cost.md): what the logs may not say")
    c.add_argument(
        "--gpus-per-node", type=int, metavar="N", help="GPUs per node when no rank map or DCGM series says"
    )
    c.add_argument(
        "--checkpoint-interval",
        type=int,
        metavar="STEPS",
        help="checkpoint every STEPS steps: places the last checkpoint when no checkpoint-saved line does",
    )
    rule_options(a)
    a.set_defaults(func=_cmd_analyze, parser=a)


def _pull_and_analyze(cfg: PullConfig, engine: Engine, progress: Callable[[str], None]) -> Diagnosis:
    from hypocenter.collector.pull import gather

    got = gather(cfg, queries=engine.ruleset.queries(), progress=progress)
    for note in got.notes:
        progress(note)
    progress("analysing")
    return engine.analyze(got)
