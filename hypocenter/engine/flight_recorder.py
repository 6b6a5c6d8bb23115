"""Hang forensics: merge every rank's Flight Recorder dump, NCCL RAS report and stack dump.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from hypocenter.engine.analyzers import AttemptView, Finding, first_seen
from hypocenter.model import Event, parse_rank_ranges

WAITING_PLACES = frozenset({"collective", "barrier"})
MAX_EVIDENCE = 6
# Where a stack is, from its innermost frame outwards: the first frame that names a place decides.
_PLACES = (
    ("barrier", re.compile(r"\b(?:monitored_)?barrier\b")),
    (
        "collective",
        re.compile(
            r"distributed_c10d\.py|\b(?:all_reduce|all_gather\w*|reduce_scatter\w*|broadcast|"
            r"all_to_all\w*|send|recv)\b"
        ),
    ),
    ("data loader", re.compile(r"torch/utils/data/|dataloader", re.IGNORECASE)),
    ("checkpoint write", re.compile(r"serialization\.py|checkpoint|\bsave\b", re.IGNORECASE)),
)


def place(e: Event) -> str:
    """Where a stack dump's thread is: a collective, a barrier, the data loader, a checkpoint write,
    or elsewhere in the program."""
    frames = [str(e.fields.get("top") or ""), *str(e.fields.get("stack") or "").splitlines()]
    for frame in frames:
        for name, pattern in _PLACES:
            if pattern.search(frame):
                return name
    return "program code"


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class _Status:
    rank: int
    event: Event
    enqueued: int
    completed: int
    members: tuple[int, ...]


def _groups(view: AttemptView) -> dict[str, dict[int, _Status]]:
    """Process group → rank → its status (the most behind one, if a rank dumped twice)."""
    out: dict[str, dict[int, _Status]] = defaultdict(dict)
    for e in view.of_kind("fr_pg"):
        enq, done = _int(e.fields.get("last_enqueued")), _int(e.fields.get("last_completed"))
        if e.rank is None or enq is None:
            continue
        members: tuple[int, ...] = ()
        spec = e.fields.get("ranks")
        if isinstance(spec, str) and spec != "-":
            try:
                members = tuple(parse_rank_ranges(spec))
            except ValueError:
                members = ()
        pg = str(e.fields.get("pg") or "0")
        st = _Status(e.rank, e, enq, done if done is not None else enq, members)
        old = out[pg].get(e.rank)
        if old is None or (st.enqueued, st.completed) < (old.enqueued, old.completed):
            out[pg][e.rank] = st
    return out


def _entries(view: AttemptView) -> dict[tuple[str, int], dict[int, Event]]:
    """(process group, sequence id) → rank → its Flight Recorder entry."""
    out: dict[tuple[str, int], dict[int, Event]] = defaultdict(dict)
    for e in view.of_kind("fr_entry"):
        seq = _int(e.fields.get("seq"))
        if e.rank is not None and seq is not None:
            out[(str(e.fields.get("pg") or "0"), seq)].setdefault(e.rank, e)
    return out


def _stuck_seq(ranks: dict[int, _Status]) -> int | None:
    """The collective the waiting ranks are in: after the last completed one of the ranks that have
    work outstanding; when none has (gloo marks a timed-out collective completed), the latest one
    most ranks enqueued."""
    waiting = Counter(s.completed + 1 for s in ranks.values() if s.enqueued > s.completed)
    if waiting:
        return min(waiting.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    enq = Counter(s.enqueued for s in ranks.values())
    top = max(enq.values())
    return max(v for v, n in enq.items() if n == top)


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:12])) + (f" and {len(ranks) - 12} more" if len(ranks) > 12 else "")


def _stacks(view: AttemptView, ranks: set[int]) -> list[Event]:
    return [e for e in view.of_kind("stack_dump") if e.rank in ranks]


def flight_recorder_laggard(view: AttemptView) -> list[Finding]:
    findings: list[Finding] = []
    entries = _entries(view)
    for pg, ranks in sorted(_groups(view).items()):
        if len(ranks) < 2:
            continue
        stuck = _stuck_seq(ranks)
        if stuck is None:
            continue
        behind = sorted(r for r, s in ranks.items() if s.enqueued < stuck)
        ahead = sorted(r for r, s in ranks.items() if s.enqueued >= stuck)
        # At least two ranks wait: with one, a dump taken while the job ran can show a rank one
        # collective behind by chance (the other had just enqueued the next one).
        if not behind or len(ahead) < 2 or len(behind) > len(ahead):
            continue
        nodes = sorted({n for r in behind if (n := view.node_of(ranks[r].event))})
        if not nodes:
            continue
        waiting = entries.get((pg, stuck), {})
        sample = waiting[min(waiting)] if waiting else None
        op = str(sample.fields.get("op")) if sample else "the collective"
        state = str(sample.fields.get("state")) if sample else "?"
        desc = str(ranks[ahead[0]].event.fields.get("desc") or pg)
        last = [entries.get((pg, ranks[r].enqueued), {}).get(r) for r in behind]
        frames = next(
            (str(e.fields.get("frames")) for e in last if e and e.fields.get("frames") not in (None, "-")), ""
        )
        stacks = _stacks(view, set(behind))
        stack_note = ""
        if stacks:
            stack_note = f"; its stack dump ({stacks[0].ref}): in the {place(stacks[0])} ({stacks[0].fields.get('top')})"
        dumped = {r for pg_ranks in _groups(view).values() for r in pg_ranks}
        members = sorted(set(ranks[ahead[0]].members) - dumped)
        missing_note = f"; no dump from rank(s) {_ranks_text(members)}" if members else ""
        evs: list[Event] = [ranks[r].event for r in behind]
        evs += [e for e in last if e is not None]
        # Stack dumps carry no time: cited in the detail, not as timed evidence. The waiting ranks'
        # entries are symptoms (rule fr-entry), not the cause.
        lag = ranks[behind[0]]
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=tuple(evs),
                first_seen=first_seen(evs[: len(behind)]) or first_seen(evs),
                detail=(
                    f"Flight Recorder ({lag.event.ref.rsplit(':', 1)[0]}): rank(s) {_ranks_text(behind)} last enqueued "
                    f"collective {lag.enqueued} of process group {pg} ({desc}) and never issued {stuck} ({op}, "
                    f"state {state}) that {len(ahead)} other rank(s) wait in"
                    + (f"; last seen at {frames}" if frames else "")
                    + stack_note
                    + missing_note
                ),
            )
        )
    return findings


def flight_recorder_desync(view: AttemptView) -> list[Finding]:
    findings: list[Finding] = []
    for (pg, seq), ranks in sorted(_entries(view).items()):
        if len(ranks) < 2:
            continue
        sig = {r: (str(e.fields.get("op")), str(e.fields.get("in"))) for r, e in ranks.items()}
        counts = Counter(sig.values())
        if len(counts) < 2:
            continue
        lowest = sig[min(sig)]
        common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] == lowest, kv[0]))[0][0]
        odd = sorted(r for r, s in sig.items() if s != common)
        if len(odd) * 2 > len(ranks):
            continue
        nodes = sorted({n for r in odd if (n := view.node_of(ranks[r]))})
        if not nodes:
            continue
        evs = tuple(ranks[r] for r in odd[:MAX_EVIDENCE])
        o = sig[odd[0]]
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=evs,
                first_seen=first_seen(evs),
                detail=(
                    f"Flight Recorder: at sequence id {seq} of process group {pg} rank(s) {_ranks_text(odd)} recorded "
                    f"{o[0]} with sizes {o[1]} while the others recorded {common[0]} with sizes {common[1]}"
                ),
            )
        )
        break  # the first divergence explains the rest
    return findings


def flight_recorder_stalled(view: AttemptView) -> list[Finding]:
    entries = _entries(view)
    findings: list[Finding] = []
    for pg, ranks in sorted(_groups(view).items()):
        if len(ranks) < 2:
            continue
        stuck = _stuck_seq(ranks)
        at = entries.get((pg, stuck or -1), {})
        if stuck is None or any(s.enqueued < stuck for s in ranks.values()) or set(at) != set(ranks):
            continue
        if not all(e.fields.get("state") == "started" for e in at.values()):
            continue
        evs = tuple(at[r] for r in sorted(at)[:MAX_EVIDENCE])
        findings.append(
            Finding(
                nodes=(),
                events=evs,
                first_seen=first_seen(evs),
                detail=(
                    f"Flight Recorder: collective {stuck} ({at[min(at)].fields.get('op')}) of process group {pg} "
                    f"started on all {len(at)} rank(s) that dumped and completed on none: the fabric or a GPU "
                    f"stopped it, not a rank that stayed behind"
                ),
            )
        )
    return findings


def flight_recorder_missing(view: AttemptView) -> list[Finding]:
    groups = _groups(view)
    dumped = {r for ranks in groups.values() for r in ranks}
    findings: list[Finding] = []
    for pg, ranks in sorted(groups.items()):
        stuck = _stuck_seq(ranks) if len(ranks) >= 2 else None
        if stuck is None or any(s.enqueued < stuck for s in ranks.values()):
            continue  # a laggard that dumped is the better answer
        members = set().union(*(s.members for s in ranks.values())) or set(view.rank_nodes)
        missing = sorted(members - dumped)
        if not missing or len(missing) * 2 >= len(members):
            continue
        nodes = sorted({n for r in missing if (n := view.rank_nodes.get(r))})
        if not nodes or len(nodes) > 2:
            continue
        evs = tuple(ranks[r].event for r in sorted(ranks)[:3])
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=evs,
                first_seen=first_seen(evs),
                detail=(
                    f"Flight Recorder: the {len(ranks)} rank(s) that dumped wait in collective {stuck} of process "
                    f"group {pg}; rank(s) {_ranks_text(missing)} left no dump (a dead process or node)"
                ),
            )
        )
        break
    return findings


def nccl_ras(view: AttemptView) -> list[Finding]:
    """Processes ncclras reports dead, else ranks it reports behind the rest of their communicator."""
    findings: list[Finding] = []
    for kind, what in (
        ("ras_dead_process", "considers dead (unreachable via the RAS network)"),
        ("ras_rank_behind", "reports behind the rest of their communicator"),
    ):
        evs = view.of_kind(kind)
        nodes = sorted({n for e in evs if (n := view.node_of(e))})
        if not nodes or len(nodes) > 2:
            continue
        shown = tuple(evs[:MAX_EVIDENCE])
        findings.append(
            Finding(
                nodes=tuple(nodes),
                events=shown,
                first_seen=first_seen(shown),
                detail=f"NCCL RAS {what}: process(es) on {', '.join(nodes)}",
            )
        )
        break
    return findings


def stack_laggard(view: AttemptView) -> list[Finding]:
    """Ranks whose main thread is somewhere else while most ranks' main threads wait in a collective."""
    per_rank: dict[int, Event] = {}
    for e in view.of_kind("stack_dump"):
        if e.rank is not None:
            per_rank.setdefault(e.rank, e)
    if len(per_rank) < 2:
        return []
    waiting = [r for r, e in per_rank.items() if place(e) in WAITING_PLACES]
    stuck = sorted(r for r, e in per_rank.items() if place(e) not in WAITING_PLACES)
    if not stuck or len(stuck) >= len(waiting):
        return []
    nodes = sorted({n for r in stuck if (n := view.node_of(per_rank[r]))})
    if not nodes:
        return []
    evs = tuple(per_rank[r] for r in stuck[:MAX_EVIDENCE])
    e0 = evs[0]
    return [
        Finding(
            nodes=tuple(nodes),
            events=evs,
            first_seen=first_seen(evs),
            detail=(
                f"stack dumps: rank(s) {_ranks_text(stuck)} are in the {place(e0)} "
                f"({e0.fields.get('top')}) while {len(waiting)} rank(s) wait in a collective"
            ),
        )
    ]


HANG_ANALYZERS = {
    "flight-recorder-laggard": flight_recorder_laggard,
    "flight-recorder-desync": flight_recorder_desync,
    "flight-recorder-stalled": flight_recorder_stalled,
    "flight-recorder-missing": flight_recorder_missing,
    "nccl-ras": nccl_ras,
    "stack-laggard": stack_laggard,
}
