"""The column schema (collector/otlp_columns.proto) reads OTLP's bytes: every field has the number,
wire type and UTF-8 check of the OTLP logs field of its name, and each message stands for one of
OTLP's, so a columns decode never misreads what a full decode reads. (tests/api/test_grpc_api.py
keeps the committed otlp_columns_pb2 modules equal to a fresh generation from the .proto.)"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from hypocenter.collector import otlp_columns, otlp_columns_pb2

# Each column message and the OTLP message whose bytes it reads.
COUNTERPARTS: dict[str, Descriptor] = {
    "Values": common_pb2.AnyValue.DESCRIPTOR,
    "KeyValues": common_pb2.KeyValue.DESCRIPTOR,
    "Records": logs_pb2.LogRecord.DESCRIPTOR,
    "ScopeLogs": logs_pb2.ScopeLogs.DESCRIPTOR,
    "ResourceLogs": logs_pb2.ResourceLogs.DESCRIPTOR,
    "FlatRequest": logs_service_pb2.ExportLogsServiceRequest.DESCRIPTOR,
    "CountScope": logs_pb2.ScopeLogs.DESCRIPTOR,
    "CountResource": logs_pb2.ResourceLogs.DESCRIPTOR,
    "CountRequest": logs_service_pb2.ExportLogsServiceRequest.DESCRIPTOR,
}


def test_the_columns_module_decodes_with_the_generated_messages() -> None:
    assert otlp_columns.FlatRequest is otlp_columns_pb2.FlatRequest
    assert otlp_columns.CountRequest is otlp_columns_pb2.CountRequest
    assert set(otlp_columns_pb2.DESCRIPTOR.message_types_by_name) == set(COUNTERPARTS)


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_every_column_field_reads_the_otlp_field_of_its_name(name: str) -> None:
    ours = otlp_columns_pb2.DESCRIPTOR.message_types_by_name[name]
    theirs = COUNTERPARTS[name]
    for field in ours.fields:
        otlp = theirs.fields_by_name[field.name]
        assert field.number == otlp.number, field.full_name
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            # a message read as another column message: the one standing for OTLP's
            assert otlp.type == FieldDescriptor.TYPE_MESSAGE, field.full_name
            assert field.message_type is not None and otlp.message_type is not None
            assert COUNTERPARTS[field.message_type.name] is otlp.message_type, field.full_name
        elif field.type == FieldDescriptor.TYPE_BYTES:
            # left undecoded: OTLP's bytes, or a whole embedded message (length-delimited alike)
            assert otlp.type in (FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE), field.full_name
        else:
            # the same scalar type (a string checked for UTF-8 as the full decode checks it)
            assert field.type == otlp.type, field.full_name
        if otlp.is_repeated and field.type != FieldDescriptor.TYPE_MESSAGE:
            # (a repeated message read as one singular message is the merge that makes columns)
            assert field.is_repeated, field.full_name
