"""The fake Loki behaves as a real Loki 3.x does where hypocenter can tell (loki_ingest.py names the
Loki source each behaviour follows): duplicates stored once, the query length with Loki's 30 s
look-back, out-of-order and too-old entries refused with Loki's status and text while the rest of
the push is kept, the labels and metadata Loki adds, the OTLP endpoint's label promotion, and the
json parser's `_extracted` names. What passes on the fake must pass on a real Loki."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from loki_ingest import IngestLimits, detected_level
from observability_fakes import FakeLoki
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc).timestamp()
T = int(NOW * 1e9) - 3600 * 10**9  # an hour before the fake's now: 11:00
MIN = 60 * 10**9
STREAM = {"host": "node01", "filename": "/var/log/kern.log"}


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki(clock=lambda: NOW).start()
    yield fake
    fake.stop()


def push(loki: FakeLoki, *streams: tuple[dict[str, str], list[tuple[int, str]]]) -> httpx.Response:
    body = {
        "streams": [
            {"stream": labels, "values": [[str(ts), line] for ts, line in values]}
            for labels, values in streams
        ]
    }
    return httpx.post(f"{loki.url}/loki/api/v1/push", json=body, timeout=10)


def query(loki: FakeLoki, expr: str, start: int, end: int, **extra: str) -> httpx.Response:
    params = {
        "query": expr,
        "start": str(start),
        "end": str(end),
        "limit": "1000",
        "direction": "forward",
        **extra,
    }
    return httpx.get(f"{loki.url}/loki/api/v1/query_range", params=params, timeout=10)


def lines(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [v[1] for s in answer.json()["data"]["result"] for v in s["values"]]


def test_an_entry_with_the_time_and_line_of_one_held_is_stored_once(loki: FakeLoki) -> None:
    flap = "mlx5_core 0000:3b:00.0: Port module event: module 1, Cable unplugged"
    assert push(loki, (STREAM, [(T, flap), (T, flap), (T, "another line")])).status_code == 204
    assert push(loki, (STREAM, [(T, flap)])).status_code == 204  # again, in a later push
    assert push(loki, ({**STREAM, "host": "node02"}, [(T, flap)])).status_code == 204  # another stream
    assert push(loki, (STREAM, [(T + 1, flap)])).status_code == 204  # another nanosecond
    got = lines(query(loki, '{filename="/var/log/kern.log"}', T, T + MIN))
    assert sorted(got) == sorted([flap, "another line", flap, flap])


def test_the_query_length_counts_lokis_30_s_look_back(loki: FakeLoki) -> None:
    limit = 721 * 3600 * 10**9
    refused = query(loki, '{host="node01"}', T - limit, T)
    assert refused.status_code == 400
    assert refused.text == "the query time range exceeds the limit (query length: 721h0m30s, limit: 30d1h)\n"
    assert query(loki, '{host="node01"}', T - limit + 30 * 10**9, T).status_code == 200
    short = FakeLoki(max_query_length_s=3600, clock=lambda: NOW).start()  # configurable like Loki's limit
    try:
        answer = query(short, '{host="node01"}', T - 3600 * 10**9, T)
        assert answer.status_code == 400 and "(query length: 1h0m30s, limit: 1h)" in answer.text
    finally:
        short.stop()


def test_an_entry_an_hour_behind_its_streams_newest_is_refused_and_the_rest_kept(loki: FakeLoki) -> None:
    assert push(loki, (STREAM, [(T, "newest")])).status_code == 204
    answer = push(loki, (STREAM, [(T - 61 * MIN, "too far behind"), (T - 59 * MIN, "within the hour")]))
    assert answer.status_code == 400
    assert answer.text == (
        "entry with timestamp 2026-11-02 09:59:00 +0000 UTC ignored, reason: 'entry too far behind, entry timestamp "
        "is: 2026-11-02T09:59:00Z, oldest acceptable timestamp is: 2026-11-02T10:00:00Z',\n"
        "user 'fake', total ignored: 1 out of 2 for stream: "
        '{filename="/var/log/kern.log", host="node01", service_name="unknown_service"}\n'
    )
    assert sorted(lines(query(loki, '{host="node01"}', T - 2 * 3600 * 10**9, T + 1))) == [
        "newest",
        "within the hour",
    ]
    # Only the request's last stream decides the answer (ingester instance.Push): a refusal in an
    # earlier stream is silent.
    other = {**STREAM, "host": "node02"}
    assert push(loki, (other, [(T, "n2 newest")])).status_code == 204
    assert push(loki, (other, [(T - 2 * 3600 * 10**9, "lost")]), (STREAM, [(T, "fine")])).status_code == 204
    assert "lost" not in lines(query(loki, '{host="node02"}', T - 3 * 3600 * 10**9, T + 1))


def test_entries_older_than_reject_old_samples_max_age_are_refused(loki: FakeLoki) -> None:
    week = 7 * 86400 * 10**9
    old = int(NOW * 1e9) - week - 3600 * 10**9
    answer = push(loki, ({"job": "hypocenter"}, [(old, "backfilled"), (T, "recent")]))
    assert answer.status_code == 400
    assert answer.text == (
        'entry for stream \'{job="hypocenter", service_name="hypocenter"}\' has timestamp too old: '
        "2026-10-26T11:00:00Z, oldest acceptable timestamp is: 2026-10-26T12:00:00Z\n"
    )
    assert lines(query(loki, '{job="hypocenter"}', T - MIN, T + MIN)) == ["recent"]  # the good one is kept
    twice = push(loki, ({"job": "hypocenter"}, [(old, "a"), (old, "b")]))
    assert twice.status_code == 400 and twice.text.startswith("2 errors like: entry for stream")
    future = push(loki, ({"job": "hypocenter"}, [(int(NOW * 1e9) + 11 * MIN, "ahead")]))
    assert future.status_code == 400 and "has timestamp too new: 2026-11-02T12:11:00Z" in future.text
    lenient = FakeLoki(clock=lambda: NOW, limits=IngestLimits(reject_old_samples=False)).start()
    try:
        assert push(lenient, ({"job": "hypocenter"}, [(old, "backfilled")])).status_code == 204
    finally:
        lenient.stop()


def test_loki_adds_service_name_and_detected_level(loki: FakeLoki) -> None:
    assert (
        push(
            loki,
            (STREAM, [(T, "NVRM: Xid (PCI:0000:3b:00): 149, NVLink error")]),
            ({"job": "slurm", "workload": "81234"}, [(T, "rank 3: all good")]),
            ({"service_name": "trainer", "app": "x"}, [(T, '{"level":"WARNING","msg":"slow"}')]),
        ).status_code
        == 204
    )
    got = {tuple(sorted(e.labels.items())): e.metadata for e in loki.entries}
    assert got == {
        (("filename", "/var/log/kern.log"), ("host", "node01"), ("service_name", "unknown_service")): {
            "detected_level": "error"
        },
        (("job", "slurm"), ("service_name", "81234"), ("workload", "81234")): {"detected_level": "unknown"},
        (("app", "x"), ("service_name", "trainer")): {"detected_level": "warn"},
    }
    # selecting by what Loki added works; exact label sets include it
    answer = query(loki, '{service_name="unknown_service"}', T, T + 1)
    assert [s["stream"] for s in answer.json()["data"]["result"]] == [
        {
            "filename": "/var/log/kern.log",
            "host": "node01",
            "service_name": "unknown_service",
            "detected_level": "error",
        }
    ]
    assert detected_level({}, {"severity_number": "17"}, "x") == "error"
    plain = FakeLoki(
        clock=lambda: NOW, limits=IngestLimits(discover_log_levels=False, discover_service_name=())
    ).start()
    try:
        assert push(plain, (STREAM, [(T, "an error")])).status_code == 204
        assert plain.entries[0].labels == STREAM and plain.entries[0].metadata == {}
    finally:
        plain.stop()
    fifteen = {f"l{i}": "v" for i in range(15)}
    assert push(loki, (fifteen, [(T, "x")])).status_code == 204  # service_name is not counted
    refused = push(loki, ({**fifteen, "l15": "v"}, [(T, "x")]))
    assert refused.status_code == 400 and "has 16 label names; limit 15" in refused.text


def otlp_request(workload: str, line: str, ts: int) -> bytes:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for key, value in (
        ("service.name", "trainer"),
        ("host.name", "node02"),
        ("hypocenter.workload.id", workload),
        ("k8s.namespace.name", "ml"),
    ):
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = key, value
    rec = rl.scope_logs.add().log_records.add()
    rec.time_unix_nano, rec.severity_number, rec.severity_text = ts, 17, "ERROR"
    rec.body.string_value = line
    return req.SerializeToString()


def test_otlp_resource_attributes_are_labels_only_when_promoted(loki: FakeLoki) -> None:
    r = httpx.post(
        f"{loki.url}/otlp/v1/logs",
        content=otlp_request("81234", "boom", T),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert r.status_code == 204, r.content
    [e] = loki.entries
    assert e.labels == {
        "service_name": "trainer",
        "k8s_namespace_name": "ml",
    }  # Loki's default promotion list
    assert e.metadata == {
        "host_name": "node02",
        "hypocenter_workload_id": "81234",
        "severity_number": "17",
        "severity_text": "ERROR",
        "detected_level": "error",
    }
    assert lines(query(loki, '{hypocenter_workload_id="81234"}', T, T + 1)) == []  # not a label
    assert lines(query(loki, '{service_name=~".+"} | hypocenter_workload_id="81234"', T, T + 1)) == ["boom"]
    promoted = FakeLoki(
        clock=lambda: NOW,
        limits=IngestLimits(
            otlp_config={
                "resource_attributes": {
                    "attributes_config": [
                        {"action": "index_label", "attributes": ["hypocenter.workload.id", "host.name"]}
                    ]
                }
            }
        ),
    ).start()
    try:
        httpx.post(
            f"{promoted.url}/otlp/v1/logs",
            content=otlp_request("81234", "boom", T),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=10,
        ).raise_for_status()
        assert lines(query(promoted, '{hypocenter_workload_id="81234"}', T, T + 1)) == ["boom"]
        assert promoted.entries[0].labels["host_name"] == "node02"
    finally:
        promoted.stop()
    old = httpx.post(
        f"{loki.url}/otlp/v1/logs",
        content=otlp_request("1", "old", T - 8 * 86400 * 10**9),
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert old.status_code == 400 and b"has timestamp too old" in old.content  # a google.rpc.Status


def test_json_names_that_are_labels_or_metadata_get_the_extracted_suffix(loki: FakeLoki) -> None:
    body = {
        "streams": [
            {
                "stream": {"service_name": "hypocenter", "outcome": "attributed"},
                "values": [
                    [
                        str(T),
                        '{"summary":"NVLink on node02","outcome":"attributed","rule":"r"}',
                        {"rule": "r"},
                    ]
                ],
            }
        ]
    }
    httpx.post(f"{loki.url}/loki/api/v1/push", json=body, timeout=10).raise_for_status()
    answer = query(loki, '{service_name="hypocenter"} | json summary, outcome, rule', T, T + 1)
    [stream] = answer.json()["data"]["result"]
    assert {k: v for k, v in stream["stream"].items() if k != "detected_level"} == {
        "service_name": "hypocenter",
        "outcome": "attributed",
        "rule": "r",
        "summary": "NVLink on node02",
        "outcome_extracted": "attributed",
        "rule_extracted": "r",
    }
    everything = query(loki, '{service_name="hypocenter"} | json | summary=~"NVLink.*"', T, T + 1)
    assert len(lines(everything)) == 1


# ----------------------------------------------------------------------------------------- real Loki

LOKI_URL = os.environ.get("LOKI_URL", "").rstrip("/")


@pytest.mark.skipif(not LOKI_URL, reason="set LOKI_URL to compare the fake with a real Loki")
def test_a_real_loki_answers_as_the_fake_does() -> None:
    """The same pushes and queries to a real Loki (default limits) and to the fake: same statuses,
    same texts (the tenant aside), same lines and labels back."""
    run = uuid.uuid4().hex[:12]
    tenant = os.environ.get("LOKI_TENANT", "")
    headers = {"X-Scope-OrgID": tenant} if tenant else {}
    t = int((time.time() - 1800) * 1e9)
    labels = {"job": f"hypocenter-test-{run}", "host": "node01"}
    selector = f'{{job="hypocenter-test-{run}"}}'
    fake = FakeLoki().start()
    try:

        def both(method: str, path: str, **kw: Any) -> list[tuple[int, str]]:
            out = []
            for url, extra in ((LOKI_URL, headers), (fake.url, {})):
                r = httpx.request(method, url + path, headers=extra, timeout=10, **kw)
                out.append(
                    (r.status_code, r.text.replace(f"user '{tenant}'", "user 'fake'") if tenant else r.text)
                )
            return out

        def values(*pairs: tuple[int, str]) -> dict[str, Any]:
            return {
                "json": {"streams": [{"stream": labels, "values": [[str(ts), line] for ts, line in pairs]}]}
            }

        real, ours = both("POST", "/loki/api/v1/push", **values((t, "a"), (t, "a"), (t, "b")))
        assert real == ours == (204, "")
        real, ours = both("POST", "/loki/api/v1/push", **values((t - 61 * MIN, "behind"), (t + 1, "c")))
        assert real == ours and real[0] == 400 and "entry too far behind" in real[1]
        params = {
            "query": selector,
            "start": str(t - 2 * 3600 * 10**9),
            "end": str(t + MIN),
            "direction": "forward",
        }
        deadline = time.monotonic() + 30
        while True:
            answers = [
                (s, json.loads(text)) for s, text in both("GET", "/loki/api/v1/query_range", params=params)
            ]
            got = [sorted(v[1] for st in doc["data"]["result"] for v in st["values"]) for _, doc in answers]
            if got[0] == got[1] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert got[0] == got[1] == ["a", "b", "c"]
        streams = [[st["stream"] for st in doc["data"]["result"]] for _, doc in answers]
        assert streams[0] == streams[1]  # service_name, detected_level: what Loki adds, the fake adds
        long = {"query": selector, "start": str(t - 721 * 3600 * 10**9), "end": str(t)}
        real, ours = both("GET", "/loki/api/v1/query_range", params=long)
        assert real == ours and real[0] == 400
    finally:
        fake.stop()
