"""Wire-faithful fakes of Loki's push API and Grafana's annotations API, for the exporter tests.

FakeLoki (`POST /loki/api/v1/push`, Loki HTTP API reference "Ingest logs"):
  * `application/x-protobuf`: the body is snappy block-compressed `logproto.PushRequest`. It is
    decoded here by a hand-written protobuf wire-format reader that follows the documented messages
    field by field (numbers and wire types) and refuses anything else, so it is independent of the
    exporter's encoder (which uses the protobuf runtime).
  * `application/json` (optionally `Content-Encoding: gzip`): `{"streams": [{"stream": {..},
    "values": [["<ns>", "<line>", {structured metadata}?]]}]}`.
  * labels are a Prometheus label string `{a="b", ...}` (protobuf) or an object (JSON); names must
    match `[a-zA-Z_][a-zA-Z0-9_]*`; structured metadata values are strings. Success is 204; a bad
    body is 400 with a text message, like Loki.
  * what is pushed is ingested as Loki does it (loki_ingest.py, from Loki's source): identical
    entries stored once, entries an hour behind their stream's newest or older than a week refused
    with Loki's 400 texts while the rest is kept, at most 15 labels besides `service_name`, which
    Loki adds, as it adds `detected_level` to structured metadata. `clock` is the server's now.
  * `POST /otlp/v1/logs`: OTLP/HTTP logs mapped to streams as Loki's OTLP endpoint does, resource
    attributes promoted to labels per `IngestLimits.otlp_config` (Loki's default list).
FakeGrafana (`POST /api/annotations`): JSON body with `text` required, `time`/`timeEnd` epoch ms
  integers, `tags` strings; answers 200 `{"message": "Annotation added", "id": N}`; 401 when a
  token is configured and `Authorization: Bearer <token>` is missing. `PATCH`, `PUT`, `GET` and
  `DELETE /api/annotations/:id` as Grafana answers them (404 "Annotation not found").

FakeLoki also answers the query side a pull connector uses (Loki HTTP API reference "Query logs
within a range of time", "Query streams", "Query logs at a single point in time"), over what was
pushed or `preload`ed:
  * `GET /loki/api/v1/query_range`: LogQL log queries — a stream selector with `=`, `!=`, `=~`,
    `!~` matchers (regexes fully anchored; at least one matcher that does not match the empty
    string), then `|=`, `!=`, `|~`, `!~` line filters and `| name op "value"` label filters over
    stream labels and structured metadata, and `| json` / `| json a, b="x.y"` parser stages (a
    field that is already a label or metadata is named `<field>_extracted`, as Loki does). Strings follow Go's strconv.Unquote (double-quoted with
    escapes, or back-quoted raw); regexes are Python `re` restricted to what RE2 accepts. `start` is
    inclusive, `end` exclusive; `limit` (default 100) counts entries over all streams and may not
    exceed `max_entries_limit_per_query`; `end - start` plus Loki's 30 s look-back may not exceed
    `max_query_length`;
    `direction` forward | backward (default). Entries at one timestamp keep push order within a
    stream; between streams they come in label order, or in a fresh random order per request
    (`ties="random"`): Loki promises no order there.
    Answer `{"status": "success", "data": {"resultType": "streams", "result": [{"stream": {..},
    "values": [["<ns>", "<line>"], ..]}], "stats": {..}}}`; with the request header
    `X-Loki-Response-Encoding-Flags: categorize-labels`, `stream` holds index labels only, each value
    carries a third element `{"structuredMetadata": {..}}` and `data.encodingFlags` says so;
    otherwise structured metadata is merged into `stream` (one stream per distinct metadata).
  * `GET|POST /loki/api/v1/series` (`match[]`, `start`, `end`): the index label sets with entries
    in range.
  * `GET /loki/api/v1/query`: only `sum by (<label>) (count_over_time(<log query> [<N>s]))`.
  A bad query is 400 with Loki's kind of text message. `required_headers` makes any query without
  them 401 (a Loki behind an auth proxy, or multi-tenant Loki without `X-Scope-OrgID`).

Both can be told to answer the next requests with given statuses (`fail_next([503, 429])`), with a
`Retry-After` header, or to stall longer than the client's timeout.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cramjam
from google.protobuf import json_format
from loki_ingest import Entry, Ingest, IngestLimits, otlp_entries, otlp_error
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class WireError(ValueError):
    pass


# ----------------------------------------------------------------------------------- protobuf wire reader


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(buf: bytes, schema: dict[int, tuple[str, int]]) -> list[tuple[str, int | bytes]]:
    """(name, value) for each field, checked against {number: (name, wire type)}; wire type 0 = varint,
    2 = length-delimited. An unknown field number or a wrong wire type is an error."""
    out: list[tuple[str, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if number not in schema:
            raise WireError(f"unknown field {number}")
        name, expected = schema[number]
        if wire != expected:
            raise WireError(f"field {name} has wire type {wire}, expected {expected}")
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((name, value))
        else:
            length, i = _varint(buf, i)
            if i + length > len(buf):
                raise WireError(f"field {name} is truncated")
            out.append((name, buf[i : i + length]))
            i += length
    return out


PUSH_REQUEST = {1: ("streams", 2), 2: ("format", 2)}
STREAM_ADAPTER = {1: ("labels", 2), 2: ("entries", 2), 3: ("hash", 0)}
ENTRY_ADAPTER = {1: ("timestamp", 2), 2: ("line", 2), 3: ("structuredMetadata", 2), 4: ("parsed", 2)}
TIMESTAMP = {1: ("seconds", 0), 2: ("nanos", 0)}
LABEL_PAIR = {1: ("name", 2), 2: ("value", 2)}


def _text(v: int | bytes) -> str:
    assert isinstance(v, bytes)
    return v.decode("utf-8")


_PAIR = re.compile(r'\s*([^=\s,{}]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_label_string(text: str) -> dict[str, str]:
    """A Prometheus label string `{a="b", c="d"}` as Loki's push endpoint parses it."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise WireError(f"labels {text!r} are not a {{...}} label string")
    body = text[1:-1].strip()
    out: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _PAIR.match(body, pos)
        if not m:
            raise WireError(f"cannot parse labels {text!r} at {pos}")
        value = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), m.group(2))
        out[m.group(1)] = value
        pos = m.end()
    return out


