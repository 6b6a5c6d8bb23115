"""Log streams of one bundle and how they turn into bytes on disk.

Scenario code appends `Entry`s (true time, text) to `Stream`s; rendering applies the writing
node's clock skew and timezone and the stream's format: syslog RFC 3164 with or without the
kernel `[uptime]` stamp, RFC 5424, rsyslog ISO, `dmesg -T`, raw `dmesg`, `dmesg --time-format
iso`, journalctl short-iso / short-precise / json, and for application output plain text,
CRI-prefixed or `kubectl logs --timestamps`. Entries are written in true-time order, so skewed
timestamps of a merged stream come out slightly non-monotonic, as they do on real clusters.
Entries flagged `key` (the root-cause evidence) are never cut by truncation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Literal
from zoneinfo import ZoneInfo

from bench.world import KernelFormat, Node, PodLogStyle

LineFn = Callable[[datetime], str]
Text = str | LineFn

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_PRIORITY = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}


@dataclass
class Entry:
    t: float
    seq: int
    text: Text
    ident: str = "kernel"
    pid: int | None = None
    level: str = "info"
    key: bool = False


@dataclass
class Stream:
    """One file of line-oriented output written by one node (or, for job logs, by many)."""

    path: str
    kind: Literal["system", "app"]
    node: Node | None = None
    fmt: KernelFormat | None = None
    pod_style: PodLogStyle = "plain"
    entries: list[Entry] = field(default_factory=list)
    truncate_at: float | None = None  # fraction of the bytes after the last key entry to keep
    kernel_only: bool = False
    anchor_boot: bool = False  # raw dmesg: keep the boot lines that give wall-clock time

    def has_key(self) -> bool:
        return any(e.key for e in self.entries)


class Clock:
    """Node-local wall clock: true time plus the node's skew, in the cluster's timezone."""

    def __init__(self, tz: str) -> None:
        self.zone: tzinfo = UTC if tz == "UTC" else ZoneInfo(tz)

    def local(self, t: float, node: Node | None) -> datetime:
        skew = node.skew if node is not None else 0.0
        return datetime.fromtimestamp(t + skew, self.zone)

    def utc(self, t: float, node: Node | None) -> datetime:
        skew = node.skew if node is not None else 0.0
        return datetime.fromtimestamp(t + skew, UTC)


# --------------------------------------------------------------------------------------------
# Timestamp renderers (shared with the line builders)


def ts_syslog(d: datetime) -> str:
    return f"{_MONTHS[d.month - 1]} {d.day:>2} {d:%H:%M:%S}"


def ts_journal_precise(d: datetime) -> str:
    return f"{_MONTHS[d.month - 1]} {d.day:02d} {d:%H:%M:%S}.{d.microsecond:06d}"


def ts_ctime(d: datetime) -> str:
    return f"{_DAYS[d.weekday()]} {_MONTHS[d.month - 1]} {d.day:>2} {d:%H:%M:%S} {d.year}"


def ts_iso(d: datetime, frac: int = 6, colon: bool = True) -> str:
    off = d.strftime("%z") or "+0000"
    if colon:
        off = f"{off[:3]}:{off[3:]}"
    base = d.strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        base += "." + f"{d.microsecond:06d}"[:frac]
    return base + off


def ts_rfc3339_utc(d: datetime, digits: int = 9) -> str:
    u = d.astimezone(UTC)
    frac = f"{u.microsecond:06d}" + "000"
    return u.strftime("%Y-%m-%dT%H:%M:%S") + "." + frac[:digits] + "Z"


def _uptime(t: float, node: Node) -> str:
    up = max(t - node.boot_time, 0.0)
    sec = int(up)
    usec = round((up - sec) * 1_000_000) % 1_000_000
    return f"[{sec:5d}.{usec:06d}]"


def render_system_line(e: Entry, node: Node, fmt: KernelFormat, clock: Clock, text: str) -> str | None:
    """One line of a node's system log in format `fmt`; None if that format drops the entry."""
    kernel = e.ident == "kernel"
    dmesg = fmt.startswith("dmesg")
    if dmesg and not kernel:
        return None
    d = clock.local(e.t, node)
    host = node.name
    tag = "kernel" if kernel else (f"{e.ident}[{e.pid}]" if e.pid is not None else e.ident)
    if fmt in ("kernlog", "kernlog_uptime", "syslog", "syslog_uptime"):
        uptime = f"{_uptime(e.t, node)} " if kernel and fmt.endswith("_uptime") else ""
        return f"{ts_syslog(d)} {host} {tag}: {uptime}{text}"
    if fmt == "rsyslog_iso":
        return f"{ts_iso(d)} {host} {tag}: {text}"
    if fmt == "rfc5424":
        facility = 0 if kernel else 3
        pri = facility * 8 + _PRIORITY.get(e.level, 6)
        procid = "-" if e.pid is None else str(e.pid)
        return f"<{pri}>1 {ts_iso(d)} {host} {e.ident} {procid} - - {text}"
    if fmt == "dmesg_T":
        return f"[{ts_ctime(d)}] {text}"
    if fmt == "dmesg_raw":
        return f"{_uptime(e.t, node)} {text}"
    if fmt == "dmesg_iso":
        iso = ts_iso(d).replace(".", ",", 1)
        return f"{iso} {text}"
    if fmt == "journal_iso":
        return f"{ts_iso(d, frac=0, colon=d.year >= 2025)} {host} {tag}: {text}"
    if fmt == "journal_precise":
        return f"{ts_journal_precise(d)} {host} {tag}: {text}"
    if fmt == "journal_json":
        up = max(e.t - node.boot_time, 0.0)
        rec: dict[str, str] = {
            "__CURSOR": f"s={node.name[-4:]}e{e.seq:x};i={e.seq + 4096:x}",
            "__REALTIME_TIMESTAMP": str(round((e.t + node.skew) * 1_000_000)),
            "__MONOTONIC_TIMESTAMP": str(int(up * 1_000_000)),
            "_BOOT_ID": hashlib.md5(f"{node.name}|{node.boot_time}".encode()).hexdigest(),
            "_HOSTNAME": host,
            "PRIORITY": str(_PRIORITY.get(e.level, 6)),
            "SYSLOG_IDENTIFIER": e.ident,
            "_TRANSPORT": "kernel" if kernel else "syslog",
            "MESSAGE": text,
        }
        if kernel:
            rec["SYSLOG_FACILITY"] = "0"
        elif e.pid is not None:
            rec["_PID"] = str(e.pid)
            rec["SYSLOG_FACILITY"] = "3"
        return json.dumps(rec, sort_keys=True, separators=(",", ":"))
    raise ValueError(fmt)


