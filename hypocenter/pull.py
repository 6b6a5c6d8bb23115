"""`hypocenter analyze` in pull mode: name the attempt by a scheduler id, gather its evidence from
the systems the cluster already runs, and hand everything to the engine.

    exactly one scope     BUNDLE | --slurm JOBID [--slurm-rest URL] | --kueue NS/WORKLOAD
                          | --k8s-job NS/NAME [--kubeconfig PATH] [--context NAME]
    any data sources      --logs DIR (repeatable) | --loki URL | --prometheus URL
    both from a file      --config FILE (YAML, strict: unknown keys and duplicates are errors)

    # pull.yaml — every key optional; flags win over the file; paths are relative to the file
    slurm: "81234"            # or kueue: NS/WORKLOAD, k8s_job: NS/NAME, bundle: DIR
    slurm_rest: https://slurmrestd:6820
    kubeconfig: ~/.kube/config
    context: prod
    logs: [/shared/collected/81234]
    loki: {url: https://loki:3100, tenant: team-a, headers: {X-Custom: v}}   # or loki: URL
    prometheus: {url: https://prometheus:9090}                              # or prometheus: URL
    timeout: 30               # seconds per call

A scope connector that cannot name the attempt stops the command (exit 2, one `hypocenter:` line);
a data connector that fails is a failed coverage entry and the verdict is given without it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypocenter import strict_yaml
from hypocenter.collector.connectors import connector_class
from hypocenter.collector.connectors.base import Collected, ConnectorError, RetryPolicy, Scope, merge
from hypocenter.errors import InputError
from hypocenter.model import AttemptContext, Coverage, Diagnosis


class UsageError(InputError):
    """Flags that do not go together: the CLI shows its usage with the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LokiSource(_Strict):
    url: str
    tenant: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class PrometheusSource(_Strict):
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


class PullConfig(_Strict):
    """The --config file; the same fields as the flags."""

    bundle: str | None = None
    slurm: str | None = None
    slurm_rest: str | None = None
    kueue: str | None = None
    k8s_job: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    logs: list[str] = Field(default_factory=list)
    loki: LokiSource | None = None
    prometheus: PrometheusSource | None = None
    timeout: float | None = Field(default=None, gt=0)

    @field_validator("slurm", mode="before")
    @classmethod
    def _job_id_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v

    @field_validator("logs", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("loki", "prometheus", mode="before")
    @classmethod
    def _url_alone(cls, v: object) -> object:
        return {"url": v} if isinstance(v, str) else v


def load_config(path: Path) -> PullConfig:
    doc = strict_yaml.load_file(path, display=str(path))
    if doc is None:
        return PullConfig()
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping of sources (slurm, logs, loki, …), not a {type(doc).__name__}")
    try:
        cfg = PullConfig.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        line = getattr(doc, "key_lines", {}).get(err["loc"][0]) if err["loc"] else None
        where = f"{path}:{line}" if line else str(path)
        if err["type"] == "extra_forbidden":
            known = ", ".join(PullConfig.model_fields)
            raise InputError(f"{where}: unknown key {'.'.join(loc)!r} (known: {known})") from None
        raise InputError(f"{where}: {'.'.join(loc)}: {str(err['msg']).removeprefix('Value error, ')}") from None
    base = path.parent
    for name in ("bundle", "kubeconfig"):
        value = getattr(cfg, name)
        if value:
            setattr(cfg, name, str(base / Path(value).expanduser()))
    cfg.logs = [str(base / Path(p).expanduser()) for p in cfg.logs]
    return cfg


def merged(args: Any) -> PullConfig:
    """The config file (if any) overridden by the flags that were given."""
    cfg = load_config(Path(args.config)) if getattr(args, "config", None) else PullConfig()
    for name in ("bundle", "slurm", "slurm_rest", "kueue", "k8s_job", "kubeconfig", "context", "timeout"):
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, value)
    if getattr(args, "logs", None):
        cfg.logs = list(args.logs)
    if getattr(args, "loki", None):
        cfg.loki = LokiSource(url=args.loki, tenant=cfg.loki.tenant if cfg.loki else None,
                              headers=cfg.loki.headers if cfg.loki else {})
    if getattr(args, "prometheus", None):
        cfg.prometheus = PrometheusSource(url=args.prometheus, headers=cfg.prometheus.headers if cfg.prometheus else {})
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {cfg.timeout:g}")
    scopes = [n for n in ("bundle", "slurm", "kueue", "k8s_job") if getattr(cfg, n)]
    if len(scopes) != 1:
        given = f" (given: {', '.join(_flag(s) for s in scopes)})" if scopes else ""
        raise UsageError("give exactly one attempt to analyse: BUNDLE, --slurm JOBID, --kueue NS/WORKLOAD or "
                         f"--k8s-job NS/NAME{given}")
    if cfg.slurm_rest and not cfg.slurm:
        raise UsageError("--slurm-rest goes with --slurm JOBID")
    if (cfg.kubeconfig or cfg.context) and not (cfg.kueue or cfg.k8s_job):
        raise UsageError("--kubeconfig and --context go with --kueue or --k8s-job")
    return cfg


