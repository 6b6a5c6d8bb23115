"""`hypocenter analyze` in pull mode: name the attempt by a scheduler id, gather its evidence from
the systems the cluster already runs, and hand everything to the engine.

One scope (bundle, Slurm, Kueue, Kubernetes job) and any data sources (log folders, Loki,
Prometheus), from flags or a strict YAML `--config` file; flags win.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypocenter import strict_yaml
from hypocenter.collector import rankmap
from hypocenter.collector.connectors import connector_class
from hypocenter.collector.connectors.base import Collected, ConnectorError, RetryPolicy, Scope, merge
from hypocenter.config import HttpSource, LokiSource, PrometheusSource, is_http_url
from hypocenter.errors import InputError
from hypocenter.model import Coverage
from hypocenter.sources import AttemptInput, RuleQueries


class UsageError(InputError):
    """Flags that do not go together: the CLI shows its usage with the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
        raise InputError(
            f"{path}: expected a mapping of sources (slurm, logs, loki, …), not a {type(doc).__name__}"
        )
    try:
        cfg = PullConfig.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        line = getattr(doc, "key_lines", {}).get(err["loc"][0]) if err["loc"] else None
        where = f"{path}:{line}" if line else str(path)
        if err["type"] == "extra_forbidden":
            if loc[0] in ("loki", "prometheus") and loc[-1] in ("token", "password"):
                env = f"${loc[0].upper()}_{'BEARER_TOKEN' if loc[-1] == 'token' else 'PASSWORD'}"
                raise InputError(
                    f"{where}: {'.'.join(loc)}: secrets are not read from the config file: use "
                    f"{loc[-1]}_file (a file holding it), or set {env}"
                ) from None
            nested: dict[str, type[BaseModel]] = {"loki": LokiSource, "prometheus": PrometheusSource}
            known = ", ".join(
                nested.get(loc[0], PullConfig).model_fields if len(loc) > 1 else PullConfig.model_fields
            )
            raise InputError(f"{where}: unknown key {'.'.join(loc)!r} (known: {known})") from None
        raise InputError(
            f"{where}: {'.'.join(loc)}: {str(err['msg']).removeprefix('Value error, ')}"
        ) from None
    base = path.parent
    for name in ("bundle", "kubeconfig"):
        value = getattr(cfg, name)
        if value:
            setattr(cfg, name, str(base / Path(value).expanduser()))
    cfg.logs = [str(base / Path(p).expanduser()) for p in cfg.logs]
    for source in (cfg.loki, cfg.prometheus):
        for name in ("token_file", "password_file"):
            if source is not None and getattr(source, name):
                setattr(source, name, str(base / Path(getattr(source, name)).expanduser()))
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
    loki = {
        k: v
        for k, v in (
            ("url", getattr(args, "loki", None)),
            ("node_label", getattr(args, "loki_node_label", None)),
            ("workload_selector", getattr(args, "loki_workload_selector", None)),
        )
        if v is not None
    }
    if loki:
        if cfg.loki is None and "url" not in loki:
            raise UsageError(
                f"{_flag('loki_' + next(iter(loki)))} goes with --loki URL (or loki: in --config)"
            )
        cfg.loki = _updated(LokiSource, cfg.loki, loki)
    if getattr(args, "prometheus", None):
        cfg.prometheus = _updated(PrometheusSource, cfg.prometheus, {"url": args.prometheus})
    for name, source in (("loki", cfg.loki), ("prometheus", cfg.prometheus)):
        if source is not None and not source.url:
            raise UsageError(f"{name}: in --config needs a url (url: … there, or --{name} URL)")
    for flag, key, url in (
        ("--loki", "loki.url", cfg.loki.url if cfg.loki else None),
        ("--prometheus", "prometheus.url", cfg.prometheus.url if cfg.prometheus else None),
        ("--slurm-rest", "slurm_rest", cfg.slurm_rest),
    ):
        if url and not is_http_url(
            url
        ):  # else every query would fail alike, retried as if the server were down
            raise UsageError(f"{url!r} is not an http:// or https:// URL ({flag}, or {key} in --config)")
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {cfg.timeout:g}")
    scopes = [n for n in ("bundle", "slurm", "kueue", "k8s_job") if getattr(cfg, n)]
    if len(scopes) != 1:
        given = f" (given: {', '.join(_flag(s) for s in scopes)})" if scopes else ""
        raise UsageError(
            "give exactly one attempt to analyse: BUNDLE, --slurm JOBID, --kueue NS/WORKLOAD or "
            f"--k8s-job NS/NAME{given}"
        )
    if cfg.slurm_rest and not cfg.slurm:
        raise UsageError("--slurm-rest goes with --slurm JOBID")
    if (cfg.kubeconfig or cfg.context) and not (cfg.kueue or cfg.k8s_job):
        raise UsageError("--kubeconfig and --context go with --kueue or --k8s-job")
    return cfg