def _pod_prefix(style: PodLogStyle, d: datetime, stream: str) -> str:
    if style == "cri":
        return f"{ts_rfc3339_utc(d)} {stream} F "
    if style == "timestamps":
        return f"{ts_rfc3339_utc(d)} "
    return ""


# Boot lines kept at the head of raw dmesg captures: the rtc line is the only wall-clock anchor.
_DMI = {
    "a100": "NVIDIA DGXA100 920-23687-2530-000/DGXA100, BIOS 1.25 02/10/2023",
    "h100": "NVIDIA DGXH100/DGXH100, BIOS 1.5.1 03/08/2024",
    "h200": "Supermicro SYS-821GE-TNHR/X13DEG-OAD, BIOS 2.1 11/29/2024",
    "b200": "NVIDIA DGXB200/DGXB200, BIOS 1.2.0 01/17/2025",
    "gb200": "NVIDIA GB200 NVL/P3809-BMC, BIOS 02.03.04 04/22/2025",
}


def boot_lines(node: Node, clock: Clock, kernel: str, platform: str = "h100") -> list[str]:
    d = clock.utc(node.boot_time + 1.0, node)
    epoch = int(node.boot_time + 1.0 + node.skew)
    return [
        f"[    0.000000] Linux version {kernel} (buildd@lcy02-amd64-051) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0) #126-Ubuntu SMP",
        "[    0.000000] Command line: BOOT_IMAGE=/vmlinuz root=UUID=3b1f0c2e ro iommu=pt pci=realloc=off",
        f"[    0.004215] DMI: {_DMI.get(platform, _DMI['h100'])}",
        f"[    1.{int(node.boot_time) % 900000 + 100000:06d}] rtc_cmos 00:00: setting system clock to {d:%Y-%m-%dT%H:%M:%S} UTC ({epoch})",
        "[    2.331018] pci 0000:00:01.0: [8086:0db0] type 01 class 0x060400",
    ]


