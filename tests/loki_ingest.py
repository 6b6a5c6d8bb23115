"""What a real Loki (3.x) does to what is pushed to it, for the fake in observability_fakes.

Followed from Loki's source (grafana/loki, pkg/...), function by function:

* Limits and their defaults — pkg/validation/limits.go `RegisterFlags`: reject_old_samples true,
  reject_old_samples_max_age 7d, creation_grace_period 10m, max_label_names_per_series 15 (the
  discovered service_name not counted: distributor/validator.go `ValidateLabels`),
  allow_structured_metadata true, discover_service_name (the list below), discover_log_levels true;
  ingester max_chunk_age 2h (pkg/ingester/ingester.go), whose half is the out-of-order window.
* service_name — loghttp/push/push.go `ParseLokiRequest`: a stream without `service_name` takes the
  value of the first label of discover_service_name it has, else `unknown_service`.
* detected_level — distributor/field_detection.go `extractLogLevel`: an existing `detected_level`
  is normalised; else a level label or structured metadata field (log_level_fields); else the OTLP
  severity_number; else the line (a JSON or logfmt level field, else the first level word).
  Stored as structured metadata, so only when allow_structured_metadata is on.
* Per entry, in the distributor (distributor/validator.go `ValidateEntry`): older than
  now - reject_old_samples_max_age → `entry for stream '{..}' has timestamp too old: T, oldest
  acceptable timestamp is: T'`; newer than now + creation_grace_period → `... has timestamp too
  new: T`; structured metadata when it is not allowed. The other entries are still ingested; the
  answer is 400 with the messages grouped (pkg/util/errors `GroupedErrors`: `N errors like: …`).
* Per stream, in the ingester (ingester/stream.go `validateEntries`, `storeEntries`): an entry with
  the timestamp, line and structured metadata of the stream's last one is dropped silently, as is
  one identical to an entry already held at that timestamp (chunkenc/unordered.go `Append`); one
  more than max_chunk_age/2 behind the stream's newest entry is refused (`entry too far behind,
  entry timestamp is: T, oldest acceptable timestamp is: T'`). The refusals of a stream make one
  400 (`errorForFailedEntries`: at most 10 `entry with timestamp … ignored, reason: '…',` lines,
  then `user 'fake', total ignored: N out of M for stream: {..}`), and — instance.go `Push` — only
  the last stream of a request decides the answer; the accepted entries are kept either way. An
  ingester's error wins over the distributor's (distributor.go `Push`).
* OTLP (`/otlp/v1/logs`, loghttp/push/otlp.go `otlpToLokiPushRequest`, otlplabels/labels.go):
  resource attributes named in otlp_config (by default the list below,
  otlplabels/config.go `RegisterFlags`) become index labels, every other resource, scope and log
  attribute is structured metadata, names with `.` become `_`; body → line; time_unix_nano, else
  observed_time_unix_nano; severity_number / severity_text / trace_id / span_id as metadata.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

DISCOVER_SERVICE_NAME = (
    "service",
    "app",
    "application",
    "app_name",
    "name",
    "app_kubernetes_io_name",
    "container",
    "container_name",
    "k8s_container_name",
    "component",
    "workload",
    "job",
    "k8s_job_name",
)
LOG_LEVEL_FIELDS = (
    "level",
    "LEVEL",
    "Level",
    "log.level",
    "severity",
    "SEVERITY",
    "Severity",
    "SeverityText",
    "lvl",
    "LVL",
    "Lvl",
    "severity_text",
    "Severity_Text",
    "SEVERITY_TEXT",
)
OTLP_INDEX_LABELS = (
    "service.name",
    "service.namespace",
    "service.instance.id",
    "deployment.environment",
    "deployment.environment.name",
    "cloud.region",
    "cloud.availability_zone",
    "k8s.cluster.name",
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.container.name",
    "container.name",
    "k8s.replicaset.name",
    "k8s.deployment.name",
    "k8s.statefulset.name",
    "k8s.daemonset.name",
    "k8s.cronjob.name",
    "k8s.job.name",
)
MAX_RETURNED_ERRORS = 10  # ingester max_returned_stream_errors
TENANT = "fake"  # Loki's tenant when auth_enabled is false


@dataclass
class IngestLimits:
    """The limits of the push path, named and defaulted as Loki's (module docstring)."""

    reject_old_samples: bool = True
    reject_old_samples_max_age_s: float = 7 * 86400.0
    creation_grace_period_s: float = 600.0
    max_chunk_age_s: float = 7200.0  # entries more than half of it behind a stream's newest are refused
    max_label_names_per_series: int = 15
    allow_structured_metadata: bool = True
    discover_service_name: Sequence[str] = DISCOVER_SERVICE_NAME
    discover_log_levels: bool = True
    # otlp_config as Loki's YAML has it: {"resource_attributes": {"ignore_defaults": bool,
    # "attributes_config": [{"action": "index_label" | "structured_metadata" | "drop",
    # "attributes": [...]} | {"action": ..., "regex": "..."}]}}
    otlp_config: Mapping[str, Any] = field(default_factory=dict)