PushedEntry = Entry  # (labels, ts_ns, line, metadata)


def decode_protobuf_push(body: bytes) -> list[PushedEntry]:
    raw = bytes(cramjam.snappy.decompress_raw(body))
    out: list[PushedEntry] = []
    for name, stream in fields(raw, PUSH_REQUEST):
        if name != "streams":
            continue
        assert isinstance(stream, bytes)
        labels: dict[str, str] = {}
        entries: list[bytes] = []
        for sname, sval in fields(stream, STREAM_ADAPTER):
            if sname == "labels":
                labels = parse_label_string(_text(sval))
            elif sname == "entries":
                assert isinstance(sval, bytes)
                entries.append(sval)
        for entry in entries:
            ts = 0
            line = ""
            meta: dict[str, str] = {}
            for ename, evalue in fields(entry, ENTRY_ADAPTER):
                if ename == "timestamp":
                    assert isinstance(evalue, bytes)
                    parts = dict(fields(evalue, TIMESTAMP))
                    ts = int(parts.get("seconds", 0)) * 1_000_000_000 + int(parts.get("nanos", 0))
                elif ename == "line":
                    line = _text(evalue)
                elif ename == "structuredMetadata":
                    assert isinstance(evalue, bytes)
                    pair = {k: _text(v) for k, v in fields(evalue, LABEL_PAIR)}
                    meta[pair.get("name", "")] = pair.get("value", "")
                elif ename == "parsed":
                    raise WireError("clients must not send `parsed`")
            out.append(PushedEntry(labels, ts, line, meta))
    return out


def decode_json_push(body: bytes) -> list[PushedEntry]:
    doc = json.loads(body)
    out: list[PushedEntry] = []
    for stream in doc["streams"]:
        labels = stream["stream"]
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise WireError("stream labels must be an object of strings")
        for value in stream["values"]:
            if not 2 <= len(value) <= 3 or not isinstance(value[0], str) or not isinstance(value[1], str):
                raise WireError(f'a value must be ["<ns>", "<line>", {{metadata}}?], not {value!r}')
            meta = value[2] if len(value) == 3 else {}
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise WireError("structured metadata must be an object of strings")
            out.append(PushedEntry(dict(labels), int(value[0]), value[1], dict(meta)))
    return out


def validate(entries: list[PushedEntry]) -> None:
    for e in entries:
        if not e.labels:
            raise WireError("error at least one label pair is required per stream")
        for name in [*e.labels, *e.metadata]:
            if not LABEL_NAME.match(name):
                raise WireError(f"invalid label name {name!r}")
        if e.ts_ns <= 0:
            raise WireError("entry has no timestamp")


# ----------------------------------------------------------------------------------- servers


