"""The one settings model of `hypocenter serve` and where each value comes from.

Precedence: defaults < YAML file < HYPOCENTER_<FIELD> environment < flags. Fields are flat, so the
file key, variable and flag are one name; a bad value is an `InputError` naming its origin.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from hypocenter import strict_yaml
from hypocenter.errors import InputError
from hypocenter.limits import DEFAULT as DEFAULT_LIMITS

ENV_PREFIX = "HYPOCENTER_"
CONFIG_ENV = "HYPOCENTER_CONFIG"


# ------------------------------------------------------------------------------- pull data sources


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HttpSource(_Strict):
    """A pull data source behind HTTP: where it is and how to authenticate to it."""

    url: str = ""  # `analyze` may take it from --loki / --prometheus instead
    headers: dict[str, str] = Field(default_factory=dict)
    token_file: str | None = None
    username: str | None = None
    password_file: str | None = None

    kind: ClassVar[str]  # the config key, and (upper case) the prefix of its environment variables

    def auth(self, env: Mapping[str, str]) -> dict[str, Any]:
        """`token` / `basic_auth` for the connector: each part from this source's own value if it has one,
        else from the ambient variables (module docstring); a file that cannot be read is a one-line error."""
        prefix = self.kind.upper()
        token = (
            _source_secret(self.token_file, f"{self.kind}.token_file")
            or env.get(f"{prefix}_BEARER_TOKEN")
            or _source_secret(env.get(f"{prefix}_BEARER_TOKEN_FILE"), f"${prefix}_BEARER_TOKEN_FILE")
        )
        username = self.username or env.get(f"{prefix}_USERNAME")
        password = _source_secret(self.password_file, f"{self.kind}.password_file")
        if password is None:
            password = env.get(f"{prefix}_PASSWORD")
        if token:
            return {"token": token}
        if username and password is None:
            raise InputError(
                f"{self.kind}: username {username!r} without a password (password_file, or "
                f"${prefix}_PASSWORD)"
            )
        return {"basic_auth": (username or "", password)} if password is not None else {}


def _source_secret(path: str | None, what: str) -> str | None:
    if not path:
        return None
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


def metadata_without_selector(kind: str, selector: str | None, prefix: str = "") -> str | None:
    """Why a Loki source whose node label is structured metadata cannot work without a selector, in the
    key names of the settings (`prefix` = "pull_loki_") or of `--config` (""); None when it can."""
    if kind != "metadata" or selector:
        return None
    return (
        f"{prefix}node_label_kind: metadata needs {prefix or 'a '}selector naming the streams (Loki filters "
        'structured metadata only after a stream selector; e.g. service_name=~".+")'
    )


class LokiSource(HttpSource):
    kind: ClassVar[str] = "loki"
    tenant: str | None = None
    node_label: str = "host"
    node_label_kind: Literal["index", "metadata"] = "index"
    selector: str | None = None
    workload_selector: str | None = None

    @model_validator(mode="after")
    def _metadata_needs_selector(self) -> LokiSource:
        problem = metadata_without_selector(self.node_label_kind, self.selector)
        if problem:
            raise ValueError(problem)
        return self

    def connector_arguments(self, env: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments of `LokiConnector(url, ...)` (besides policy, queries and the window)."""
        return {
            "headers": self.headers or None,
            "tenant": self.tenant or env.get("LOKI_ORG_ID") or None,
            "node_label": self.node_label,
            "node_label_kind": self.node_label_kind,
            "selector": self.selector or None,
            "workload_selector": self.workload_selector or None,
            **self.auth(env),
        }


