"""`hypocenter analyze`'s text report of an abstention: each candidate in its own block, numbered, with
what its lines suggest and, on a line of its own, why it falls short."""

from __future__ import annotations

from pathlib import Path

from engine_support import analyze_bundle, write_attempt

from hypocenter.cli.analyze import render_text
from hypocenter.cli.console import Style


def test_each_candidate_says_why_it_falls_short_on_its_own_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "gpu-a01"
    logs.mkdir(parents=True)
    (logs / "out.log").write_text(
        "gpu-a01:946:988 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<56042> "
        "with status=12 opcode=129 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGidsfe80::1\n",
        encoding="utf-8",
    )
    write_attempt(tmp_path, "ib", ["gpu-a01"])
    d = analyze_bundle(tmp_path)
    assert d.outcome == "unattributed" and len(d.candidates) >= 2
    lines = render_text(d, Style(False)).splitlines()
    start = lines.index("Candidates (the causes weighed, most likely first; none attributed)")
    block = lines[start + 1 : start + 7]
    assert block[0].startswith("  1. network/fabric on ") and "rule lead-ib-transport" in block[0]
    assert (
        block[1].startswith("     NCCL's InfiniBand/RoCE transport failed") and "falls short" not in block[1]
    )
    assert (
        block[2] == "     why it falls short: no link event, counter or peer pattern confirms a fabric fault"
    )
    assert block[3].startswith("  2. software/configuration on ")
