"""Wire-faithful fakes of Loki's push API and Grafana's annotations API, for the exporter tests.

FakeLoki (`POST /loki/api/v1/push`, Loki HTTP API reference "Ingest logs"):
  * `application/x-protobuf`: the body is snappy block-compressed `logproto.PushRequest`. It is
    decoded here by a hand-written protobuf wire-format reader that follows the documented messages
    field by field (numbers and wire types) and refuses anything else, so it is independent of the
    exporter's encoder (which uses the protobuf runtime).
  * `application/json` (optionally `Content-Encoding: gzip`): `{"streams": [{"stream": {..},
    "values": [["<ns>", "<line>", {structured metadata}?]]}]}`.
  * labels are a Prometheus label string `{a="b", ...}` (protobuf) or an object (JSON); names must
    match `[a-zA-Z_][a-zA-Z0-9_]*`, at most 15 per stream (Loki's default limit); structured metadata
    values are strings. Success is 204; a bad body is 400 with a text message, like Loki.
FakeGrafana (`POST /api/annotations`): JSON body with `text` required, `time`/`timeEnd` epoch ms
  integers, `tags` strings; answers 200 `{"message": "Annotation added", "id": N}`; 401 when a
  token is configured and `Authorization: Bearer <token>` is missing.

Both can be told to answer the next requests with given statuses (`fail_next([503, 429])`), with a
`Retry-After` header, or to stall longer than the client's timeout.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cramjam

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_LABELS = 15


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
            out.append((name, buf[i:i + length]))
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


@dataclass(frozen=True)
class PushedEntry:
    labels: dict[str, str]
    ts_ns: int
    line: str
    metadata: dict[str, str]


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
                raise WireError(f"a value must be [\"<ns>\", \"<line>\", {{metadata}}?], not {value!r}")
            meta = value[2] if len(value) == 3 else {}
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise WireError("structured metadata must be an object of strings")
            out.append(PushedEntry(dict(labels), int(value[0]), value[1], dict(meta)))
    return out


def validate(entries: list[PushedEntry]) -> None:
    for e in entries:
        if not e.labels:
            raise WireError("error at least one label pair is required per stream")
        if len(e.labels) > MAX_LABELS:
            raise WireError(f"stream has {len(e.labels)} labels, more than the limit of {MAX_LABELS}")
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

            def reply(self, status: int, body: bytes = b"", ctype: str = "text/plain; charset=utf-8",
                      headers: dict[str, str] | None = None) -> None:
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
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                b = server.behaviour
                with b.lock:
                    b.requests.append({"path": self.path, "headers": dict(self.headers), "size": len(body)})
                if b.stall_s:
                    time.sleep(b.stall_s)
                failure = b.next_failure()
                if failure is not None:
                    extra = {"Retry-After": b.retry_after} if b.retry_after else None
                    self.reply(failure, f"injected failure {failure}\n".encode(), headers=extra)
                    return
                status, answer, ctype = server.handle(self.path, dict(self.headers), body)
                self.reply(status, answer, ctype)

        return Handler

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        raise NotImplementedError


class FakeLoki(_FakeServer):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[PushedEntry] = []
        self.tenants: list[str | None] = []

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
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
        self.entries.extend(entries)
        self.tenants.append(headers.get("X-Scope-OrgID"))
        return 204, b"", ""


class FakeGrafana(_FakeServer):
    def __init__(self, token: str = "") -> None:
        super().__init__()
        self.token = token
        self.annotations: list[dict[str, Any]] = []

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        def answer(status: int, message: str, **extra: Any) -> tuple[int, bytes, str]:
            return status, json.dumps({"message": message, **extra}).encode(), "application/json"

        if path != "/api/annotations":
            return answer(404, "Not found")
        if self.token and headers.get("Authorization") != f"Bearer {self.token}":
            return answer(401, "Unauthorized")
        try:
            doc = json.loads(body)
        except ValueError:
            return answer(400, "bad request data")
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or not doc["text"]:
            return answer(400, "bad request data")
        for key in ("time", "timeEnd"):
            if key in doc and not isinstance(doc[key], int):
                return answer(400, "bad request data")
        if not isinstance(doc.get("tags", []), list) or not all(isinstance(t, str) for t in doc.get("tags", [])):
            return answer(400, "bad request data")
        self.annotations.append(doc)
        return answer(200, "Annotation added", id=len(self.annotations))
