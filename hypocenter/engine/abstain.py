"""Abstaining that still localises.

When no cause can be attributed, the diagnosis still says which process failed first, where, how
(exit code or signal) and what to check next, and lists the causes it weighed with why each fell
short.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from hypocenter.engine.suspects import Suspect, solo_work, timed_out
from hypocenter.model import Action, Event, FirstFailure, RootCause, isoformat

# Signals a process is killed by when it crashed on its own (native code, a failed assert).
_CRASH = frozenset({"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE"})
# Scheduler events and terminal states that say why the scheduler ended a job.
_REASON_KINDS = frozenset({"time_limit", "host_oom", "cancellation", "preemption", "node_lost"})
_REASON_STATES = frozenset({"TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED", "NODE_FAIL", "DEADLINE"})


def _signal_name(code: int | None, named: object) -> str | None:
    if isinstance(named, str) and named.startswith("SIG"):
        return named
    if code is not None and code < 0:
        try:
            return _signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return None


@dataclass
class _Exit:
    event: Event
    rank: int | None
    code: int | None
    signal: str | None


class FirstFailureFinder:
    """Finds the first failed process among an attempt's events and says what to check next."""

    def __init__(self, events: list[Event], rank_nodes: dict[int, str]) -> None:
        self.events = events
        self.rank_nodes = rank_nodes
        self.kernel_oom_nodes = {e.node for e in events if e.kind in ("oom_kill", "host_oom") and e.node}
        self.suspects: list[Suspect] = []  # candidates with the lines they rest on (shown as evidence)
        # Whether the scheduler said why it ended the job: `task N: Killed` follows a time limit, an OOM
        # kill and a cancel alike, and only the scheduler's own reason tells them apart.
        self.scheduler_reason = any(
            e.kind in _REASON_KINDS
            or (
                e.kind == "job_state"
                and str(e.fields.get("state") or "").split("+")[0].upper() in _REASON_STATES
            )
            for e in events
        )
        self.step_cancelled = any(e.kind == "step_cancelled" for e in events)

    def _exits(self) -> list[_Exit]:
        firsts = [e for e in self.events if e.kind == "child_failed" and e.fields.get("first")]
        if firsts:
            # One Root Cause block per agent (node): the earliest by the time torchrun states in it.
            firsts.sort(key=lambda e: (str(e.fields.get("failed_at") or "~"), *e.stream_order()))
            return [self._of_child(e) for e in firsts]
        agent = sorted((e for e in self.events if e.kind == "worker_exit"), key=Event.stream_order)
        if agent:
            return [
                _Exit(
                    e,
                    e.rank,
                    _int(e.fields.get("exitcode")),
                    _signal_name(_int(e.fields.get("exitcode")), None),
                )
                for e in agent
            ]
        srun = sorted((e for e in self.events if e.kind == "task_exit"), key=Event.stream_order)
        if srun:
            out = []
            for e in srun:
                what = str(e.fields.get("what") or "")
                sig = {
                    "Killed": "SIGKILL",
                    "Aborted": "SIGABRT",
                    "Segmentation fault": "SIGSEGV",
                    "Terminated": "SIGTERM",
                    "Bus error": "SIGBUS",
                }.get(what)
                tasks = str(e.fields.get("tasks") or "")
                out.append(_Exit(e, int(tasks) if tasks.isdigit() else None, _int(e.fields.get("code")), sig))
            return out
        others = sorted((e for e in self.events if e.kind == "child_failed"), key=Event.stream_order)
        # Without a Root Cause block, a SIGTERM'd rank is the agent's collateral: prefer any other.
        others.sort(
            key=lambda e: (
                _signal_name(_int(e.fields.get("exitcode")), e.fields.get("signal")) == "SIGTERM",
                *e.stream_order(),
            )
        )
        return [self._of_child(e) for e in others]

    def _worker_killed(self, rank: int | None) -> Event | None:
        killed = sorted(
            (
                e
                for e in self.events
                if e.kind == "worker_killed" and (rank is None or e.rank in (None, rank))
            ),
            key=Event.stream_order,
        )
        return killed[0] if killed else None

    def _silent_rank(self) -> int | None:
        """The one rank of three or more that reported no collective timeout while all the others did."""
        if len(self.rank_nodes) < 3:
            return None
        waited = {e.rank for e in self.events if e.rank is not None and timed_out(e)}
        missing = set(self.rank_nodes) - waited
        return missing.pop() if len(missing) == 1 and len(waited) >= 2 else None

    @staticmethod
    def _of_child(e: Event) -> _Exit:
        code = _int(e.fields.get("exitcode"))
        return _Exit(e, _int(e.fields.get("rank")), code, _signal_name(code, e.fields.get("signal")))

    def find(self) -> tuple[FirstFailure | None, list[RootCause]]:
        """The first failure and the candidates it suggests (each saying why it falls short)."""
        exits = self._exits()
        if not exits:
            return None, []
        x = exits[0]
        node = x.event.node or (self.rank_nodes.get(x.rank) if x.rank is not None else None)
        where = f"rank {x.rank}" if x.rank is not None else "a process"
        where += f" on {node}" if node else ""
        how = (
            f"killed by {x.signal}"
            if x.signal
            else f"exited with code {x.code}"
            if x.code is not None
            else "failed"
        )
        cands: list[RootCause] = []
        action: Action = "INVESTIGATE"
        if x.signal == "SIGKILL":
            step = (
                f"{where} was {how} first. Check {node or 'its node'}'s kernel log for an OOM kill "
                "(`journalctl -k | grep -i -E 'out of memory|killed process'`) and the job's memory limit "
                "(cgroup, container); a SIGKILL also comes from the scheduler or an operator"
            )
            if not self.scheduler_reason:
                step += (
                    ". The scheduler states no reason for the kill"
                    + (" (the step was cancelled with none)" if self.step_cancelled else "")
                    + ": its record tells a time limit, an OOM kill and a cancel apart "
                    "(`sacct -j <job> -o JobID,State,ExitCode`: TIMEOUT, OUT_OF_MEMORY, CANCELLED)"
                )
            if node not in self.kernel_oom_nodes:
                cands.append(
                    RootCause(
                        domain="resource",
                        subdomain="host_oom",
                        rule="signal-kill-unexplained",
                        summary=(
                            f"host out of memory likely: {where} was {how} and no kernel line at hand records "
                            "an OOM kill (it falls short: SIGKILL also comes from a scheduler or an operator)"
                        ),
                        nodes=[node] if node else [],
                        first_seen=isoformat(x.event.time),
                        action="INVESTIGATE",
                    )
                )
        elif x.signal in _CRASH:
            step = (
                f"{where} was {how} first: a native crash. Read that rank's output just before it (a C++ stack, "
                "`Fatal Python error`, a CUDA or NCCL line) and look for a core dump on "
                f"{node or 'its node'}; SIGBUS in a container is usually /dev/shm exhausted"
            )
        elif x.signal == "SIGTERM":
            step = (
                f"{where} was {how} first: something asked it to stop. Find who sent it (a scheduler cancel, "
                "preemption, time limit, or the launcher after another worker failed)"
            )
        elif self._worker_killed(x.rank) is not None:
            killed = self._worker_killed(x.rank)
            assert killed is not None
            step = (
                f"{where} {how} first, after one of its DataLoader workers was killed by signal "
                f"{killed.fields.get('signal') or '?'}: check {node or 'its node'}'s kernel log and the job's memory "
                "limit for an OOM kill (fewer workers or a smaller prefetch use less host memory)"
            )
            if node not in self.kernel_oom_nodes and killed.fields.get("signal") == "Killed":
                cands.append(
                    RootCause(
                        domain="resource",
                        subdomain="host_oom",
                        rule="signal-kill-unexplained",
                        summary=(
                            f"host out of memory likely: a DataLoader worker of {where} was killed by SIGKILL and no "
                            "kernel line at hand records an OOM kill (it falls short: no OOM record)"
                        ),
                        nodes=[node] if node else [],
                        first_seen=isoformat(killed.time),
                        action="INVESTIGATE",
                    )
                )
        elif x.code is not None and x.code > 0:
            step = (
                f"{where} {how} first: read that rank's traceback (the last exception before its exit) "
                "for the error the rules did not recognise"
            )
        else:
            step = f"{where} {how} first: read that rank's output just before it failed"
        silent = self._silent_rank()
        snode = self.rank_nodes.get(silent) if silent is not None else None
        solo = solo_work(self.events, silent, snode) if silent is not None else None
        if solo is not None:
            step = (
                f"every rank but rank {silent}{f' on {snode}' if snode else ''} timed out in a collective while rank {silent} was still working on "
                f"its own ({solo.events[-1].text.strip()[:80]}): compare the collective timeout with how long that "
                "work takes"
            )
            cands.append(solo.cause)
            self.suspects.append(solo)
        elif silent is not None:
            step = (
                f"every rank but rank {silent}{f' on {snode}' if snode else ''} reported a collective timeout: "
                f"rank {silent} never reached the collective. Check what it was doing (its last lines, a stack dump "
                f"with py-spy) rather than {where}, which only exited first"
            )
            cands.append(
                RootCause(
                    domain="software",
                    subdomain="hang",
                    rule="collective-timeout-silent-rank",
                    summary=(
                        f"rank {silent} stalled before a collective: every other rank timed out waiting for it "
                        "(it falls short: what it was doing is not in the logs)"
                    ),
                    nodes=[snode] if snode else [],
                    first_seen=None,
                    action="INVESTIGATE",
                )
            )
        return FirstFailure(
            rank=x.rank,
            node=node,
            exit_code=x.code,
            signal=x.signal,
            time=isoformat(x.event.time),
            ref=x.event.ref,
            text=x.event.text,
            next_step=step,
            action=action,
        ), cands


def _int(v: object) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return None
