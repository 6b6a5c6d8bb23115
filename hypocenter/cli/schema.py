"""`hypocenter schema`: print the JSON Schema of the diagnosis (hypocenter.diagnosis/v1)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hypocenter.cli.console import EXIT_OK
from hypocenter.model import SCHEMA_ID
from hypocenter.model_schema import Diagnosis

SCHEMA_URN = "urn:hypocenter:schema:diagnosis:v1"


def _cmd_schema(args: argparse.Namespace) -> int:
    schema = Diagnosis.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    # A name, not a place: the project holds no domain to publish the schema under (a URN is a URI, as
    # JSON Schema's $id asks, and resolves to nothing anyone else could serve).
    schema["$id"] = SCHEMA_URN
    # The model gives `schema` a default; every diagnosis carries it, with exactly this value.
    schema["properties"]["schema"] = {**schema["properties"]["schema"], "const": SCHEMA_ID}
    schema["required"] = ["schema", *(f for f in schema.get("required", []) if f != "schema")]
    sys.stdout.write(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    s = sub.add_parser(
        "schema",
        help="print the JSON Schema of the diagnosis (hypocenter.diagnosis/v1)",
        description="Print the JSON Schema (draft 2020-12) of the diagnosis document that `analyze --format "
        "json`, the REST API and the gRPC API return (schema hypocenter.diagnosis/v1), to validate "
        "diagnoses or generate client types: `hypocenter schema > diagnosis.schema.json`.",
    )
    s.set_defaults(func=_cmd_schema)
