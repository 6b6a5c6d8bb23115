"""Recognise the prefix of one log line by its content and turn it into a wall-clock time.

Handles the formats that GPU-cluster logs arrive in: CRI (`kubectl logs` / containerd) prefixes,
JSON lines (journalctl -o json, structured app logs), RFC 5424 and RFC 3164 syslog (with and
without the kernel's `[uptime]` stamp), journalctl short-iso / short-precise, `dmesg -T`, raw
`dmesg` (monotonic seconds), PyTorch `[rankN]:` prefixes, c10/glog stamps (`E1102 10:15:03.123`),
Python logging and ISO stamps. Layers are peeled in order (a CRI line may carry a JSON line that
carries a rank prefix …).

This module only parses one line at a time and is called for candidate lines only: it must stay
cheap and must never raise on odd input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hypocenter.errors import BundleError
from hypocenter.model import AttemptContext

# A line longer than this is parsed and matched only up to here (the extractor cuts it; the
# bundle reader says so in coverage).
MAX_LINE = 64 * 1024

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1
    )
}

_CRI = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})) (?:stdout|stderr) [FP] ?"
)
_RFC5424 = re.compile(r"^<\d{1,3}>1 (\S+) (\S+) (\S+) \S+ \S+ (?:-|(?:\[[^\]]*\])+) ?")
_RFC3164 = re.compile(
    r"^(?:<\d{1,3}>)?([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? "
    r"([A-Za-z0-9][\w.-]*) ([A-Za-z_][\w.@/-]*)(?:\[\d+\])?: ?"
)
_SHORT_ISO = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})) ([A-Za-z0-9][\w.-]*) "
    r"([A-Za-z_][\w.@/-]*)(?:\[\d+\])?: ?"
)
_DMESG_T = re.compile(
    r"^\[(?:[A-Z][a-z]{2}) ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\] ?"
)
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)\] ?")
_RANK = re.compile(r"^\[rank(\d+)\]:\s?")
_NCCL = re.compile(r"^([A-Za-z0-9][\w.-]*):(\d+):(\d+) \[(\d+)\] ")
_DEFAULT_RANK = re.compile(r"^\[[A-Za-z_][\w-]*?(\d+)\]:\s?")  # torchrun --tee: [${role_name}${local_rank}]:
_SRUN_LABEL = re.compile(r"^(?:P\d+ )?(\d{1,6}): (?!\d)")  # srun --label: "%*d: " (het jobs: "P%u %*d: ")
# Launcher prefixes that name the rank or the host:
# Open MPI --tag-output / --output tag: "[jobid,rank]<stdout>:" (v5 adds a space after the colon);
# a "[host:rank]:" prefix (mpirun -prepend-pattern, hand-made wrappers); Open MPI / glibc
# "[host:pid] *** Process received signal ***" names the host only.
_OMPI_TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err|diag)>: ?")
_HOST_RANK = re.compile(r"^\[([A-Za-z][\w.-]*):(\d{1,6})\]: ?")
_HOST_PID = re.compile(r"^\[([A-Za-z][\w.-]*):\d+\] (?=\*\*\*|\[)")
# pdsh (DeepSpeed's multi-node runner, pdsh -R ssh): "host: message". Only peeled when `host` is one
# of the attempt's nodes (TimeContext.hosts): "RuntimeError: …" and "srun: error: …" look the same.
_PDSH = re.compile(r"^([A-Za-z][\w.-]{0,62}): ")
_GLOG = re.compile(r"^\[?([IWEF])(\d{3,4}) (\d{2}):(\d{2}):(\d{2})\.(\d{1,9})\b")
_US_DATE = re.compile(
    r"^\[?(\d{2})/(\d{2})/(\d{4})[ ,]+(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\]?"
)  # HF Trainer
_ISO = re.compile(
    r"^\[?(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?\]?"
)

_APP_TAG = re.compile(r"^\[[A-Za-z][\w.-]{0,30}\] (?=\[?\d{4}-\d{2}-\d{2}[ T])")  # "[titan] 2026-…"
_KERNEL_TAGS = frozenset({"kernel", "kern"})
_SCHEDULER_TAGS = frozenset({"slurmstepd", "slurmd", "slurmctld", "srun", "sbatch", "kubelet"})

_JSON_MESSAGE_KEYS = ("MESSAGE", "message", "msg", "log", "text", "line")
_JSON_TIME_KEYS = ("time", "timestamp", "@timestamp", "ts", "asctime", "date")
_JSON_HOST_KEYS = ("_HOSTNAME", "hostname", "host", "node", "nodename")


@dataclass(slots=True)
class LineHeader:
    """What a line's prefix says; `message` is the line with every recognised prefix removed."""

    message: str
    time: datetime | None = None
    uptime: float | None = None
    host: str | None = None
    tag: str | None = None
    rank: int | None = None
    device: int | None = None
    task: int | None = None  # srun --label task id: the global rank only when srun starts one task per rank
    local_rank: int | None = None  # torchrun's [defaultN]: prefix (a rank within its node)

    @property
    def source_hint(self) -> str | None:
        if self.tag in _KERNEL_TAGS:
            return "kernel"
        if self.tag in _SCHEDULER_TAGS:
            return "scheduler"
        if self.tag is not None and self.tag.startswith("slurm"):
            return "scheduler"
        return None


