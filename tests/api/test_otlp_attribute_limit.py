"""OTLP/JSON requests are bounded in attributes (`max_attributes_per_request`), counted while parsing
stops at the bound: a request of a few records carrying a million attributes parses to gigabytes of
objects, whatever its record count. Spelling "key" with JSON escapes does not get past the count."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from hypocenter import limits
from hypocenter.cli.assembly import Server, serve_in_thread
from tests.api.test_auth import settings

pytestmark = pytest.mark.slow

BOUND = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv, thread = serve_in_thread(
        settings(tmp_path_factory.mktemp("attrs"), max_attributes_per_request=BOUND)
    )
    yield srv
    srv.shutdown()
    thread.join(30)
    limits.configure(limits.DEFAULT)


def _request(attributes: int, key: str = "key") -> bytes:
    attrs = ",".join(f'{{"{key}":"a{i}","value":{{"stringValue":"v"}}}}' for i in range(attributes))
    resource = '{"attributes":[{"key":"host.name","value":{"stringValue":"n1"}}]}'
    record = f'{{"timeUnixNano":"1","body":{{"stringValue":"line"}},"attributes":[{attrs}]}}'
    return (
        f'{{"resourceLogs":[{{"resource":{resource},"scopeLogs":[{{"logRecords":[{record}]}}]}}]}}'.encode()
    )


@pytest.mark.parametrize("key", ["key", "k\\u0065y", "\\u006b\\u0065\\u0079"])
def test_too_many_attributes_are_refused_before_they_are_built(server: Server, key: str) -> None:
    url = f"http://{server.http_address}/v1/logs"
    headers = {"Content-Type": "application/json"}
    body = _request(BOUND + 10, key)
    assert json.loads(body)  # valid JSON: only its size in attributes is wrong
    r = httpx.post(url, content=body, headers=headers, timeout=30)
    assert r.status_code == 413, r.text
    assert "max_attributes_per_request" in r.json()["message"]
    ok = httpx.post(url, content=_request(BOUND - 10, key), headers=headers, timeout=30)
    assert ok.status_code == 200, ok.text
