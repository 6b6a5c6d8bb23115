"""schemathesis on the REST API's own OpenAPI document, against the app in this process: requests
generated from the schema (a small fixed number per operation) never get a server error.

POST /v1/scopes is left out: it asks Slurm or Kubernetes (tests/server/test_pulls.py covers it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from hypocenter.api.http import build_app
from hypocenter.config import load_settings
from hypocenter.server.service import Attribution
from hypocenter.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    config, _ = load_settings({"store": str(tmp / "h.db")}, environ={})
    store = open_store(config.store)
    service = Attribution(config, store)
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", build_app(service)).exclude(path="/v1/scopes")
    finally:
        service.close()
        store.close()


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_generated_requests_never_get_a_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
