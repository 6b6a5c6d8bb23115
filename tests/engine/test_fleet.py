"""Fleet memory (engine/fleet.py, engine/topology.py): recurring culprits across workloads, lemon
GPUs, shared switch ports, the store's marks in SQLite and PostgreSQL, and what the server shows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from postgres_support import fresh_schema
from server_support import REPO, ServerProcess, analyze, clean_env, replay, wait_for_diagnosis

from hypocenter.api.v1 import attribution_pb2 as pb
from hypocenter.api.v1 import attribution_pb2_grpc as pb_grpc
from hypocenter.engine.fleet import FleetView, findings, history_note, marks_of, suspects
from hypocenter.engine.topology import (
    Link,
    Topology,
    load_topology,
    parse_ibnetdiscover,
    parse_lldp,
    parse_topology,
)
from hypocenter.errors import InputError
from hypocenter.store import open_store

pytestmark = pytest.mark.slow

DAY = 86400.0
NOW = 1_800_000_000.0


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def diagnosis(
    workload: str,
    attempt: int = 0,
    *,
    at: float = NOW - DAY,
    outcome: str = "attributed",
    domain: str = "hardware",
    subdomain: str = "gpu",
    nodes: tuple[str, ...] = ("n1",),
    components: tuple[tuple[str, str, str], ...] = (),
    xids: tuple[tuple[str, str, int], ...] = (),
    cluster: str = "eos",
) -> dict[str, Any]:
    """A diagnosis (schema hypocenter.diagnosis/v1), reduced to what fleet memory reads; `xids`: (node, pci, code) in the evidence."""
    rc = {
        "domain": domain,
        "subdomain": subdomain,
        "rule": f"{subdomain}-rule",
        "summary": "s",
        "nodes": list(nodes),
        "components": [{"node": n, "kind": k, "id": i} for n, k, i in components],
        "first_seen": _iso(at),
        "action": "INVESTIGATE",
    }
    evidence = [
        {
            "time": _iso(at),
            "node": n,
            "source": "kernel",
            "ref": f"logs/{n}/kern.log:1",
            "role": "root_cause",
            "rule": "xid-application",
            "text": f"NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python, MMU Fault",
        }
        for n, pci, code in xids
    ]
    return {
        "schema": "hypocenter.diagnosis/v1",
        "id": f"dx-{workload}-{attempt}",
        "attempt": {
            "workload_id": workload,
            "attempt": attempt,
            "cluster": cluster,
            "window": {"start": _iso(at - 3600), "end": _iso(at + 60)},
            "nodes": list(nodes),
        },
        "outcome": outcome,
        "root_cause": rc if outcome == "attributed" else None,
        "candidates": [rc, {**rc, "nodes": ["other"]}] if outcome == "ambiguous" else [],
        "evidence": evidence,
        "quality": {"level": "high", "reasons": []},
    }


def _marks(*diagnoses: dict[str, Any]) -> list[Any]:
    return [m for d in diagnoses for m in marks_of(d)]


def test_a_job_restarting_on_a_bad_node_is_one_workload_not_ten() -> None:
    restarts = [diagnosis("job-a", attempt=i, nodes=("bad",), at=NOW - DAY + i * 600) for i in range(10)]
    three = [diagnosis(f"job-{c}", nodes=("flaky",)) for c in "xyz"]
    ranked = {s.name: s for s in suspects(_marks(*restarts, *three), NOW)}
    assert ranked["bad"].workloads == 1 and ranked["bad"].attempts == 10
    assert ranked["flaky"].workloads == 3
    assert ranked["flaky"].score > 2 * ranked["bad"].score
    assert [s.name for s in findings(list(ranked.values()))] == ["flaky"]
    # job ids repeat across clusters: job-a on another cluster is another workload
    other = diagnosis("job-a", nodes=("bad",), cluster="selene")
    assert {s.name: s.workloads for s in suspects(_marks(*restarts, other), NOW)} == {"bad": 2}


def test_score_halves_every_half_life_and_user_bugs_name_no_suspect() -> None:
    old = suspects(_marks(diagnosis("w1", nodes=("n1",), at=NOW - 14 * DAY)), NOW, half_life_s=7 * DAY)
    new = suspects(_marks(diagnosis("w1", nodes=("n1",), at=NOW)), NOW, half_life_s=7 * DAY)
    assert new[0].score == pytest.approx(1.0) and old[0].score == pytest.approx(0.25)
    bug = diagnosis("w2", domain="software", subdomain="user_code", nodes=("n9",))
    assert marks_of(bug) == [] and marks_of(diagnosis("w3", outcome="not_failed")) == []
    # an ambiguous verdict's candidates count half
    amb = suspects(_marks(diagnosis("w4", outcome="ambiguous", nodes=("n4",), at=NOW)), NOW)
    assert {s.name: s.score for s in amb} == {"n4": pytest.approx(0.5), "other": pytest.approx(0.5)}


def test_application_xids_on_one_gpu_across_workloads_make_a_lemon() -> None:
    once = diagnosis("w1", domain="software", subdomain="user_code", xids=(("n7", "0000:3B:00", 31),))
    assert suspects(marks_of(once), NOW) == []  # the user's fault, once
    again = diagnosis("w2", domain="software", subdomain="user_code", xids=(("n7", "0000:3b:00", 13),))
    same_job = diagnosis(
        "w1", attempt=1, domain="software", subdomain="user_code", xids=(("n2", "0000:01:00", 31),)
    )
    ranked = suspects(_marks(once, again, same_job), NOW)
    assert [(s.kind, s.name, s.workloads, s.app_xids) for s in ranked] == [
        ("gpu", "n7/0000:3b:00", 2, [13, 31])
    ]
    assert "suspect the hardware" in ranked[0].verdict
    # the per-attempt note: the second workload's diagnosis learns of the first
    notes = history_note(marks_of(once), again, NOW)
    assert notes == [
        "fleet history: GPU n7/0000:3b:00 raised application-class Xids in 1 other workload too: "
        "suspect the GPU, not only the code"
    ]
    assert history_note(marks_of(same_job), once, NOW) == []


IBNETDISCOVER = """#
# Topology file: generated on Thu Dec  3 08:00:00 2026
#
# Initiated from node 0002c903000a0001 port 0002c903000a0002