class PrometheusSource(HttpSource):
    kind: ClassVar[str] = "prometheus"
    node_labels: list[str] | None = Field(default=None, min_length=1)
    resolution_s: float | None = Field(default=None, gt=0)

    @field_validator("node_labels", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    def connector_arguments(self, env: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments of `PrometheusConnector(url, ...)` (besides policy, queries and the window)."""
        options = {
            k: v
            for k, v in (("node_labels", self.node_labels), ("resolution_s", self.resolution_s))
            if v is not None
        }
        return {"headers": self.headers or None, **options, **self.auth(env)}


class Settings(BaseSettings):
    """Everything `hypocenter serve` can be told. Field descriptions are the documentation."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    grpc_listen: str = Field(
        "127.0.0.1:4317", description="OTLP/gRPC and hypocenter.v1 gRPC address (host:port; port 0 = any)"
    )
    http_listen: str = Field(
        "127.0.0.1:4318", description="OTLP/HTTP and REST address (host:port; port 0 = any)"
    )
    store: str = Field(
        "hypocenter.db",
        description="SQLite file path (or sqlite:///path; created if missing), or "
        "postgresql://user:password@host:port/database (needs hypocenter[postgresql])",
    )
    store_synchronous: Literal["NORMAL", "FULL", "EXTRA"] = Field(
        "FULL",
        description="SQLite synchronous mode: FULL survives power loss, NORMAL only process crashes "
        "(PostgreSQL: not used, its commits are durable)",
    )
    max_message_bytes: int = Field(64 << 20, ge=1024, description="largest OTLP request, after decompression")
    # Bounds on what input expands to (hypocenter/limits.py; docs/security.md "Bounded input").
    max_records_per_request: int = Field(
        DEFAULT_LIMITS.max_records_per_request,
        ge=1,
        description="log records + metric points in one OTLP request (more: 413 / RESOURCE_EXHAUSTED)",
    )
    max_attributes_per_request: int = Field(
        DEFAULT_LIMITS.max_attributes_per_request,
        ge=1,
        description="attributes (key-value pairs, nested ones included) of one OTLP/JSON request, "
        "counted before it is parsed (more: 413)",
    )
    max_concurrent_decodes: int = Field(
        DEFAULT_LIMITS.max_concurrent_decodes,
        ge=1,
        le=256,
        description="OTLP requests decompressed and decoded at "
        "once (each may take several times max_message_bytes of memory); others wait",
    )
    max_ranks_per_attempt: int = Field(
        DEFAULT_LIMITS.max_ranks_per_attempt,
        ge=1,
        description="ranks an attempt's rank map may name (more: 422, "
        "or the attempt's analysis fails with the reason)",
    )
    max_nodes_per_attempt: int = Field(
        DEFAULT_LIMITS.max_nodes_per_attempt,
        ge=1,
        description="nodes of one attempt, and hosts one Slurm hostlist may expand to",
    )
    bundle_max_members: int = Field(
        DEFAULT_LIMITS.bundle_max_members,
        ge=1,
        description="entries of an uploaded bundle archive (more: 413)",
    )
    bundle_max_member_bytes: int = Field(
        DEFAULT_LIMITS.bundle_max_member_bytes,
        ge=1,
        description="one file of an uploaded bundle, after decompression (more: 413)",
    )
    bundle_max_bytes: int = Field(
        DEFAULT_LIMITS.bundle_max_bytes,
        ge=1,
        description="all files of an uploaded "
        "bundle together, after decompression; past 16 MiB spooled to one anonymous temporary file "
        "(TMPDIR), never extracted",
    )
    bundle_max_ratio: int = Field(
        DEFAULT_LIMITS.bundle_max_ratio,
        ge=1,
        description="decompressed / uploaded bytes of a bundle, once past 16 MiB (a compression bomb: 413)",
    )
    ingest_queue_records: int = Field(
        200_000, ge=1, description="records waiting for the store before OTLP answers UNAVAILABLE / 503"
    )
    retry_after_s: float = Field(
        1.0, gt=0, description="back-off sent with UNAVAILABLE (RetryInfo) and 503 (Retry-After)"
    )
    grpc_workers: int = Field(
        8, ge=1, le=256, description="gRPC worker threads (at most half of them hold WatchDiagnoses streams)"
    )
    settle_s: float = Field(
        10.0, ge=0, description="quiet time after a terminal state before the attempt is analysed"
    )
    idle_timeout_s: float = Field(
        900.0, gt=0, description="an attempt quiet this long is analysed (provisional if not ended)"
    )
    tick_s: float = Field(
        0.5, gt=0, le=60, description="how often the analysis loop looks for attempts that are due"
    )
    replica_id: str = Field(
        "",
        description="this replica's name among replicas sharing a PostgreSQL store "
        "(empty: host name and process id)",
    )
    lease_s: float = Field(
        15.0,
        ge=1,
        le=600,
        description="replicas on one PostgreSQL: a scheduler poll or the outbox moves to another replica "
        "this long after its holder stops",
    )
    node_lookback_s: float = Field(
        3600.0, ge=0, description="a node stream with records this long before an attempt's window joins it"
    )
    node_slack_s: float = Field(
        600.0, ge=0, description="a node stream with records this long after an attempt's window joins it"
    )
    retention_max_age_s: float = Field(7 * 86400.0, gt=0, description="accepted records are kept this long")
    retention_max_lines_per_stream: int = Field(
        1_000_000, ge=1, description="oldest lines beyond this are removed per stream"
    )
    retention_diagnoses_max_age_s: float = Field(
        90 * 86400.0, gt=0, description="diagnoses are kept this long"
    )
    retention_interval_s: float = Field(300.0, gt=0, description="how often retention and compaction run")
    compact_after_s: float = Field(
        1800.0,
        ge=-1,
        description="once a log line is this old, its text is blanked unless a rule can read it "
        "(a token line, its context, the stamps it inherits); -1 = never",
    )
    store_every_line: bool = Field(
        False,
        description="store a row per log line as it arrives (compaction blanks them later) instead of "
        "reducing each record-numbered stream to its evidence lines and gap rows on arrival",
    )
    collapse_after_s: float = Field(
        86400.0,
        ge=-1,
        description="once blanked this long (retries of those records are no longer expected), "
        "each run of blanked lines is merged into one row; -1 = keep one row per line until retention",
    )
    # Pull connectors (server/pulls.py): the same ones as `hypocenter analyze --slurm/--loki/--prometheus`.
    pull_loki_url: str = Field(
        "",
        description="Loki to read an attempt's logs from when none arrived over OTLP "
        "(e.g. http://loki:3100); empty = off",
    )
    pull_loki_tenant: str = Field(
        "", description="X-Scope-OrgID for pull_loki_url (empty: $LOKI_ORG_ID, if set)"
    )
    pull_loki_node_label: str = Field("host", description="the Loki stream label that names a node")
    pull_loki_node_label_kind: Literal["index", "metadata"] = Field(
        "index",
        description="index: pull_loki_node_label is a stream label; metadata: structured metadata, as "
        "Loki's own OTLP endpoint keeps host.name (host_name), filtered after pull_loki_selector (docs/loki.md)",
    )
    pull_loki_selector: str = Field(
        "",
        description="fixed LogQL matchers added to every node query (e.g. "
        'service_name=~".+"); required when pull_loki_node_label_kind is metadata',
    )
    pull_loki_workload_selector: str = Field(
        "",
        description="LogQL stream selector of a job's own logs, "
        '{workload} filled in (e.g. {job="slurm", workload="{workload}"}); '
        "empty = node streams only",
    )
    pull_prometheus_url: str = Field(
        "",
        description="Prometheus to read the metric rules' series from when none "
        "arrived over OTLP (e.g. http://prometheus:9090); empty = off",
    )
    pull_timeout_s: float = Field(
        30.0, gt=0, description="timeout of one pull connector call (retried with back-off)"
    )
    slurm_poll_s: float = Field(
        0.0,
        ge=0,
        description="ask Slurm accounting (sacct) this often for jobs that ended, and analyse each (0 = off)",
    )
    slurm_poll_lookback_s: float = Field(3600.0, gt=0, description="how far back the first Slurm poll looks")
    slurm_rest_url: str = Field(
        "",
        description="slurmrestd URL to scope polled jobs with (JWT in $SLURM_JWT); "
        "empty = the client commands",
    )
    kubeconfig: str = Field(
        "",
        description="kubeconfig for the Kueue poll and POST /v1/scopes (empty: in-cluster "
        "service account, else $KUBECONFIG or ~/.kube/config)",
    )
    kube_context: str = Field("", description="kubeconfig context to use (empty: its current-context)")
    kube_poll_s: float = Field(
        0.0,
        ge=0,
        description="list Kueue Workloads this often for ones that finished or "
        "were evicted, and analyse each (0 = off)",
    )
    kube_poll_lookback_s: float = Field(3600.0, gt=0, description="how far back the first Kueue poll looks")
    rules: list[str] = Field(default_factory=list, description="extra rule files or directories")
    no_builtin_rules: bool = Field(False, description="use only the extra rules")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="server log level")
    # Outputs (server/outputs.py): Prometheus /metrics, and diagnoses pushed through the outbox.
    metrics_listen: str = Field(
        "127.0.0.1:9464", description="Prometheus /metrics address (host:port; port 0 = any; empty = off)"
    )
    metrics_window_s: float = Field(
        86400.0, gt=0, description="window of the hypocenter_recent_* gauges (culprit nodes, GPUs, ports)"
    )
    metrics_top_n: int = Field(
        20,
        ge=1,
        le=1000,
        description='culprit nodes / components exposed by name; the rest are summed as "other"',
    )
    loki_url: str = Field(
        "", description="Loki base URL to push diagnoses to (e.g. http://loki:3100); empty = off"
    )
    loki_encoding: Literal["protobuf", "json"] = Field(
        "protobuf", description="Loki push body: snappy protobuf or gzip JSON"
    )
    loki_tenant: str = Field("", description="X-Scope-OrgID sent to a multi-tenant Loki")
    loki_basic_auth: SecretStr = Field(
        SecretStr(""),
        description="user:password for a Loki behind basic auth; "
        "environment only (HYPOCENTER_LOKI_BASIC_AUTH), or loki_basic_auth_file",
    )
    loki_basic_auth_file: str = Field(
        "", description="file holding user:password for a Loki behind basic auth"
    )
    grafana_url: str = Field("", description="Grafana base URL to add diagnosis annotations to; empty = off")
    grafana_token: SecretStr = Field(
        SecretStr(""),
        description="Grafana service-account token (annotations:create); "
        "environment only (HYPOCENTER_GRAFANA_TOKEN), or grafana_token_file",
    )
    grafana_token_file: str = Field("", description="file holding the Grafana service-account token")
    grafana_dashboard_uid: str = Field(
        "", description="attach annotations to this dashboard (default: organisation-wide)"
    )
    # The web UI (api/ui/): links from a diagnosis to its attempt's logs in Grafana Explore.
    ui_grafana_url: str = Field(
        "",
        description="Grafana base URL the web UI links to (Explore on the attempt's logs); empty = no links",
    )
    ui_loki_datasource_uid: str = Field(
        "", description="uid of the Loki data source in ui_grafana_url's Grafana"
    )
    ui_loki_node_label: str = Field(
        "host", description="the Loki stream label that names a node, for those links"
    )
    export_timeout_s: float = Field(10.0, gt=0, description="timeout of one Loki / Grafana request")
    export_retry_max_s: float = Field(
        300.0, gt=0, description="longest back-off between retries of a failing exporter"
    )
    export_max_age_s: float = Field(
        6 * 86400.0,
        gt=0,
        description="a diagnosis not delivered by then is dropped (Loki refuses week-old entries)",
    )

    # Fleet memory (engine/fleet.py): recurring culprits across workloads.
    fleet_window_s: float = Field(
        30 * 86400.0, gt=0, description="how far back the fleet view looks at diagnoses"
    )
    fleet_half_life_s: float = Field(
        7 * 86400.0, gt=0, description="a failure this old counts half in a suspect's score"
    )
    fleet_min_workloads: int = Field(
        2, ge=1, description="distinct workloads behind a suspect before it is a finding"
    )
    fleet_top_k: int = Field(
        20, ge=1, le=1000, description="suspects exposed by /metrics (hypocenter_fleet_suspect_score)"
    )
    # The cost of failures (engine/cost.py, engine/fleet_cost.py, docs/cost.md).
    cost_window_s: float = Field(
        7 * 86400.0,
        gt=0,
        description="the window of GET /v1/fleet/cost and the hypocenter_cost_* gauges (alerts read them)",
    )
    cost_gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs per node when an attempt has no rank map and no DCGM series"
    )
    cost_checkpoint_interval_steps: int | None = Field(
        None,
        ge=1,
        description="checkpoint interval in steps: places the last checkpoint when no checkpoint-saved line does",
    )
    topology: list[str] = Field(
        default_factory=list,
        description="files or directories mapping host ports to switch "
        "ports: topology YAML, ibnetdiscover output, lldpctl -f json (<host>.json)",
    )

    # Who may talk to the server, and how (api/auth.py, api/tls.py; docs/security.md).
    auth_tokens_file: str = Field(
        "",
        description="YAML file mapping each role (ingest | read | admin) to a list of "
        "bearer tokens; tokens also come from HYPOCENTER_AUTH_TOKEN_INGEST/_READ/_ADMIN",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="listen off loopback without tokens or client certificates "
        "(anyone who reaches a port may do anything); logs a warning at start",
    )
    metrics_auth: bool = Field(
        False,
        description="/metrics asks for a token with the read role like the REST API, on loopback too "
        "(off loopback it always does when tokens or client certificates are configured)",
    )
    tls_cert_file: str = Field(
        "",
        description="PEM certificate chain served on every listener (reloaded when it "
        "changes); empty = plaintext",
    )
    tls_key_file: str = Field("", description="PEM private key of tls_cert_file")
    tls_client_ca_file: str = Field(
        "",
        description="PEM CA bundle: clients presenting a certificate it signed are "
        "authenticated by it (mTLS; required on gRPC, optional on HTTP)",
    )
    tls_client_roles: str = Field(
        "",
        description="roles of client certificates by subject CN, e.g. "
        '"collector-eos=ingest,alice=admin"; other verified clients get tls_client_default_role',
    )
    tls_client_default_role: Literal["ingest", "read", "admin", "none"] = Field(
        "ingest", description="role of a verified client certificate whose CN is not in tls_client_roles"
    )
    tls_reload_s: float = Field(
        2.0, gt=0, description="how often the certificate files are checked for a change"
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="an idle HTTP keep-alive connection is closed after this"
    )
    http_request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="an HTTP client must send a request's headers, and each part of its body, within "
        "this; a gRPC client must finish its handshake within it",
    )
    grpc_keepalive_s: float = Field(
        60.0, gt=0, description="the gRPC server pings an idle connection this often"
    )
    grpc_keepalive_timeout_s: float = Field(
        20.0,
        gt=0,
        description="a gRPC connection whose ping is not answered within this is closed (a dead peer)",
    )
    grpc_max_connection_idle_s: float = Field(
        300.0,
        gt=0,
        description="a gRPC connection with no RPC for this long "
        "is closed (GOAWAY; clients reconnect on demand)",
    )
    grpc_max_connection_age_s: float = Field(
        0.0,
        ge=0,
        description="a gRPC connection is closed after this long, "
        "its RPCs given 30 s to finish (0 = no limit; WatchDiagnoses reconnect)",
    )
    # Listener limits (api/listener_limits.py; docs/security.md "Listener limits").
    grpc_receive_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a gRPC call whose request message has not arrived this long after its "
        "credentials were accepted is cancelled (a call without valid credentials is refused at once)",
    )
    grpc_max_concurrent_rpcs: int = Field(
        1000,
        ge=0,
        description="gRPC calls in progress or waiting for a worker, all connections together; "
        "more are refused RESOURCE_EXHAUSTED at once (0 = no limit)",
    )
    grpc_max_streams_per_connection: int = Field(
        100, ge=1, description="concurrent gRPC calls (HTTP/2 streams) one connection may open"
    )
    http_request_deadline_s: float = Field(
        60.0,
        gt=0,
        description="an HTTP request's headers and body must all arrive within this, however steadily "
        "they trickle in (counted from its first byte); then the connection is closed",
    )
    http_max_connections: int = Field(
        1000,
        ge=1,
        description="open HTTP connections (REST, OTLP/HTTP, UI) in all; more are answered 503 and "
        "closed at once. Kept to at most half the process' open-file limit",
    )
    http_max_connections_per_client: int = Field(
        128,
        ge=1,
        description="open HTTP connections from one client address (behind a proxy or load balancer "
        "that does not keep the client's address, raise it to http_max_connections)",
    )
    metrics_max_connections: int = Field(
        64,
        ge=1,
        description="open /metrics connections (each holds a thread); more are answered 503 and "
        "closed. http_request_deadline_s applies to /metrics requests too",
    )
    http_body_budget_bytes: int = Field(
        256 << 20,
        ge=1024,
        description="request body bytes held by all HTTP requests in progress together (at least "
        "max_message_bytes); a request that does not fit is answered 503 with Retry-After",
    )
    watch_max_per_client: int = Field(
        2,
        ge=1,
        description="WatchDiagnoses streams one client (token, certificate, "
        "or address when anonymous) may hold at once",
    )
    label_max_values: int = Field(
        100,
        ge=1,
        description="distinct values of a client-supplied exported label "
        '(cluster) kept in /metrics and Loki; later ones become "other" and are counted',
    )

    @field_validator(
        "pull_loki_url", "pull_prometheus_url", "slurm_rest_url", "loki_url", "grafana_url", "ui_grafana_url"
    )
    @classmethod
    def _http_url(cls, v: str) -> str:
        # Caught here, not as requests that fail (and are retried) forever: httpx calls a URL without a
        # scheme a transport error, which looks like a server that is down.
        if v and not is_http_url(v):
            raise ValueError(f"{v!r} is not an http:// or https:// URL (e.g. http://loki:3100)")
        return v

    @model_validator(mode="after")
    def _budget_holds_a_message(self) -> Settings:
        if self.http_body_budget_bytes < self.max_message_bytes:
            raise ValueError(
                f"http_body_budget_bytes ({self.http_body_budget_bytes}) must be at least max_message_bytes "
                f"({self.max_message_bytes}): the largest request must fit in it"
            )
        return self

    @model_validator(mode="after")
    def _metadata_needs_selector(self) -> Settings:
        problem = metadata_without_selector(
            self.pull_loki_node_label_kind, self.pull_loki_selector, "pull_loki_"
        )
        if problem:
            raise ValueError(problem)
        return self

    @property
    def pull_loki(self) -> LokiSource | None:
        """The Loki `serve` pulls from (the `pull_loki_*` settings), as `analyze --loki` would describe it."""
        if not self.pull_loki_url:
            return None
        return LokiSource(
            url=self.pull_loki_url,
            tenant=self.pull_loki_tenant or None,
            node_label=self.pull_loki_node_label,
            node_label_kind=self.pull_loki_node_label_kind,
            selector=self.pull_loki_selector or None,
            workload_selector=self.pull_loki_workload_selector or None,
        )

    @property
    def pull_prometheus(self) -> PrometheusSource | None:
        """The Prometheus `serve` pulls from (`pull_prometheus_url`), as `analyze --prometheus` would."""
        return PrometheusSource(url=self.pull_prometheus_url) if self.pull_prometheus_url else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init = flags and the file, merged by `load_settings` in precedence order; env sits between.
        return (init_settings,)


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """HYPOCENTER_* variables decoded the pydantic-settings way (JSON for lists)."""
    source = EnvSettingsSource(Settings, case_sensitive=False, env_prefix=ENV_PREFIX)
    source.env_vars = {k.lower(): v for k, v in environ.items()}
    out: dict[str, Any] = {}
    for name, info in Settings.model_fields.items():
        value, _, complex_ = source.get_field_value(info, name)
        if value is not None:
            try:
                out[name] = source.prepare_field_value(name, info, value, complex_)
            except ValueError as exc:
                raise InputError(f"{ENV_PREFIX}{name.upper()}: {exc}") from None
    return out


