"""`hypocenter serve --help`: every setting of the model as a flag, grouped by purpose, with its
default and allowed values, all taken from the fields of `hypocenter.config.Settings`.

A group names its settings by pattern (first matching group wins); tests/test_config.py checks that
every field lands in a group, so a new setting cannot be left out of `--help`.
"""

from __future__ import annotations

import argparse
from fnmatch import fnmatchcase
from typing import Any, Literal, get_args, get_origin

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from hypocenter.config import ENV_PREFIX, SECRET_SETTINGS, Settings

GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "listeners",
        "where the server listens and how much one client may send or hold",
        (
            "*_listen",
            "max_message_bytes",
            "ingest_queue_records",
            "retry_after_s",
            "grpc_*",
            "http_*",
            "metrics_max_connections",
            "watch_max_per_client",
        ),
    ),
    (
        "security",
        "who may talk to the server (bearer tokens per role, TLS, client certificates; docs/security.md)",
        ("auth_*", "allow_unauthenticated", "metrics_auth", "tls_*"),
    ),
    (
        "store",
        "where records and diagnoses are kept, and for how long; replicas sharing one PostgreSQL",
        ("store", "store_*", "retention_*", "compact_after_s", "collapse_after_s", "replica_id", "lease_s"),
    ),
    (
        "analysis",
        "when an attempt is analysed, and with which rules",
        ("settle_s", "idle_timeout_s", "tick_s", "node_*", "rules", "no_builtin_rules"),
    ),
    (
        "push exports (diagnoses out)",
        "where the server sends what it finds: Prometheus /metrics, diagnoses "
        "pushed to Loki (--loki-url) and Grafana annotations; not where it reads logs from (that is the pulls "
        "group's --pull-loki-url, or `analyze --loki`)",
        ("metrics_*", "label_max_values", "loki_*", "grafana_*", "export_*"),
    ),
    (
        "pulls (evidence in)",
        "where the server reads an attempt's evidence when nothing was pushed to it, and "
        "which schedulers it polls for jobs that ended: the same connectors as `hypocenter "
        "analyze --loki`, `--prometheus` and `--slurm`. Credentials are never settings: logcli's variables "
        "LOKI_BEARER_TOKEN[_FILE], LOKI_USERNAME + LOKI_PASSWORD (Prometheus: PROMETHEUS_...). Those and "
        "LOKI_ORG_ID only fill in what the settings leave out: --pull-loki-tenant beats $LOKI_ORG_ID, as "
        "logcli's --org-id does, and as `tenant:` does for `analyze`",
        ("pull_*", "slurm_*", "kube*"),
    ),
    (
        "input bounds",
        "how much any one request, record, attempt or upload may expand to (docs/security.md)",
        (
            "max_records_per_request",
            "max_attributes_per_request",
            "max_concurrent_decodes",
            "max_ranks_per_attempt",
            "max_nodes_per_attempt",
            "bundle_max_*",
        ),
    ),
    (
        "fleet memory",
        "recurring culprits across workloads: scoring and the fabric topology",
        ("fleet_*", "topology"),
    ),
    (
        "cost of failures",
        "what the logs may not say about lost GPU-hours (docs/cost.md)",
        ("cost_*",),
    ),
    ("web UI", "the page at /ui: links to the attempt's logs in Grafana Explore", ("ui_*",)),
    ("logging", "", ("log_level",)),
)


def group_of(name: str) -> str | None:
    return next((title for title, _, patterns in GROUPS if any(fnmatchcase(name, p) for p in patterns)), None)


def _metavar(name: str, info: FieldInfo) -> str:
    if info.annotation is int:
        return "N"
    if info.annotation is float:
        return "SECONDS" if name.endswith("_s") else "NUMBER"
    if name.endswith("_listen"):
        return "HOST:PORT"
    if name.endswith("_url"):
        return "URL"
    if name.endswith(("_file", "kubeconfig")):
        return "PATH"
    return "TEXT"


def _default(name: str, info: FieldInfo) -> str:
    value: Any = info.get_default(call_default_factory=True)
    if isinstance(value, SecretStr) or name.endswith("_file"):
        return ""
    if isinstance(value, bool):
        return ""
    if value in ("", []):  # unless the description already says what empty means
        return "" if any(w in (info.description or "") for w in ("empty", "default")) else " (default: none)"
    return f" (default: {value})"


def _help(name: str, info: FieldInfo) -> str:
    text = (info.description or "").replace("%", "%%")
    return text + _default(name, info) + f" [{ENV_PREFIX}{name.upper()}]"


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """One flag per setting (dest `set_<name>`, default None so that unset flags do not override)."""
    groups = {title: p.add_argument_group(title, description or None) for title, description, _ in GROUPS}
    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        dest = f"set_{name}"
        if name in SECRET_SETTINGS:  # refused with a hint by load_settings; never listed
            p.add_argument(flag, dest=dest, default=None, help=argparse.SUPPRESS)
            continue
        g = groups[group_of(name) or "logging"]
        if info.annotation is bool:
            g.add_argument(
                flag, dest=dest, action="store_const", const=True, default=None, help=_help(name, info)
            )
        elif name in ("rules", "topology"):
            g.add_argument(
                flag, dest=dest, action="append", default=None, metavar="PATH", help=_help(name, info)
            )
        elif get_origin(info.annotation) is Literal:
            g.add_argument(
                flag,
                dest=dest,
                default=None,
                choices=[str(a) for a in get_args(info.annotation)],
                help=_help(name, info),
            )
        else:
            g.add_argument(
                flag, dest=dest, default=None, metavar=_metavar(name, info), help=_help(name, info)
            )