vendid=0x2c9
devid=0xd2f0
sysimgguid=0x1070fd0300aa0000
switchguid=0x1070fd0300aa0000(1070fd0300aa0000)
Switch\t40 "S-1070fd0300aa0000"\t\t# "leaf-03" enhanced port 0 lid 3 lmc 0
[17]\t"H-0002c903000a0001"[1](2c903000a0002) \t\t# "n1 mlx5_0" lid 5 4xHDR
[18]\t"H-0002c903000b0001"[1](2c903000b0002) \t\t# "n2 mlx5_0" lid 6 4xHDR

vendid=0x2c9
devid=0x101b
sysimgguid=0x2c903000a0003
caguid=0x2c903000a0001
Ca\t1 "H-0002c903000a0001"\t\t# "n1 mlx5_0"
[1](2c903000a0002) \t"S-1070fd0300aa0000"[17]\t\t# lid 5 lmc 0 "leaf-03" lid 3 4xHDR

vendid=0x2c9
devid=0x101b
sysimgguid=0x2c903000b0003
caguid=0x2c903000b0001
Ca\t1 "H-0002c903000b0001"\t\t# "n2 mlx5_0"
[1](2c903000b0002) \t"S-1070fd0300aa0000"[18]\t\t# lid 6 lmc 0 "leaf-03" lid 3 4xHDR
"""

LLDP_ONE = {
    "lldp": {
        "interface": {
            "enp60s0np0": {
                "via": "LLDP",
                "chassis": {
                    "leaf-07": {"id": {"type": "mac", "value": "0c:42:a1:00:00:07"}, "descr": "Cumulus"}
                },
                "port": {"id": {"type": "ifname", "value": "swp12"}, "descr": "swp12"},
            }
        }
    }
}
LLDP_TWO = {
    "lldp": {
        "interface": [
            {
                "enp60s0np0": {
                    "chassis": {"leaf-07": {}},
                    "port": {"id": {"type": "ifname", "value": "swp12"}},
                }
            },
            {
                "enp61s0np0": {
                    "chassis": {"id": {"type": "mac", "value": "0c:42:a1:00:00:08"}},
                    "port": {"id": {"type": "ifname", "value": "swp3"}},
                }
            },
        ]
    }
}


def test_topology_from_ibnetdiscover_lldp_and_our_yaml(tmp_path: Path) -> None:
    assert parse_ibnetdiscover(IBNETDISCOVER) == [
        Link("n1", "mlx5_0/1", "leaf-03", "17"),
        Link("n2", "mlx5_0/1", "leaf-03", "18"),
    ]
    assert parse_lldp(LLDP_ONE, "n3") == [Link("n3", "enp60s0np0", "leaf-07", "swp12")]
    assert parse_lldp(LLDP_TWO, "n4") == [
        Link("n4", "enp60s0np0", "leaf-07", "swp12"),
        Link("n4", "enp61s0np0", "0c:42:a1:00:00:08", "swp3"),
    ]
    (tmp_path / "fabric.txt").write_text(IBNETDISCOVER)
    (tmp_path / "n3.json").write_text(json.dumps(LLDP_ONE))
    (tmp_path / "cables.yaml").write_text(
        "links:\n  - {node: n5, port: mlx5_1/1, switch: leaf-03, switch_port: 17, cable: C-17}\n"
    )
    topo = load_topology([tmp_path])
    assert len(topo) == 4
    assert topo.link("n1", "mlx5_0") == Link(
        "n1", "mlx5_0/1", "leaf-03", "17"
    )  # a single-port HCA named bare
    with pytest.raises(InputError, match=r"links\[0\]: unknown keys swtch; missing switch"):
        parse_topology("links:\n  - {node: a, port: b, swtch: c, switch_port: 1}\n", "bad.yaml")
    with pytest.raises(InputError, match="nor is it ibnetdiscover"):
        parse_topology("hello: world\n", "notes.yaml")


def test_errors_on_hosts_sharing_a_switch_port_become_one_finding_across_attempts() -> None:
    # n1 and n5 are cabled to the same port of leaf-03 (a patch panel swap); n2 to another port of it
    topo = Topology([*parse_ibnetdiscover(IBNETDISCOVER), Link("n5", "mlx5_1/1", "leaf-03", "17", "C-17")])

    def link_down(workload: str, node: str, port: str, days: float = 1) -> dict[str, Any]:
        return diagnosis(
            workload,
            domain="network",
            subdomain="fabric",
            nodes=(node,),
            components=((node, "port", port),),
            at=NOW - days * DAY,
        )

    # three workloads, each seeing one host's link fail; no host port repeats
    ds = [
        link_down("w1", "n1", "mlx5_0/1"),
        link_down("w2", "n5", "mlx5_1/1", 2),
        link_down("w3", "n2", "mlx5_0/1", 3),
    ]
    found = {(s.kind, s.name): s for s in findings(suspects(_marks(*ds), NOW, topology=topo))}
    assert sorted(found) == [("switch", "leaf-03"), ("switch_port", "leaf-03/17")]
    assert found[("switch_port", "leaf-03/17")].hosts == ["n1", "n5"]
    assert found[("switch", "leaf-03")].workloads == 3
    assert "errors on 2 hosts (n1, n5) in 2 workloads" in found[("switch_port", "leaf-03/17")].verdict
    # without the topology, the same history is three unrelated one-off ports: no finding
    assert findings(suspects(_marks(*ds), NOW)) == []


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
    else:
        yield from fresh_schema()


def _put(store: Any, d: dict[str, Any], provisional: bool = False) -> None:
    store.set_context(d["attempt"]["workload_id"], d["attempt"]["attempt"], {}, NOW)
    row = store.attempt(d["attempt"]["workload_id"], d["attempt"]["attempt"])
    summary = {
        "id": d["id"],
        "workload": d["attempt"]["workload_id"],
        "attempt": d["attempt"]["attempt"],
        "cluster": "eos",
        "outcome": d["outcome"],
        "domain": None,
        "subdomain": None,
        "culprits": [],
        "affected": [],
        "marks": marks_of(d),
    }
    store.put_diagnosis(row.id, json.dumps(d), summary, provisional, NOW)


def test_the_store_keeps_each_final_diagnosis_marks_and_replaces_them_with_it(store_url: str) -> None:
    store = open_store(store_url)
    try:
        _put(store, diagnosis("w1", nodes=("n1",), components=(("n1", "gpu", "GPU-aa"),)))
        _put(store, diagnosis("w2", nodes=("n1",)))
        _put(store, diagnosis("w3", nodes=("n3",)), provisional=True)  # not final: not in the fleet view
        view = FleetView(store, window_s=30 * DAY)
        assert [(s.kind, s.name, s.workloads) for s in view.suspects(NOW)] == [
            ("node", "n1", 2),
            ("gpu", "n1/GPU-aa", 1),
        ]
        # w2 re-analysed: now a user bug; its marks go with the verdict it replaced
        d2 = diagnosis("w2", domain="software", subdomain="user_code")
        d2["id"] = "dx-w2-0-rev2"
        _put(store, d2)
        assert [(s.name, s.workloads) for s in view.suspects(NOW)] == [("n1", 1), ("n1/GPU-aa", 1)]
        report = view.report(NOW)
        assert report["schema"] == "hypocenter.fleet/v1" and report["findings"] == []
        assert store.fleet_marks(NOW) == []  # the window: nothing happened after now
    finally:
        store.close()


# ------------------------------------------------------------------------------------ the server, the CLI


def _populated_store(path: Path, topology: Path) -> None:
    """History a server starts with: a lemon GPU (n7), three workloads failing on leaf-03's hosts, and
    an application Xid on the GPU the replayed app-xid bundle (bench seed 2) faults on."""
    topology.write_text(IBNETDISCOVER)
    store = open_store(str(path))
    try:
        now = time.time()
        _put(
            store,
            diagnosis(
                "lemon-1",
                at=now - DAY,
                domain="software",
                subdomain="user_code",
                xids=(("n7", "0000:3b:00", 31),),
            ),
        )
        _put(
            store,
            diagnosis(
                "lemon-2",
                at=now - 2 * DAY,
                domain="software",
                subdomain="user_code",
                xids=(("n7", "0000:3b:00", 13),),
            ),
        )
        for wl, node in (("fab-1", "n1"), ("fab-2", "n2"), ("fab-3", "n1")):
            _put(
                store,
                diagnosis(
                    wl,
                    at=now - DAY,
                    domain="network",
                    subdomain="fabric",
                    nodes=(node,),
                    components=((node, "port", "mlx5_0/1"),),
                ),
            )
        _put(
            store,
            diagnosis(
                "earlier-user-job",
                at=now - DAY,
                domain="software",
                subdomain="user_code",
                xids=(("gpu-a20", "0000:0f:00", 31),),
            ),
        )
    finally:
        store.close()


@pytest.fixture(scope="module")
def fleet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fleet")
    _populated_store(tmp / "store.db", tmp / "fabric.ibnetdiscover")
    srv = ServerProcess(tmp / "store.db", "--topology", str(tmp / "fabric.ibnetdiscover")).start()
    yield srv
    srv.stop()


def test_rest_grpc_and_metrics_show_the_same_suspects(fleet_server: ServerProcess) -> None:
    with fleet_server.client() as c:
        doc = c.get("/v1/fleet/suspects").json()
        found = {(s["kind"], s["name"]) for s in c.get("/v1/fleet/findings").json()["findings"]}
        only_gpus = c.get("/v1/fleet/suspects", params={"kind": "gpu"}).json()["suspects"]
        bad = c.get("/v1/fleet/suspects", params={"kind": "rack"})
    assert {("gpu", "n7/0000:3b:00"), ("switch", "leaf-03"), ("node", "n1"), ("port", "n1/mlx5_0/1")} <= found
    assert ("gpu", "gpu-a20/0000:0f:00") not in {
        (s["kind"], s["name"]) for s in doc["suspects"]
    }  # once: a user bug
    assert doc["topology_links"] == 2 and {s["kind"] for s in only_gpus} == {"gpu"}
    assert bad.status_code == 400 and "unknown rack" in bad.json()["message"]
    with grpc.insecure_channel(fleet_server.grpc) as ch:
        reply = pb_grpc.AttributionStub(ch).ListFleetSuspects(pb.ListFleetSuspectsRequest(), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.AttributionStub(ch).ListFleetSuspects(
                pb.ListFleetSuspectsRequest(kinds=["rack"]), timeout=30
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert {(s.kind, s.name) for s in reply.findings} == found
    assert [s.name for s in reply.suspects] == [s["name"] for s in doc["suspects"]]
    metrics = httpx.get(f"http://{fleet_server.metrics}/metrics", timeout=30).text
    assert 'hypocenter_fleet_finding{kind="gpu",suspect="n7/0000:3b:00"} 1.0' in metrics
    assert 'hypocenter_fleet_suspect_workloads{kind="switch",suspect="leaf-03"} 3.0' in metrics


def test_a_fresh_diagnosis_learns_the_gpus_history_and_analyze_does_not(
    fleet_server: ServerProcess, tmp_path: Path
) -> None:
    from bench.generate import build, write_bundle
    from bench.scenarios import MODES

    bundle = tmp_path / "app-xid"
    write_bundle(bundle, build(MODES["app-xid31-13-illegal-memory-access"], 2, 8))
    plain = analyze(bundle)
    assert not any("fleet history" in r for r in plain["quality"]["reasons"])
    r = replay(bundle, fleet_server.grpc)
    assert r.returncode == 0, r.stderr
    with fleet_server.client() as c:
        served = wait_for_diagnosis(c, plain["attempt"]["workload_id"])
    assert (
        "fleet history: GPU gpu-a20/0000:0f:00 raised application-class Xids in 1 other workload too: "
        "suspect the GPU, not only the code"
    ) in served["quality"]["reasons"]
    assert served["root_cause"] == plain["root_cause"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypocenter.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )


def test_hypocenter_fleet_reads_a_store_or_a_server(tmp_path: Path, fleet_server: ServerProcess) -> None:
    _populated_store(tmp_path / "store.db", tmp_path / "fabric.txt")
    table = _cli("fleet", "--store", str(tmp_path / "store.db"), "--topology", str(tmp_path / "fabric.txt"))
    assert table.returncode == 0, table.stderr
    lemon = next(line for line in table.stdout.splitlines() if "n7/0000:3b:00" in line)
    assert lemon.lstrip().startswith("!") and "application-class Xid 13/31 in 2 different workloads" in lemon
    as_json = json.loads(_cli("fleet", "--store", str(tmp_path / "store.db"), "--format", "json").stdout)
    assert "switch" not in {s["kind"] for s in as_json["suspects"]}  # no topology given: no switch
    remote = json.loads(
        _cli("fleet", "--server", fleet_server.base, "--format", "json", "--kind", "switch").stdout
    )
    assert [s["name"] for s in remote["suspects"]] == ["leaf-03"]
    bad = _cli("fleet", "--store", str(tmp_path / "store.db"), "--topology", str(tmp_path / "nope.yaml"))
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr and "Traceback" not in bad.stderr
    typo = _cli("fleet", "--store", str(tmp_path / "stor.db"))
    assert (
        typo.returncode == 2 and "no such store file" in typo.stderr and not (tmp_path / "stor.db").exists()
    )


NEW_RULE = """rules:
  - id: xid-application-is-hardware
    title: Application Xid blamed on the GPU (a deliberately bad change, to backtest)
    status: experimental
    description: Treats every application-class Xid as a GPU fault.
    runbook: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
    attribute:
      when: {kind: xid, fields: {class: app}}
      role: root_cause
      domain: hardware
      subdomain: gpu
      locus: gpu
      precedence: 99
      explains: ["software/*"]
      action: RESET_GPU
      summary: "GPU {pci} on {node}"
