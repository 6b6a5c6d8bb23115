"""An attempt rebuilt from the store (server/attempts.py `assemble`) is its logs as they were written:
streams reduced on arrival keep every line number and count, a rotated file is its own older
generation, and the diagnosis is byte for byte the one the whole texts give — boot anchors included
(an uptime-only kernel line placed by the wall/uptime pairs at the head of another stream of its node)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from bench.perf import FAULT, VICTIM
from hypocenter.engine import default_engine
from hypocenter.server.arrival import Arrival
from hypocenter.server.attempts import assemble
from hypocenter.sources import AttemptInput, TextSource
from hypocenter.store.base import Entry
from hypocenter.store.sqlite import SQLiteStore

T0 = 1_793_613_600  # 2026-11-02T10:00:00Z
BOOT = T0 - 100_000  # n1 booted 100,000 s before the window: kernel uptime = wall time - BOOT
SCOPE = {
    "window_start": "2026-11-02T10:00:00Z",
    "window_end": "2026-11-02T11:02:00Z",
    "nodes": "n1,n2",
    "state": "FAILED",
    "scheduler": "slurm",
}


def _kern(n: int, offset: int) -> list[str]:
    """kern.log of n1: syslog kernel lines (a wall stamp and an uptime: boot anchors) between NCCL
    chatter without either; none is a candidate."""
    out = []
    for i in range(n):
        t = offset + i
        if i % 3:
            out.append(
                f"n1:4242:4242 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : 1[0] -> 2[0] [send] via NET/IB/0"
            )
        else:
            out.append(
                f"Nov  2 {10 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d} n1 kernel: [{t + T0 - BOOT}.000000] "
                f'audit: type=1400 apparmor="STATUS" pid={i}'
            )
    return out


def _rank(n: int) -> list[str]:
    """A rank's log: stamped progress, unstamped lines, a watchdog failure at 10:51 and torchrun's
    failure report, whose `exitcode` line opens a batch and reads the five lines before it."""
    out = [
        f"[2026-11-02 10:{i // 60 % 60:02d}:{i % 60:02d}] step {i} ppl 12.5" if i % 2 else f"  tokens {i}"
        for i in range(n)
    ]
    out[1500] = VICTIM.format(rank=0, s=7)
    out[2095:2101] = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-02_10:35:00",
        "  host      : n1",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 1 (pid: 4242)",
    ]
    return out


def _send(
    store: SQLiteStore,
    arrival: Arrival,
    workload: str | None,
    stream: str,
    lines: list[str],
    start_s: int,
    now: float,
    node: str = "n1",
) -> None:
    """The stream as a collector sends it: record-numbered lines in batches, reduced on arrival."""
    entries = [
        Entry(
            workload=workload,
            attempt=0,
            node=node,
            stream=stream,
            kind="text",
            body=b,
            time_ns=(T0 + start_s + i) * 10**9,
            line=i + 1,
            dedup=f"{node}|{stream}|{start_s}|{i}",
            scope=SCOPE if workload else {},
        )
        for i, b in enumerate(lines)
    ]
    for i in range(0, len(entries), 700):
        reduced = arrival.split(store, entries[i : i + 700], now)
        store.ingest(reduced.rest, [], now, (), reduced.writes)


def test_the_stored_attempt_is_its_logs_and_diagnoses_as_they_do(tmp_path: Path) -> None:
    engine = default_engine()
    store = SQLiteStore(tmp_path / "store.db")
    arrival = Arrival(engine.extractor)
    kern_old, kern_new = _kern(2400, 0), _kern(600, 2400)
    dmesg = [f"[{100_000 + 100 + i}.000000] usb 1-1: new high-speed USB device number {i}" for i in range(40)]
    dmesg.append(FAULT.split("kernel: ", 1)[1])  # raw dmesg: uptime only, placed by n1's boot anchors
    dmesg[-1] = dmesg[-1].replace("[294950.412118]", f"[{T0 + 3063 - BOOT}.000000]")
    rank = _rank(3000)
    now = T0 + 4000.0
    _send(store, arrival, None, "logs/n1/kern.log", kern_old, 0, now)
    _send(store, arrival, None, "logs/n1/kern.log", kern_new, 2400, now)  # logrotate: line 1 again
    _send(store, arrival, None, "logs/n1/dmesg", dmesg, 3000, now)
    _send(store, arrival, "w1", "logs/n1/rank.log", rank, 0, now)
    # one file sent under two spellings of the node: one spelling's lines after the other's (by name)
    short, fqdn = [f"short {i}" for i in range(20)], [f"fqdn {i}" for i in range(30)]
    _send(store, arrival, None, "logs/n1/extra.log", short, 100, now)
    _send(store, arrival, None, "logs/n1/extra.log", fqdn, 200, now, node="N1.example.com")
    row = store.attempt("w1", 0)
    assert row is not None
    inp = assemble(store, row, lookback_s=3600, slack_s=600, now=datetime.fromtimestamp(now, timezone.utc))

    written = {
        "logs/n1/kern.log": kern_new,
        "logs/n1/kern.log.1": kern_old,
        "logs/n1/dmesg": dmesg,
        "logs/n1/rank.log": rank,
        "logs/n1/extra.log": short,
        "logs/n1/extra.log.1": fqdn,
    }
    texts = {s.name: s for s in inp.sources if isinstance(s, TextSource)}
    assert sorted(texts) == sorted(written)
    observed = {c.source: c.observations for c in inp.coverage}
    blanked = 0
    for name, lines in written.items():
        rebuilt = str(texts[name].text).split("\n")
        assert rebuilt[-1] == "" and len(rebuilt) - 1 == len(lines) == observed[name], (
            name
        )  # every line number
        assert all(got in ("", want) for got, want in zip(rebuilt, lines, strict=False)), (
            name
        )  # a kept line is itself
        blanked += sum(1 for got, want in zip(rebuilt, lines, strict=False) if got != want)
    # The store kept evidence, not lines: what no rule's token names (no candidate) is blanked.
    tokens = engine.ruleset.queries().tokens
    plain = sum(1 for lines in written.values() for line in lines if not any(t in line for t in tokens))
    assert blanked > 0.9 * plain - 100

    whole = AttemptInput(
        context=inp.context,
        coverage=inp.coverage,
        notes=inp.notes,
        sources=[
            TextSource(s.name, "\n".join(written[s.name]) + "\n", node=s.node)
            if isinstance(s, TextSource)
            else s
            for s in inp.sources
        ],
    )
    got, want = engine.analyze(inp), engine.analyze(whole)
    assert got.to_json() == want.to_json()
    placed = [e for e in got.evidence if e.ref.startswith("logs/n1/dmesg:")]
    assert placed and placed[0].time is not None  # placed by n1's boot anchors, not at the window's end
    assert datetime.fromisoformat(placed[0].time.replace("Z", "+00:00")).timestamp() == T0 + 3063
