"""OTLP in: decode export requests and tag every record with its node and workload (contract 2).

Tagging reads resource attributes first, then the record's own; a record that cannot be tagged is
rejected with a reason in the response's partial success, never dropped silently.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from hypocenter import limits
from hypocenter.collector import otlp_wire
from hypocenter.collector.otlp_columns import Columns, CountRequest, FlatRequest
from hypocenter.errors import InputError, TransientError
from hypocenter.modelbase import ATTEMPT_MAX, check_state
from hypocenter.names import (
    ATTEMPT_KEYS,
    LINE_KEY,
    NODE_KEYS,
    NODE_LABELS,
    NODE_RANKS_KEY,
    NODE_RANKS_SCOPE,
    SCOPE_KEYS,
    STATE_KEY,
    STREAM_KEYS,
    UID_KEY,
    WORKLOAD_KEYS,
)
from hypocenter.store.base import Entry, Point, RecordBlock, line_dedup

MAX_MESSAGE_BYTES = 64 << 20  # the size OTLP v1.11 recommends, enforced after decompression too

JSON_TYPES = ("application/json",)
PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")


class OTLPDecodeError(InputError):
    """A request body that is not a valid OTLP export request (HTTP 400 / INVALID_ARGUMENT)."""


class UnsupportedMediaType(InputError):
    """A content type OTLP/HTTP does not define (HTTP 415)."""


class MessageTooLarge(InputError):
    """A body over the size limit, before or after decompression (HTTP 413 / RESOURCE_EXHAUSTED)."""


# --------------------------------------------------------------------------------------------- decoding


def media_type(content_type: str | None) -> str:
    """`application/json; charset=utf-8` → `application/json`; raises UnsupportedMediaType."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in JSON_TYPES or kind in PROTOBUF_TYPES:
        return kind
    raise UnsupportedMediaType(
        f"unsupported Content-Type {content_type or '(none)'!r}: OTLP/HTTP takes application/x-protobuf or application/json"
    )


