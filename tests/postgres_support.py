"""A PostgreSQL schema per test, for the store contract and the server end to end.

The tests need HYPOCENTER_TEST_POSTGRES_URL: a database the test role may create schemas in. CI
sets it (`.ci/run` installs Debian's `postgresql`, starts a cluster and creates the database);
elsewhere the PostgreSQL tests skip and say so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_URL = os.environ.get("HYPOCENTER_TEST_POSTGRES_URL", "")
NO_PG = (
    "HYPOCENTER_TEST_POSTGRES_URL is not set (CI sets it: .ci/run starts PostgreSQL from Debian's package)"
)


def schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


def fresh_schema() -> Iterator[str]:
    """Body of a `pg_schema` fixture: a new schema, dropped afterwards; yields the store URL for it."""
    if not PG_URL:
        pytest.skip(NO_PG)
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema_url(schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
