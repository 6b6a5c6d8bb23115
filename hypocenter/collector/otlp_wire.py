"""Count the records of an OTLP protobuf request from its wire format, without decoding it.

Decoding is the expensive step of a hostile request (a small body can hold millions of one-byte
records), so the count is read first, walking only the fields on the path to the records and
stopping once it passes the bound. Malformed input is left for the real decoder to report.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Iterator

_LOG_PATH = (1, 2, 2)
_METRIC_PATH = (1, 2, 2)
_METRIC_DATA = (5, 7, 9, 10, 11)


class _Malformed(Exception):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Malformed
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview, wanted: tuple[int, ...]) -> Iterator[tuple[int, memoryview]]:
    """(field number, bytes) of the length-delimited fields numbered in `wanted`; others skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise _Malformed
            if number in wanted:
                yield number, buf[pos : pos + size]
            pos += size
        else:
            raise _Malformed


def _count_field(buf: memoryview, number: int, stop_after: int) -> int:
    """How many times length-delimited field `number` occurs in one message (up to `stop_after` + 1):
    the hot loop over records, kept free of generators and slices."""
    data = bytes(buf) if len(buf) < 1 << 16 else buf
    n = 0
    pos = 0
    end = len(data)
    while pos < end:
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 2:
            size = data[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(buf, pos)
            pos += size
            if key >> 3 == number:
                n += 1
                if n > stop_after:
                    return n
        elif wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise _Malformed
    return n


def count_log_records(body: bytes, stop_after: int) -> int:
    """Log records in an ExportLogsServiceRequest, counting no further than `stop_after` + 1. Resource
    and scope groups count too when there are more of them than records (empty groups cost the
    decoder as much as records do)."""
    records = groups = 0
    try:
        for _, rl in _fields(memoryview(body), (_LOG_PATH[0],)):
            for _, sl in _fields(rl, (_LOG_PATH[1],)):
                groups += 1
                records += _count_field(sl, _LOG_PATH[2], stop_after - records)
                if records > stop_after:
                    return records
                if groups > stop_after:
                    return groups
    except _Malformed:
        pass
    return records


def count_data_points(body: bytes, stop_after: int) -> int:
    """Data points in an ExportMetricsServiceRequest, counting no further than `stop_after` + 1
    (metrics count too when there are more of them than points)."""
    points = groups = 0
    try:
        for _, rm in _fields(memoryview(body), (_METRIC_PATH[0],)):
            for _, sm in _fields(rm, (_METRIC_PATH[1],)):
                for _, metric in _fields(sm, (_METRIC_PATH[2],)):
                    groups += 1
                    if groups > stop_after:
                        return groups
                    for _, data in _fields(metric, _METRIC_DATA):
                        points += _count_field(data, 1, stop_after - points)
                        if points > stop_after:
                            return points
    except _Malformed:
        pass
    return points


# Where attributes (KeyValue) and array values (AnyValue inside an ArrayValue) sit in the OTLP
# messages: message name -> {field number: (message name of the field, counts as an attribute)}.
_SCHEMA: dict[str, dict[int, tuple[str, bool]]] = {
    "logs_request": {1: ("resource_logs", False)},
    "resource_logs": {1: ("resource", False), 2: ("scope_logs", False)},
    "scope_logs": {1: ("scope", False), 2: ("log_record", False)},
    "log_record": {5: ("any_value", False), 6: ("key_value", True)},
    "metrics_request": {1: ("resource_metrics", False)},
    "resource_metrics": {1: ("resource", False), 2: ("scope_metrics", False)},
    "scope_metrics": {1: ("scope", False), 2: ("metric", False)},
    "metric": {
        5: ("number_data", False),
        7: ("number_data", False),
        9: ("histogram_data", False),
        10: ("exp_histogram_data", False),
        11: ("summary_data", False),
        12: ("key_value", True),
    },
    "number_data": {1: ("number_point", False)},
    "histogram_data": {1: ("histogram_point", False)},
    "exp_histogram_data": {1: ("exp_histogram_point", False)},
    "summary_data": {1: ("summary_point", False)},
    "number_point": {7: ("key_value", True), 5: ("exemplar", False)},
    "histogram_point": {9: ("key_value", True), 8: ("exemplar", False)},
    "exp_histogram_point": {1: ("key_value", True), 11: ("exemplar", False)},
    "summary_point": {7: ("key_value", True), 6: ("quantile", True)},
    "exemplar": {7: ("key_value", True)},
    "resource": {1: ("key_value", True)},
    "scope": {3: ("key_value", True)},
    "key_value": {2: ("any_value", False)},
    "any_value": {5: ("array_value", False), 6: ("kvlist_value", False)},
    "array_value": {1: ("any_value", True)},
    "kvlist_value": {1: ("key_value", True)},
}
_FIELDS = {name: tuple(fields) for name, fields in _SCHEMA.items()}
_MAX_DEPTH = 100  # the protobuf decoder's own recursion limit: deeper is malformed, for it to report


def count_attributes(body: bytes, signal: str, stop_after: int) -> int:
    """Attributes (KeyValue, at any depth: resource, scope, record, data point, exemplar, nested
    key-value lists) and array values of an OTLP export request, counting no further than
    `stop_after` + 1. Each costs the decoder a message object for two bytes of body, so a body of
    `max_message_bytes` could otherwise hold tens of millions of them."""
    found = 0
    stack: list[tuple[str, memoryview, int]] = [(f"{signal}_request", memoryview(body), 0)]
    try:
        while stack:
            name, buf, depth = stack.pop()
            if depth > _MAX_DEPTH:
                return found
            schema = _SCHEMA[name]
            for number, sub in _fields(buf, _FIELDS[name]):
                child, counts = schema[number]
                if counts:
                    found += 1
                    if found > stop_after:
                        return found
                if child in _SCHEMA and len(sub):
                    stack.append((child, sub, depth + 1))
    except _Malformed:
        pass
    return found


__all__ = ["count_attributes", "count_data_points", "count_log_records"]