def _flag(name: str) -> str:
    return "BUNDLE" if name == "bundle" else "--" + name.replace("_", "-")


@dataclass
class Gathered:
    context: AttemptContext
    collected: Collected
    notes: list[str] = field(default_factory=list)


def gather(cfg: PullConfig, *, ruleset: Any = None, progress: Callable[[str], None] = lambda s: None) -> Gathered:
    """Scope the attempt, then collect from every data source; see the module docstring for failures."""
    policy = RetryPolicy(timeout_s=cfg.timeout) if cfg.timeout else RetryPolicy()
    if cfg.bundle:
        from hypocenter.collector.bundle import load_bundle

        bundle = load_bundle(Path(cfg.bundle))
        scope = Scope(context=bundle.context, collected=Collected(sources=bundle.sources, coverage=bundle.coverage))
    else:
        scope = _scope(cfg, policy, progress)
    parts = [scope.collected]
    for name, make in _data_connectors(cfg, policy, ruleset):
        progress(f"collecting from {name}")
        try:
            parts.append(make().collect(scope.context))
        except InputError:
            raise
        except Exception as exc:  # a data source never blocks the verdict: it is a failed coverage entry
            parts.append(Collected(coverage=[Coverage(connector=name.split(" ")[0], source=name, status="failed",
                                                      observations=0, reason=f"{type(exc).__name__}: {exc}")]))
    return Gathered(scope.context, merge(parts), scope.notes)


def _scope(cfg: PullConfig, policy: RetryPolicy, progress: Callable[[str], None]) -> Scope:
    try:
        if cfg.slurm:
            progress(f"asking Slurm about job {cfg.slurm}")
            connector = connector_class("slurm")(cfg.slurm, policy=policy, rest_url=cfg.slurm_rest)
        else:
            kubernetes = connector_class("kubernetes")
            kwargs = {"kubeconfig": cfg.kubeconfig, "context": cfg.context, "policy": policy, "progress": progress}
            connector = (kubernetes.for_kueue(cfg.kueue, **kwargs) if cfg.kueue
                         else kubernetes.for_job(str(cfg.k8s_job), **kwargs))
        scope: Scope = connector.scope()
        return scope
    except ConnectorError as exc:
        which = "slurm" if cfg.slurm else "kubernetes"
        raise InputError(f"{which}: {exc}") from None


def _data_connectors(cfg: PullConfig, policy: RetryPolicy, ruleset: Any) -> list[tuple[str, Callable[[], Any]]]:
    out: list[tuple[str, Callable[[], Any]]] = []
    for directory in cfg.logs:
        out.append((f"files {directory}", partial(_make, "files", "--logs", Path(directory))))
    if cfg.loki:
        loki = cfg.loki
        out.append((f"loki {loki.url}", lambda: _make("loki", "--loki", loki.url, policy=policy,
                                                      headers=loki.headers or None, tenant=loki.tenant, ruleset=ruleset)))
    if cfg.prometheus:
        prom = cfg.prometheus
        out.append((f"prometheus {prom.url}", lambda: _make("prometheus", "--prometheus", prom.url, policy=policy,
                                                            headers=prom.headers or None, ruleset=ruleset)))
    return out


def _make(name: str, flag: str, *args: Any, **kwargs: Any) -> Any:
    try:
        cls = connector_class(name)
    except ConnectorError:
        raise InputError(f"{flag} needs the {name} connector (hypocenter.collector.connectors.{name}), which this "
                         "installation does not have") from None
    if kwargs.get("ruleset") is None:
        kwargs.pop("ruleset", None)
    try:
        return cls(*args, **kwargs)
    except TypeError:  # a connector without the optional ruleset hook
        kwargs.pop("ruleset", None)
        return cls(*args, **kwargs)


def analyze(cfg: PullConfig, engine: Any, progress: Callable[[str], None]) -> Diagnosis:
    got = gather(cfg, ruleset=getattr(engine, "ruleset", None), progress=progress)
    for note in got.notes:
        progress(note)
    progress("analysing")
    diagnosis: Diagnosis = engine.analyze(got.context, got.collected.sources, got.collected.coverage)
    return diagnosis


def tty_progress(text: str) -> None:
    """Short progress lines on stderr, only for a person watching a terminal."""
    if sys.stderr.isatty():
        print(f"hypocenter: {text}", file=sys.stderr, flush=True)