@dataclass
class Bundle:
    """An attempt bundle held in memory until `files()` renders it."""

    clock: Clock
    kernel_version: str
    platform: str = "h100"
    streams: dict[str, Stream] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)
    binary: dict[str, bytes] = field(
        default_factory=dict
    )  # files that are not text (Flight Recorder pickles)
    _seq: int = 0

    def stream(
        self,
        path: str,
        kind: Literal["system", "app"],
        node: Node | None = None,
        fmt: KernelFormat | None = None,
        pod_style: PodLogStyle = "plain",
    ) -> Stream:
        s = self.streams.get(path)
        if s is None:
            s = Stream(path=path, kind=kind, node=node, fmt=fmt, pod_style=pod_style)
            self.streams[path] = s
        return s

    def add(self, stream: Stream, t: float, text: Text, **kw: object) -> Entry:
        self._seq += 1
        e = Entry(t=t, seq=self._seq, text=text, **kw)  # type: ignore[arg-type]
        stream.entries.append(e)
        return e

    def put(self, path: str, content: str) -> None:
        self.static[path] = content

    def put_bytes(self, path: str, content: bytes) -> None:
        self.binary[path] = content

    def drop(self, path: str) -> None:
        self.streams.pop(path, None)
        self.static.pop(path, None)

    # ----------------------------------------------------------------------------------------
    def render(self, stream: Stream) -> str:
        lines: list[str] = []
        key_end = 0
        entries = sorted(stream.entries, key=lambda e: (e.t, e.seq))
        if stream.kind == "system" and stream.fmt == "dmesg_raw" and stream.anchor_boot and stream.node:
            lines.extend(boot_lines(stream.node, self.clock, self.kernel_version, self.platform))
        for e in entries:
            d = self.clock.local(e.t, stream.node)
            text = e.text(d) if callable(e.text) else e.text
            for part in text.split("\n"):
                if stream.kind == "system":
                    assert stream.node is not None and stream.fmt is not None
                    if stream.kernel_only and e.ident != "kernel":
                        continue
                    line = render_system_line(e, stream.node, stream.fmt, self.clock, part)
                    if line is None:
                        continue
                else:
                    line = (
                        _pod_prefix(
                            stream.pod_style, d, "stderr" if e.level in ("err", "warning") else "stdout"
                        )
                        + part
                    )
                lines.append(line)
            if e.key:
                key_end = len(lines)
        body = "\n".join(lines) + ("\n" if lines else "")
        if stream.truncate_at is not None and lines:
            head = "\n".join(lines[:key_end]) + ("\n" if key_end else "")
            tail = body[len(head) :]
            keep = int(len(tail) * stream.truncate_at)
            body = head + tail[:keep]
        return body

    def files(self) -> dict[str, str | bytes]:
        out: dict[str, str | bytes] = {**self.static, **self.binary}
        for path, s in self.streams.items():
            if s.entries or s.anchor_boot:
                out[path] = self.render(s)
        return out
