"""Push diagnoses to Loki (`POST /loki/api/v1/push`), so root causes sit next to the logs they explain.

Wire format (Loki HTTP API, "Ingest logs"): by default a snappy-compressed (block format, no
framing) protobuf `logproto.PushRequest`, `Content-Type: application/x-protobuf`; optionally JSON
`{"streams": [{"stream": {labels}, "values": [["<ns>", "<line>", {structured metadata}]]}]}`.
Success is 204 (200 accepted too). The protobuf messages are declared below as a descriptor, field
for field as Loki documents them (pkg/push/push.proto), and encoded by the `protobuf` runtime:

    PushRequest      { repeated StreamAdapter streams = 1; string format = 2; }
    StreamAdapter    { string labels = 1;  // '{a="b", c="d"}'
                       repeated EntryAdapter entries = 2; uint64 hash = 3; }
    EntryAdapter     { google.protobuf.Timestamp timestamp = 1; string line = 2;
                       repeated LabelPairAdapter structuredMetadata = 3; repeated LabelPairAdapter parsed = 4; }
    LabelPairAdapter { string name = 1; string value = 2; }

What is sent per diagnosis, in one stream per label set:
  labels (index, few values each): service_name="hypocenter", cluster, outcome, domain
  one `record="diagnosis"` entry: the verdict as one JSON line
  one `record="evidence"` entry per evidence item (at most EVIDENCE_MAX), so a logs panel can show them
  structured metadata (not indexed, filterable with `| workload_id="81234"`): diagnosis_id,
    workload_id, attempt, nodes, affected_nodes, components, rule, subdomain, action, quality,
    revision, …; a verdict that replaces one pushed before for the attempt (the final diagnosis after
    a provisional one) carries `supersedes` (that one's diagnosis id) and `supersedes_revision`, in
    its metadata and its line: Loki only appends, so a reader keeps the latest verdict per attempt

Timestamps: the diagnosis entry is dated where the failure began (root cause first_seen, else the
attempt's end) so a dashboard annotation lands there, but never more than BACKDATE_S before the
diagnosis was stored, nor more than BEHIND_MAX_S before the push: Loki refuses an entry more than
max_chunk_age/2 (1 h by default) behind its stream's newest one (pkg/ingester/stream.go
`validateEntries`), and, in one request, only the last stream's refusal reaches the client
(instance.go `Push`), so an entry delayed by retries and back-off is moved forward in steps of
LATE_STEP_S rather than pushed to be refused: every entry is within BEHIND_MAX_S of the push, so it
is never behind anything already in its stream by more than the window, and a retry within one
step repeats the same entry, which Loki stores once. Evidence entries follow it by 1 ns each.

Loki's refusals that no retry can cure are told apart (`refusal`): an entry older than
reject_old_samples_max_age (7 days by default; distributor/validator.go `ValidateEntry`:
"has timestamp too old") is dropped as `too_old`, one too far behind its stream as
`out_of_order`; both are HTTP 400, counted in hypocenter_export_dropped_total{reason}.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import cramjam
import httpx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from hypocenter import __version__
from hypocenter.exporter.cardinality import LabelLimit
from hypocenter.exporter.outbox import ExportRejected, ExportUnavailable, classify_status
from hypocenter.store.base import Delivered, DiagnosisRow

PUSH_PATH = "/loki/api/v1/push"
SERVICE_NAME = "hypocenter"
LABELS = ("service_name", "cluster", "outcome", "domain")
BACKDATE_S = 50 * 60
BEHIND_MAX_S = 55 * 60  # how far behind the push an entry may be: under Loki's 1 h, with 5 min for skew
LATE_STEP_S = 10 * 60
EVIDENCE_MAX = 50
AFFECTED_MAX = 256  # structured metadata is limited to 64 KB per entry
TEXT_MAX = 4096


@dataclass(frozen=True, slots=True)
class LokiEntry:
    ts_ns: int
    line: str
    metadata: dict[str, str]


# ------------------------------------------------------------------------------------------- protobuf


def _push_request_class() -> Any:
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="hypocenter/loki_push.proto",
        package="logproto",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message(
        "PushRequest",
        ("streams", 1, F.TYPE_MESSAGE, many, ".logproto.StreamAdapter"),
        ("format", 2, F.TYPE_STRING, one, ""),
    )
    message(
        "StreamAdapter",
        ("labels", 1, F.TYPE_STRING, one, ""),
        ("entries", 2, F.TYPE_MESSAGE, many, ".logproto.EntryAdapter"),
        ("hash", 3, F.TYPE_UINT64, one, ""),
    )
    message(
        "EntryAdapter",
        ("timestamp", 1, F.TYPE_MESSAGE, one, ".google.protobuf.Timestamp"),
        ("line", 2, F.TYPE_STRING, one, ""),
        ("structuredMetadata", 3, F.TYPE_MESSAGE, many, ".logproto.LabelPairAdapter"),
        ("parsed", 4, F.TYPE_MESSAGE, many, ".logproto.LabelPairAdapter"),
    )
    message("LabelPairAdapter", ("name", 1, F.TYPE_STRING, one, ""), ("value", 2, F.TYPE_STRING, one, ""))
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another copy of logproto
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("logproto.PushRequest"))


PushRequest: Any = _push_request_class()


def label_string(labels: dict[str, str]) -> str:
    """Labels the way Loki parses them: `{a="b", c="d"}`, sorted, values escaped as in PromQL."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ", ".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items())) + "}"


