"""Read PyTorch Flight Recorder dumps and render them as canonical lines the extraction rules match.

On a collective timeout (`TORCH_NCCL_DUMP_ON_TIMEOUT`) every rank writes its Flight Recorder ring
buffer to `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` + rank (default `/tmp/nccl_trace_rank_<N>`); the
dump can also be taken on demand (`torch._C._distributed_c10d._dump_fr_trace()` /
`_dump_fr_trace_json()`). A dump is a pickled dict (protocol 2, written by torch's C++ pickler) or
its JSON twin:

    version            "1.0" … "2.10" (torch 2.13 writes "2.10"); see docs/hangs.md
    pg_config          {pg name: {name, desc, ranks: "[0, 1, …]"}}   (2.x; 1.4: {pg id: [ranks]})
    pg_status          {pg id: {last_enqueued_collective, last_started_collective,
                                last_completed_collective}}          (from 2.3; JSON: strings)
    comm_lib_version   the NCCL version ("" for gloo; 2.7-2.9: nccl_version)
    entries            [{record_id, pg_id, process_group: (name, desc), collective_seq_id,
                         p2p_seq_id, op_id, profiling_name, input_sizes, output_sizes,
                         (1.x: seq_id, no process_group)
                         input_dtypes, output_dtypes, state: scheduled|started|completed,
                         time_created_ns, time_discovered_started_ns, …, timeout_ms,
                         is_p2p, frames: [{name, filename, line}]}]          (JSON: no frames)
    nccl_comm_state    per-communicator NCCL state (ignored)

The dump names no rank: like torch's own `fr_trace`, the rank is the number that ends the file
name (`nccl_trace_rank_3`, `nccl_trace_rank_3.json`).

A dump is untrusted input. It is never given to `pickle.load`: `plain_pickle.load` builds only the
plain values a dump holds (dict, list, tuple, str, bytes, int, float, bool, None), refuses every
global, call and persistent id, so a crafted pickle cannot import or call anything, and bounds what
it builds (`PICKLE_BOUNDS`, derived from `MAX_DUMP_BYTES`) so a few bytes cannot expand to
gigabytes. Dumps over `MAX_DUMP_BYTES` are refused unread. Whatever a dump holds, reading it either
renders it or raises `DumpError`: a bad dump is a failed source, never a failed analysis.

`render` turns one dump into a few lines (`FlightRecorder dump|pg|entry …`, each stamped with the
entry's creation time): per process group its last enqueued / started / completed collective, the
entries not yet completed and the last completed one. Only these lines reach the engine, so the
analysis is the same whether the dump came from a bundle, an upload or a pull.
`python -m hypocenter.collector.flight_recorder FILE` prints them.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import stat
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypocenter.collector import plain_pickle
from hypocenter.errors import InputError
from hypocenter.model import Coverage
from hypocenter.sources import TextSource

MAX_DUMP_BYTES = 64 << 20
MAX_ENTRIES = 50_000  # newest entries read per dump (torch's default ring buffer holds 2,000)
MAX_GROUPS = 4_096  # process groups read per dump
MAX_RANKS = 1 << 20  # members read per process group
MAX_PENDING_SHOWN = 6  # not-yet-completed entries rendered per process group
MAX_FRAMES_SHOWN = 3  # user frames kept per entry
DUMP_TOKEN = "FlightRecorder"
# What one pickled dump may build (plain_pickle.py): values pushed, opcodes run, and its size with
# every shared reference counted in full (what printing or walking it would cost). A real dump of
# torch's default 2,000 entries builds 10^5 values (4 x 10^5 with 20 frames each); each value costs
# 50 to 150 bytes of memory, so the objects bound keeps a dump's memory near 300 MiB at most.
PICKLE_BOUNDS = plain_pickle.Bounds(
    objects=MAX_DUMP_BYTES // 32, opcodes=MAX_DUMP_BYTES // 8, expanded=4 * MAX_DUMP_BYTES, depth=64
)

_PICKLE_HEAD = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_JSON_FIRST = frozenset(b"{ \t\n\r\x0b\x0c")  # a JSON dump's first byte: its brace, or a blank before it
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$", re.IGNORECASE)
_DEFAULT_NAME = re.compile(
    r"(?:^|[/_.-])(?:nccl_trace_rank|fr_trace|flight_recorder|fr_dump)[_-]?\d*", re.IGNORECASE
)
# Frames of torch itself and of the process launcher say nothing about where the program was.
_PLUMBING = ("/torch/", "\\torch\\", "/multiprocessing/", "<string>", "/runpy.py", "/threading.py")


class DumpError(InputError, ValueError):
    """Not a readable Flight Recorder dump; the message says why."""


def is_dump_bytes(head: bytes) -> bool:
    """Whether the first bytes of a file look like a Flight Recorder dump (pickle or JSON)."""
    if head.startswith(_PICKLE_HEAD):
        return b"version" in head[:256] or b"entries" in head[:4096] or b"pg_config" in head[:4096]
    # torch's JSON writer sorts keys: "comm_lib_version", "entries" (long), then "pg_config", "version"
    return head.lstrip().startswith(b"{") and any(
        k in head for k in (b'"pg_config"', b'"profiling_name"', b'"collective_seq_id"')
    )


def is_dump_name(name: str) -> bool:
    """Torch's default dump file names (`nccl_trace_rank_<N>`, …)."""
    return bool(_DEFAULT_NAME.search(name.rsplit("/", 1)[-1]))