def zone(name: str) -> tzinfo:
    """The tzinfo for an attempt's `timezone:`; raises ValueError with a clear message."""
    if name.upper() in ("UTC", "Z", "GMT"):
        return timezone.utc
    m = re.fullmatch(r"([+-])(\d{2}):?(\d{2})", name)
    if m:
        delta = timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
        return timezone(-delta if m.group(1) == "-" else delta)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown timezone {name!r} (use an IANA name such as 'Europe/Paris', or '+02:00')"
        ) from None


@dataclass(frozen=True, slots=True)
class TimeContext:
    """What is needed to turn partial stamps into instants: the zone and the attempt's window."""

    tz: tzinfo
    start: datetime
    end: datetime
    hosts: frozenset[str] = (
        frozenset()
    )  # the attempt's node names, lower case (short and full): pdsh prefixes

    def complete(self, month: int, day: int, hh: int, mm: int, ss: int, us: int) -> datetime | None:
        """A year-less local stamp → aware UTC instant; the year is the one nearest the window."""
        best: datetime | None = None
        for year in (self.start.year, self.start.year - 1, self.start.year + 1):
            try:
                local = datetime(year, month, day, hh, mm, ss, us, tzinfo=self.tz)
            except ValueError:
                continue
            cand = local.astimezone(timezone.utc)
            if best is None or _distance(cand, self) < _distance(best, self):
                best = cand
        return best

    def localize(self, dt: datetime) -> datetime:
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=self.tz)
        return dt.astimezone(timezone.utc)


def _distance(t: datetime, ctx: TimeContext) -> float:
    if t < ctx.start:
        return (ctx.start - t).total_seconds()
    if t > ctx.end:
        return (t - ctx.end).total_seconds()
    return 0.0


def _micros(frac: str | None) -> int:
    if not frac:
        return 0
    return int((frac + "000000")[:6])


def parse_iso(text: str, ctx: TimeContext) -> datetime | None:
    """Parse an ISO-8601-ish stamp (`2026-11-02T10:15:03.123Z`, `2026-11-02 10:15:03,5`, …); None
    when it is not one or names no possible instant (an offset of 24 h or more). Never raises."""
    try:
        return _parse_iso(text, ctx)
    except (ValueError, OverflowError):
        return None


def _parse_iso(text: str, ctx: TimeContext) -> datetime | None:
    """`parse_iso` that raises on an impossible stamp: `parse_line` then keeps the line unparsed."""
    m = _ISO.match(text.strip())
    if not m:
        return None
    return _iso_from_match(m, ctx)