"""


def test_rules_backtest_over_bundles_and_a_store_names_what_flips(tmp_path: Path) -> None:
    from bench.generate import build, write_bundle
    from bench.scenarios import MODES

    for i, mode in enumerate(("app-xid31-13-illegal-memory-access", "s06-single-rank-exception", "gpu-oom")):
        write_bundle(
            tmp_path / "bundles" / f"{i}-{mode}", build(MODES[mode], 2 + 10 * i, 8)
        )  # three workloads
    (tmp_path / "rule.yaml").write_text(NEW_RULE)
    r = _cli(
        "rules",
        "backtest",
        "--bundles",
        str(tmp_path / "bundles"),
        "--rules",
        str(tmp_path / "rule.yaml"),
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["attempts"] == 3 and report["flipped"] == 1
    change = report["changes"][0]
    assert change["from"].startswith("attributed software/user_code") and "hardware/gpu" in change["to"]
    assert change["examples"] == ["0-app-xid31-13-illegal-memory-access"] and report["by_domain"] == {
        "software": 1
    }
    text = _cli(
        "rules", "backtest", "--bundles", str(tmp_path / "bundles"), "--rules", str(tmp_path / "rule.yaml")
    )
    assert (
        "1 verdict(s) flip" in text.stdout
        and "-> attributed hardware/gpu (xid-application-is-hardware)" in text.stdout
    )
    # the same attempts stored by a server: rebuilt from the store as the server does at analysis
    srv = ServerProcess(tmp_path / "store.db").start()
    try:
        with srv.client() as c:
            for b in sorted((tmp_path / "bundles").iterdir()):
                assert replay(b, srv.grpc).returncode == 0
                wait_for_diagnosis(c, yaml.safe_load((b / "attempt.yaml").read_text())["workload"]["id"])
    finally:
        srv.stop()
    stored = json.loads(
        _cli(
            "rules",
            "backtest",
            "--store",
            str(tmp_path / "store.db"),
            "--since",
            "3650d",
            "--rules",
            str(tmp_path / "rule.yaml"),
            "--format",
            "json",
        ).stdout
    )
    assert stored["attempts"] == 3 and stored["flipped"] == 1 and stored["by_domain"] == {"software": 1}
    usage = _cli("rules", "backtest", "--bundles", str(tmp_path / "bundles"))
    assert usage.returncode == 2 and "--rules" in usage.stderr


def test_the_bench_fleet_finds_the_planted_culprits() -> None:
    from bench.fleet import run

    report = run(workloads=14, seed=1, k=4)
    assert "gpu fleet-n003/0000:3b:00" in report["top"] and "switch leaf-20" in report["top"]
    assert report["precision_at_k"] >= report["reference_precision_at_k"]


def test_metrics_expose_only_the_top_k_suspects(tmp_path: Path) -> None:
    from hypocenter.exporter.activity import Activity
    from hypocenter.exporter.prometheus import HypocenterCollector

    store = open_store(str(tmp_path / "store.db"))
    try:
        for i in range(12):  # twelve nodes, node k behind k % 4 + 1 workloads
            for j in range(i % 4 + 1):
                _put(store, diagnosis(f"w{i}-{j}", nodes=(f"n{i:02d}",), at=time.time() - DAY))
        view = FleetView(store)
        families = {
            f.name: f for f in HypocenterCollector(Activity(), store, fleet=view, fleet_top=3).collect()
        }
    finally:
        store.close()
    scores = families["hypocenter_fleet_suspect_score"].samples
    assert len(scores) == 3 and {s.labels["suspect"] for s in scores} == {"n03", "n07", "n11"}
    assert all(s.value == 1 for s in families["hypocenter_fleet_finding"].samples)


def test_an_upgraded_store_brings_its_earlier_diagnoses_into_fleet_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from hypocenter.server.fleet import backfill
    from hypocenter.store import sqlite as sqlite_store
    from hypocenter.store.migrations import MIGRATIONS

    path = tmp_path / "old.db"
    with monkeypatch.context() as m:  # a store written by the hypocenter before fleet memory
        m.setattr(sqlite_store, "MIGRATIONS", MIGRATIONS[:10])
        open_store(str(path)).close()
    db = sqlite3.connect(path)
    for d in (
        diagnosis("old-1", nodes=("n5",)),
        diagnosis("old-2", nodes=("n5",)),
        diagnosis("old-3", outcome="not_failed"),
    ):
        db.execute(
            "INSERT INTO diagnoses (id, workload, attempt, outcome, provisional, created, body)"
            " VALUES (?, ?, 0, ?, 0, ?, ?)",
            (d["id"], d["attempt"]["workload_id"], d["outcome"], NOW, json.dumps(d)),
        )
    db.execute(
        "INSERT INTO diagnoses (id, workload, attempt, outcome, provisional, created, body)"
        " VALUES ('dx-broken', 'b', 0, 'attributed', 0, 0, 'not json')"
    )
    db.commit()
    db.close()
    store = open_store(str(path))
    try:
        assert store.fleet_marks(0) == [] and len(store.fleet_pending(10)) == 4
        assert backfill(store, batch=2) == 4 and store.fleet_pending(10) == []
        assert [(s.name, s.workloads) for s in FleetView(store).suspects(NOW)] == [("n5", 2)]
        assert backfill(store) == 0
    finally:
        store.close()