def go_labels(labels: Mapping[str, str]) -> str:
    """Prometheus labels.Labels.String(): sorted, `{a="b", c="d"}`, values Go-quoted."""
    return (
        "{" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(labels.items())) + "}"
    )


def rfc3339(ns: int) -> str:
    """Go's time.Format(time.RFC3339) in UTC: whole seconds."""
    return datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def go_time(ns: int) -> str:
    """Go's time.Time.String() in UTC: `2026-11-02 10:00:00.5 +0000 UTC`."""
    secs, frac = divmod(ns, 10**9)
    text = datetime.fromtimestamp(secs, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + " +0000 UTC"


def grouped(errors: Sequence[str]) -> str:
    """pkg/util/errors GroupedErrors.Error() (Go iterates a map; sorted here to be deterministic)."""
    counts: dict[str, int] = {}
    for e in errors:
        counts[e] = counts.get(e, 0) + 1
    return "; ".join(
        (f"{n} errors like: " if len(counts) > 1 or n > 1 else "") + e for e, n in sorted(counts.items())
    )


# ------------------------------------------------------------------------------------------ detected_level

_LEVELS = {
    "trace": "trace",
    "trc": "trace",
    "debug": "debug",
    "dbg": "debug",
    "info": "info",
    "inf": "info",
    "information": "info",
    "warn": "warn",
    "wrn": "warn",
    "warning": "warn",
    "error": "error",
    "err": "error",
    "critical": "critical",
    "fatal": "fatal",
}
_LEVEL_WORDS = (
    ("trace", "trace"),
    ("debug", "debug"),
    ("fatal", "fatal"),
    ("critical", "critical"),
    ("error", "error"),
    ("err", "error"),
    ("warning", "warn"),
    ("warn", "warn"),
    ("info", "info"),
)
_LEFT = set(" \t\n[({\"'=|")
_RIGHT = set(" \t\n[]{}():,!\"'=|")


def _normalise(level: str) -> str:
    return _LEVELS.get(level.lower(), level)


def _bounded(text: str, word: str) -> int:
    """field_detection.go `indexOfBoundedLevel`."""
    offset = 0
    while (pos := text.find(word, offset)) >= 0:
        if (pos == 0 or text[pos - 1] in _LEFT) and (
            pos + len(word) >= len(text) or text[pos + len(word)] in _RIGHT
        ):
            return pos
        offset = pos + 1
    return -1


def level_from_line(line: str) -> str:
    """`extractLogLevelFromLogLine`: a JSON (two levels deep) or logfmt level field, else the
    earliest level word (`detectLevelFromLogLine`), else `unknown`."""
    stripped = line.strip()
    value: str | None = None
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            doc = None

        def find(node: Any, depth: int) -> str | None:
            if not isinstance(node, dict) or depth >= 2:
                return None
            for k, v in node.items():
                if isinstance(v, str) and k in LOG_LEVEL_FIELDS:
                    return v
                if isinstance(v, dict) and (hit := find(v, depth + 1)) is not None:
                    return hit
            return None

        value = find(doc, 0)
    elif "=" in line:
        for m in re.finditer(r'(\S+?)=("(?:[^"\\]|\\.)*"|\S*)', line):
            if m.group(1).lower() in {f.lower() for f in LOG_LEVEL_FIELDS}:
                value = m.group(2).strip('"')
                break
    if value is not None and value.lower() in _LEVELS:
        return _LEVELS[value.lower()]
    lower = line.lower()
    best, at = "unknown", len(lower)
    for word, level in _LEVEL_WORDS:
        pos = _bounded(lower, word)
        if 0 <= pos < at:
            best, at = level, pos
            if pos == 0:
                break
    return best


def detected_level(labels: Mapping[str, str], metadata: Mapping[str, str], line: str) -> str:
    """`extractLogLevel`."""
    if "detected_level" in metadata:
        return _normalise(metadata["detected_level"])
    for source in (labels, metadata):
        for name in LOG_LEVEL_FIELDS:
            if name in source:
                return _normalise(source[name])
    if "severity_number" in metadata:
        try:
            n = int(metadata["severity_number"])
        except ValueError:
            return "info"
        bands = (
            (0, "unknown"),
            (4, "trace"),
            (8, "debug"),
            (12, "info"),
            (16, "warn"),
            (20, "error"),
            (24, "fatal"),
        )
        return next((name for top, name in bands if n <= top), "unknown")
    return level_from_line(line)


# ------------------------------------------------------------------------------------------ ingestion


@dataclass(frozen=True)
class Entry:
    labels: dict[str, str]
    ts_ns: int
    line: str
    metadata: dict[str, str]


@dataclass
class _Stream:
    last: tuple[int, str, tuple[tuple[str, str], ...]] | None = None
    highest: int = 0
    held: set[tuple[int, str, tuple[tuple[str, str], ...]]] = field(default_factory=set)


class Ingest:
    """Loki's push path over a list of stored entries (module docstring). `push` answers
    (status, body) as the distributor's HTTP handler would."""

    def __init__(self, limits: IngestLimits, clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self.clock = clock
        self.entries: list[Entry] = []
        self._streams: dict[tuple[tuple[str, str], ...], _Stream] = {}

    def with_service_name(self, labels: Mapping[str, str]) -> dict[str, str]:
        out = dict(labels)
        if "service_name" not in out and self.limits.discover_service_name:
            out["service_name"] = next(
                (out[n] for n in self.limits.discover_service_name if out.get(n)), "unknown_service"
            )
        return out

    def push(self, entries: Sequence[Entry], *, check_time: bool = True) -> tuple[int, str]:
        now_ns = int(self.clock() * 1e9)
        lim = self.limits
        distributor: list[str] = []
        streams: list[tuple[dict[str, str], list[Entry]]] = []
        for e in entries:  # a request's streams, in order (consecutive entries of one label set)
            if streams and streams[-1][1][0].labels == e.labels:
                streams[-1][1].append(e)
            else:
                streams.append((e.labels, [e]))
        accepted: list[tuple[dict[str, str], list[Entry], int]] = []
        for pushed_labels, items in streams:
            labels = self.with_service_name(pushed_labels)
            names = len(labels) - ("service_name" in labels)
            if names > lim.max_label_names_per_series:
                distributor.append(
                    f"entry for stream '{go_labels(labels)}' has {names} label names; "
                    f"limit {lim.max_label_names_per_series}"
                )
                continue
            keep: list[Entry] = []
            for e in items:
                if (
                    check_time
                    and lim.reject_old_samples
                    and e.ts_ns < now_ns - int(lim.reject_old_samples_max_age_s * 1e9)
                ):
                    oldest = now_ns - int(lim.reject_old_samples_max_age_s * 1e9)
                    distributor.append(
                        f"entry for stream '{go_labels(labels)}' has timestamp too old: "
                        f"{rfc3339(e.ts_ns)}, oldest acceptable timestamp is: {rfc3339(oldest)}"
                    )
                    continue
                if check_time and e.ts_ns > now_ns + int(lim.creation_grace_period_s * 1e9):
                    distributor.append(
                        f"entry for stream '{go_labels(labels)}' has timestamp too new: {rfc3339(e.ts_ns)}"
                    )
                    continue
                meta = dict(e.metadata)
                if meta and not lim.allow_structured_metadata:
                    distributor.append(
                        f"stream '{go_labels(labels)}' includes structured metadata, but this feature "
                        "is disallowed. Please see `limits_config.allow_structured_metadata` or contact "
                        "your Loki administrator to enable it"
                    )
                    continue
                if lim.discover_log_levels and lim.allow_structured_metadata:
                    meta["detected_level"] = detected_level(labels, meta, e.line)
                keep.append(Entry(labels, e.ts_ns, e.line, meta))
            if keep:
                accepted.append((labels, keep, len(items)))
        ingester_error: str | None = None
        for labels, keep, total in accepted:
            ingester_error = self._append(labels, keep, total)  # instance.Push: the last stream's error
        if ingester_error is not None:
            return 400, ingester_error
        if distributor:
            return 400, grouped(distributor)
        return 204, ""

    def _append(self, labels: dict[str, str], items: list[Entry], total: int) -> str | None:
        key = tuple(sorted(labels.items()))
        s = self._streams.setdefault(key, _Stream())
        window = int(self.limits.max_chunk_age_s / 2 * 1e9)
        failed: list[tuple[int, str]] = []
        for e in items:
            ident = (e.ts_ns, e.line, tuple(sorted(e.metadata.items())))
            if ident == s.last:
                continue  # stream.go validateEntries: the same as the last line
            cutoff = s.highest - window
            if s.highest and e.ts_ns < cutoff:
                failed.append(
                    (
                        e.ts_ns,
                        f"entry too far behind, entry timestamp is: {rfc3339(e.ts_ns)}, "
                        f"oldest acceptable timestamp is: {rfc3339(cutoff)}",
                    )
                )
                continue
            s.last = ident
            s.highest = max(s.highest, e.ts_ns)
            if ident in s.held:
                continue  # chunkenc/unordered.go Append: a duplicate at that timestamp
            s.held.add(ident)
            self.entries.append(e)
        if not failed:
            return None
        lines = "".join(
            f"entry with timestamp {go_time(ts)} ignored, reason: '{why}',\n"
            for ts, why in failed[:MAX_RETURNED_ERRORS]
        )
        return f"{lines}user '{TENANT}', total ignored: {len(failed)} out of {total} for stream: {go_labels(labels)}"


# ------------------------------------------------------------------------------------------ OTLP


def _label_name(attribute: str) -> str:
    """otlptranslator LabelNamer.Build, for the names OTLP uses: anything but [a-zA-Z0-9_] → `_`."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", attribute)
    return f"key_{name}" if name[:1].isdigit() else name


def _action(attribute: str, configs: Sequence[Mapping[str, Any]]) -> str:
    """otlplabels/config.go `actionForAttribute`: the first config naming or matching it; else metadata."""
    for c in configs:
        if "regex" in c and re.fullmatch(c["regex"], attribute):
            return str(c.get("action", "structured_metadata"))
        if attribute in c.get("attributes", ()):
            return str(c.get("action", "structured_metadata"))
    return "structured_metadata"


def _value(v: Any) -> str:
    """pcommon.Value.AsString()."""
    kind = v.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return str(v.string_value)
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind in ("int_value", "double_value"):
        return str(getattr(v, kind))
    if kind == "bytes_value":
        import base64

        return base64.b64encode(v.bytes_value).decode()
    from google.protobuf.json_format import MessageToDict

    return json.dumps(MessageToDict(v), separators=(",", ":"))


def otlp_entries(request: Any, limits: IngestLimits) -> list[Entry]:
    """An ExportLogsServiceRequest as Loki turns it into stream entries (module docstring)."""
    rc = limits.otlp_config.get("resource_attributes", {})
    configs = list(rc.get("attributes_config", ()))
    if not rc.get("ignore_defaults"):
        configs.insert(0, {"action": "index_label", "attributes": list(OTLP_INDEX_LABELS)})
    out: list[Entry] = []
    for rl in request.resource_logs:
        labels: dict[str, str] = {}
        resource_meta: dict[str, str] = {}
        has_service = False
        for kv in rl.resource.attributes:
            action = _action(kv.key, configs)
            if action == "drop":
                continue
            if kv.key == "service.name" and _value(kv.value):
                has_service = True
            (labels if action == "index_label" else resource_meta)[_label_name(kv.key)] = _value(kv.value)
        if not has_service and limits.discover_service_name:
            labels["service_name"] = next(
                (labels[n] for n in limits.discover_service_name if labels.get(n)), "unknown_service"
            )
        for sl in rl.scope_logs:
            scope_meta = {_label_name(kv.key): _value(kv.value) for kv in sl.scope.attributes}
            if sl.scope.name:
                scope_meta["scope_name"] = sl.scope.name
            if sl.scope.version:
                scope_meta["scope_version"] = sl.scope.version
            for rec in sl.log_records:
                meta = {
                    **resource_meta,
                    **scope_meta,
                    **{_label_name(kv.key): _value(kv.value) for kv in rec.attributes},
                }
                ts = rec.time_unix_nano or rec.observed_time_unix_nano
                if rec.time_unix_nano and rec.observed_time_unix_nano:
                    meta["observed_timestamp"] = str(rec.observed_time_unix_nano)
                if rec.severity_number:
                    meta["severity_number"] = str(int(rec.severity_number))
                if rec.severity_text:
                    meta["severity_text"] = rec.severity_text
                if rec.trace_id:
                    meta["trace_id"] = rec.trace_id.hex()
                if rec.span_id:
                    meta["span_id"] = rec.span_id.hex()
                out.append(Entry(dict(labels), int(ts), _value(rec.body), meta))
    return out


def otlp_error(message: str) -> bytes:
    """push.go `OTLPError`: a google.rpc.Status with code 0 and the message, protobuf-encoded."""
    from google.rpc import status_pb2

    return bytes(status_pb2.Status(code=0, message=message).SerializeToString())
