"""OTLP log records as columns: one C-level decode gives a scope group's bodies, record numbers and times as lists.

A Python loop over decoded records costs more than the decode itself (an attribute access per
field per record), so the usual shape — what the filelog receiver sends: a string body, the
record number and at most the file's path and name as attributes — is read through a second
message type for the same bytes (otlp_columns.proto, compiled like the API's), in which every field a
record carries is *repeated* and each record's fields are singular embedded messages. Protobuf merges
the occurrences of a singular embedded message into one, so the decoder concatenates the records'
fields into columns:

    FlatRequest.resource_logs[i].scope_logs[j].log_records   (one message for all records)
        .time_unix_nano[k], .observed_time_unix_nano[k]
        .body.string_value[k]
        .attributes.key[k * K + a], .attributes.value.{string_value, int_value}[…]

A column is used only when its length says each record gave exactly one value (and the keys
repeat one per-record pattern); anything else — another body type, an attribute that changes
tagging, a record without a time when others have one — leaves the group to `log_entries`. Protobuf
also lets one record repeat a singular field and another omit it, which would shift a column by
one: the records that result are ones the client could have sent as such, so nothing is gained by
it, and no exporter encodes records that way.

The resource and scope of each group come as their bytes (decoded on their own, with the real
types), and `CountRequest` — each record as its bytes, not decoded — says how many records each
group has. Together they are what tagging reads of a request in the usual shape, without the whole
request decoded into message objects (collector/otlp.py falls back to that for any other shape).
Every string field a full decode would check for valid UTF-8 is declared a string here too, so
these decodes refuse what it refuses (the fallback then reports why).

This module only reads; tagging stays collector/otlp.py's (contract 2).
"""

from __future__ import annotations

# Generated from otlp_columns.proto next to this module (the regeneration command is at its top).
from hypocenter.collector.otlp_columns_pb2 import CountRequest, FlatRequest, Records

_STRING_ATTRS = (
    "log.file.path",
    "log.file.name",
)  # the stream a line belongs to (STREAM_KEYS), as filelog sends them


class Columns:
    """One scope group's records as columns, or None where the group is not in the usual shape."""

    __slots__ = ("bodies", "lines", "observed", "stamps", "strings", "times")

    def __init__(
        self,
        bodies: list[str],
        lines: list[int] | None,
        times: list[int],
        stamps: list[int],
        strings: dict[str, list[str]],
        observed: list[int] | None = None,
    ) -> None:
        self.bodies = bodies
        self.lines = lines  # log.file.record_number; None: the records carry none
        self.times = times  # time_unix_nano, else observed_time_unix_nano
        self.stamps = stamps  # time_unix_nano as sent
        self.strings = strings  # log.file.path / log.file.name per record, where the records carry them
        self.observed = observed or [0] * len(bodies)  # observed_time_unix_nano as sent

    @classmethod
    def of(cls, records: Records, n: int, line_key: str) -> Columns | None:
        """`records`: a FlatRequest's `…scope_logs[j].log_records`; `n`: how many records the group has.
        Records with the record number `line_key` give `lines`; records without it (the filelog
        receiver's default, and most other senders) give `lines` None."""
        body = records.body
        bodies = list(body.string_value)
        if (
            len(bodies) != n
            or body.bool_value
            or body.int_value
            or body.double_value
            or body.array_value
            or body.kvlist_value
            or body.bytes_value
        ):
            return None
        attrs = records.attributes
        keys = list(attrs.key)
        width = len(keys) // n
        if width > 1 + len(_STRING_ATTRS) or len(keys) != width * n:
            return None
        pattern = keys[:width]
        numbered = line_key in pattern
        if (
            pattern.count(line_key) > 1
            or len(set(pattern)) != width
            or any(k != line_key and k not in _STRING_ATTRS for k in pattern)
            or keys != pattern * n
        ):
            return None
        value = attrs.value
        lines = list(value.int_value)
        texts = list(value.string_value)
        if (
            len(lines) != (n if numbered else 0)
            or len(texts) != (width - numbered) * n
            or value.bool_value
            or value.double_value
            or value.array_value
            or value.kvlist_value
            or value.bytes_value
            or (numbered and min(lines) <= 0)
        ):
            return None
        named = [k for k in pattern if k != line_key]
        strings = {k: texts[i :: len(named)] for i, k in enumerate(named)}
        stamps = list(records.time_unix_nano)
        observed = list(records.observed_time_unix_nano)
        if len(stamps) not in (0, n) or len(observed) not in (0, n):
            return None
        if not stamps:
            stamps = [0] * n
        times = stamps
        if 0 in stamps:  # the observed times are read only where a record has no time of its own
            times = [t or o for t, o in zip(stamps, observed or [0] * n, strict=True)]
        return cls(bodies, lines if numbered else None, times, stamps, strings, observed)


__all__ = ["Columns", "CountRequest", "FlatRequest"]
