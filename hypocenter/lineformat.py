"""Recognise the prefix of one log line by its content and turn it into a wall-clock time.

Layers (CRI, JSON, syslog, journalctl, dmesg, rank prefixes, glog, Python logging …) are peeled in
the order of the table LAYERS. Called for candidate lines only, one at a time: it must stay cheap
and never raise on odd input.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
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
# util-linux dmesg (sys-utils/dmesg.c, print_record): -T "[%a %b %e %H:%M:%S %Y] ", with -d a delta
# after it "[… <%12.06f>] "; raw "[%5ld.%06ld] ", with -d "[%5ld.%06ld <%12.06f>] "; --time-format
# delta "[<%12.06f>] "; -H / -e (reltime) "[%b%e %H:%M] " on the first line of each minute, then the
# delta since the line before, "[  %+8.06f] " (or "[ %+9.06f] " from 10 s).
_DMESG_T = re.compile(
    r"^\[(?:[A-Z][a-z]{2}) ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})(?: <\s*-?\d+\.\d+>)?\] ?"
)
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)(?: <\s*-?\d+\.\d+>)?\] ?")
_DMESG_MINUTE = re.compile(r"^\[([A-Z][a-z]{2}) ?(\d{1,2}) (\d{2}):(\d{2})\] ?")
_DMESG_DELTA = re.compile(r"^\[(?:\s*[+-]\d+\.\d{6}|<\s*-?\d+\.\d{6}>)\] ?")
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

_JSON_START = re.compile(r"\{")
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


# ------------------------------------------------------------------------------------ the cascade
# One peel removes the first layer that fits. Which layers are tried, and in which order, is the
# format specification: LAYERS below, read top to bottom. A layer is tried only on a line whose first
# character it `starts` with; its `read` records what the prefix says and returns the rest of the line,
# or None to let the next layer try (a stamp where an outer layer already gave the time, a month name
# that is no month). The first layer whose pattern matches and whose read returns text wins.

Read = Callable[[re.Match[str], str, LineHeader, TimeContext], str | None]


@dataclass(frozen=True, slots=True)
class Layer:
    """One prefix the cascade can peel, with a line it is the first to peel (`example`)."""

    name: str
    starts: Callable[[str], bool]  # the line's first character
    pattern: re.Pattern[str]
    read: Read
    example: str
    needs_hosts: bool = False  # tried only when the attempt's node names are known


def _nccl(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.host = h.host or m.group(1)
    h.device = int(m.group(4))
    return text[m.end() :]


def _pdsh(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    name = m.group(1)
    if name.lower() not in ctx.hosts and name.split(".", 1)[0].lower() not in ctx.hosts:
        return None
    h.host = h.host or name
    return text[m.end() :]


def _srun_label(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.task = int(m.group(1))
    return text[m.end() :]


def _cri(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.time = h.time or _parse_iso(m.group(1), ctx)
    return text[m.end() :]


def _short_iso(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if h.time is not None:
        return None
    h.time = _parse_iso(m.group(1), ctx)
    h.host = h.host or m.group(2)
    h.tag = m.group(3)
    return text[m.end() :]


def _iso(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if h.time is not None:
        return None
    h.time = _iso_from_match(m, ctx)
    return text[m.end() :].lstrip(" -|:")


def _us_date(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if h.time is not None:
        return None
    a, b, y, hh, mi, ss, frac = m.groups()
    month, day = (int(a), int(b)) if int(a) <= 12 else (int(b), int(a))
    h.time = ctx.localize(datetime(int(y), month, day, int(hh), int(mi), int(ss), _micros(frac)))
    return text[m.end() :].lstrip(" -|:")


def _json(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    return _peel_json(text, h, ctx)


def _rfc5424(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.time = h.time or _parse_iso(m.group(1), ctx)
    h.host = h.host or (m.group(2) if m.group(2) != "-" else None)
    h.tag = m.group(3)
    return text[m.end() :]


def _rfc3164(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if m.group(1) not in _MONTHS:
        return None
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


def _glog(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    md = m.group(2)
    month, day = int(md[:-2]), int(md[-2:])
    if h.time is None and 1 <= month <= 12 and 1 <= day <= 31:  # an outer stamp (CRI) wins
        h.time = ctx.complete(
            month, day, int(m.group(3)), int(m.group(4)), int(m.group(5)), _micros(m.group(6))
        )
    end = text.find("]", m.end())
    return text[end + 1 :].lstrip() if end != -1 and text.startswith("[") else text[m.end() :].lstrip()


def _app_tag(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    return text[m.end() :]


def _rank(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.rank = int(m.group(1))  # PyTorch's own prefix wins over an srun task label
    return text[m.end() :]


def _ompi_tag(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.rank = h.rank if h.rank is not None else int(m.group(1))
    return text[m.end() :]


def _host_rank(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.host = h.host or m.group(1)
    h.rank = h.rank if h.rank is not None else int(m.group(2))
    return text[m.end() :]


def _host_pid(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.host = h.host or m.group(1)
    return text[m.end() :]


def _default_rank(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if text.startswith(("[rank", "[Rank")):
        return None
    h.local_rank = int(m.group(1))  # a rank within its node: the extractor maps it with the node
    return text[m.end() :]


def _uptime(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    h.uptime = float(m.group(1))
    if h.tag is None:
        h.tag = "kernel"
    return text[m.end() :]


def _dmesg_t(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if m.group(1) not in _MONTHS:
        return None
    try:
        local = datetime(
            int(m.group(6)),
            _MONTHS[m.group(1)],
            int(m.group(2)),
            int(m.group(3)),
            int(m.group(4)),
            int(m.group(5)),
        )
    except ValueError:
        return None  # no other layer matches a line that starts like `dmesg -T`
    h.time = h.time or ctx.localize(local)
    if h.tag is None:
        h.tag = "kernel"
    return text[m.end() :]


def _dmesg_minute(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    if m.group(1) not in _MONTHS:
        return None
    if h.time is None:
        h.time = ctx.complete(_MONTHS[m.group(1)], int(m.group(2)), int(m.group(3)), int(m.group(4)), 0, 0)
    if h.tag is None:
        h.tag = "kernel"
    return text[m.end() :]


def _dmesg_delta(m: re.Match[str], text: str, h: LineHeader, ctx: TimeContext) -> str | None:
    """A delta since the line before: no time of its own. The extractor places the line at the nearest
    stamp before it in its stream (a `[Nov 2 10:15]` minute line), or marks it approximate."""
    if h.tag is None:
        h.tag = "kernel"
    return text[m.end() :]


def _digit(c: str) -> bool:
    return c.isdigit()


def _syslog_start(c: str) -> bool:
    return c == "<" or c.isupper()


LAYERS: tuple[Layer, ...] = (
    # A host or a rank written first, by NCCL or a launcher.
    Layer("nccl", str.isalnum, _NCCL, _nccl, "node03:2411:2520 [4] NCCL INFO x"),
    Layer("pdsh", str.isalpha, _PDSH, _pdsh, "node01: RuntimeError: x", needs_hosts=True),
    Layer("srun --label", _digit, _SRUN_LABEL, _srun_label, "12: RuntimeError: x"),
    # Stamps that start with the date.
    Layer("cri", _digit, _CRI, _cri, "2026-11-02T10:15:03.123456789Z stderr F x"),
    Layer("short-iso", _digit, _SHORT_ISO, _short_iso, "2026-11-02T10:15:03+0000 node01 kernel: x"),
    Layer("iso", _digit, _ISO, _iso, "2026-11-02 10:15:03,123 - INFO - x"),
    Layer("us-date", _digit, _US_DATE, _us_date, "11/02/2026 10:15:03 - INFO - x"),
    Layer("json", "{".__eq__, _JSON_START, _json, '{"message": "x", "time": "2026-11-02T10:15:03Z"}'),
    # Syslog (RFC 5424, then RFC 3164) and glog stamps.
    Layer("rfc5424", "<".__eq__, _RFC5424, _rfc5424, "<3>1 2026-11-02T10:15:03Z node01 kernel - - - x"),
    Layer("rfc3164", _syslog_start, _RFC3164, _rfc3164, "Nov  2 10:15:03 node01 kernel: x"),
    Layer("glog", _syslog_start, _GLOG, _glog, "E1102 10:15:03.123456 42 file.cpp:1] x"),
    # Bracketed prefixes: an application tag before a stamp, ranks and hosts, kernel stamps, stamps.
    Layer("app tag", "[".__eq__, _APP_TAG, _app_tag, "[titan] 2026-11-02 10:15:03,123 - x"),
    Layer("rank", "[".__eq__, _RANK, _rank, "[rank3]: RuntimeError: x"),
    Layer("open mpi tag", "[".__eq__, _OMPI_TAG, _ompi_tag, "[1,6]<stderr>:ValueError: x"),
    Layer("host:rank", "[".__eq__, _HOST_RANK, _host_rank, "[gpu-a02:5]: IndexError: x"),
    Layer("host:pid", "[".__eq__, _HOST_PID, _host_pid, "[node01:4242] *** Process received signal ***"),
    Layer("torchrun --tee", "[".__eq__, _DEFAULT_RANK, _default_rank, "[default2]:KeyError: 'x'"),
    Layer("uptime", "[".__eq__, _UPTIME, _uptime, "[294950.412118] NVRM: Xid 79"),
    Layer("dmesg -T", "[".__eq__, _DMESG_T, _dmesg_t, "[Mon Nov  2 10:15:03 2026] NVRM: Xid 79"),
    Layer("dmesg -H minute", "[".__eq__, _DMESG_MINUTE, _dmesg_minute, "[Nov 2 10:15] NVRM: Xid 79"),
    Layer("dmesg -H delta", "[".__eq__, _DMESG_DELTA, _dmesg_delta, "[  +0.000844] NVRM: Xid 79"),
    Layer("glog in brackets", "[".__eq__, _GLOG, _glog, "[E1102 10:15:03.123 42 file.cpp:1] x"),
    Layer("iso in brackets", "[".__eq__, _ISO, _iso, "[2026-11-02 10:15:03,123] INFO x"),
)


@functools.lru_cache(maxsize=1024)
def _layers_for(c: str, hosts: bool) -> tuple[tuple[Callable[[str], re.Match[str] | None], Read, Layer], ...]:
    """The layers tried on a line starting with `c`, in LAYERS' order, as (match, read, layer)."""
    return tuple(
        (layer.pattern.match, layer.read, layer)
        for layer in LAYERS
        if layer.starts(c) and (hosts or not layer.needs_hosts)
    )


def peel(text: str, h: LineHeader, ctx: TimeContext) -> tuple[Layer, str] | None:
    """Remove one recognised layer from `text`, recording what it said in `h`: the layer and the rest,
    or None if none fits."""
    if not text:
        return None
    for match, read, layer in _layers_for(text[0], bool(ctx.hosts)):
        m = match(text)
        if m:
            rest = read(m, text, h, ctx)
            if rest is not None:
                return layer, rest
    return None


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
            peeled = peel(text, h, ctx)
        except (ValueError, OverflowError, OSError):
            break  # an impossible stamp (offset ≥ 24 h, year 10000, 1e30 s): keep the line, unparsed
        if peeled is None:
            break
        text = peeled[1]
    h.message = text
    if h.rank is None and h.task is not None:
        h.rank = h.task
    return h


def time_context(ctx: AttemptContext) -> TimeContext:
    try:
        tz = zone(ctx.timezone)
    except ValueError as exc:
        raise BundleError(f"attempt.yaml: timezone: {exc}") from None
    return TimeContext(tz=tz, start=ctx.window.start, end=ctx.window.end)
