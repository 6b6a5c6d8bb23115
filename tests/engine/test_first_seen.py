"""What a newcomer checks first: `first seen` is the time of the cause's earliest evidence line, and an
evidence line the diagnosis cut short says so with an ellipsis."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

from engine_support import analyze_bundle

REPO = Path(__file__).resolve().parents[2]


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_first_seen_is_the_earliest_cause_line() -> None:
    d = analyze_bundle(REPO / "examples" / "nvlink-xid149")
    assert d.root_cause is not None
    causes = [e for e in d.evidence if e.role == "root_cause" and e.time]
    # node02's rank 10 reports the NVLink error (unstamped, after the 10:50:58 stamp) before the
    # kernel logs Xid 149 at 10:51:03
    assert d.root_cause.first_seen == "2026-11-02T10:50:58Z" == min(e.time for e in causes)


def test_an_unstamped_line_long_after_its_stamp_does_not_date_the_cause() -> None:
    """A traceback printed 2.5 h after the last stamp of its stream was not written 2.5 h early: the
    cause is dated by the kernel's Xid."""
    d = analyze_bundle(REPO / "bench" / "heldout" / "gb200-xid149-peer-link-down")
    assert d.root_cause is not None
    wide = [e for e in d.evidence if e.role == "root_cause" and e.inherited and e.time_max]
    assert wide and wide[0].time and wide[0].time_max
    assert _t(wide[0].time_max) - _t(wide[0].time) > timedelta(hours=2)
    assert d.root_cause.first_seen == "2026-09-22T14:07:31.402000Z"


def test_a_cut_evidence_line_ends_with_an_ellipsis(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(REPO / "examples" / "nvlink-xid149", bundle)
    kern = bundle / "logs" / "node02" / "kern.log"
    lines = kern.read_text().splitlines(keepends=True)
    xid = next(i for i, line in enumerate(lines) if "): 149," in line)
    lines[xid] = lines[xid].rstrip("\n") + " " + "0x00000000 " * 80 + "\n"
    kern.write_text("".join(lines))
    d = analyze_bundle(bundle)
    cut = next(e for e in d.evidence if e.ref.endswith(f"kern.log:{xid + 1}"))
    assert cut.text.endswith("…") and len(cut.text) == 600
    whole = [e for e in d.evidence if len(e.text) < 590]
    assert whole and not any(e.text.endswith("…") for e in whole)
