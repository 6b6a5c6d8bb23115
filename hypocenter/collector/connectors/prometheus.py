"""The Prometheus pull connector: the series the metric rules read, for an attempt's nodes and window.

One `query_range` per node label the rules name (exporters disagree on the label), for the metric
names of the ruleset's metric rules only.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

import httpx

from hypocenter.collector.connectors.base import Collected, ConnectorError, RetryPolicy
from hypocenter.collector.connectors.http_api import (
    DEFAULT_POLICY,
    HttpApi,
    auth_headers,
    classify_status,
    message_of,
)
from hypocenter.collector.connectors.loki import logql_string
from hypocenter.collector.connectors.scope import NODE_LOOKBACK_S, NODE_SLACK_S, node_regex, re2_escape
from hypocenter.collector.metrics import MetricFormatError, parse_prometheus_json
from hypocenter.model import AttemptContext, Coverage
from hypocenter.names import NodeNames
from hypocenter.sources import MetricSource, RuleQueries, Series, Source

MAX_POINTS = 11_000  # Prometheus: "exceeded maximum resolution of 11,000 points per timeseries"
_TRANSIENT_TYPES = frozenset({"timeout", "canceled", "unavailable"})
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def classify_prometheus(response: httpx.Response, what: str) -> ConnectorError | None:
    """Prometheus' error JSON says what kind of failure it was (`errorType`); the status code alone
    would call a query timeout (503) and a bad query (400) by their HTTP class only."""
    if 200 <= response.status_code < 300:
        return None
    try:
        doc = response.json()
    except ValueError:
        doc = None
    error_type = doc.get("errorType") if isinstance(doc, dict) else None
    if isinstance(error_type, str):
        detail = f"{what}: HTTP {response.status_code} {error_type}: {message_of(response)}"
        if response.status_code in (401, 403):
            return ConnectorError(detail, kind="auth")
        if error_type in _TRANSIENT_TYPES or response.status_code in (429, 503):
            return ConnectorError(detail, kind="transient")
        return ConnectorError(detail, kind="permanent")
    return classify_status(response, what)


def plan(
    start: float, end: float, *, resolution_s: float, max_points: int = MAX_POINTS, max_pieces: int = 8
) -> tuple[int, list[tuple[int, int]]]:
    """(step in s, [(piece start, piece end)] in epoch s) for a query_range over [start, end] (module docstring)."""
    lo = math.floor(start)
    hi = math.ceil(end)
    span = max(0, hi - lo)
    step = max(math.ceil(resolution_s), math.ceil(span / (max_points * max_pieces - 1)) if span else 1, 1)
    instants = span // step + 1
    out: list[tuple[int, int]] = []
    first = 0
    while first < instants:
        last = min(instants, first + max_points) - 1
        out.append((lo + first * step, lo + last * step))
        first = last + 1
    return step, out


class PrometheusConnector:
    """Pull the metric rules' series from Prometheus (module docstring)."""

    name = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        policy: RetryPolicy = DEFAULT_POLICY,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        resolution_s: float = 15.0,
        max_points: int = MAX_POINTS,
        max_pieces: int = 8,
        lookback_s: float = NODE_LOOKBACK_S,
        slack_s: float = NODE_SLACK_S,
        metrics: Sequence[str] | None = None,
        node_labels: Sequence[str] | None = None,
        queries: RuleQueries | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        all_headers = {**auth_headers(token=token, basic_auth=basic_auth), **(headers or {})}
        self.api = HttpApi(
            url,
            policy=policy,
            headers=all_headers,
            transport=transport,
            classify=classify_prometheus,
            sleep=sleep,
        )
        self.resolution_s = resolution_s
        self.max_points = max_points
        self.max_pieces = max_pieces
        self.lookback_s = lookback_s
        self.slack_s = slack_s
        if metrics is None or node_labels is None:
            if queries is None:
                raise ValueError(
                    "PrometheusConnector needs the rules' queries, or both metrics and node_labels"
                )
            metrics = queries.metrics if metrics is None else metrics
            node_labels = queries.node_labels if node_labels is None else node_labels
        self.metrics = sorted(set(metrics))
        self.node_labels = list(dict.fromkeys(node_labels))

    def collect(self, context: AttemptContext) -> Collected:
        try:
            with self.api:
                return self._collect(context)
        except Exception as exc:  # a bug or an answer unlike any Prometheus' must not stop the analysis
            return Collected(
                coverage=[
                    Coverage(
                        connector=self.name,
                        source=f"prometheus/{n}",
                        status="failed",
                        observations=0,
                        reason=f"internal error: {type(exc).__name__}: {exc}",
                    )
                    for n in context.nodes or ["_all"]
                ]
            )

    def selectors(self, nodes: Sequence[str]) -> list[str]:
        """One selector per node label: every rule metric, on the attempt's nodes."""
        names = "|".join(re2_escape(m) for m in self.metrics)
        return [
            f'{{__name__=~"{names}", {label}=~"{_promql_escape(node_regex(nodes))}"}}'
            for label in self.node_labels
        ]

    def _collect(self, ctx: AttemptContext) -> Collected:
        if not self.metrics or not ctx.nodes:
            return Collected()
        start = ctx.window.start.timestamp() - self.lookback_s
        end = ctx.window.end.timestamp() + self.slack_s
        step, spans = plan(
            start, end, resolution_s=self.resolution_s, max_points=self.max_points, max_pieces=self.max_pieces
        )
        samples: dict[SeriesKey, dict[float, float]] = defaultdict(dict)
        tried = failed = 0
        problems: list[str] = []
        for query in self.selectors(ctx.nodes):
            for a, b in spans:
                tried += 1
                try:
                    doc = self.api.post_form(
                        "/api/v1/query_range",
                        {"query": query, "start": str(a), "end": str(b), "step": str(step)},
                        what="Prometheus query_range",
                    )
                    got = parse_prometheus_json(doc)
                except ConnectorError as exc:
                    failed += 1
                    if str(exc) not in problems:
                        problems.append(str(exc))
                    continue
                except MetricFormatError as exc:
                    failed += 1
                    problems.append(f"Prometheus query_range: unexpected answer: {exc}")
                    continue
                for s in got:
                    into = samples[(s.name, tuple(sorted(s.labels.items())))]
                    for when, value in s.samples:
                        into[when.timestamp()] = value
        return self._result(ctx, samples, tried, failed, problems)

    def _result(
        self,
        ctx: AttemptContext,
        samples: dict[SeriesKey, dict[float, float]],
        tried: int,
        failed: int,
        problems: list[str],
    ) -> Collected:
        names = NodeNames(ctx.nodes)
        by_metric: dict[str, list[Series]] = defaultdict(list)
        per_node: dict[str, int] = defaultdict(int)
        for (name, labels), points in sorted(samples.items()):
            label_map = dict(labels)
            series = Series(
                name=name,
                labels=label_map,
                samples=[(datetime.fromtimestamp(t, tz=timezone.utc), v) for t, v in sorted(points.items())],
            )
            by_metric[name].append(series)
            host = next((label_map[k] for k in self.node_labels if k in label_map), None)
            node = names.resolve(host)
            if node is not None:
                per_node[node] += len(series.samples)
        sources: list[Source] = [
            MetricSource(name=f"prometheus/{m}", series=s) for m, s in sorted(by_metric.items())
        ]
        reason = "; ".join(problems) or None
        coverage: list[Coverage] = []
        for node in ctx.nodes:
            n = per_node.get(node, 0)
            source = f"prometheus/{node}"
            if tried and failed == tried:
                coverage.append(
                    Coverage(
                        connector=self.name, source=source, status="failed", observations=n, reason=reason
                    )
                )
            elif failed:
                coverage.append(
                    Coverage(
                        connector=self.name,
                        source=source,
                        status="partial",
                        observations=n,
                        reason=f"{failed} of {tried} queries failed: {reason}",
                    )
                )
            elif n:
                coverage.append(Coverage(connector=self.name, source=source, status="ok", observations=n))
            else:
                coverage.append(
                    Coverage(
                        connector=self.name,
                        source=source,
                        status="missing",
                        observations=0,
                        reason=f"no series of {', '.join(self.metrics)} for node {node} "
                        f"(labels {', '.join(self.node_labels)})",
                    )
                )
        return Collected(sources=sources, coverage=coverage)


def _promql_escape(text: str) -> str:
    """Inside a PromQL double-quoted string: the same Go string rules as LogQL's (backslash and quote
    escaped, and no raw newline: a node name holding one must not end the string or the query)."""
    return logql_string(text)[1:-1]