def _file_values(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    if not path.is_file():
        raise InputError(f"{path}: no such config file")
    doc = strict_yaml.load_file(path, display=str(path))
    if doc is None:
        return {}, {}
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping of settings, not a {type(doc).__name__}")
    lines: dict[str, int] = getattr(doc, "key_lines", {})
    where: dict[str, str] = {}
    for key in doc:
        line = lines.get(key) or getattr(doc, "line", 0)
        where[str(key)] = f"{path}:{line}" if line else str(path)
        if key not in Settings.model_fields:
            hint = get_close_matches(str(key), list(Settings.model_fields), n=1)
            tip = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise InputError(f"{where[str(key)]}: unknown setting {key!r}{tip}")
    return dict(doc), where


def load_settings(
    flags: Mapping[str, Any] | None = None,
    config: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """Effective settings and, per field, where its value came from (default, file:line, env VAR, flag)."""
    env = dict(os.environ if environ is None else environ)
    flag_values = {k: v for k, v in (flags or {}).items() if v is not None}
    for key in flag_values:
        if key not in Settings.model_fields:
            raise InputError(f"unknown setting {key!r}")
    path = config if config is not None else env.get(CONFIG_ENV)
    file_values, file_where = _file_values(Path(path)) if path else ({}, {})
    env_values = _env_values({k: v for k, v in env.items() if k.upper() != CONFIG_ENV})
    merged = {**file_values, **env_values, **flag_values}
    origin: dict[str, str] = {}
    for name in Settings.model_fields:
        if name in flag_values:
            origin[name] = f"flag --{name.replace('_', '-')}"
        elif name in env_values:
            origin[name] = f"env {ENV_PREFIX}{name.upper()}"
        elif name in file_values:
            origin[name] = f"file {file_where[name]}"
        else:
            origin[name] = "default"
    refuse_secrets(flag_values, file_where)
    try:
        return Settings(**merged), origin
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        where = origin.get(name, "settings").replace("file ", "")
        raise InputError(
            redact_text(f"{where}: {name}: {str(err['msg']).removeprefix('Value error, ')}")
        ) from None


SECRET_SETTINGS = {"grafana_token": "grafana_token_file", "loki_basic_auth": "loki_basic_auth_file"}
"""Settings that are secrets: from the environment or their file only, never a flag (`ps` shows every
process's arguments to every user) nor a value in the settings file."""


def refuse_secrets(flags: Mapping[str, Any], file_where: Mapping[str, str]) -> None:
    for name, file_setting in SECRET_SETTINGS.items():
        instead = f"--{file_setting.replace('_', '-')} PATH or {ENV_PREFIX}{name.upper()}"
        if name in flags:
            raise InputError(f"--{name.replace('_', '-')} would show the secret in `ps`: use {instead}")
        if name in file_where:
            raise InputError(
                f"{file_where[name]}: {name}: no secrets in the settings file: use {file_setting} "
                f"or {ENV_PREFIX}{name.upper()}"
            )


def secret(settings: Settings, name: str) -> str:
    """A secret setting's value: its environment variable, else the stripped contents of its file."""
    value: str = getattr(settings, name).get_secret_value()
    path = getattr(settings, SECRET_SETTINGS[name])
    return value if value or not path else read_secret_file(path, SECRET_SETTINGS[name])


def read_secret_file(path: str, what: str) -> str:
    """The stripped contents of a file holding one secret; `what` (a setting or flag) names it in errors."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(f"{what} {path}: {exc.strerror or exc}") from None
    if not text:
        raise InputError(f"{what} {path}: the file is empty")
    return text


def listen_address(address: str, setting: str) -> tuple[str, int]:
    """(host, port) of a `*_listen` value: brackets off an IPv6 host, loopback when no host is given."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"{setting}: {address!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_http_url(url: str) -> bool:
    """An http:// or https:// URL with a host: anything else fails every request alike (httpx calls
    a missing scheme a transport error, which would be retried as if the server were down)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


# Query parameters that carry credentials (Grafana/Loki/Prometheus proxies, presigned URLs, libpq).
_SECRET_PARAM = re.compile(
    r"(?i)^(?:.*token|.*secret|.*password|passwd|pass|pwd|.*key|auth|authorization|"
    r"signature|sig|x-amz-signature|x-amz-credential|credential|sslpassword)$"
)
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """A URL as it may be printed or logged: its password (or a user name alone, which is often a
    token) and the values of credential query parameters (token=, api_key=, ...) replaced by ***."""
    parts = urlsplit(url)
    try:
        password, username = parts.password, parts.username
    except ValueError:  # not a URL with a parsable authority: nothing to hide in it
        return url
    netloc = parts.netloc
    if password is not None:
        netloc = netloc.replace(f":{password}@", ":***@", 1)
    elif username:
        netloc = netloc.replace(f"{username}@", "***@", 1)
    query = parts.query
    if query:
        query = "&".join(
            f"{k}=***" if sep and _SECRET_PARAM.match(k) else f"{k}{sep}{v}"
            for k, sep, v in (item.partition("=") for item in query.split("&"))
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str) -> str:
    """Every URL in a message (an error, a log line) passed through `redact_url`."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text) if "://" in text else text


def shown(name: str, value: Any) -> Any:
    """A setting's value as `hypocenter config show` prints it: credentials in URLs hidden."""
    return redact_text(value) if isinstance(value, str) else value


def describe(settings: Settings, origin: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(name, value, origin) rows for `hypocenter config show`."""
    rows: list[tuple[str, str, str]] = []
    for name in Settings.model_fields:
        value = shown(name, getattr(settings, name))
        text = (
            ",".join(value)
            if isinstance(value, list)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        rows.append((name, text, origin[name]))
    return rows


def field_help(name: str) -> str:
    info: FieldInfo = Settings.model_fields[name]
    return info.description or ""