def encode_protobuf(streams: Sequence[tuple[dict[str, str], Sequence[LokiEntry]]]) -> bytes:
    """A snappy-compressed PushRequest."""
    req = PushRequest()
    for labels, entries in streams:
        s = req.streams.add()
        s.labels = label_string(labels)
        for e in entries:
            en = s.entries.add()
            en.timestamp.seconds, en.timestamp.nanos = divmod(e.ts_ns, 1_000_000_000)
            en.line = e.line
            for name, value in e.metadata.items():
                en.structuredMetadata.add(name=name, value=value)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def encode_json(streams: Sequence[tuple[dict[str, str], Sequence[LokiEntry]]]) -> bytes:
    doc = {
        "streams": [
            {"stream": labels, "values": [[str(e.ts_ns), e.line, e.metadata] for e in entries]}
            for labels, entries in streams
        ]
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ------------------------------------------------------------------------------------------- content


def _ns(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return None


def verdict_line(d: dict[str, Any], provisional: bool, supersedes: Delivered | None = None) -> str:
    """One JSON line a person can read in a logs panel and `| json` can take apart; `supersedes`:
    the verdict of the same attempt delivered before, which this one replaces."""
    rc = d.get("root_cause") or {}
    a = d.get("attempt") or {}
    summary = rc.get("summary") or {
        "unattributed": "no root cause can be attributed from the evidence available",
        "not_failed": "the attempt did not fail",
    }.get(d.get("outcome", ""), "")
    doc = {
        "summary": summary,
        "outcome": d.get("outcome"),
        "domain": rc.get("domain"),
        "subdomain": rc.get("subdomain"),
        "nodes": rc.get("nodes") or [],
        "components": [f"{c['node']} {c['kind']} {c['id']}" for c in rc.get("components") or []],
        "action": rc.get("action"),
        "rule": rc.get("rule"),
        "first_seen": rc.get("first_seen"),
        "candidates": [
            f"{c['domain']}/{c['subdomain']} on {','.join(c['nodes']) or 'the job'}"
            for c in d.get("candidates") or []
        ],
        "quality": (d.get("quality") or {}).get("level"),
        "terminal_state": d.get("terminal_state"),
        "workload_id": a.get("workload_id"),
        "attempt": a.get("attempt"),
        "cluster": a.get("cluster"),
        "affected_node_count": len(d.get("affected_nodes") or []),
        "provisional": provisional,
        "diagnosis_id": d.get("id"),
    }
    if supersedes is not None:
        doc["supersedes"] = {"diagnosis_id": supersedes.diagnosis_id, "revision": supersedes.revision}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def entry_time(began_ns: int, created_ns: int, push_ns: int) -> int:
    """The diagnosis entry's timestamp (module docstring): where the failure began, within
    BACKDATE_S before it was stored and BEHIND_MAX_S before the push (moved in whole LATE_STEP_S)."""
    ts = min(created_ns, max(began_ns, created_ns - BACKDATE_S * 1_000_000_000))
    floor = push_ns - BEHIND_MAX_S * 1_000_000_000
    if ts < floor:
        step = LATE_STEP_S * 1_000_000_000
        ts += -(-(floor - ts) // step) * step
    return min(ts, push_ns)


def refusal(status: int, body: str) -> str | None:
    """The reason Loki refused entries for good (module docstring), if it is one of those."""
    if status != 400:
        return None
    if "has timestamp too old" in body:
        return "too_old"
    if "entry too far behind" in body or "entry out of order" in body:
        return "out_of_order"
    return None


def diagnosis_entries(
    row: DiagnosisRow,
    push_ns: int | None = None,
    labels_limit: LabelLimit | None = None,
    before: Delivered | None = None,
) -> tuple[dict[str, str], list[LokiEntry]]:
    """The stream labels and entries of one stored diagnosis, pushed at `push_ns` (default: when stored),
    `cluster` folded by `labels_limit`. `before`: what was pushed for the attempt earlier; when that
    was another verdict, the diagnosis entry says it supersedes it (`supersedes`,
    `supersedes_revision`)."""
    d: dict[str, Any] = json.loads(row.body)
    rc = d.get("root_cause") or {}
    a = d.get("attempt") or {}
    labels = {"service_name": SERVICE_NAME, "outcome": row.outcome}
    if row.cluster:
        labels["cluster"] = labels_limit.value("cluster", row.cluster) if labels_limit else row.cluster
    if row.domain:
        labels["domain"] = row.domain
    created_ns = int(row.created * 1e9)
    began = _ns(rc.get("first_seen")) or _ns((a.get("window") or {}).get("end")) or created_ns
    ts = entry_time(began, created_ns, created_ns if push_ns is None else max(push_ns, created_ns))
    common = {"diagnosis_id": row.id, "workload_id": row.workload, "attempt": str(row.attempt)}
    meta = {
        "record": "diagnosis",
        **common,
        "nodes": ",".join(rc.get("nodes") or []),
        "affected_nodes": ",".join((d.get("affected_nodes") or [])[:AFFECTED_MAX]),
        "components": ",".join(f"{c['node']}/{c['kind']}/{c['id']}" for c in rc.get("components") or []),
        "rule": rc.get("rule") or "",
        "subdomain": rc.get("subdomain") or "",
        "action": rc.get("action") or "",
        "first_seen": rc.get("first_seen") or "",
        "quality": (d.get("quality") or {}).get("level") or "",
        "provisional": str(row.provisional).lower(),
        "terminal_state": d.get("terminal_state") or "",
        "revision": str(row.revision),
    }
    replaced = (
        before
        if before is not None and (before.diagnosis_id, before.revision) != (row.id, row.revision)
        else None
    )
    if replaced is not None:
        meta["supersedes"] = replaced.diagnosis_id
        meta["supersedes_revision"] = str(replaced.revision)
    entries = [
        LokiEntry(ts, verdict_line(d, row.provisional, replaced), {k: v for k, v in meta.items() if v})
    ]
    for i, e in enumerate((d.get("evidence") or [])[:EVIDENCE_MAX]):
        text = str(e.get("text") or "")[:TEXT_MAX]
        line = f"{e.get('role')} {e.get('time') or '?'} {e.get('node') or '-'} {e.get('ref')}: {text}"
        em = {
            "record": "evidence",
            **common,
            "role": str(e.get("role") or ""),
            "rule": str(e.get("rule") or ""),
            "node": str(e.get("node") or ""),
            "evidence_time": str(e.get("time") or ""),
            "ref": str(e.get("ref") or ""),
        }
        entries.append(LokiEntry(ts + i + 1, line, {k: v for k, v in em.items() if v}))
    return labels, entries


# ------------------------------------------------------------------------------------------- exporter


class LokiExporter:
    """Pushes batches of diagnoses; raises ExportRejected / ExportUnavailable (outbox.py) on failure."""

    name = "loki"

    def __init__(
        self,
        url: str,
        *,
        encoding: str = "protobuf",
        tenant: str = "",
        basic_auth: str = "",
        timeout_s: float = 10.0,
        max_batch: int = 50,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if encoding not in ("protobuf", "json"):
            raise ValueError(f"Loki encoding must be protobuf or json, not {encoding!r}")
        self.url = url.rstrip("/") + PUSH_PATH if not url.rstrip("/").endswith(PUSH_PATH) else url.rstrip("/")
        self.encoding = encoding
        self.max_batch = max_batch
        self.labels_limit: LabelLimit | None = None  # the process' cluster fold, set by Outputs
        headers = {"User-Agent": f"hypocenter/{__version__}"}
        if tenant:
            headers["X-Scope-OrgID"] = tenant
        auth: tuple[str, str] | None = None
        if basic_auth:
            user, _, password = basic_auth.partition(":")
            auth = (user, password)
        self._client = httpx.Client(timeout=timeout_s, headers=headers, auth=auth, transport=transport)

    def payload(
        self,
        batch: Sequence[DiagnosisRow],
        push_ns: int | None = None,
        before: Sequence[Delivered | None] | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        grouped: dict[str, tuple[dict[str, str], list[LokiEntry]]] = {}
        push_ns = time.time_ns() if push_ns is None else push_ns
        for row, earlier in zip(batch, before or [None] * len(batch), strict=True):
            labels, entries = diagnosis_entries(row, push_ns, self.labels_limit, earlier)
            grouped.setdefault(label_string(labels), (labels, []))[1].extend(entries)
        streams = [(labels, sorted(entries, key=lambda e: e.ts_ns)) for labels, entries in grouped.values()]
        if self.encoding == "json":
            return gzip.compress(encode_json(streams)), {
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
            }
        return encode_protobuf(streams), {"Content-Type": "application/x-protobuf"}

    def send(self, batch: Sequence[DiagnosisRow]) -> None:
        self.revise([(row, None) for row in batch])

    def revise(self, batch: Sequence[tuple[DiagnosisRow, Delivered | None]]) -> list[str]:
        """Push each row, saying which earlier verdict of its attempt it supersedes (Loki keeps both
        entries: it appends, it never replaces)."""
        body, headers = self.payload([row for row, _ in batch], before=[b for _, b in batch])
        try:
            r = self._client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ExportUnavailable(f"{type(exc).__name__}: {exc}") from None
        if r.status_code not in (200, 204):
            reason = refusal(r.status_code, r.text)
            if reason is not None:
                raise ExportRejected(f"HTTP {r.status_code}: {r.text.strip()[:300]}", reason=reason)
            raise classify_status(r.status_code, r.text, r.headers.get("Retry-After"))
        return [""] * len(batch)

    def close(self) -> None:
        self._client.close()