@dataclass
class Behaviour:
    statuses: list[int] = field(default_factory=list)
    retry_after: str | None = None
    stall_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_failure(self) -> int | None:
        with self.lock:
            return self.statuses.pop(0) if self.statuses else None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-request is part of the tests, not an error to print


class _FakeServer:
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        handler = self._handler()
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> _FakeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def fail_next(self, statuses: list[int], retry_after: str | None = None) -> None:
        with self.behaviour.lock:
            self.behaviour.statuses.extend(statuses)
            self.behaviour.retry_after = retry_after

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def reply(
                self,
                status: int,
                body: bytes = b"",
                ctype: str = "text/plain; charset=utf-8",
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if status != 204:
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if status != 204:
                    # the client may have given up (its timeout): what a real server sees too
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self.wfile.write(body)

            def do_POST(self) -> None:
                self.serve("POST")

            def do_GET(self) -> None:
                self.serve("GET")

            def do_PATCH(self) -> None:
                self.serve("PATCH")

            def do_PUT(self) -> None:
                self.serve("PUT")

            def do_DELETE(self) -> None:
                self.serve("DELETE")

            def serve(self, method: str) -> None:
                body = (
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    if method in ("POST", "PATCH", "PUT")
                    else b""
                )
                b = server.behaviour
                with b.lock:
                    b.requests.append(
                        {
                            "method": method,
                            "path": self.path,
                            "headers": dict(self.headers),
                            "size": len(body),
                        }
                    )
                if b.stall_s:
                    time.sleep(b.stall_s)
                failure = b.next_failure()
                if failure is not None:
                    extra = {"Retry-After": b.retry_after} if b.retry_after else None
                    self.reply(failure, f"injected failure {failure}\n".encode(), headers=extra)
                    return
                if method == "POST":
                    status, answer, ctype = server.handle(self.path, dict(self.headers), body)
                elif method == "GET":
                    status, answer, ctype = server.handle_get(self.path, dict(self.headers))
                else:
                    status, answer, ctype = server.handle_other(method, self.path, dict(self.headers), body)
                self.reply(status, answer, ctype)

        return Handler

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        raise NotImplementedError

    def handle_get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        return 405, b"method not allowed\n", "text/plain"

    def handle_other(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, str]:
        return 405, b"method not allowed\n", "text/plain"


class FakeLoki(_FakeServer):
    """Loki's push, OTLP and query APIs over one store; what is pushed is ingested as a real Loki
    does it (loki_ingest.py: dedup, out-of-order and age refusals, service_name, detected_level).
    `limits` are Loki's push limits (IngestLimits, Loki's defaults); `clock` is the server's now
    (a test replaying old logs sets it to when they were written, as a real push would have been)."""

    def __init__(
        self,
        *,
        max_entries_limit_per_query: int = 5000,
        max_query_length_s: float = 721 * 3600.0,
        ties: str = "labels",
        seed: int = 0,
        required_headers: dict[str, str] | None = None,
        limits: IngestLimits | None = None,
        clock: Callable[[], float] = time.time,
        query_lookback_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.ingest = Ingest(limits or IngestLimits(), clock)
        self.tenants: list[str | None] = []
        self.max_entries_limit_per_query = max_entries_limit_per_query
        self.max_query_length_ns = int(max_query_length_s * 1e9)
        self.query_lookback_ns = int(query_lookback_s * 1e9)
        self.ties = ties
        self.random = random.Random(seed)
        self.required_headers = dict(required_headers or {})
        self.queries: list[dict[str, str]] = []  # parameters of every query_range answered
        self.pushes: list[tuple[int, str]] = []  # (status, body) of every push answered

    @property
    def entries(self) -> list[PushedEntry]:
        """What Loki holds (labels with service_name, metadata with detected_level), in arrival order."""
        return self.ingest.entries

    def preload(self, entries: list[PushedEntry]) -> None:
        """Entries as if pushed when they were written: in time order, validated and ingested the same
        way but not refused for their age; a refusal is an error in the test."""
        validate(entries)
        status, body = self.ingest.push(sorted(entries, key=lambda e: e.ts_ns), check_time=False)
        if status != 204:
            raise WireError(f"preload refused ({status}): {body}")

    def handle_get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        url = urllib.parse.urlsplit(path)
        return self._query(url.path, urllib.parse.parse_qsl(url.query, keep_blank_values=True), headers)

    def _query(
        self, path: str, params: list[tuple[str, str]], headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        for name, value in self.required_headers.items():
            if headers.get(name) != value:
                return 401, b"no org id\n" if name == "X-Scope-OrgID" else b"Unauthorized\n", "text/plain"
        try:
            if path == "/loki/api/v1/query_range":
                doc = self._query_range(dict(params), headers)
            elif path == "/loki/api/v1/series":
                doc = self._series(params)
            elif path == "/loki/api/v1/query":
                doc = self._instant(dict(params))
            else:
                return 404, b"404 page not found\n", "text/plain"
        except LogQLError as exc:
            return 400, f"{exc}\n".encode(), "text/plain; charset=utf-8"
        return 200, json.dumps(doc).encode(), "application/json; charset=UTF-8"

    def _range(self, params: dict[str, str]) -> tuple[int, int]:
        now = time.time_ns()
        end = _loki_time(params["end"]) if params.get("end") else now
        start = _loki_time(params["start"]) if params.get("start") else end - 3600 * 10**9
        if end < start:
            raise LogQLError(
                "invalid start and end time: end timestamp must not be before or equal to start time"
            )
        # The length Loki checks is end - start plus its 30 s look-back (logql/engine.go
        # max_look_back_period), as a real Loki 3.x answers a piece of exactly max_query_length;
        # the text is queryrange/limits.go's (util/validation ErrQueryTooLong): the length as a Go
        # time.Duration, the limit as a Prometheus model.Duration.
        length = end - start + self.query_lookback_ns
        if self.max_query_length_ns and length > self.max_query_length_ns:
            raise LogQLError(
                f"the query time range exceeds the limit (query length: {_duration(length)}, "
                f"limit: {model_duration(self.max_query_length_ns)})"
            )
        return start, end

    def _select(self, query: LogQuery, start: int, end: int) -> list[tuple[int, int, PushedEntry]]:
        """(timestamp, tie-break, entry) of every entry the query selects in [start, end); labels
        its parser stages extracted are in `self.parsed[id(entry)]` for the answer."""
        out = []
        self.parsed: dict[int, dict[str, str]] = {}
        for seq, e in enumerate(self.entries):
            if start <= e.ts_ns < end and (parsed := query.evaluate(e)) is not None:
                out.append((e.ts_ns, seq, e))
                self.parsed[id(e)] = parsed
        # Within a stream Loki keeps push order; between streams at one timestamp it promises nothing.
        if self.ties == "random":
            keys = {tuple(sorted(e.labels.items())): self.random.random() for _, _, e in out}
            out.sort(key=lambda t: (t[0], keys[tuple(sorted(t[2].labels.items()))], t[1]))
        else:
            out.sort(key=lambda t: (t[0], sorted(t[2].labels.items()), t[1]))
        return out

    def _query_range(self, params: dict[str, str], headers: dict[str, str]) -> dict[str, Any]:
        if "query" not in params:
            raise LogQLError("query parameter is required")
        query = parse_logql(params["query"])
        start, end = self._range(params)
        try:
            limit = int(params.get("limit", "100"))
        except ValueError:
            raise LogQLError(f"invalid limit {params['limit']!r}") from None
        if limit <= 0:
            raise LogQLError("limit must be a positive value")
        if limit > self.max_entries_limit_per_query:
            raise LogQLError(
                f"max entries limit per query exceeded, limit > max_entries_limit_per_query "
                f"({limit} > {self.max_entries_limit_per_query})"
            )
        direction = params.get("direction", "backward").lower()
        if direction not in ("forward", "backward"):
            raise LogQLError(f"invalid direction {params['direction']!r}")
        with self.behaviour.lock:
            self.queries.append(dict(params))
        selected = self._select(query, start, end)
        if direction == "backward":
            selected.reverse()
        chosen = selected[:limit]
        categorize = "categorize-labels" in headers.get("X-Loki-Response-Encoding-Flags", "")
        streams: dict[tuple[tuple[str, str], ...], list[list[Any]]] = {}
        for ts, _, e in chosen:
            parsed = self.parsed.get(id(e), {})
            labels = e.labels if categorize else {**e.metadata, **e.labels, **parsed}
            value: list[Any] = [str(ts), e.line]
            if categorize and (e.metadata or parsed):
                value.append(
                    {k: v for k, v in (("structuredMetadata", dict(e.metadata)), ("parsed", parsed)) if v}
                )
            streams.setdefault(tuple(sorted(labels.items())), []).append(value)
        result = [{"stream": dict(k), "values": v} for k, v in streams.items()]
        data: dict[str, Any] = {
            "resultType": "streams",
            "result": result,
            "stats": {"summary": {"totalEntriesReturned": len(chosen), "totalLinesProcessed": len(selected)}},
        }
        if categorize:
            data["encodingFlags"] = ["categorize-labels"]
        return {"status": "success", "data": data}

    def _series(self, params: list[tuple[str, str]]) -> dict[str, Any]:
        selectors = [v for k, v in params if k == "match[]"]
        if not selectors:
            raise LogQLError("at least one match[] argument is required")
        queries = [parse_logql(m) for m in selectors]
        if any(q.stages for q in queries):
            raise LogQLError("only stream selectors are allowed in match[]")
        start, end = self._range(dict(params))
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for q in queries:
            for _, _, e in self._select(q, start, end):
                seen.setdefault(tuple(sorted(e.labels.items())), dict(e.labels))
        return {"status": "success", "data": list(seen.values())}

    def _instant(self, params: dict[str, str]) -> dict[str, Any]:
        m = _COUNT_BY.match(params.get("query", ""))
        if not m:
            raise LogQLError("this fake only answers sum by (<label>) (count_over_time(<log query> [<N>s]))")
        label, inner, seconds = m.group(1), parse_logql(m.group(2)), int(m.group(3))
        at = _loki_time(params["time"]) if params.get("time") else time.time_ns()
        if self.max_query_length_ns and seconds * 10**9 > self.max_query_length_ns:
            raise LogQLError(
                f"the query time range exceeds the limit (query length: {_duration(seconds * 10**9)}, "
                f"limit: {model_duration(self.max_query_length_ns)})"
            )
        counts: dict[str, int] = {}
        for _, _, e in self._select(inner, at - seconds * 10**9, at):
            value = {**e.metadata, **e.labels}.get(label, "")
            counts[value] = counts.get(value, 0) + 1
        result = [
            {"metric": {label: v} if v else {}, "value": [at / 1e9, str(n)]}
            for v, n in sorted(counts.items())
        ]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        if path == "/loki/api/v1/series":
            return self._query(path, urllib.parse.parse_qsl(body.decode(), keep_blank_values=True), headers)
        if path == "/otlp/v1/logs":
            return self._otlp(headers, body)
        if path != "/loki/api/v1/push":
            return 404, b"404 page not found\n", "text/plain"
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            if ctype == "application/x-protobuf" or ctype == "":
                entries = decode_protobuf_push(body)
            elif ctype == "application/json":
                if (headers.get("Content-Encoding") or "").lower() == "gzip":
                    body = gzip.decompress(body)
                entries = decode_json_push(body)
            else:
                return 415, f"unsupported Content-Type {ctype!r}\n".encode(), "text/plain"
            validate(entries)
        except (WireError, ValueError, KeyError, TypeError, OSError) as exc:
            return 400, f"{exc}\n".encode(), "text/plain"
        status, answer = self.ingest.push(entries)
        with self.behaviour.lock:
            self.tenants.append(headers.get("X-Scope-OrgID"))
            self.pushes.append((status, answer))
        # push.go HTTPError is Go's http.Error: the text and a newline
        return status, (answer + "\n").encode() if answer else b"", "text/plain; charset=utf-8"

    def _otlp(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        """`POST /otlp/v1/logs` (loghttp/push/otlp.go): OTLP/HTTP protobuf or JSON; errors are a
        protobuf google.rpc.Status (push.go OTLPError)."""
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        if (headers.get("Content-Encoding") or "").lower() == "gzip":
            body = gzip.decompress(body)
        request = ExportLogsServiceRequest()
        try:
            if ctype == "application/json":
                json_format.Parse(body.decode("utf-8"), request)
            elif ctype == "application/x-protobuf":
                request.ParseFromString(body)
            else:
                return 415, otlp_error(f"unsupported content type: {ctype}"), "application/octet-stream"
            entries = otlp_entries(request, self.ingest.limits)
            validate(entries)
        except (WireError, ValueError) as exc:
            return 400, otlp_error(str(exc)), "application/octet-stream"
        status, answer = self.ingest.push(entries)
        with self.behaviour.lock:
            self.tenants.append(headers.get("X-Scope-OrgID"))
            self.pushes.append((status, answer))
        return status, otlp_error(answer) if answer else b"", "application/octet-stream"


# ----------------------------------------------------------------------------------- LogQL (query side)


class LogQLError(ValueError):
    pass


_COUNT_BY = re.compile(r"^sum by \((\w+)\) \(count_over_time\((.*) \[(\d+)s\]\)\)$", re.S)
_RE2_UNSUPPORTED = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\(\?P=|[*+?}][+]")
_IDENT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_GO_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
}


def _loki_time(text: str) -> int:
    """Loki's accepted timestamps: integer ns epoch, float seconds, RFC 3339."""
    if re.fullmatch(r"\d+", text):
        return int(text)
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        raise LogQLError(f"cannot parse {text!r} to a valid timestamp") from None


def _duration(ns: int) -> str:
    """Go's time.Duration.String() for whole seconds: `721h0m30s`."""
    hours, rest = divmod(ns // 10**9, 3600)
    if not hours:
        return f"{rest // 60}m{rest % 60}s" if rest >= 60 else f"{rest}s"
    return f"{hours}h{rest // 60}m{rest % 60}s"


def model_duration(ns: int) -> str:
    """Prometheus model.Duration.String(): `30d1h` for 721 h (y and w only when exact)."""
    ms = ns // 10**6
    if ms == 0:
        return "0s"
    out = ""
    for unit, mult, exact in (
        ("y", 31_536_000_000, True),
        ("w", 604_800_000, True),
        ("d", 86_400_000, False),
        ("h", 3_600_000, False),
        ("m", 60_000, False),
        ("s", 1000, False),
        ("ms", 1, False),
    ):
        if exact and ms % mult:
            continue
        if (v := ms // mult) > 0:
            out += f"{v}{unit}"
            ms -= v * mult
    return out


def _re2(pattern: str, anchored: bool) -> re.Pattern[str]:
    if _RE2_UNSUPPORTED.search(pattern):
        raise LogQLError(f"error parsing regexp: invalid or unsupported Perl syntax in `{pattern}`")
    # RE2 takes flags anywhere; Python only at the start: hoist a leading `(?i)` out of the anchoring group.
    m = re.match(r"\(\?([imsU]+)\)", pattern)
    flags = f"(?{m.group(1).replace('U', '')})" if m and m.group(1).replace("U", "") else ""
    body = pattern[m.end() :] if m else pattern
    try:
        return re.compile(flags + (f"(?:{body})\\Z" if anchored else body))
    except re.error as exc:
        raise LogQLError(f"error parsing regexp: {exc}: `{pattern}`") from None


@dataclass
class LogQuery:
    matchers: list[tuple[str, str, str, re.Pattern[str] | None]]
    # (kind "line" | "label" | "json", op, value | name\0value | json spec, regex)
    stages: list[tuple[str, str, str, re.Pattern[str] | None]]

    def matches(self, e: PushedEntry) -> bool:
        return self.evaluate(e) is not None

    def evaluate(self, e: PushedEntry) -> dict[str, str] | None:
        """None when the entry is filtered out; else the labels its parser stages extracted."""
        if not all(
            _test(op, e.labels.get(name, ""), value, rx, full=True) for name, op, value, rx in self.matchers
        ):
            return None
        parsed: dict[str, str] = {}
        for kind, op, name_or_value, rx in self.stages:
            if kind == "line":
                if not _test(op, e.line, name_or_value, rx, full=False):
                    return None
            elif kind == "json":
                parsed.update(json_stage(e, json.loads(name_or_value), parsed))
            else:
                name, value = name_or_value.split("\0", 1)
                if not _test(op, {**e.labels, **e.metadata, **parsed}.get(name, ""), value, rx, full=True):
                    return None
        return parsed


def _json_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def json_stage(e: PushedEntry, spec: list[list[str]], parsed: dict[str, str]) -> dict[str, str]:
    """logql/log/parser.go: `| json` (JSONParser: every field, nested names joined by `_`) or
    `| json a, b="x.y"` (JSONExpressionParser). A name that is already a stream label or structured
    metadata gets the suffix `_extracted` (`duplicateSuffix`); a line that is not JSON gets
    `__error__="JSONParserErr"`."""
    try:
        doc = json.loads(e.line)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return {"__error__": "JSONParserErr"}

    def name(key: str) -> str:
        return key + "_extracted" if key in e.labels or key in e.metadata else key

    out: dict[str, str] = {}
    if not spec:

        def walk(node: dict[str, Any], prefix: str) -> None:
            for k, v in node.items():
                key = prefix + re.sub(r"[^a-zA-Z0-9_]", "_", k)
                if isinstance(v, dict):
                    walk(v, key + "_")
                else:
                    out[name(key)] = _json_text(v)

        walk(doc, "")
        return out
    for identifier, path in spec:
        node: Any = doc
        for part in re.findall(r'[^.\[\]"]+', path):
            node = node.get(part) if isinstance(node, dict) else None
        out[name(identifier)] = _json_text(node) if node is not None else ""
    return out


def _test(op: str, text: str, value: str, rx: re.Pattern[str] | None, *, full: bool) -> bool:
    if op in ("=~", "|~", "!~"):
        assert rx is not None
        hit = bool(rx.match(text) if full else rx.search(text))
        return hit if op != "!~" else not hit
    if op == "|=":
        return value in text
    if full:
        return (text == value) if op == "=" else (text != value)
    return value not in text  # "!=" as a line filter


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, what: str) -> LogQLError:
        return LogQLError(f"parse error at line 1, col {self.pos + 1}: syntax error: {what}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\n\r":
            self.pos += 1

    def peek(self, *options: str) -> str | None:
        self.skip()
        return next((o for o in options if self.text.startswith(o, self.pos)), None)

    def expect(self, *options: str) -> str:
        found = self.peek(*options)
        if found is None:
            rest = self.text[self.pos : self.pos + 10] or "end of input"
            raise self.error(f"unexpected {rest!r}, expecting {' or '.join(options)}")
        self.pos += len(found)
        return found

    def ident(self) -> str:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise self.error(f"unexpected {self.text[self.pos : self.pos + 10]!r}, expecting IDENTIFIER")
        self.pos = m.end()
        return m.group(0)

    def string(self) -> str:
        """A Go string literal: back-quoted raw, or double-quoted with Go's escapes only."""
        self.skip()
        if self.text.startswith("`", self.pos):
            end = self.text.find("`", self.pos + 1)
            if end < 0:
                raise self.error("literal not terminated")
            value = self.text[self.pos + 1 : end]
            self.pos = end + 1
            return value
        if not self.text.startswith('"', self.pos):
            raise self.error(f"unexpected {self.text[self.pos : self.pos + 10]!r}, expecting STRING")
        i = self.pos + 1
        out: list[str] = []
        while i < len(self.text):
            c = self.text[i]
            if c == '"':
                self.pos = i + 1
                return "".join(out)
            if c == "\n":
                break
            if c == "\\":
                nxt = self.text[i + 1 : i + 2]
                if nxt in _GO_ESCAPES:
                    out.append(_GO_ESCAPES[nxt])
                    i += 2
                    continue
                m = re.match(
                    r"x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-7]{3})", self.text[i + 1 :]
                )
                if not m:
                    self.pos = i
                    raise self.error(f"invalid char escape \\{nxt}")
                digits = next(g for g in m.groups() if g)
                out.append(chr(int(digits, 8 if m.group(4) else 16)))
                i += 1 + m.end()
                continue
            out.append(c)
            i += 1
        raise self.error("literal not terminated")


def _json_keyword(lx: _Lexer) -> bool:
    """`json` as a parser stage (not a label filter on a label named json)."""
    lx.skip()
    m = _IDENT.match(lx.text, lx.pos)
    if not m or m.group(0) != "json":
        return False
    rest = lx.text[m.end() :].lstrip()
    if rest[:1] == "=" or rest[:2] in ("!=", "=~", "!~"):
        return False
    lx.pos = m.end()
    return True


def parse_logql(text: str) -> LogQuery:
    """A LogQL log query: `{matchers}` then line filters and label filters."""
    lx = _Lexer(text)
    lx.expect("{")
    matchers: list[tuple[str, str, str, re.Pattern[str] | None]] = []
    while lx.peek("}") is None:
        if matchers:
            lx.expect(",")
        name = lx.ident()
        op = lx.expect("=~", "!~", "!=", "=")
        value = lx.string()
        matchers.append((name, op, value, _re2(value, anchored=True) if "~" in op else None))
    lx.expect("}")
    if all(_test(op, "", value, rx, full=True) for _, op, value, rx in matchers):  # `{}` too
        raise LogQLError(
            "parse error : queries require at least one regexp or equality matcher that does not "
            'have an empty-compatible value. For instance, app=~".*" does not meet this requirement, '
            'but app=~".+" will'
        )
    stages: list[tuple[str, str, str, re.Pattern[str] | None]] = []
    while True:
        op = lx.peek("|=", "|~", "!=", "!~", "|")
        if op is None:
            break
        lx.pos += len(op)
        if op == "|" and _json_keyword(lx):
            spec: list[list[str]] = []
            while True:
                lx.skip()
                if not _IDENT.match(lx.text, lx.pos) or lx.peek("|"):
                    break
                ident = lx.ident()
                path = lx.string() if lx.peek("=") and lx.expect("=") else ident
                spec.append([ident, path])
                if lx.peek(",") is None:
                    break
                lx.expect(",")
            stages.append(("json", "", json.dumps(spec), None))
        elif op == "|":
            name = lx.ident()
            lop = lx.expect("=~", "!~", "!=", "=")
            value = lx.string()
            stages.append(
                ("label", lop, f"{name}\0{value}", _re2(value, anchored=True) if "~" in lop else None)
            )
        else:
            value = lx.string()
            stages.append(("line", op, value, _re2(value, anchored=False) if "~" in op else None))
    lx.skip()
    if lx.pos != len(text):
        raise lx.error(f"unexpected {text[lx.pos : lx.pos + 10]!r}")
    return LogQuery(matchers, stages)


class FakeGrafana(_FakeServer):
    """Grafana's legacy annotations API (pkg/api/annotations.go): `POST /api/annotations` adds one and
    answers its id; `PATCH /api/annotations/:id` changes the fields given (text when not empty, tags
    when present, time / timeEnd when > 0; 200 "Annotation patched"), `PUT` replaces them (200
    "Annotation updated"), `DELETE` removes it (200 "Annotation deleted"), `GET /api/annotations/:id`
    reads it; an id it does not hold is 404 "Annotation not found". `annotations` holds the live
    ones in the order they were added, each with its `id`; ids are never reused."""

    def __init__(self, token: str = "") -> None:
        super().__init__()
        self.token = token
        self.annotations: list[dict[str, Any]] = []
        self._next_id = 1

    @staticmethod
    def _answer(status: int, message: str, **extra: Any) -> tuple[int, bytes, str]:
        return status, json.dumps({"message": message, **extra}).encode(), "application/json"

    def _authorised(self, headers: dict[str, str]) -> bool:
        return not self.token or headers.get("Authorization") == f"Bearer {self.token}"

    @staticmethod
    def _fields_ok(doc: Any) -> bool:
        if not isinstance(doc, dict):
            return False
        for key in ("time", "timeEnd"):
            if key in doc and not isinstance(doc[key], int):
                return False
        tags = doc.get("tags", [])
        return isinstance(tags, list) and all(isinstance(t, str) for t in tags)

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        if path != "/api/annotations":
            return self._answer(404, "Not found")
        if not self._authorised(headers):
            return self._answer(401, "Unauthorized")
        try:
            doc = json.loads(body)
        except ValueError:
            return self._answer(400, "bad request data")
        if not self._fields_ok(doc) or not isinstance(doc.get("text"), str) or not doc["text"]:
            return self._answer(400, "bad request data")
        doc["id"] = self._next_id
        self._next_id += 1
        self.annotations.append(doc)
        return self._answer(200, "Annotation added", id=doc["id"])

    def _find(self, path: str) -> tuple[dict[str, Any] | None, tuple[int, bytes, str] | None]:
        m = re.fullmatch(r"/api/annotations/([^/?]+)", path)
        if not m:
            return None, self._answer(404, "Not found")
        if not m.group(1).lstrip("-").isdigit():
            return None, self._answer(400, "annotationId is invalid")
        found = next((a for a in self.annotations if a["id"] == int(m.group(1))), None)
        return found, None if found is not None else self._answer(404, "Annotation not found")

    def handle_get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        if not self._authorised(headers):
            return self._answer(401, "Unauthorized")
        found, error = self._find(path)
        if error is not None:
            return error
        return 200, json.dumps(found).encode(), "application/json"

    def handle_other(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, str]:
        if not self._authorised(headers):
            return self._answer(401, "Unauthorized")
        found, error = self._find(path)
        if error is not None:
            return error
        assert found is not None
        if method == "DELETE":
            self.annotations.remove(found)
            return self._answer(200, "Annotation deleted")
        try:
            doc = json.loads(body)
        except ValueError:
            return self._answer(400, "bad request data")
        if not self._fields_ok(doc):
            return self._answer(400, "bad request data")
        if method == "PUT":
            for key in ("time", "timeEnd", "text", "tags"):
                found[key] = doc.get(key, 0 if key.startswith("time") else [] if key == "tags" else "")
            return self._answer(200, "Annotation updated")
        if "tags" in doc and doc["tags"] is not None:
            found["tags"] = doc["tags"]
        if isinstance(doc.get("text"), str) and doc["text"]:
            found["text"] = doc["text"]
        for key in ("time", "timeEnd"):
            if doc.get(key, 0) > 0:
                found[key] = doc[key]
        return self._answer(200, "Annotation patched")