def decompress(body: bytes, encoding: str | None, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """Undo `Content-Encoding` (none, identity, gzip, deflate) without ever holding more than `limit` bytes."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity", "none"):
        return body
    if enc not in ("gzip", "deflate", "x-gzip"):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}: OTLP/HTTP takes gzip or none")
    wbits = 16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OTLPDecodeError(f"body is not valid {enc} data: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise MessageTooLarge(f"body is over {limit} bytes after {enc} decompression")
    if not d.eof:
        raise OTLPDecodeError(f"body is truncated {enc} data")
    return out


def decode_logs(body: bytes, content_type: str) -> tuple[ExportLogsServiceRequest, list[str]]:
    msg = ExportLogsServiceRequest()
    return msg, _decode(msg, body, content_type)


def decode_metrics(body: bytes, content_type: str) -> tuple[ExportMetricsServiceRequest, list[str]]:
    msg = ExportMetricsServiceRequest()
    return msg, _decode(msg, body, content_type)


def _decode(msg: Message, body: bytes, content_type: str) -> list[str]:
    """Fill `msg` from `body`; returns warnings (accepted with a note, e.g. repaired UTF-8)."""
    warnings: list[str] = []
    if media_type(content_type) in PROTOBUF_TYPES:
        try:
            msg.ParseFromString(body)
        except DecodeError as exc:
            raise OTLPDecodeError(
                f"malformed protobuf {msg.DESCRIPTOR.name}: {_decode_problem(exc)}"
            ) from None
        return warnings
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="replace")
        warnings.append("request body was not valid UTF-8: undecodable bytes were replaced with U+FFFD")
    try:
        doc = json.loads(text, object_pairs_hook=_attribute_counter(body))
    except RecursionError:
        raise OTLPDecodeError("malformed OTLP/JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise OTLPDecodeError(
            f"malformed OTLP/JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(doc, dict):
        raise OTLPDecodeError(f"malformed OTLP/JSON: expected an object, not {type(doc).__name__}")
    try:
        _hex_ids_to_base64(doc)
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise OTLPDecodeError(f"malformed OTLP/JSON {msg.DESCRIPTOR.name}: {exc}") from None
    except RecursionError:
        raise OTLPDecodeError("malformed OTLP/JSON: nested too deeply") from None
    return warnings


def _decode_problem(exc: DecodeError) -> str:
    text = str(exc)
    if "UTF-8" in text:
        return (
            "a string field holds invalid UTF-8 (protobuf strings must be UTF-8; "
            "send binary log bodies as bytesValue)"
        )
    return text.split(": ", 1)[-1] or "wire format is corrupt"


_HEX = re.compile(r"^[0-9a-fA-F]*$")


def _hex_ids_to_base64(node: Any) -> None:
    """OTLP/JSON carries traceId/spanId as hex, protobuf JSON expects base64: convert in place.

    Left alone, `json_format` decodes the hex as base64 into garbage bytes, silently."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                if not _HEX.match(value) or len(value) % 2:
                    raise ValueError(f"{key} {value[:40]!r} is not a hex string")
                node[key] = base64.b64encode(binascii.unhexlify(value)).decode("ascii")
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


# --------------------------------------------------------------------------------------------- values


def any_value(v: AnyValue) -> Any:
    """An AnyValue as plain Python: str, bool, int, float, list, dict, bytes (as text) or None."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.decode("utf-8", errors="replace")
    return None  # string_value_strindex needs a dictionary OTLP logs/metrics do not send


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _text(v: Any) -> str | None:
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, str | int | float):
        return str(v).strip() or None
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _first(keys: Iterable[str], *maps: Mapping[str, Any]) -> str | None:
    """The first key found, looking in the later (more specific) maps first."""
    for m in reversed(maps):
        for k in keys:
            t = _text(m.get(k))
            if t is not None:
                return t
    return None


# --------------------------------------------------------------------------------------------- tagging


# The store keeps every number in a signed 64-bit integer (SQLite INTEGER, PostgreSQL BIGINT): a
# value outside it is refused here, for its record alone, before it can fail a shared transaction.
INT64_MAX = (1 << 63) - 1
_INVALID = "invalid_number"


@dataclass(slots=True)
class Identity:
    node: str | None
    workload: str | None
    attempt: int
    scope: dict[str, str]
    invalid: str | None = None  # why the record cannot be stored (an attempt number out of range)


def _attempt(text: str | None) -> tuple[int, str | None]:
    """The attempt number an attribute names, or 0 and why it cannot be one (out of range, not finite)."""
    if text is None:
        return 0, None
    try:
        value = int(text) if re.fullmatch(r"[+-]?\d{1,30}", text) else int(float(text))
    except ValueError:
        return 0, None  # not a number at all: attempt 0, as before
    except OverflowError:
        value = ATTEMPT_MAX + 1
    if value > ATTEMPT_MAX:
        return 0, (
            f"attempt {text[:40]!r} (hypocenter.workload.attempt) is not a whole number from 0 to 2^31-1"
        )
    return value, None


def time_invalid(*stamps: int) -> str | None:
    """Why a record's times (OTLP fixed64 nanoseconds) cannot be stored, or None."""
    bad = next((t for t in stamps if t > INT64_MAX), None)
    if bad is None:
        return None
    return f"time {bad} ns is past 2^63-1 ns (year 2262): timeUnixNano must be nanoseconds since 1970"


def identify(*maps: Mapping[str, Any]) -> Identity:
    """Node, workload, attempt and scope attributes from resource (first) and record (later) maps."""
    attempt, invalid = _attempt(_first(ATTEMPT_KEYS, *maps))
    scope: dict[str, str] = {}
    for key, name in SCOPE_KEYS:
        t = _first((key,), *maps)
        if t is not None and name not in scope:
            scope[name] = t
    node = _first(NODE_KEYS, *maps)
    node_ranks = _first((NODE_RANKS_KEY,), *maps)
    if node is not None and node_ranks is not None:
        scope[NODE_RANKS_SCOPE + node] = node_ranks
    return Identity(
        node=node,
        workload=_first(WORKLOAD_KEYS, *maps),
        attempt=max(0, attempt),
        scope=scope,
        invalid=invalid,
    )


@dataclass(slots=True)
class Tagged:
    accepted: list[Any]
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    rejected_by: dict[str, int] = field(default_factory=dict)  # the same count by reason, for /metrics
    blocks: list[RecordBlock] = field(default_factory=list)  # accepted records as columns (log_entries)

    @property
    def count(self) -> int:
        """Records accepted, in `accepted` and in `blocks`."""
        return len(self.accepted) + sum(len(b) for b in self.blocks)

    def refuse(self, kind: str, reason: str, what: str) -> None:
        """Count one record rejected for `reason` (its first `reason` per kind is kept for the answer)."""
        self.rejected += 1
        if kind not in self.rejected_by:
            self.reasons.append(f"{what} rejected: {reason}")
        self.rejected_by[kind] = self.rejected_by.get(kind, 0) + 1


_UNSCOPED = (
    "{n} {what} had neither a node (host.name | k8s.node.name) nor a workload "
    "(hypocenter.workload.id | slurm.job.id | k8s.job.name | …): they cannot be joined to any attempt"
)


def stream_name(node: str | None, path: str | None, fallback: str) -> str:
    """The stream a line belongs to; names a node's streams so that two nodes' /var/log/kern.log differ."""
    name = path or fallback
    if node is None or node in re.split(r"[/\\]", name):
        return name
    return f"{node}:{name}"


# Record attributes that change a record's tagging; a record carrying none of them (the filelog
# receiver's usual `log.file.record_number` alone) is tagged as its resource is, computed once.
_TAGGING_KEYS = frozenset(
    (
        *NODE_KEYS,
        *WORKLOAD_KEYS,
        *ATTEMPT_KEYS,
        *STREAM_KEYS,
        STATE_KEY,
        NODE_RANKS_KEY,
        *(key for key, _ in SCOPE_KEYS),
    )
)


def log_entries(req: ExportLogsServiceRequest, body: bytes | None = None, flat: Any = None) -> Tagged:
    """`req`'s records tagged. With `body` (the bytes `req` was decoded from) or `flat` (its
    FlatRequest), scope groups in the filelog receiver's usual shape come out as `RecordBlock`s
    (collector/otlp_columns.py), tagged per group; the others as one `Entry` per record."""
    out = Tagged(accepted=[])
    unscoped = 0
    bad_states: list[str] = []
    if flat is None and body is not None:
        flat = _flat(body)
    for ri, rl in enumerate(req.resource_logs):
        rattrs = attributes(rl.resource.attributes)
        rident = identify(rattrs)
        rstream = _first(STREAM_KEYS, rattrs)
        for si, sl in enumerate(rl.scope_logs):
            scope_name = sl.scope.name or "otlp"
            rstream_name = stream_name(rident.node, rstream, f"otlp/{scope_name}")
            rwhere = f"{rident.workload}\x1f{rident.attempt}\x1f{rident.node}\x1f{rstream_name}"
            if flat is not None and sl.log_records:
                block = _block(
                    flat.resource_logs[ri].scope_logs[si].log_records,
                    [lr.SerializeToString() for lr in sl.log_records],
                    rattrs,
                    rident,
                    f"otlp/{scope_name}",
                )
                if block is not None:
                    out.blocks.append(block)
                    continue
            first = len(out.accepted)
            stamps: list[int] = []  # time_unix_nano of each record taken (a group numbered on arrival)
            groupable = True  # text lines of one stream without record numbers or uids, so far
            for lr in sl.log_records:
                lattrs = attributes(lr.attributes)
                own = not _TAGGING_KEYS.isdisjoint(lattrs)
                ident = identify(rattrs, lattrs) if own else rident
                if ident.node is None and ident.workload is None:
                    unscoped += 1
                    continue
                invalid = ident.invalid or time_invalid(lr.time_unix_nano or lr.observed_time_unix_nano)
                if invalid is not None:
                    out.refuse(_INVALID, invalid, "log record(s)")
                    continue
                value = any_value(lr.body)
                kind = "doc" if isinstance(value, dict | list) else "text"
                if kind == "doc" and isinstance(value, dict) and _journal_entry(value):
                    # the journald receiver's entry: a line of `journalctl -o json`, of the fields read
                    kind, value = "text", {k: value[k] for k in JOURNAL_FIELDS if k in value}
                if STATE_KEY in lattrs:  # the terminal-state marker: scope, not a log line to analyse
                    kind = "state"
                    refusal = _state_refusal(ident.scope.get("state"))
                    if refusal is not None:  # a typo would end the attempt as a failure of no kind
                        bad_states.append(refusal)
                        continue
                text = (
                    json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                    if isinstance(value, dict | list)
                    else (
                        ""
                        if value is None
                        else str(value)
                        if not isinstance(value, bool)
                        else str(value).lower()
                    )
                )
                stream = (
                    stream_name(ident.node, _first(STREAM_KEYS, rattrs, lattrs), f"otlp/{scope_name}")
                    if own
                    else rstream_name
                )
                line_value = lattrs.get(LINE_KEY)
                if type(line_value) is int:  # the filelog receiver sends an int: skip the text round trip
                    line: int | None = line_value
                else:
                    line_text = _text(line_value)
                    try:
                        line = int(line_text) if line_text is not None else None
                    except ValueError:
                        line = None
                    if line is not None and not -INT64_MAX <= line <= INT64_MAX:
                        out.refuse(
                            _INVALID, f"{LINE_KEY} {str(line_text)[:40]!r} is out of range", "log record(s)"
                        )
                        continue
                time_ns = lr.time_unix_nano or lr.observed_time_unix_nano
                if kind == "text" and ident.workload is not None and "*** " in text:
                    banner = _BANNER.search(text)
                    if banner:  # Slurm's end-of-job banner: a terminal state seen in the job's own output
                        ident = Identity(ident.node, ident.workload, ident.attempt, dict(ident.scope))
                        ident.scope.setdefault("banner_state", banner.group(1))
                uid = _text(lattrs[UID_KEY]) if UID_KEY in lattrs else None
                where = (
                    f"{ident.workload}\x1f{ident.attempt}\x1f{ident.node}\x1f{stream}"
                    if own or ident is not rident
                    else rwhere
                )
                groupable = groupable and uid is None and line is None and kind == "text"
                stamps.append(lr.time_unix_nano)
                if uid is not None:
                    key = f"uid\x1f{where}\x1f{uid}"
                elif (
                    line is not None
                ):  # after rotation a file restarts at 1: time and text tell the lines apart
                    key = ""
                else:  # an exporter retry resends the identical record: same times, body and attributes
                    key = (
                        f"rec\x1f{where}\x1f{lr.time_unix_nano}\x1f{lr.observed_time_unix_nano}\x1f{text}\x1f"
                        + json.dumps(lattrs, sort_keys=True, default=str)
                    )
                out.accepted.append(
                    Entry(
                        workload=ident.workload,
                        attempt=ident.attempt,
                        node=ident.node,
                        stream=stream,
                        kind=kind,
                        body=text,
                        time_ns=time_ns,
                        line=line,
                        dedup=(
                            hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
                            if key
                            else line_dedup(
                                ident.workload,
                                ident.attempt,
                                ident.node,
                                stream,
                                line or 0,
                                lr.time_unix_nano,
                                text,
                            )
                        ),
                        scope=ident.scope,
                    )
                )
            if groupable and len(out.accepted) > first:
                blocks = _as_blocks(out.accepted[first:], stamps)
                if blocks is not None:
                    del out.accepted[first:]
                    out.blocks.extend(blocks)
    if unscoped:
        out.rejected += unscoped
        out.rejected_by["no_node_or_workload"] = unscoped
        out.reasons.append(_UNSCOPED.format(n=unscoped, what="log record(s)"))
    if bad_states:
        out.rejected += len(bad_states)
        out.rejected_by["unknown_state"] = len(bad_states)
        out.reasons.extend(sorted(set(bad_states)))
    return out


def _state_refusal(state: str | None) -> str | None:
    """Why a `hypocenter.attempt.state` value is refused (it names no job state), or None."""
    if state is None:
        return None
    try:
        check_state(state.strip().upper())
    except ValueError as exc:
        return f"hypocenter.attempt.state: {exc}; the record was not taken"
    return None


def _columnar_entries(body: bytes, flat: Any) -> Tagged | None:
    """`log_entries` of a protobuf request whose every scope group is in the usual shape, read from
    `flat` (its FlatRequest) and each group's record count, without decoding the request whole;
    None when a group is not in that shape or a part does not decode (the whole decode then
    tags it, or says what is malformed)."""
    try:
        counts = CountRequest.FromString(body)
        out = Tagged(accepted=[])
        for rl, crl in zip(flat.resource_logs, counts.resource_logs, strict=True):
            rattrs = attributes(Resource.FromString(rl.resource).attributes)
            rident = identify(rattrs)
            for sl, csl in zip(rl.scope_logs, crl.scope_logs, strict=True):
                n = len(csl.log_records)
                if not n:
                    continue
                scope_name = InstrumentationScope.FromString(sl.scope).name or "otlp"
                block = _block(sl.log_records, csl.log_records, rattrs, rident, f"otlp/{scope_name}")
                if block is None:
                    return None
                out.blocks.append(block)
    except (DecodeError, ValueError):
        return None
    if not out.accepted and not out.blocks:  # no record where the shape put them: the whole decode says
        return None  # whether the request is empty or malformed
    return out


def _block(
    records: Any, raw: Sequence[bytes], rattrs: Mapping[str, Any], rident: Identity, fallback: str
) -> RecordBlock | None:
    """A scope group's records (`raw`: each as sent) as one `RecordBlock`, when they are text lines of
    one stream (with or without record numbers) tagged as their resource is, or as the file's path or
    name on every record says; None sends the group through the per-record path."""
    if (rident.node is None and rident.workload is None) or "state" in rident.scope or rident.invalid:
        return None
    n = len(raw)
    cols = Columns.of(records, n, LINE_KEY)
    if cols is None or (max(cols.times) > INT64_MAX if cols.times else False):
        return None  # the per-record path says which records it refuses
    lattrs: dict[str, Any] = {}
    for key, values in cols.strings.items():
        if values.count(values[0]) != n:  # records of several files in one group
            return None
        lattrs[key] = values[0]
    banners: dict[int, str] = {}
    if rident.workload is not None and "*** " in "\n".join(cols.bodies):  # a Slurm banner: a terminal state
        if cols.lines is not None:
            return None  # tagged per record
        banners = {i: m.group(1) for i, text in enumerate(cols.bodies) if (m := _BANNER.search(text))}
    if cols.lines is None:
        block = _unnumbered(cols, raw, rattrs, lattrs, rident, fallback)
        block.banners = banners
        return block
    stream = stream_name(rident.node, _first(STREAM_KEYS, rattrs, lattrs), fallback)
    return RecordBlock(
        workload=rident.workload,
        attempt=rident.attempt,
        node=rident.node,
        stream=stream,
        scope=rident.scope,
        lines=cols.lines,
        bodies=cols.bodies,
        times=cols.times,
        stamps=cols.stamps,
    )


def _unnumbered(
    cols: Columns,
    raw: Sequence[bytes],
    rattrs: Mapping[str, Any],
    lattrs: dict[str, Any],
    rident: Identity,
    fallback: str,
) -> RecordBlock:
    """A group of text records without record numbers whose attributes are the same on every record
    (at most the file's path and name), tagged once, not per record: a `RecordBlock` whose numbers
    are given on arrival, with the digest of its records as sent (an exporter's retry sends the same
    bytes) and what the per-record path's dedup keys are made of."""
    own = bool(lattrs)  # the file's path or name: a stream key
    ident = identify(rattrs, lattrs) if own else rident
    stream = stream_name(ident.node, _first(STREAM_KEYS, rattrs, lattrs), fallback)
    where = f"rec\x1f{ident.workload}\x1f{ident.attempt}\x1f{ident.node}\x1f{stream}\x1f"
    digest = hashlib.blake2b(where.encode("utf-8", "surrogatepass"), digest_size=16)
    digest.update(array("Q", map(len, raw)).tobytes())  # where each record ends, then the records
    digest.update(b"".join(raw))
    return RecordBlock(
        workload=ident.workload,
        attempt=ident.attempt,
        node=ident.node,
        stream=stream,
        scope=ident.scope,
        lines=[],
        bodies=cols.bodies,
        times=cols.times,
        stamps=cols.stamps,
        digest=digest.hexdigest(),
        observed=cols.observed,
        retry_key=(where, "\x1f" + json.dumps(lattrs, sort_keys=True, default=str)),
    )


# The fields of a journal entry a line is read by (lineformat.py's JSON layer: the message, its time,
# host and identifier): the journald receiver sends every field of an entry as a map body.
JOURNAL_FIELDS = (
    "MESSAGE",
    "PRIORITY",
    "SYSLOG_IDENTIFIER",
    "_HOSTNAME",
    "_PID",
    "_SYSTEMD_UNIT",
    "_TRANSPORT",
    "__REALTIME_TIMESTAMP",
)


def _journal_entry(body: Mapping[str, Any]) -> bool:
    """A journal entry as the journald receiver sends it (a map of the entry's fields): a MESSAGE (text
    or, for binary data, a list of byte values) and a field only the journal writes."""
    message = body.get("MESSAGE")
    return isinstance(message, str | list) and any(
        k in body for k in ("__REALTIME_TIMESTAMP", "_TRANSPORT", "SYSLOG_IDENTIFIER", "_SYSTEMD_UNIT")
    )


def _as_blocks(entries: list[Entry], stamps: list[int]) -> list[RecordBlock] | None:
    """A scope group's text records without record numbers, tagged one by one, as a block per stream
    they belong to (in order of first appearance; a filelog receiver reading several files sends
    their lines in one group), each numbered on arrival; None when one of them cannot be."""
    streams: dict[tuple[str | None, int, str | None, str], list[int]] = {}
    for i, e in enumerate(entries):
        streams.setdefault((e.workload, e.attempt, e.node, e.stream), []).append(i)
    out: list[RecordBlock] = []
    for indices in streams.values():
        block = _as_block([entries[i] for i in indices], [stamps[i] for i in indices])
        if block is None:
            return None
        out.append(block)
    return out


def _as_block(entries: list[Entry], stamps: list[int]) -> RecordBlock | None:
    """Records of one stream (`_as_blocks`), tagged one by one, as one block numbered on arrival (an
    SDK handler's records, whose attributes differ from record to record): each keeps its `Entry`'s
    dedup key (its retry key) and the block's digest is made of them, so a retry of the group is
    dropped whole. None when they do not share their scope."""
    head = entries[0]
    if "state" in head.scope:  # a terminal state on the resource: each record says it (per record)
        return None
    scope = {k: v for k, v in head.scope.items() if k != "banner_state"}
    banners: dict[int, str] = {}
    for i, e in enumerate(entries):
        if e.scope is not head.scope and {k: v for k, v in e.scope.items() if k != "banner_state"} != scope:
            return None
        if "banner_state" in e.scope:
            banners[i] = e.scope["banner_state"]
    dedups = [e.dedup for e in entries]
    return RecordBlock(
        workload=head.workload,
        attempt=head.attempt,
        node=head.node,
        stream=head.stream,
        scope=scope,
        lines=[],
        bodies=[e.body for e in entries],
        times=[e.time_ns for e in entries],
        stamps=stamps,
        digest=hashlib.blake2b("\x1f".join(dedups).encode(), digest_size=16).hexdigest(),
        banners=banners,
        dedups=dedups,
    )


def _flat(body: bytes) -> Any:
    """`body` as a FlatRequest (collector/otlp_columns.py), or None when it does not decode as one."""
    try:
        return FlatRequest.FromString(body)
    except DecodeError:
        return None


def metric_entries(req: ExportMetricsServiceRequest) -> Tagged:
    out = Tagged(accepted=[])
    unscoped = 0
    unsupported = 0
    for rm in req.resource_metrics:
        rattrs = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    n = _count_points(metric, kind)
                    unsupported += n
                    continue
                points = metric.gauge.data_points if kind == "gauge" else metric.sum.data_points
                for dp in points:
                    pattrs = attributes(dp.attributes)
                    ident = identify(rattrs, pattrs)
                    labels = {k: t for k, v in pattrs.items() if (t := _text(v)) is not None}
                    node = ident.node
                    if node is None and ident.workload is None:
                        node = next((labels[k] for k in NODE_LABELS if k in labels), None)
                    if node is None and ident.workload is None:
                        unscoped += 1
                        continue
                    invalid = ident.invalid or time_invalid(dp.time_unix_nano or dp.start_time_unix_nano)
                    if invalid is not None:
                        out.refuse(_INVALID, invalid, "data point(s)")
                        continue
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    source = _first(("hypocenter.source",), rattrs) or f"otlp/{sm.scope.name or 'metrics'}"
                    out.accepted.append(
                        Point(
                            workload=ident.workload,
                            attempt=ident.attempt,
                            node=node,
                            source=source,
                            name=metric.name,
                            labels=labels,
                            time_ns=dp.time_unix_nano or dp.start_time_unix_nano,
                            value=value,
                            scope=ident.scope,
                        )
                    )
    if unscoped:
        out.rejected += unscoped
        out.rejected_by["no_node_or_workload"] = unscoped
        out.reasons.append(_UNSCOPED.format(n=unscoped, what="data point(s)"))
    if unsupported:
        out.rejected += unsupported
        out.rejected_by["unsupported_metric_type"] = unsupported
        out.reasons.append(
            f"{unsupported} histogram/summary data point(s) rejected: only gauges and sums are analysed"
        )
    return out


def receive(signal: str, body: bytes, content_type: str) -> tuple[Tagged, list[str]]:
    """An export request of `signal` ("logs" | "metrics") decoded and tagged, with the decoding warnings."""
    bound = limits.active().max_records_per_request
    protobuf = media_type(content_type) in PROTOBUF_TYPES
    if not protobuf:
        _check_json_values(body, bound)
    else:
        _check_wire_attributes(signal, body)
    if signal == "logs":
        if protobuf and body.count(b"\x12") > bound:  # counted on the wire first: decoding is what a hostile
            # request makes expensive. Each record and scope group has a 0x12 tag byte: fewer, no walk needed.
            _check_count("log records", otlp_wire.count_log_records(body, bound), bound)
        flat = _flat(body) if protobuf else None
        if flat is not None:  # the usual shape throughout: no whole decode
            tagged = _columnar_entries(body, flat)
            if tagged is not None:
                _check_count("log records", tagged.count, bound)
                return tagged, []
        logs, warnings = decode_logs(body, content_type)
        _check_count(
            "log records",
            sum(len(sl.log_records) for rl in logs.resource_logs for sl in rl.scope_logs),
            bound,
        )
        return _usable(log_entries(logs, flat=flat)), warnings
    if protobuf:
        _check_count("metric data points", otlp_wire.count_data_points(body, bound), bound)
    metrics, warnings = decode_metrics(body, content_type)
    _check_count(
        "metric data points",
        sum(
            _count_points(m, m.WhichOneof("data"))
            for rm in metrics.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        ),
        bound,
    )
    return _usable(metric_entries(metrics)), warnings


class InvalidRecords(InputError):
    """Every record of a request holds a number the store cannot keep: 400 / INVALID_ARGUMENT, not retried."""


def _usable(tagged: Tagged) -> Tagged:
    """`tagged`, unless every record was refused for a bad number: then the request is (OTLP's "bad
    data": the client must not retry it). Some records refused among accepted ones are a partial
    success instead, which clients do not retry either."""
    if tagged.count == 0 and tagged.rejected_by.get(_INVALID):
        raise InvalidRecords("; ".join(tagged.reasons))
    return tagged


class DecoderBusy(TransientError):
    """Every decode slot (max_concurrent_decodes) stayed taken: UNAVAILABLE / 503, retry later."""


def receive_bounded(
    signal: str, raw: bytes, encoding: str | None, content_type: str, limit: int, wait_s: float = 30.0
) -> tuple[Tagged, list[str]]:
    """`decompress` then `receive`, holding one of the max_concurrent_decodes slots: however many
    requests arrive at once, only that many are ever expanded in memory together."""
    try:
        with limits.decode_slot(wait_s):
            return receive(signal, decompress(raw, encoding, limit), content_type)
    except TimeoutError as exc:
        raise DecoderBusy(f"server busy decoding other requests ({exc}): retry later") from None


# OTLP/JSON values per record allowed before parsing: a record with a dozen attributes has ~40.
JSON_VALUES_PER_RECORD = 64


def _check_json_values(body: bytes, bound: int) -> None:
    """Refuse OTLP/JSON that would parse into more values than `bound` records can hold. `json.loads`
    builds every value before anything can be counted, and `[{},{},…]` costs ~100 bytes of memory
    per 3 bytes of body; a value after the first in a container needs a comma, so commas and
    brackets bound the values from above (string contents only make the bound looser)."""
    values = body.count(b",") + body.count(b"{") + body.count(b"[")
    if values > bound * JSON_VALUES_PER_RECORD:
        raise MessageTooLarge(
            f"OTLP/JSON body holds up to {values:,} values, more than {JSON_VALUES_PER_RECORD} for each "
            f"of the {bound:,} records allowed per request (setting max_records_per_request): "
            "send smaller batches"
        )


class _AttributeCounter:
    """`object_pairs_hook` of json.loads that refuses the document as soon as it holds more than `bound`
    attributes (objects with a "key" member: KeyValue), so parsing stops there."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.found = 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(pairs)
        if "key" in made:
            self.found += 1
            if self.found > self.bound:
                raise MessageTooLarge(
                    f"OTLP/JSON body holds more than {self.bound:,} attributes, the limit per request "
                    "(setting max_attributes_per_request): send smaller batches"
                )
        return made


def _attribute_counter(body: bytes) -> _AttributeCounter | None:
    """A counter for json.loads when the body may hold too many attributes, else None (parse at full
    speed). Each attribute is an object with a "key" member, spelt `"key"` or with \\u escapes in it,
    so these two counts bound the attributes from above."""
    bound = limits.active().max_attributes_per_request
    if body.count(b'"key"') + body.count(b"\\u") <= bound:
        return None
    return _AttributeCounter(bound)


# The tag bytes of the fields counted as attributes: KeyValue lists (resource 1, scope 3, log record
# 6, data points 7, 9 and 1, exemplar 7, metric metadata 12, key-value list 1), array values (1) and
# summary quantiles (6).
_ATTRIBUTE_TAGS = (b"\x0a", b"\x1a", b"\x32", b"\x3a", b"\x4a", b"\x62")
_NOT_ATTRIBUTE_TAGS = bytes(sorted(set(range(256)) - {t[0] for t in _ATTRIBUTE_TAGS}))


def _check_wire_attributes(signal: str, body: bytes) -> None:
    """Refuse OTLP/protobuf holding more attributes than max_attributes_per_request, or than
    JSON_VALUES_PER_RECORD per record when it holds more records, counted on the wire before
    decoding: an attribute takes two bytes of body and a message object once decoded."""
    bound = limits.active().max_attributes_per_request
    if len(body) <= 2 * bound:  # too short to hold more
        return
    # each attribute has its own tag byte, one of these: counted in one pass (what is left of the body)
    tags = len(body.translate(None, _NOT_ATTRIBUTE_TAGS))
    if tags <= bound:  # no more than the least allowed: the records need no counting
        return
    records = limits.active().max_records_per_request
    if signal == "logs":
        records = otlp_wire.count_log_records(body, records)
    else:
        records = otlp_wire.count_data_points(body, records)
    allowed = max(bound, JSON_VALUES_PER_RECORD * records)
    if tags <= allowed:
        return
    if otlp_wire.count_attributes(body, signal, allowed) > allowed:
        raise MessageTooLarge(
            f"OTLP/protobuf body holds more than {allowed:,} attributes and array values, the limit "
            f"for its {records:,} records (setting max_attributes_per_request, or "
            f"{JSON_VALUES_PER_RECORD} per record): send smaller batches"
        )


def _check_count(what: str, count: int, bound: int) -> None:
    """Refuse a request with more records than max_records_per_request before they are decoded or
    tagged (hypocenter/limits.py): MessageTooLarge, so 413 / RESOURCE_EXHAUSTED."""
    if count > bound:
        raise MessageTooLarge(
            f"request holds more than {bound:,} {what}, the limit per request "
            "(setting max_records_per_request): send smaller batches"
        )


def export_response(signal: str, tagged: Tagged, warnings: Iterable[str] = ()) -> Message:
    """The answer to an accepted export: a partial success naming what was rejected and why, and
    any warning about what was accepted; an empty response when there is nothing to say."""
    message = "; ".join([*warnings, *tagged.reasons])
    if signal == "logs":
        if not message:
            return ExportLogsServiceResponse()
        return ExportLogsServiceResponse(
            partial_success=ExportLogsPartialSuccess(
                rejected_log_records=tagged.rejected, error_message=message
            )
        )
    if not message:
        return ExportMetricsServiceResponse()
    return ExportMetricsServiceResponse(
        partial_success=ExportMetricsPartialSuccess(
            rejected_data_points=tagged.rejected, error_message=message
        )
    )


_BANNER = re.compile(r"\*\*\* JOB \S+ ON \S+ (CANCELLED|FAILED|TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY)\b")

# Prometheus-style node labels, for node-scoped metrics scraped without a host.name resource.


def _count_points(metric: Any, kind: str | None) -> int:
    if kind is None:
        return 0
    return len(getattr(metric, kind).data_points)