def load(raw: bytes) -> dict[str, Any]:
    """The dump's top-level dict, from pickle or JSON bytes. DumpError says what is wrong."""
    if len(raw) > MAX_DUMP_BYTES:
        raise DumpError(f"dump of {len(raw)} bytes is over the {MAX_DUMP_BYTES >> 20} MiB limit")
    if raw.startswith(_PICKLE_HEAD):
        try:
            doc = plain_pickle.load(raw, PICKLE_BOUNDS)
        except plain_pickle.PickleRefused as exc:
            raise DumpError(f"not a plain Flight Recorder pickle: {exc}") from None
    else:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise DumpError("neither a pickle nor UTF-8 JSON") from None
        except RecursionError:
            raise DumpError("JSON nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise DumpError(f"invalid JSON at line {exc.lineno}: {exc.msg} (truncated?)") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise DumpError("not a Flight Recorder dump (no 'version' key in a top-level dict)")
    return doc


def rank_from_name(name: str) -> int | None:
    """The rank a dump's file name ends with (torch's own rule)."""
    m = _RANK_IN_NAME.search(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Entry:
    record: int
    pg: str
    desc: str
    seq: int
    p2p: bool
    op: str
    state: str
    in_sizes: str
    out_sizes: str
    dtypes: str
    timeout_ms: int | None
    created_ns: int | None
    frames: str


@dataclass
class Group:
    name: str
    desc: str = ""
    ranks: list[int] = field(default_factory=list)
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


@dataclass
class Dump:
    rank: int
    version: str
    comm_lib: str
    groups: dict[str, Group]
    entries: list[Entry]

    @property
    def time_ns(self) -> int | None:
        return max((e.created_ns for e in self.entries if e.created_ns), default=None)


_INT64 = 1 << 63


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -_INT64 <= v < _INT64 else None
    if isinstance(v, str) and re.fullmatch(r"-?\d{1,20}", v.strip()):
        return _int(int(v))
    return None


def _text(v: object, limit: int = 120) -> str:
    """A scalar as one short token; a container (or a number too big to print) as ''."""
    if isinstance(v, bytes):
        s = v[: limit * 4].decode("utf-8", "replace")
    elif isinstance(v, str):
        s = v[: limit * 4]
    elif isinstance(v, int) and not -_INT64 <= v < _INT64:
        return ""
    elif isinstance(v, (int, float)):  # bool is an int
        s = str(v)
    else:
        return ""
    return re.sub(r"[\s\"]+", "_", s)[:limit]


def _ranks(v: object) -> list[int]:
    if isinstance(v, str):
        return list(_rank_text(v))
    if isinstance(v, (list, tuple, set)):
        return sorted({r for r in (_int(x) for x in list(v)[:MAX_RANKS]) if r is not None})
    return []


@functools.lru_cache(maxsize=16)
def _rank_text(v: str) -> tuple[int, ...]:
    """`"[0, 1, 2]"` read once per distinct string: a pickle may name one long string in every group."""
    try:
        parsed = ast.literal_eval(v) if len(v) < 1_000_000 else []
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return ()
    return tuple(_ranks(parsed)) if isinstance(parsed, (list, tuple, set)) else ()


def _sizes(v: object) -> str:
    if not isinstance(v, (list, tuple)):
        return "-"
    parts = []
    for arg in list(v)[:8]:
        dims = [
            d for d in (_int(x) for x in (arg if isinstance(arg, (list, tuple)) else [])[:8]) if d is not None
        ]
        parts.append("[" + ",".join(map(str, dims)) + "]")
    return "[" + ",".join(parts) + "]"


def _frames(v: object) -> str:
    if not isinstance(v, (list, tuple)):
        return "-"
    out: list[str] = []
    for f in list(v)[:64]:
        if not isinstance(f, dict):
            continue
        filename = _text(f.get("filename"), 300)
        if any(p in filename for p in _PLUMBING):
            continue
        short = "/".join(filename.split("/")[-2:])
        out.append(f"{short}:{_int(f.get('line')) or 0}:{_text(f.get('name'), 60)}")
        if len(out) >= MAX_FRAMES_SHOWN:
            break
    return "<".join(out) or "-"


def parse(doc: dict[str, Any], rank: int) -> Dump:
    """The parts of a loaded dump the analysis uses, checked and normalised."""
    version = _text(doc.get("version"), 16) or "?"
    groups: dict[str, Group] = {}
    config = doc.get("pg_config")
    if isinstance(config, dict):
        # A pickle can repeat one memoised object millions of times in a few bytes each: every
        # collection is read up to a bound.
        for key, info in list(config.items())[:MAX_GROUPS]:
            if isinstance(info, dict):
                name = _text(info.get("name", key)) or _text(key)
                groups[name] = Group(name=name, desc=_text(info.get("desc")), ranks=_ranks(info.get("ranks")))
            else:  # 1.x: {pg id: [ranks]}
                groups[_text(key)] = Group(name=_text(key), ranks=_ranks(info))
    raw_entries = doc.get("entries")
    entries: list[Entry] = []
    id_to_name: dict[str, str] = {}
    for e in raw_entries[-MAX_ENTRIES:] if isinstance(raw_entries, (list, tuple)) else []:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        name, desc = (
            (_text(pg[0]), _text(pg[1]))
            if isinstance(pg, (list, tuple)) and len(pg) >= 2
            else (_text(pg), "")
        )
        pg_id = _int(e.get("pg_id"))
        if not name:
            name = str(pg_id) if pg_id is not None else "0"
        if pg_id is not None:
            id_to_name.setdefault(str(pg_id), name)
        seq = _int(e.get("collective_seq_id", e.get("seq_id")))  # 1.x: seq_id
        if seq is None:
            continue
        dtypes = e.get("input_dtypes")
        entries.append(
            Entry(
                record=_int(e.get("record_id")) or 0,
                pg=name,
                desc=desc,
                seq=seq,
                p2p=bool(e.get("is_p2p")),
                op=_text(e.get("profiling_name"), 80) or "?",
                state=_text(e.get("state"), 16) or "?",
                in_sizes=_sizes(e.get("input_sizes")),
                out_sizes=_sizes(e.get("output_sizes")),
                dtypes=",".join(_text(d, 16) for d in dtypes[:4])
                if isinstance(dtypes, (list, tuple))
                else "-",
                timeout_ms=_int(e.get("timeout_ms")),
                created_ns=_int(e.get("time_created_ns")),
                frames=_frames(e.get("frames")),
            )
        )
    entries.sort(key=lambda x: (x.pg, x.record, x.seq))
    by_pg: dict[str, list[Entry]] = {}
    for e in entries:
        by_pg.setdefault(e.pg, []).append(e)
    for e in entries:
        g = groups.get(e.pg)
        if g is None and len(groups) >= MAX_GROUPS:
            continue
        if g is None:
            # gloo's default group is configured under "" and recorded under "0"
            alias = groups.pop("", None) if len(groups) == 1 and "" in groups else None
            g = groups[e.pg] = Group(name=e.pg, desc=e.desc, ranks=alias.ranks if alias else [])
        if not g.desc:
            g.desc = e.desc
    status = doc.get("pg_status")
    if isinstance(status, dict):
        for pg_id, st in list(status.items())[:MAX_GROUPS]:
            if not isinstance(st, dict):
                continue
            found = id_to_name.get(_text(pg_id)) or (_text(pg_id) if _text(pg_id) in groups else None)
            if found is None:
                continue
            g = groups.setdefault(found, Group(name=found))
            g.last_enqueued = _int(st.get("last_enqueued_collective"))
            g.last_started = _int(st.get("last_started_collective"))
            g.last_completed = _int(st.get("last_completed_collective"))
    for g in groups.values():  # before pg_status (< 2.3), or a group pg_status does not list
        mine = [e for e in by_pg.get(g.name, ()) if not e.p2p]
        if g.last_enqueued is None and mine:
            g.last_enqueued = max(e.seq for e in mine)
        if g.last_completed is None and mine:
            done = [e.seq for e in mine if e.state == "completed"]
            g.last_completed = max(done) if done else min(e.seq for e in mine) - 1
        if g.last_started is None and mine:
            run = [e.seq for e in mine if e.state in ("started", "completed")]
            g.last_started = max(run) if run else -1
    lib = doc.get("comm_lib_version", doc.get("nccl_version"))
    return Dump(rank=rank, version=version, comm_lib=_text(lib, 40) or "-", groups=groups, entries=entries)


# ------------------------------------------------------------------------------------------- render


def _stamp(ns: int | None) -> str:
    if not ns or ns <= 0 or ns > 4_102_444_800 * 10**9:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ ")


def _rank_spec(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def render(dump: Dump) -> str:
    """The dump as canonical lines: one for the dump, one per process group, one per entry shown."""
    when = _stamp(dump.time_ns)
    lines = [
        f"{when}{DUMP_TOKEN} dump rank={dump.rank} version={dump.version} entries={len(dump.entries)} "
        f"groups={len(dump.groups)} comm_lib={dump.comm_lib}"
    ]
    by_pg: dict[str, list[Entry]] = {}
    for e in dump.entries:
        by_pg.setdefault(e.pg, []).append(e)
    for name in sorted(dump.groups):
        g = dump.groups[name]
        lines.append(
            f"{when}{DUMP_TOKEN} pg rank={dump.rank} pg={g.name or '-'} desc={g.desc or '-'} "
            f"ranks={_rank_spec(g.ranks)} last_enqueued={_n(g.last_enqueued)} "
            f"last_started={_n(g.last_started)} last_completed={_n(g.last_completed)}"
        )
        mine = [e for e in by_pg.get(name, ()) if not e.p2p]
        done = g.last_completed if g.last_completed is not None else -1
        shown = [e for e in mine if e.seq > done][:MAX_PENDING_SHOWN]
        last_done = [e for e in mine if e.seq <= done][-1:]
        for e in sorted([*last_done, *shown], key=lambda x: (x.seq, x.record)):
            pending = "yes" if e.seq > done else "no"
            lines.append(
                f"{_stamp(e.created_ns) or when}{DUMP_TOKEN} entry rank={dump.rank} pg={e.pg or '-'} "
                f"desc={e.desc or '-'} seq={e.seq} op={e.op} state={e.state} pending={pending} "
                f"in={e.in_sizes} out={e.out_sizes} dtype={e.dtypes or '-'} "
                f"timeout_ms={_n(e.timeout_ms)} record={e.record} frames={e.frames}"
            )
    return "\n".join(lines) + "\n"


def render_file(raw: bytes, name: str) -> str:
    """Load, parse and render one dump file's bytes; DumpError when it cannot be used."""
    rank = rank_from_name(name)
    if rank is None:
        raise DumpError(
            "the file name does not end with the rank (torch names dumps <prefix><rank>, "
            "e.g. nccl_trace_rank_3)"
        )
    doc = load(raw)
    try:
        return render(parse(doc, rank))
    except RecursionError:
        raise DumpError("values nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        # parse reads any plain values; a shape it did not foresee is this dump's failure alone
        raise DumpError(f"not understood ({type(exc).__name__}: {str(exc)[:200]})") from None


def read_source(path: Path, rel: str, node: str | None) -> tuple[TextSource | None, Coverage] | None:
    """A file of a bundle that is a Flight Recorder dump, rendered as a text source, with its coverage
    entry; None when the file is not a dump (it is then read as a log). Never raises.
    Only a regular file is looked into: opening a FIFO would wait for a writer forever, and links and
    devices are the log reader's to refuse."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return None
    if not sniffed(head, rel):
        return None
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise DumpError(f"dump of {size} bytes is over the {MAX_DUMP_BYTES >> 20} MiB limit")
        raw = path.read_bytes()
    except OSError as exc:
        return None, Coverage(
            connector="flight_recorder",
            source=rel,
            status="failed",
            observations=0,
            reason=f"cannot read: {exc.strerror or exc}",
        )
    except DumpError as exc:
        return _refused(exc, head, rel)
    return source_of(raw, rel, node)


def sniffed(head: bytes, rel: str) -> bool:
    """Whether a file named `rel` whose first bytes are `head` (4 KiB, or the whole file) is read as a
    dump (`source_of`), not as a log."""
    if head.startswith(_PICKLE_HEAD):
        return is_dump_bytes(head[:4096]) or is_dump_name(rel)
    return bool(head) and head[0] in _JSON_FIRST and is_dump_bytes(head[:4096])


def source_of(raw: bytes, rel: str, node: str | None) -> tuple[TextSource | None, Coverage] | None:
    """`read_source`'s answer for the bytes `raw` of a regular file that `sniffed` says is a dump."""
    try:
        text = render_file(raw, rel)
    except DumpError as exc:
        return _refused(exc, raw, rel)
    return (
        TextSource(name=rel, text=text, node=node, source="app"),
        Coverage(connector="flight_recorder", source=rel, status="ok", observations=text.count("\n")),
    )


def _refused(exc: DumpError, head: bytes, rel: str) -> tuple[None, Coverage] | None:
    if not head.startswith(_PICKLE_HEAD) and not is_dump_name(rel):
        return None  # JSON that only mentions the dump's keys (JSON-lines logs): read it as a log
    return None, Coverage(
        connector="flight_recorder",
        source=rel,
        status="failed",
        observations=0,
        reason=f"Flight Recorder dump not read: {exc}",
    )


def main(argv: list[str]) -> int:
    for arg in argv:
        try:
            sys.stdout.write(render_file(Path(arg).read_bytes(), arg))
        except (OSError, DumpError) as exc:
            sys.stderr.write(f"{arg}: {exc}\n")
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