def _iso_from_match(m: re.Match[str], ctx: TimeContext) -> datetime | None:
    y, mo, d, hh, mi, ss, frac, tz = m.groups()
    try:
        dt = datetime(int(y), int(mo), int(d), int(hh), int(mi), int(ss), _micros(frac))
    except ValueError:
        return None
    if tz:
        if tz == "Z":
            return dt.replace(tzinfo=timezone.utc)
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        off = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4]))
        return dt.replace(tzinfo=timezone(sign * off)).astimezone(timezone.utc)
    return ctx.localize(dt)


def parse_line(line: str, ctx: TimeContext) -> LineHeader:
    """Peel the recognised prefixes of one line. Never raises."""
    h = LineHeader(message=line)
    text = line
    if text[:1] in (" ", "\t"):
        stripped = text.lstrip(" \t")
        if stripped[:1] in ("[", "{", "<") or stripped[:1].isdigit():  # Megatron's " [2026-…] iteration …"
            text = stripped
    for _ in range(6):  # layers: CRI → JSON → syslog → uptime → rank → stamp; bounded
        try:
            peeled = _peel(text, h, ctx)
        except (ValueError, OverflowError, OSError):
            break  # an impossible stamp (offset ≥ 24 h, year 10000, 1e30 s): keep the line, unparsed
        if peeled is None:
            break
        text = peeled
    h.message = text
    if h.rank is None and h.task is not None:
        h.rank = h.task
    return h


