"""The `hypocenter` command.

    hypocenter analyze BUNDLE [--format text|json] [--rules PATH]...   diagnose one attempt bundle
    hypocenter analyze --slurm JOBID | --kueue NS/WL | --k8s-job NS/NAME [--logs DIR] [--loki URL]
                       [--prometheus URL] [--config FILE]              pull the attempt (hypocenter.collector.pull)
    hypocenter schema                                                  JSON Schema of the diagnosis
    hypocenter rules list | check | test [--rule ID]                   the rule catalog
    hypocenter serve | replay BUNDLE | config show                     the server (hypocenter.cli.serve)
    hypocenter fleet [--store URL | --server URL]                      recurring culprits (hypocenter.cli.fleet)
    hypocenter rules backtest [--since 30d] [--rules DIR]              what a rule change flips (hypocenter.cli.backtest)

Exit codes: 0 a diagnosis was produced (whatever its outcome) / the command succeeded; 1 rules
check or test found problems; 2 unusable input, with a one-line reason on stderr; 70 an internal
error (a bug: one line on stderr, the traceback only with HYPOCENTER_DEBUG=1). Never a traceback
for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from hypocenter import __version__
from hypocenter.errors import InputError
from hypocenter.model import SCHEMA_ID, Diagnosis

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE


class _Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text


def _color_wanted(stream: TextIO, mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


_OUTCOME_STYLE = {"attributed": "1;32", "ambiguous": "1;33", "unattributed": "1;35", "not_failed": "1;36"}
_QUALITY_STYLE = {"high": "32", "medium": "33", "low": "31"}


def render_text(d: Diagnosis, style: _Style) -> str:
    a = d.attempt
    out: list[str] = []
    sched = "/".join(x for x in (a.scheduler, a.cluster) if x)
    out.append(f"hypocenter · workload {a.workload_id} attempt {a.attempt}" + (f" ({sched})" if sched else "")
               + f" · {d.terminal_state or 'state unknown'} · {len(a.nodes)} node(s)")
    head = style(d.outcome.upper().replace("_", " "), _OUTCOME_STYLE[d.outcome])
    rc = d.root_cause
    if rc is not None:
        where = ", ".join(rc.nodes) or "the job"
        out.append(f"{head}  {style(f'{rc.domain}/{rc.subdomain}', '1')} on {where}   "
                   f"[quality: {style(d.quality.level, _QUALITY_STYLE[d.quality.level])}]")
        out.append(f"  {rc.summary}")
        comps = ", ".join(f"{c.node} {c.kind} {c.id}" for c in rc.components)
        out.append(f"  first seen {rc.first_seen or 'unknown'} · action {style(rc.action, '1')} · rule {rc.rule}"
                   + (f" · components: {comps}" if comps else ""))
    else:
        text = {"unattributed": "no root cause can be attributed from the evidence available",
                "not_failed": "the attempt did not fail"}.get(d.outcome, "")
        out.append(f"{head}  {text}   [quality: {style(d.quality.level, _QUALITY_STYLE[d.quality.level])}]")
        ff = d.first_failure
        if ff is not None:
            how = ff.signal or (f"exit code {ff.exit_code}" if ff.exit_code is not None else "failed")
            who = f"rank {ff.rank}" if ff.rank is not None else "a process"
            out.append(f"  first failure: {who} on {ff.node or '?'} · {how} · {ff.time or '?'} · {ff.ref}")
            out.append(f"  next step ({style(ff.action, '1')}): {ff.next_step}")
    if d.candidates:
        out.append("")
        out.append(style("Candidates", "1"))
        for c in d.candidates:
            out.append(f"  {c.domain}/{c.subdomain} on {', '.join(c.nodes) or 'the job'} — {c.summary} "
                       f"(first seen {c.first_seen or '?'}, rule {c.rule})")
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
            out.append(f"          {e.text[:160]}")
    out.append("")
    out.append(style("Quality", "1") + f": {d.quality.level}")
    for r in d.quality.reasons:
        out.append(f"  - {r}")
    bad = [c for c in d.coverage if c.status != "ok"]
    ok = len(d.coverage) - len(bad)
    out.append(style("Coverage", "1") + f": {ok} source(s) read" + (f", {len(bad)} with problems:" if bad else ""))
    for cov in bad:
        inner = sum(1 for b in bad if b.source.startswith(cov.source + "/"))
        if inner:  # a node directory: its files are listed one by one right after it
            out.append(f"  - {cov.source}: {cov.status}, {inner} file(s) with problems:")
            continue
        indent = "    " if any(cov.source.startswith(b.source + "/") for b in bad) else "  "
        out.append(f"{indent}- {cov.source}: {cov.status}" + (f" ({cov.reason})" if cov.reason else ""))
    out.append(f"diagnosis {d.id} · engine {d.engine.version} · ruleset {d.engine.ruleset[:19]}")
    return "\n".join(out) + "\n"


def _cmd_analyze(args: argparse.Namespace) -> int:
    from hypocenter.collector import pull
    from hypocenter.engine import default_engine

    try:
        cfg = pull.merged(args)  # bad combinations fail before the rules are loaded
    except pull.UsageError as exc:
        args.parser.error(str(exc))  # usage and the message, exit 2
    engine = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules)
    if cfg.bundle and not (cfg.logs or cfg.loki or cfg.prometheus):
        from hypocenter.collector.bundle import load_bundle

        bundle = load_bundle(Path(cfg.bundle))
        diagnosis = engine.analyze(bundle.context, bundle.sources, bundle.coverage)
    else:
        diagnosis = pull.analyze(cfg, engine, pull.tty_progress)
    if args.format == "json":
        _emit(diagnosis.to_json(), utf8=True)
    else:
        _emit(render_text(diagnosis, _Style(_color_wanted(sys.stdout, args.color))))
    return EXIT_OK


def _emit(text: str, *, utf8: bool = False) -> None:
    """Write to stdout. JSON is UTF-8 whatever the locale; a report on a terminal that cannot show
    some character (PYTHONIOENCODING=ascii, a Latin-1 locale) gets '?' instead of a crash."""
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower().replace("-", "").replace("_", "")
    if encoding == "utf8":
        sys.stdout.write(text)
    elif utf8 and hasattr(sys.stdout, "buffer"):
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(text.encode(sys.stdout.encoding, errors="replace").decode(sys.stdout.encoding))


def _cmd_schema(args: argparse.Namespace) -> int:
    schema = Diagnosis.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://hypocenter.dev/schema/diagnosis/v1.json"
    # The model gives `schema` a default; every diagnosis carries it, with exactly this value.
    schema["properties"]["schema"] = {**schema["properties"]["schema"], "const": SCHEMA_ID}
    schema["required"] = ["schema", *(f for f in schema.get("required", []) if f != "schema")]
    sys.stdout.write(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return EXIT_OK


def _cmd_rules(args: argparse.Namespace) -> int:
    from hypocenter.cli.cases import lint, run_cases
    from hypocenter.engine import default_engine

    engine = default_engine([Path(p) for p in args.rules], builtin=not args.no_builtin_rules)
    rs = engine.ruleset
    if args.rules_cmd == "list":
        for r in rs.rules:
            role = ""
            if r.attribute:
                role = r.attribute.role + (f" {r.attribute.domain}/{r.attribute.subdomain}" if r.attribute.domain else "")
            kind = "analyzer" if r.analyzer else ("extract" if r.extract else "metric" if r.metric else "attribute")
            print(f"{r.id:<34} {r.status:<12} {kind:<9} {role:<34} {r.where}")
        print(f"{len(rs)} rules · {rs.fingerprint}")
        return EXIT_OK
    if args.rules_cmd == "check":
        problems = lint(rs)
        for p in problems:
            print(f"{p.where}: {p.rule}: {p.message}")
        cases = sum(len(r.cases) for r in rs.rules)
        print(f"{len(rs)} rules, {cases} cases, {len(problems)} problem(s)")
        return EXIT_PROBLEMS if problems else EXIT_OK
    results = run_cases(engine, only=args.rule)
    if args.rule and not results:
        print(f"hypocenter: no cases for rule {args.rule!r}", file=sys.stderr)
        return EXIT_INPUT
    failed = [r for r in results if not r.ok]
    for res in results:
        if not res.ok or args.verbose:
            mark = "ok  " if res.ok else "FAIL"
            print(f"{mark} {res.rule} · {res.case} [{res.expect}] · {res.detail} ({res.where})")
    misses = sum(1 for r in results if r.expect == "known_miss")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed ({misses} known misses)")
    return EXIT_PROBLEMS if failed else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hypocenter", description="Find where a failed distributed AI workload's failure began.")
    p.add_argument("--version", action="version", version=f"hypocenter {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    def rule_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="extra rule file or directory (repeatable); added to the built-in catalog")
        sp.add_argument("--no-builtin-rules", action="store_true", help="use only the --rules given")

    a = sub.add_parser("analyze", help="diagnose one attempt: a bundle directory, or a job pulled from the scheduler",
                       description="Diagnose one attempt. Give exactly one of BUNDLE, --slurm, --kueue, --k8s-job; "
                                   "--logs, --loki and --prometheus add evidence (see hypocenter/collector/pull.py).")
    a.add_argument("bundle", nargs="?", help="path to an attempt bundle directory (attempt.yaml, logs/, …)")
    pa = a.add_argument_group("pull from the scheduler (instead of BUNDLE)")
    pa.add_argument("--slurm", metavar="JOBID", help="a Slurm job: 81234, array task 81234_7, het component 81234+1")
    pa.add_argument("--slurm-rest", metavar="URL", help="ask slurmrestd at URL instead of sacct/scontrol (token: $SLURM_JWT)")
    pa.add_argument("--kueue", metavar="NS/WORKLOAD", help="a Kueue Workload")
    pa.add_argument("--k8s-job", metavar="NS/NAME", help="a JobSet, PyTorchJob or batch Job (NS/KIND/NAME to name the kind)")
    pa.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    pa.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current-context)")
    pa.add_argument("--logs", metavar="DIR", action="append", default=[],
                    help="a bundle-like directory: logs/<node>/<file>, metrics/, events/ (repeatable)")
    pa.add_argument("--loki", metavar="URL", help="pull the attempt's log lines from Loki (auth: $LOKI_BEARER_TOKEN, "
                    "$LOKI_USERNAME/$LOKI_PASSWORD, or token_file in --config)")
    pa.add_argument("--loki-node-label", metavar="LABEL", help="the Loki stream label naming a node (default: host)")
    pa.add_argument("--loki-workload-selector", metavar="SELECTOR",
                    help="LogQL matchers of the job's own logs, e.g. 'job=\"slurm\", slurm_job_id=\"{workload}\"' "
                         "({workload}, {attempt} filled in); without it job-level logs (stdout) are not pulled")
    pa.add_argument("--prometheus", metavar="URL", help="pull the rules' metric series from Prometheus (auth: "
                    "$PROMETHEUS_BEARER_TOKEN, $PROMETHEUS_USERNAME/$PROMETHEUS_PASSWORD, or token_file in --config)")
    pa.add_argument("--config", metavar="FILE", help="YAML naming the scope and sources; flags win over it")
    pa.add_argument("--timeout", metavar="S", type=float, help="seconds per connector call (default 30)")
    a.add_argument("--format", choices=("text", "json"), default="text", help="text report (default) or diagnosis JSON")
    a.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour the text report (auto: on a terminal)")
    rule_opts(a)
    a.set_defaults(func=_cmd_analyze, parser=a)

    s = sub.add_parser("schema", help="print the JSON Schema of the diagnosis (hypocenter.diagnosis/v1)")
    s.set_defaults(func=_cmd_schema)

    r = sub.add_parser("rules", help="list, lint or test the rule catalog")
    rsub = r.add_subparsers(dest="rules_cmd", required=True)
    for name, text in (("list", "list the rules"), ("check", "lint the catalog"), ("test", "run every rule's cases")):
        sp = rsub.add_parser(name, help=text)
        rule_opts(sp)
        if name == "test":
            sp.add_argument("--rule", help="run only this rule's cases")
            sp.add_argument("-v", "--verbose", action="store_true", help="show passing cases too")
        sp.set_defaults(func=_cmd_rules)
    from hypocenter.cli.backtest import add_backtest

    add_backtest(rsub)

    from hypocenter.cli.serve import add_commands  # serve, replay, config show

    add_commands(sub)
    from hypocenter.cli.fleet import add_commands as add_fleet

    add_fleet(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except InputError as exc:
        print(f"hypocenter: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("hypocenter: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("HYPOCENTER_DEBUG"):
            raise
        print(f"hypocenter: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
              "(this is a bug, please report it; HYPOCENTER_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(text: str) -> str:
    from hypocenter.config import redact_text  # an error may quote a URL with credentials in it

    text = redact_text(text)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())