def _updated(model: type[HttpSource], old: HttpSource | None, changes: dict[str, Any]) -> Any:
    """The file's source with the flags' values, validated again."""
    try:
        return model.model_validate({**(old.model_dump() if old is not None else {}), **changes})
    except ValidationError as exc:
        raise UsageError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def _flag(name: str) -> str:
    return "BUNDLE" if name == "bundle" else "--" + name.replace("_", "-")


def gather(
    cfg: PullConfig, *, queries: RuleQueries, progress: Callable[[str], None] = lambda s: None
) -> AttemptInput:
    """Scope the attempt, then collect from every data source; see the module docstring for failures."""
    policy = RetryPolicy(timeout_s=cfg.timeout) if cfg.timeout else RetryPolicy()
    connectors = _data_connectors(
        cfg, policy, queries
    )  # a secret that cannot be read stops us before the pull
    if cfg.bundle:
        from hypocenter.collector.bundle import load_bundle

        bundle = load_bundle(Path(cfg.bundle))
        scope = Scope(
            context=bundle.context,
            collected=Collected(sources=bundle.sources, coverage=bundle.coverage),
            notes=bundle.notes,
        )
    else:
        scope = _scope(cfg, policy, progress)
    parts = [scope.collected]
    for name, make in connectors:
        progress(f"collecting from {name}")
        try:
            parts.append(make().collect(scope.context))
        except InputError:
            raise
        except Exception as exc:  # a data source never blocks the verdict: it is a failed coverage entry
            parts.append(
                Collected(
                    coverage=[
                        Coverage(
                            connector=name.split(" ")[0],
                            source=name,
                            status="failed",
                            observations=0,
                            reason=f"{type(exc).__name__}: {exc}",
                        )
                    ]
                )
            )
    merged = merge(parts)
    context, note = rankmap.rebuild(scope.context, scope.tasks, merged.sources)
    return AttemptInput(context, merged.sources, merged.coverage, scope.notes + ([note] if note else []))


def _scope(cfg: PullConfig, policy: RetryPolicy, progress: Callable[[str], None]) -> Scope:
    try:
        if cfg.slurm:
            progress(f"asking Slurm about job {cfg.slurm}")
            connector = connector_class("slurm")(cfg.slurm, policy=policy, rest_url=cfg.slurm_rest)
        else:
            kubernetes = connector_class("kubernetes")
            kwargs = {
                "kubeconfig": cfg.kubeconfig,
                "context": cfg.context,
                "policy": policy,
                "progress": progress,
            }
            connector = (
                kubernetes.for_kueue(cfg.kueue, **kwargs)
                if cfg.kueue
                else kubernetes.for_job(str(cfg.k8s_job), **kwargs)
            )
        scope: Scope = connector.scope()
        return scope
    except ConnectorError as exc:
        which = "slurm" if cfg.slurm else "kubernetes"
        raise InputError(f"{which}: {exc}") from None


def _data_connectors(
    cfg: PullConfig, policy: RetryPolicy, queries: RuleQueries, env: Mapping[str, str] = os.environ
) -> list[tuple[str, Callable[[], Any]]]:
    out: list[tuple[str, Callable[[], Any]]] = []
    for directory in cfg.logs:
        out.append((f"files {directory}", partial(_make, "files", "--logs", Path(directory))))
    if cfg.loki:
        out.append(
            (
                f"loki {cfg.loki.url}",
                partial(
                    _make,
                    "loki",
                    "--loki",
                    cfg.loki.url,
                    policy=policy,
                    queries=queries,
                    **cfg.loki.connector_arguments(env),
                ),
            )
        )
    if cfg.prometheus:
        out.append(
            (
                f"prometheus {cfg.prometheus.url}",
                partial(
                    _make,
                    "prometheus",
                    "--prometheus",
                    cfg.prometheus.url,
                    policy=policy,
                    queries=queries,
                    **cfg.prometheus.connector_arguments(env),
                ),
            )
        )
    return out


def _make(name: str, flag: str, *args: Any, **kwargs: Any) -> Any:
    try:
        cls = connector_class(name)
    except ConnectorError:
        raise InputError(
            f"{flag} needs the {name} connector (hypocenter.collector.connectors.{name}), which this "
            "installation does not have"
        ) from None
    try:
        return cls(*args, **kwargs)
    except TypeError:  # a connector that takes no rule queries
        kwargs.pop("queries", None)
        return cls(*args, **kwargs)


def tty_progress(text: str) -> None:
    """Short progress lines on stderr, only for a person watching a terminal."""
    if sys.stderr.isatty():
        print(f"hypocenter: {text}", file=sys.stderr, flush=True)
