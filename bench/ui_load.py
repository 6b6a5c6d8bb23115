"""The web UI's reads with many diagnoses stored: list, filters, paging, detail, fleet.

    python -m bench.ui_load [--diagnoses 10000] [--requests 40]

Fills a SQLite store with `--diagnoses` diagnoses (each example's real diagnosis, copied under new
workload ids, clusters, culprit nodes and windows spread over 60 days), starts a real
`hypocenter serve` on it and times, over HTTP on loopback, `--requests` sequential requests of:

- GET /readyz (the reference: the cheapest request the same server answers, store query included);
- GET /v1/diagnoses: first page of 50, each filter (outcome, domain, node, cluster, workload search,
  time range), a deep page reached by cursor, and the poll the page makes every 3 s (If-None-Match → 304);
- GET /v1/diagnoses/{id} (the detail), GET /v1/fleet/culprits, GET /ui/ (the page itself).

Prints median and 95th percentile per request. Figures are for this machine and run only; compare
rows of one run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from bench.panel_history import stop_process
from hypocenter.collector.bundle import load_bundle
from hypocenter.engine import default_engine
from hypocenter.model import AttemptContext
from hypocenter.server.attempts import summary
from hypocenter.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if (p / "attempt.yaml").is_file())
CLUSTERS = ("eos", "hopper-b", "jupiter-gpu", "selene")
START = datetime(2026, 9, 1, tzinfo=timezone.utc)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def fill_store(path: Path, count: int) -> list[str]:
    """`count` diagnoses in a new SQLite store at `path`; returns their ids."""
    engine = default_engine()
    bases = []
    for p in EXAMPLES:
        bundle = load_bundle(p)
        bases.append(json.loads(engine.analyze(bundle).to_json()))
    store = SQLiteStore(path, synchronous="OFF")
    ids: list[str] = []
    now = time.time()
    try:
        for i in range(count):
            doc = copy.deepcopy(bases[i % len(bases)])
            cluster = CLUSTERS[i % len(CLUSTERS)]
            # 400 nodes per cluster; a few of them fail far more often (the fleet view's repeat culprits)
            rename = {
                n: f"{cluster}-n{(i * 7 + k * 13 if i % 5 else (i % 3) + k) % 400:03d}"
                for k, n in enumerate(doc["attempt"]["nodes"])
            }
            start = START + timedelta(minutes=i * 60 * 24 * 60 // max(count, 1))
            end = start + timedelta(minutes=30 + i % 90)
            doc["id"] = f"dx-bench{i:06d}"
            doc["attempt"].update(
                workload_id=f"{700000 + i}",
                cluster=cluster,
                nodes=list(rename.values()),
                window={"start": _iso(start), "end": _iso(end)},
            )
            for cause in [doc["root_cause"], *doc["candidates"]] if doc["root_cause"] else doc["candidates"]:
                cause["nodes"] = [rename.get(n, n) for n in cause["nodes"]]
                for comp in cause["components"]:
                    comp["node"] = rename.get(comp["node"], comp["node"])
            doc["affected_nodes"] = [rename.get(n, n) for n in doc["affected_nodes"]]
            ctx = AttemptContext.model_validate(
                {
                    "workload": {
                        "id": doc["attempt"]["workload_id"],
                        "attempt": 0,
                        "cluster": cluster,
                        "scheduler": doc["attempt"].get("scheduler") or "slurm",
                    },
                    "window": doc["attempt"]["window"],
                    "nodes": doc["attempt"]["nodes"],
                    "state": doc["terminal_state"],
                }
            )
            store.set_context(ctx.workload.id, 0, ctx.model_dump(mode="json"), now)
            row = store.attempt(ctx.workload.id, 0)
            assert row is not None
            store.put_diagnosis(
                row.id, json.dumps(doc, indent=2, sort_keys=False), summary(doc, ctx), i % 97 == 0, now + 1e9
            )
            ids.append(doc["id"])
    finally:
        store.close()
    return ids


def start_server(store: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """A real `hypocenter serve` on loopback; returns the process and its HTTP base URL."""
    proc, addrs = serve(store, log, *extra)
    return proc, f"http://{addrs['http']}"


def serve(store: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A real `hypocenter serve` on loopback (no /metrics unless `extra` asks for it); returns the
    process and the addresses it printed (grpc, http, metrics)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOCENTER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    cmd = [
        sys.executable,
        "-m",
        "hypocenter.cli",
        "serve",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "",
        "--store",
        str(store),
        "--log-level",
        "warning",
        *extra,
    ]
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO)
    line: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not line or not line[0]:
        proc.kill()
        raise RuntimeError(f"server did not start: {log.read_text(errors='replace')[-2000:]}")
    addrs: dict[str, str] = json.loads(line[0])
    return proc, addrs


def _time(
    client: httpx.Client, url: str, n: int, headers: dict[str, str] | None = None, expect: int = 200
) -> tuple[float, float, int]:
    samples: list[float] = []
    size = 0
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(url, headers=headers)
        samples.append(time.perf_counter() - t)
        if r.status_code != expect:
            raise RuntimeError(f"GET {url}: {r.status_code} {r.text[:200]}")
        size = len(r.content)
    samples.sort()
    return (
        statistics.median(samples) * 1e3,
        samples[min(len(samples) - 1, int(len(samples) * 0.95))] * 1e3,
        size,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diagnoses", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=40, help="timed requests per row")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hypocenter-ui-load-") as tmp:
        db = Path(tmp) / "store.db"
        t = time.perf_counter()
        ids = fill_store(db, args.diagnoses)
        print(
            f"filled {len(ids)} diagnoses in {time.perf_counter() - t:.1f} s ({db.stat().st_size / 1e6:.0f} MB store)"
        )
        proc, base = start_server(db, Path(tmp) / "server.log")
        try:
            with httpx.Client(base_url=base, timeout=60.0) as client:
                first = client.get("/v1/diagnoses?limit=50").json()
                node = client.get("/v1/fleet/culprits").json()["nodes"]
                cursor = first["next_cursor"]
                for _ in range(19):  # page 21
                    cursor = client.get("/v1/diagnoses", params={"limit": 50, "cursor": cursor}).json()[
                        "next_cursor"
                    ]
                etag = client.get("/v1/diagnoses?limit=50").headers["etag"]
                mid = ids[len(ids) // 2]
                rows: list[tuple[str, str, dict[str, str] | None, int]] = [
                    ("reference: GET /readyz", "/readyz", None, 200),
                    ("list, first page of 50", "/v1/diagnoses?limit=50", None, 200),
                    ("list, outcome=ambiguous", "/v1/diagnoses?limit=50&outcome=ambiguous", None, 200),
                    ("list, domain=network", "/v1/diagnoses?limit=50&domain=network", None, 200),
                    (
                        "list, node=<top culprit>",
                        f"/v1/diagnoses?limit=50&node={node[0]['node'] if node else 'x'}",
                        None,
                        200,
                    ),
                    ("list, cluster=selene", "/v1/diagnoses?limit=50&cluster=selene", None, 200),
                    ("list, search=7012", "/v1/diagnoses?limit=50&search=7012", None, 200),
                    (
                        "list, one week",
                        "/v1/diagnoses?limit=50&since=2026-10-01T00:00:00Z&until=2026-10-08T00:00:00Z",
                        None,
                        200,
                    ),
                    ("list, page 21 by cursor", f"/v1/diagnoses?limit=50&cursor={cursor}", None, 200),
                    ("list poll, unchanged (304)", "/v1/diagnoses?limit=50", {"If-None-Match": etag}, 304),
                    ("detail GET /v1/diagnoses/{id}", f"/v1/diagnoses/{mid}", None, 200),
                    ("fleet GET /v1/fleet/culprits", "/v1/fleet/culprits", None, 200),
                    ("page GET /ui/", "/ui/", None, 200),
                ]
                print(
                    f"{'request':34} {'median ms':>10} {'p95 ms':>8} {'bytes':>9}   ({args.requests} requests each, "
                    f"{len(ids)} diagnoses)"
                )
                for label, url, headers, expect in rows:
                    med, p95, size = _time(client, url, args.requests, headers, expect)
                    print(f"{label:34} {med:10.1f} {p95:8.1f} {size:9d}")
        finally:
            stop_process(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