def _peel(text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    """Remove one recognised layer from `text`, recording what it said in `h`; None if none fits."""
    if not text:
        return None
    c = text[0]
    if c.isalnum():
        m = _NCCL.match(text)
        if m:
            h.host = h.host or m.group(1)
            h.device = int(m.group(4))
            return text[m.end() :]
        if ctx.hosts and c.isalpha():
            m = _PDSH.match(text)
            if m and (m.group(1).lower() in ctx.hosts or m.group(1).split(".", 1)[0].lower() in ctx.hosts):
                h.host = h.host or m.group(1)
                return text[m.end() :]
    if c.isdigit():
        m = _SRUN_LABEL.match(text)  # srun --label: "<task>: message"
        if m:
            h.task = int(m.group(1))
            return text[m.end() :]
        m = _CRI.match(text)
        if m:
            h.time = h.time or _parse_iso(m.group(1), ctx)
            return text[m.end() :]
        m = _SHORT_ISO.match(text)
        if m and h.time is None:
            h.time = _parse_iso(m.group(1), ctx)
            h.host = h.host or m.group(2)
            h.tag = m.group(3)
            return text[m.end() :]
        m = _ISO.match(text)
        if m and h.time is None:
            h.time = _iso_from_match(m, ctx)
            return text[m.end() :].lstrip(" -|:")
        m = _US_DATE.match(text)
        if m and h.time is None:
            a, b, y, hh, mi, ss, frac = m.groups()
            month, day = (int(a), int(b)) if int(a) <= 12 else (int(b), int(a))
            h.time = ctx.localize(datetime(int(y), month, day, int(hh), int(mi), int(ss), _micros(frac)))
            return text[m.end() :].lstrip(" -|:")
        return None
    if c == "{":
        return _peel_json(text, h, ctx)
    if c == "<":
        m = _RFC5424.match(text)
        if m:
            h.time = h.time or _parse_iso(m.group(1), ctx)
            h.host = h.host or (m.group(2) if m.group(2) != "-" else None)
            h.tag = m.group(3)
            return text[m.end() :]
    if c == "<" or c.isupper():
        m = _RFC3164.match(text)
        if m and m.group(1) in _MONTHS:
            if h.time is None:
                h.time = ctx.complete(
                    _MONTHS[m.group(1)],
                    int(m.group(2)),
                    int(m.group(3)),
                    int(m.group(4)),
                    int(m.group(5)),
                    _micros(m.group(6)),
                )
            h.host = h.host or m.group(7)
            h.tag = m.group(8)
            return text[m.end() :]
        m = _GLOG.match(text)
        if m:
            return _glog(m, text, h, ctx)
        return None
    if c == "[":
        m = _APP_TAG.match(text)
        if m:
            return text[m.end() :]
        m = _RANK.match(text)
        if m:
            h.rank = int(m.group(1))  # PyTorch's own prefix wins over an srun task label
            return text[m.end() :]
        m = _OMPI_TAG.match(text)
        if m:
            h.rank = h.rank if h.rank is not None else int(m.group(1))
            return text[m.end() :]
        m = _HOST_RANK.match(text)
        if m:
            h.host = h.host or m.group(1)
            h.rank = h.rank if h.rank is not None else int(m.group(2))
            return text[m.end() :]
        m = _HOST_PID.match(text)
        if m:
            h.host = h.host or m.group(1)
            return text[m.end() :]
        m = _DEFAULT_RANK.match(text)  # torchrun --tee: a *local* rank; the extractor maps it with the node
        if m and not text.startswith(("[rank", "[Rank")):
            h.local_rank = int(m.group(1))
            return text[m.end() :]
        m = _UPTIME.match(text)
        if m:
            h.uptime = float(m.group(1))
            if h.tag is None:
                h.tag = "kernel"
            return text[m.end() :]
        m = _DMESG_T.match(text)
        if m and m.group(1) in _MONTHS:
            try:
                local = datetime(
                    int(m.group(6)),
                    _MONTHS[m.group(1)],
                    int(m.group(2)),
                    int(m.group(3)),
                    int(m.group(4)),
                    int(m.group(5)),
                )
                h.time = h.time or ctx.localize(local)
            except ValueError:
                return None
            if h.tag is None:
                h.tag = "kernel"
            return text[m.end() :]
        m = _GLOG.match(text)
        if m:
            return _glog(m, text, h, ctx)
        m = _ISO.match(text)
        if m and h.time is None:
            h.time = _iso_from_match(m, ctx)
            return text[m.end() :].lstrip(" -|:")
    return None


def _glog(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str:
    md = m.group(2)
    month, day = int(md[:-2]), int(md[-2:])
    if h.time is None and 1 <= month <= 12 and 1 <= day <= 31:  # an outer stamp (CRI) wins
        h.time = ctx.complete(
            month, day, int(m.group(3)), int(m.group(4)), int(m.group(5)), _micros(m.group(6))
        )
    end = text.find("]", m.end())
    return text[end + 1 :].lstrip() if end != -1 and text.startswith("[") else text[m.end() :].lstrip()


def _peel_json(text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    message: str | None = None
    for key in _JSON_MESSAGE_KEYS:
        v = doc.get(key)
        if isinstance(v, str):
            message = v.rstrip("\n")
            break
        if isinstance(v, list) and all(isinstance(b, int) for b in v):  # journald binary MESSAGE
            message = bytes(b & 0xFF for b in v).decode("utf-8", "replace").rstrip("\n")
            break
    if message is None:
        return None
    rt = doc.get("__REALTIME_TIMESTAMP")
    if isinstance(rt, str | int) and str(rt).isdigit() and h.time is None:
        h.time = datetime.fromtimestamp(int(rt) / 1e6, tz=timezone.utc)
    if h.time is None:
        for key in _JSON_TIME_KEYS:
            v = doc.get(key)
            if isinstance(v, str):
                h.time = _parse_iso(v, ctx)
            elif isinstance(v, int | float) and not isinstance(v, bool):
                secs = v / 1e9 if v > 1e17 else v / 1e3 if v > 1e11 else v
                h.time = datetime.fromtimestamp(secs, tz=timezone.utc)
            if h.time is not None:
                break
    for key in _JSON_HOST_KEYS:
        v = doc.get(key)
        if isinstance(v, str) and v:
            h.host = h.host or v
            break
    ident = doc.get("SYSLOG_IDENTIFIER") or doc.get("_TRANSPORT")
    if isinstance(ident, str):
        h.tag = "kernel" if ident == "kernel" else ident
    rank = doc.get("rank")
    if isinstance(rank, int) and h.rank is None:
        h.rank = rank
    return message


def time_context(ctx: AttemptContext) -> TimeContext:
    try:
        tz = zone(ctx.timezone)
    except ValueError as exc:
        raise BundleError(f"attempt.yaml: timezone: {exc}") from None
    return TimeContext(tz=tz, start=ctx.window.start, end=ctx.window.end)
