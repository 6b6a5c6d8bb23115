"""Write PyTorch Flight Recorder dumps, `ncclras` reports and py-spy stack dumps for hang scenarios.

The dump shapes follow torch's writer across its format versions (see docs/hangs.md):

    1.4    entries with seq_id and pg_id, pg_config {pg id: [ranks]}
    2.2    collective_seq_id / p2p_seq_id, process_group (name, desc), dtypes, timeout_ms,
           pg_config {name: {name, desc, ranks: "[…]"}}
    2.3    + pg_status {pg id: {last_enqueued_collective, last_started_collective, last_completed_collective}}
    2.7    + nccl_version
    2.10   comm_lib_version instead, + thread_id / thread_name (torch 2.13)

Pickles are protocol 2 of plain values, as torch's C++ pickler writes them; JSON dumps (from 2.3)
carry no frames, write pg_status values as strings and missing times as 0.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

VERSIONS = ("1.4", "2.2", "2.3", "2.7", "2.10")
JSON_FROM = (2, 3)


@dataclass(frozen=True)
class Op:
    """One collective as one rank recorded it."""

    seq: int
    name: str  # profiling name, e.g. nccl:all_reduce
    numel: int
    state: str  # scheduled | started | completed
    created_ns: int


def _v(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def dump_doc(
    version: str,
    ops: list[Op],
    world: list[int],
    *,
    frames: list[dict[str, Any]] | None = None,
    timeout_ms: int = 600_000,
    desc: str = "default_pg",
    comm_lib: str = "2.21.5",
    status: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """One rank's dump as torch `version` writes it; `status` is (last enqueued, started, completed)."""
    v = _v(version)
    entries: list[dict[str, Any]] = []
    for i, op in enumerate(ops):
        e: dict[str, Any] = {
            "record_id": i,
            "pg_id": 0,
            "op_id": op.seq,
            "profiling_name": op.name,
            "time_created_ns": op.created_ns,
            "input_sizes": [[op.numel]],
            "output_sizes": [[op.numel]],
            "state": op.state,
            "retired": op.state == "completed",
            "time_discovered_started_ns": op.created_ns + 1_000_000 if op.state != "scheduled" else None,
            "time_discovered_completed_ns": op.created_ns + 9_000_000 if op.state == "completed" else None,
            "frames": list(frames or []),
        }
        if v < (2, 0):
            e["seq_id"] = op.seq
        else:
            e.update(
                {
                    "process_group": ("0", desc),
                    "collective_seq_id": op.seq,
                    "p2p_seq_id": 0,
                    "is_p2p": False,
                    "input_dtypes": ["Float"],
                    "output_dtypes": ["Float"],
                    "timeout_ms": timeout_ms,
                }
            )
        if v >= (2, 10):
            e.update({"thread_id": "140210558617408", "thread_name": "pt_main_thread"})
        entries.append(e)
    doc: dict[str, Any] = {"version": version, "entries": entries}
    if v < (2, 0):
        doc["pg_config"] = {0: list(world)}
    else:
        doc["pg_config"] = {"0": {"name": "0", "desc": desc, "ranks": str(list(world))}}
    if v >= (2, 3) and status is not None:
        enq, started, done = status
        doc["pg_status"] = {
            "0": {
                "last_enqueued_collective": enq,
                "last_started_collective": started,
                "last_completed_collective": done,
            }
        }
    if (2, 7) <= v < (2, 10):
        doc["nccl_version"] = comm_lib
    elif v >= (2, 10):
        doc["comm_lib_version"] = comm_lib
    return doc


def encode(doc: dict[str, Any], fmt: str) -> bytes:
    """The dump's bytes: `pickle` (protocol 2, what TORCH_NCCL_DUMP_ON_TIMEOUT writes) or `json`."""
    if fmt == "pickle":
        return pickle.dumps(doc, protocol=2)
    out = json.loads(json.dumps(doc))
    for e in out["entries"]:
        e.pop("frames", None)
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or 0
    for st in out.get("pg_status", {}).values():
        for k in st:
            st[k] = str(st[k])
    return json.dumps(out, sort_keys=True).encode()


def ras_report(
    nccl_version: str,
    dead: list[tuple[int, str, int]],
    behind: list[tuple[int, int, int, str, int]],
    ranks: int,
    nodes: int,
    ahead_count: int,
) -> str:
    """`ncclras` text output (src/ras/client_support.cc): a DEAD section for `dead` (pid, node, gpu)
    and a MISMATCH warning with the ranks `behind` (rank, op count, gpu, node, pid)."""
    lines = [
        f"NCCL version {nccl_version} compiled with CUDA 12.8",
        "CUDA runtime version 12080, driver version 12080",
        "",
        "Job summary",
        "===========",
        "",
        "  Nodes  Processes         GPUs  Processes     GPUs",
        "(total)   per node  per process    (total)  (total)",
        f"{nodes:7d}  {max(1, ranks // max(nodes, 1)):9d}  {1:11d}  {ranks:9d}  {ranks:7d}",
        "",
        "Communicators... (0.01s)",
        "=============",
        "",
        "Errors",
        "======",
        "",
    ]
    if dead:
        lines += [
            "DEAD",
            f"  {len(dead)} job process{'es are' if len(dead) > 1 else ' is'} considered dead "
            "(unreachable via the RAS network)",
        ]
        lines += [f"  Process {pid} on node {node} managing GPU {gpu}" for pid, node, gpu in dead]
        lines.append("")
    lines += ["Warnings", "========", ""]
    if behind:
        lines += [
            "#0-0 (27a079b828ff1a75) MISMATCH",
            "  Communicator ranks have different AllReduce operation counts",
            f"  {ahead_count} ranks have launched up to operation {behind[0][1] + 1}",
        ]
        lines += [
            f"  Rank {r} has launched up to operation {n} -- GPU {gpu} managed by process {pid} on node {node}"
            for r, n, gpu, node, pid in behind
        ]
        lines.append("")
    return "\n".join(lines) + "\n"
