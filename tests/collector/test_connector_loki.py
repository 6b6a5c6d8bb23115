"""The Loki pull connector against the wire-faithful fake (observability_fakes.FakeLoki): the LogQL
it sends, pagination and splitting without loss or duplication, errors, headers, dating, context
lines, coverage. A real Loki is used when LOKI_URL is set."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import httpx
import pytest
from engine_support import QUERIES
from observability_fakes import FakeLoki, PushedEntry, parse_logql

from hypocenter.collector.connectors.base import RetryPolicy
from hypocenter.collector.connectors.loki import (
    LokiConnector,
    LokiLimits,
    interleave,
    line_filters,
    logql_string,
    rfc3339_ns,
)
from hypocenter.collector.connectors.scope import epoch_ns
from hypocenter.engine import default_engine
from hypocenter.lineformat import time_context
from hypocenter.model import AttemptContext
from hypocenter.sources import AttemptInput, TextSource

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)
FAST = RetryPolicy(timeout_s=2.0, attempts=3, backoff_s=0.01, max_backoff_s=0.02)
XID = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, GPU has fallen off the bus."


def context(nodes: list[str], start: datetime = T0, minutes: int = 60, **extra: Any) -> AttemptContext:
    return AttemptContext.model_validate(
        {
            "workload": {"id": "81234", "attempt": 0},
            "state": "FAILED",
            "nodes": nodes,
            "window": {"start": start.isoformat(), "end": (start + timedelta(minutes=minutes)).isoformat()},
            **extra,
        }
    )


def ns(minutes: float) -> int:
    return epoch_ns(T0) + int(minutes * 60e9)


def kern(node: str, ts: int, line: str, **labels: str) -> PushedEntry:
    return PushedEntry({"host": node, "filename": "/var/log/kern.log", **labels}, ts, line, {})


def returned(collected: Any) -> Counter[tuple[str | None, str]]:
    """(node, line without the date prefix) of every line the connector returned."""
    out: Counter[tuple[str | None, str]] = Counter()
    for s in collected.sources:
        assert isinstance(s, TextSource) and isinstance(s.text, str)
        for line in s.text.splitlines():
            out[(s.node, line.split("] ", 1)[1] if line.startswith("[20") else line)] += 1
    return out


@pytest.fixture
def loki() -> Iterator[FakeLoki]:
    fake = FakeLoki(ties="random").start()
    yield fake
    fake.stop()


def test_line_filter_is_the_rules_tokens_escaped_for_re2_and_logql() -> None:
    tokens = default_engine().extractor.tokens
    [only] = line_filters(tokens, budget=100_000)
    query = parse_logql('{host="x"} ' + only)  # the fake refuses what Loki's parser would
    kind, op, _, regex = query.stages[0]
    assert (kind, op) == ("line", "|~") and regex is not None
    for tok in tokens:
        assert regex.search(f"noise {tok} noise"), tok
    assert not regex.search("an ordinary line about nothing in particular")
    # neighbours in the alternation never share a first character, so Go's parser factors no
    # prefix and Loki can turn the regex into plain substring tests
    order = interleave(tokens)
    assert sorted(order) == sorted(set(tokens))
    assert all(a[0] != b[0] for a, b in pairwise(order))


def test_logql_strings_survive_quotes_and_backslashes() -> None:
    nasty = 'say "hi" \\ (x)\n'
    lx = parse_logql("{a=" + logql_string(nasty) + "}")
    assert lx.matchers[0][2] == nasty


def test_only_candidate_lines_of_the_attempts_nodes_come_back(loki: FakeLoki) -> None:
    tokens = default_engine().extractor.tokens
    entries = [kern("node01", ns(1 + i / 100), f"prefix {tok} suffix") for i, tok in enumerate(tokens)]
    entries += [
        # in a stream of its own: a rule that reads lines around its match (lines_before/after) has
        # them fetched as Grafana's "show context" does, so a boring neighbour of a candidate comes back
        kern("node01", ns(2), "a boring line", filename="/var/log/syslog"),
        kern("node09", ns(3), XID),  # not a candidate / not ours
        kern("NODE02.cluster.local", ns(4), XID),
    ]  # FQDN, other case: still node02
    loki.preload(entries)
    got = returned(
        LokiConnector(loki.url, queries=QUERIES, policy=FAST).collect(context(["node01", "node02"]))
    )
    want = Counter(("node01", f"prefix {tok} suffix") for tok in tokens) + Counter({("node02", XID): 1})
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("limit", [10, 13, 64])  # more than the 9 entries sharing a nanosecond
def test_pages_lose_nothing_and_repeat_nothing_at_tied_timestamps(loki: FakeLoki, limit: int) -> None:
    """Many entries share a nanosecond, across streams and within one. Identical entries (same
    stream, time and line) are pushed too: Loki stores them once. Whatever order Loki gives ties
    in, each entry it holds comes back exactly once."""
    entries = []
    for i in range(300):
        ts = ns(5 + (i // 9) / 60)  # nine entries per timestamp
        node = f"node0{1 + i % 3}"
        entries.append(kern(node, ts, f"{XID} #{(i // 3) % 3}"))
    loki.preload(entries + entries[::7])  # the repeats are dropped by Loki, not by the connector
    assert len(loki.entries) == 300
    collected = LokiConnector(
        loki.url, queries=QUERIES, policy=FAST, limits=LokiLimits(max_entries=limit)
    ).collect(context(["node01", "node02", "node03"]))
    assert returned(collected) == Counter((e.labels["host"], e.line) for e in entries)
    assert {c.status for c in collected.coverage} == {"ok"}
    assert len(loki.queries) > 300 // limit  # it did page


def test_a_page_full_of_one_nanosecond_is_reported_partial(loki: FakeLoki) -> None:
    loki.preload([kern("node01", ns(5), f"{XID} {i}") for i in range(6)] + [kern("node01", ns(6), XID)])
    collected = LokiConnector(
        loki.url, queries=QUERIES, policy=FAST, limits=LokiLimits(max_entries=4)
    ).collect(context(["node01"]))
    [cov] = collected.coverage
    assert cov.status == "partial" and "more than 4 entries at 2026-11-02T10:05:00.000000000Z" in (
        cov.reason or ""
    )
    assert returned(collected)[("node01", XID)] == 1  # the rest of the piece is still read


def test_long_windows_are_split_within_max_query_length(loki: FakeLoki) -> None:
    fake = FakeLoki(max_query_length_s=1800).start()  # Loki refuses a longer range with 400
    try:
        fake.preload([kern("node01", ns(m), f"{XID} at {m}") for m in range(-59, 75, 7)])
        collected = LokiConnector(
            fake.url, queries=QUERIES, policy=FAST, limits=LokiLimits(max_query_length_s=1800)
        ).collect(context(["node01"]))
        # the node window is [start - 1 h lookback, end + 10 min slack]
        assert returned(collected) == Counter(
            ("node01", f"{XID} at {m}") for m in range(-59, 75, 7) if m <= 70
        )
        spans = {(int(q["start"]), int(q["end"])) for q in fake.queries}
        assert all(b // 10**6 - a // 10**6 <= 1800 * 10**3 for a, b in spans)  # Loki's measure, in ms
        assert max(b - a for a, b in spans) == 1800 * 10**9  # the whole limit, no margin taken off it
        assert min(a for a, _ in spans) == ns(-60) and max(b for _, b in spans) == ns(70) + 1
    finally:
        fake.stop()


def test_long_filters_are_split_and_a_line_two_groups_match_comes_back_once(loki: FakeLoki) -> None:
    tokens = default_engine().extractor.tokens
    both = f"{tokens[0]} and {tokens[-1]}"  # the longest and the shortest token: different groups
    loki.preload([kern("node01", ns(1), both), kern("node01", ns(1.5), both), kern("node01", ns(2), XID)])
    connector = LokiConnector(loki.url, queries=QUERIES, policy=FAST, limits=LokiLimits(max_query_chars=700))
    collected = connector.collect(context(["node01"]))
    assert returned(collected) == Counter({("node01", both): 2, ("node01", XID): 1})
    queries = {q["query"] for q in loki.queries}
    assert len(queries) > 3 and all(len(httpx.QueryParams({"query": q}).__str__()) <= 700 for q in queries)


def test_bad_logql_is_permanent_not_retried_and_carries_lokis_message(loki: FakeLoki) -> None:
    loki.preload([kern("node01", ns(1), XID)])
    connector = LokiConnector(loki.url, queries=QUERIES, policy=FAST, selector='job=~"(unclosed"')
    [cov] = connector.collect(context(["node01"])).coverage
    assert (
        cov.status == "failed"
        and "HTTP 400" in (cov.reason or "")
        and "error parsing regexp" in (cov.reason or "")
    )
    assert connector.api.calls == 1


def test_transient_failures_are_retried(loki: FakeLoki) -> None:
    loki.preload([kern("node01", ns(1), XID)])
    loki.fail_next([503, 429])
    connector = LokiConnector(loki.url, queries=QUERIES, policy=FAST)
    collected = connector.collect(context(["node01"]))
    assert returned(collected) == Counter({("node01", XID): 1}) and collected.coverage[0].status == "ok"


def test_tenant_and_credentials_are_sent() -> None:
    fake = FakeLoki(required_headers={"X-Scope-OrgID": "team-a", "Authorization": "Bearer s3cret"}).start()
    try:
        fake.preload([kern("node01", ns(1), XID)])
        ok = LokiConnector(fake.url, queries=QUERIES, policy=FAST, tenant="team-a", token="s3cret").collect(
            context(["node01"])
        )
        assert returned(ok) == Counter({("node01", XID): 1})
        refused = LokiConnector(fake.url, queries=QUERIES, policy=FAST, tenant="team-b", token="s3cret")
        [cov] = refused.collect(context(["node01"])).coverage
        assert cov.status == "failed" and "HTTP 401" in (cov.reason or "") and refused.api.calls == 1
    finally:
        fake.stop()
    basic = FakeLoki(required_headers={"Authorization": "Basic dTpwdw=="}).start()  # u:pw
    try:
        basic.preload([kern("node01", ns(1), XID)])
        got = LokiConnector(basic.url, queries=QUERIES, policy=FAST, basic_auth=("u", "pw")).collect(
            context(["node01"])
        )
        assert returned(got) == Counter({("node01", XID): 1})
    finally:
        basic.stop()


def test_lines_without_a_stamp_are_dated_by_loki_and_the_engine_uses_it(loki: FakeLoki) -> None:
    stamped = "2026-11-02T10:20:00.5Z node01 kernel: " + XID
    loki.preload([kern("node01", ns(12.5), XID), kern("node01", ns(19), stamped)])
    ctx = context(["node01"])
    collected = LokiConnector(loki.url, queries=QUERIES, policy=FAST).collect(ctx)
    [src] = collected.sources
    assert isinstance(src.text, str)
    assert src.text.splitlines() == [f"[{rfc3339_ns(ns(12.5))}] {XID}", stamped]  # its own stamp wins
    diagnosis = default_engine().analyze(AttemptInput(ctx, collected.sources, collected.coverage))
    assert diagnosis.root_cause is not None and diagnosis.root_cause.first_seen == "2026-11-02T10:12:30Z"


def test_context_lines_around_a_candidate_are_fetched(loki: FakeLoki) -> None:
    """hung-task reads 14 lines after its match for the stack; they hold no token, so the line
    filter alone would drop them and the filesystem could not be blamed."""
    stack = [
        "INFO: task python:77121 blocked for more than 120 seconds.",
        "      Not tainted 5.15.0-91-generic",
        "Call Trace:",
        " <TASK>",
        " __schedule+0x2cd/0x890",
        " rpc_wait_bit_killable+0x25/0xb0 [sunrpc]",
        " nfs_wait_on_request+0x30/0x40 [nfs]",
    ]
    loki.preload(
        [kern("node01", ns(17 + i / 1000), line) for i, line in enumerate(stack)]
        + [kern("node01", ns(16), "an unrelated earlier line")]
    )
    ctx = context(["node01"])
    collected = LokiConnector(loki.url, queries=QUERIES, policy=FAST).collect(ctx)
    got = returned(collected)
    assert list(got) == [("node01", line) for line in stack] and set(got.values()) == {1}
    [hung] = [
        e
        for e in default_engine().extractor.extract(collected.sources, ctx, time_context(ctx)).events
        if e.kind == "hung_task"
    ]
    assert hung.fields.get("fs") == "rpc_wait_bit_killable"


def test_context_fetches_stay_within_max_query_length() -> None:
    """The lines around a candidate are asked for within Loki's max_query_length too (a Loki with
    a 30 min limit refuses the default hour-long reach)."""
    fake = FakeLoki(max_query_length_s=1800).start()
    try:
        stack = [
            "INFO: task python:77121 blocked for more than 120 seconds.",
            "Call Trace:",
            " rpc_wait_bit_killable+0x25/0xb0 [sunrpc]",
        ]
        fake.preload([kern("node01", ns(17 + i / 1000), line) for i, line in enumerate(stack)])
        collected = LokiConnector(
            fake.url, queries=QUERIES, policy=FAST, limits=LokiLimits(max_query_length_s=1800)
        ).collect(context(["node01"], minutes=10))
        assert list(returned(collected)) == [("node01", line) for line in stack]
        assert [c.status for c in collected.coverage] == ["ok"], collected.coverage
        spans = [int(q["end"]) // 10**6 - int(q["start"]) // 10**6 for q in fake.queries]
        assert max(spans) <= 1800 * 10**3  # as Loki measures: whole milliseconds
    finally:
        fake.stop()


def test_otlp_style_node_in_structured_metadata() -> None:
    """Loki's native OTLP ingestion keeps host.name as structured metadata `host_name`, and may split a
    file by `detected_level`: asked with categorize-labels, one file is still one source."""
    fake = FakeLoki().start()
    try:
        labels = {"service_name": "kernel"}
        fake.preload(
            [
                PushedEntry(labels, ns(1), XID, {"host_name": "node01", "detected_level": "error"}),
                PushedEntry(
                    labels,
                    ns(2),
                    "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 3 timed out",
                    {"host_name": "node01", "detected_level": "info"},
                ),
                PushedEntry(labels, ns(3), XID, {"host_name": "node02", "detected_level": "error"}),
                PushedEntry(labels, ns(4), "quiet", {"host_name": "node03"}),
            ]
        )
        connector = LokiConnector(
            fake.url,
            queries=QUERIES,
            policy=FAST,
            selector='service_name=~".+"',
            node_label="host_name",
            node_label_kind="metadata",
        )
        collected = connector.collect(context(["node01", "node02", "node03", "node04"]))
        assert [(s.name, s.node) for s in collected.sources] == [
            ("loki/node01/kernel", "node01"),
            ("loki/node02/kernel", "node02"),
        ]
        assert returned(collected) == Counter(
            {
                ("node01", XID): 1,
                ("node01", "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 3 timed out"): 1,
                ("node02", XID): 1,
            }
        )
        status = {c.source: c.status for c in collected.coverage}
        assert status == {
            "logs/node01": "ok",
            "logs/node02": "ok",
            "logs/node03": "ok",
            "logs/node04": "missing",
        }
    finally:
        fake.stop()
    with pytest.raises(ValueError, match="needs a selector"):
        LokiConnector("http://loki", queries=QUERIES, node_label="host_name", node_label_kind="metadata")


def test_job_level_streams_and_stream_names(loki: FakeLoki) -> None:
    loki.preload(
        [
            PushedEntry(
                {"job": "slurm", "slurm_job_id": "81234", "filename": "/shared/slurm-81234.out"},
                ns(30),
                "[rank3]: torch.distributed.DistBackendError: NCCL error ... ncclRemoteError",
                {},
            ),
            PushedEntry(
                {"job": "slurm", "slurm_job_id": "99999", "filename": "/shared/slurm-99999.out"},
                ns(30),
                "ncclRemoteError elsewhere",
                {},
            ),
            kern("node01", ns(20), XID),
            kern("node01", ns(21), XID, filename="/var/log/syslog"),
            PushedEntry(
                {"host": "node01", "unit": "kubelet.service"}, ns(22), "k8s pod train-0 OOMKilled", {}
            ),
        ]
    )
    collected = LokiConnector(
        loki.url, queries=QUERIES, policy=FAST, workload_selector='{job="slurm", slurm_job_id="{workload}"}'
    ).collect(context(["node01"]))
    assert sorted((s.name, s.node) for s in collected.sources) == [
        ("loki/_job/slurm-81234.out", None),
        ("loki/node01/kern.log", "node01"),
        ("loki/node01/kubelet.service", "node01"),
        ("loki/node01/syslog", "node01"),
    ]
    assert {c.source: c.status for c in collected.coverage} == {"logs/node01": "ok", "logs/_job": "ok"}


def test_a_stalled_loki_is_a_timeout_not_a_hang(loki: FakeLoki) -> None:
    loki.preload([kern("node01", ns(1), XID)])
    loki.behaviour.stall_s = 1.0
    policy = RetryPolicy(timeout_s=0.2, attempts=2, backoff_s=0.01, max_backoff_s=0.01)
    began = time.monotonic()
    [cov] = LokiConnector(loki.url, queries=QUERIES, policy=policy).collect(context(["node01"])).coverage
    assert cov.status == "failed" and "within 0.2 s" in (cov.reason or "") and "2 tries" in (cov.reason or "")
    assert time.monotonic() - began < 2.0


# ----------------------------------------------------------------------------------------- real Loki

LOKI_URL = os.environ.get("LOKI_URL", "")


@pytest.mark.skipif(not LOKI_URL, reason="set LOKI_URL to run against a real Loki")
def test_against_a_real_loki() -> None:
    """Push fixtures with a fresh label, query them back through the connector (recent times: Loki
    refuses entries older than reject_old_samples_max_age)."""
    run = uuid.uuid4().hex[:12]
    now = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=20)
    base = epoch_ns(now)
    lines = [(f"node-{run}-1", base + i * 1000 + (i % 3), f"{XID} #{i % 4}") for i in range(40)]
    lines += [(f"node-{run}-2", base + 10**9, "nothing to see")]
    streams: dict[str, list[list[str]]] = {}
    for node, ts, line in lines:
        streams.setdefault(node, []).append([str(ts), line])
    body = {
        "streams": [
            {
                "stream": {"host": n, "job": f"hypocenter-test-{run}", "filename": "/var/log/kern.log"},
                "values": v,
            }
            for n, v in streams.items()
        ]
    }
    headers = {"X-Scope-OrgID": os.environ["LOKI_TENANT"]} if os.environ.get("LOKI_TENANT") else {}
    httpx.post(f"{LOKI_URL}/loki/api/v1/push", json=body, headers=headers, timeout=10).raise_for_status()
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": run, "attempt": 0},
            "nodes": list(streams),
            "window": {"start": now.isoformat(), "end": (now + timedelta(minutes=5)).isoformat()},
        }
    )
    connector = LokiConnector(
        LOKI_URL,
        queries=QUERIES,
        tenant=os.environ.get("LOKI_TENANT") or None,
        selector=f'job="hypocenter-test-{run}"',
        limits=LokiLimits(max_entries=7),
    )
    deadline = time.monotonic() + 30
    while True:
        collected = connector.collect(ctx)
        got = returned(collected)
        if sum(got.values()) >= 40 or time.monotonic() > deadline:
            break
        time.sleep(1)
    # Loki drops an entry identical (time and line) to the one before it in a stream; ours differ in time
    assert got == Counter((n, line) for n, _, line in lines if line != "nothing to see")
    assert {c.source: c.status for c in collected.coverage} == {
        f"logs/node-{run}-1": "ok",
        f"logs/node-{run}-2": "ok",
    }


@pytest.mark.skipif(not LOKI_URL, reason="set LOKI_URL to run against a real Loki")
def test_a_real_lokis_otlp_endpoint_is_pulled_by_structured_metadata() -> None:
    """Records sent to Loki's own /otlp/v1/logs with its default otlp_config: `host.name` and
    `hypocenter.workload.id` are structured metadata, and the pull still finds the node's lines
    and the job's."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    run = uuid.uuid4().hex[:12]
    now = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=20)
    request = ExportLogsServiceRequest()
    for i, (attrs, line) in enumerate(
        [
            ({"host.name": f"node-{run}"}, XID),
            ({"hypocenter.workload.id": run}, "torch.OutOfMemoryError: CUDA out of memory."),
        ]
    ):
        rl = request.resource_logs.add()
        for key, value in {"service.name": f"hypocenter-test-{run}", **attrs}.items():
            kv = rl.resource.attributes.add()
            kv.key, kv.value.string_value = key, value
        rec = rl.scope_logs.add().log_records.add()
        rec.time_unix_nano, rec.body.string_value = epoch_ns(now) + i * 10**9, line
    headers = {"Content-Type": "application/x-protobuf"}
    if os.environ.get("LOKI_TENANT"):
        headers["X-Scope-OrgID"] = os.environ["LOKI_TENANT"]
    httpx.post(
        f"{LOKI_URL}/otlp/v1/logs", content=request.SerializeToString(), headers=headers, timeout=10
    ).raise_for_status()
    ctx = AttemptContext.model_validate(
        {
            "workload": {"id": run, "attempt": 0},
            "nodes": [f"node-{run}"],
            "window": {"start": now.isoformat(), "end": (now + timedelta(minutes=5)).isoformat()},
        }
    )
    connector = LokiConnector(
        LOKI_URL,
        queries=QUERIES,
        tenant=os.environ.get("LOKI_TENANT") or None,
        selector=f'service_name="hypocenter-test-{run}"',
        node_label="host_name",
        node_label_kind="metadata",
        workload_selector='hypocenter_workload_id="{workload}"',
    )
    deadline = time.monotonic() + 30
    while True:
        got = returned(connector.collect(ctx))
        if sum(got.values()) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert got == Counter({(f"node-{run}", XID): 1, (None, "torch.OutOfMemoryError: CUDA out of memory."): 1})
