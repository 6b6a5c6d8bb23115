"""network/fabric and network/nic: an HCA port that flaps (S04), a leaf switch fault seen by several
nodes, and a ConnectX firmware wedge (S16)."""

from __future__ import annotations

from bench import metrics, nccl, nvidia
from bench.scenario import Mode, Scenario
from bench.scenarios.common import finish_failed
from bench.world import HCA, Node


def ranks_on_hca(sc: Scenario, node: Node, hca: HCA) -> list[int]:
    """The ranks whose GPU uses this HCA (rail-optimised: GPU i on HCA i mod the node's HCA count)."""
    idx = node.hcas.index(hca)
    return [sc.w.rank(node, g) for g in range(sc.w.gpus_per_node) if g % len(node.hcas) == idx]


def _ramp(start: float, end: float, step: float, since: float, per_second: float) -> list[tuple[float, str]]:
    """A counter that starts climbing at `since` (symbol errors of a degrading cable)."""

    def value(t: float) -> float:
        return max(0.0, t - since) * per_second

    return metrics.sample(start, end, step, value, "{:.0f}")


def _link_metrics(sc: Scenario, downs: dict[str, tuple[HCA, float]], *, symbol_ramp: bool) -> None:
    w, rng = sc.w, sc.rng
    step = max(30.0, round((sc.end - w.start) / 120))
    nodes = (
        w.nodes if len(w.nodes) <= 16 else [n for n in w.nodes if n.name in downs] + rng.sample(w.nodes, k=8)
    )
    seen: set[str] = set()
    downed, symbols = [], []
    for n in nodes:
        if n.name in seen:
            continue
        seen.add(n.name)
        for h in n.hcas:
            bad = downs.get(n.name)
            hit = bad is not None and bad[0] is h
            t_down = bad[1] if bad is not None else 0.0
            downed.append(
                (
                    metrics.ib_labels(n, h, "node_infiniband_link_downed_total"),
                    metrics.step_values(w.start, sc.end, step, t_down, 0.0, 1.0 if hit else 0.0),
                )
            )
            if symbol_ramp:
                symbols.append(
                    (
                        metrics.ib_labels(n, h, "node_infiniband_symbol_error_total"),
                        _ramp(w.start, sc.end, step, t_down - 3600, 14.0 if hit else 0.0),
                    )
                )
    sc.bundle.put("metrics/node_infiniband_link_downed_total.json", metrics.query_range(downed))
    if symbols:
        sc.bundle.put("metrics/node_infiniband_symbol_error_total.json", metrics.query_range(symbols))


def _fabric_cascade(sc: Scenario, t: float, targets: list[tuple[Node, HCA]]) -> float:
    """Peers' QPs toward the dead ports retry out (status=12); the port owners see flushes (status=5)."""
    w, rng = sc.w, sc.rng
    t_ib = t + rng.uniform(18, 35)
    reporters_all: list[int] = []
    for node, hca in targets:
        peers = [r for r in sc.peers_of(node, 3) if w.node_of(r).name not in {n.name for n, _ in targets}]
        sc.ib_errors(t_ib, node, peers, status=12, target_hca=hca)
        reporters_all += peers
        own = ranks_on_hca(sc, node, hca)
        if own and w.nccl_debug:
            if rng.random() < 0.5:
                for r in own:
                    sc.out(r, t + rng.uniform(0.01, 0.5), nccl.async_event(w, node, r, hca, fatal=False))
            other = next((n for n in w.nodes if n.name not in {x.name for x, _ in targets}), None)
            if other is not None:
                sc.ib_errors(t_ib + 0.5, other, own, status=5, spread=3.0)
    if reporters_all and w.stack.torch >= (2, 0) and rng.random() < 0.65:
        node, hca = targets[0]
        r0 = reporters_all[0]
        last = nccl.ib_completion(w, w.node_of(r0), r0, node, status=12, direction="Send", rng=rng).split(
            "NCCL WARN ", 1
        )[1]
        sc.remote_errors(
            t_ib + rng.uniform(0.5, 4), reporters_all, last if w.stack.nccl >= (2, 10, 0) else None
        )
        return t_ib + 1
    return sc.timeouts(t)


def s04_link_flap(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes)
    hca = rng.choice(node.hcas)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 40))
    roce = hca.netdev.startswith("enp")
    if rng.random() < 0.3:
        sc.kernel(node, t - rng.uniform(30, 3000), nvidia.mlx5_module_error(hca, rng), level="err")
        sc.collateral(f"cable/module error on {hca.name} ({node.name}) before the link went down")
    down = nvidia.mlx5_eth_link(hca, False) if roce else nvidia.mlx5_link(hca, "DOWN")
    sc.root_kernel(node, t, [down], level="warning")
    if rng.random() < 0.65:
        # The link comes back within seconds and the job dies anyway: the peers' queue pairs had already
        # retried out (NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT). "Back" is not "recovered".
        t_back = t + rng.uniform(4, 12)
        back = (
            [nvidia.mlx5_eth_link(hca, True)]
            if roce
            else [nvidia.mlx5_link(hca, "INIT"), nvidia.mlx5_link(hca, "ACTIVE")]
        )
        sc.kernel(node, t_back, back, level="info", gap=1.5)
        if w.nccl_debug and rng.random() < 0.5:
            for r in ranks_on_hca(sc, node, hca)[:2]:
                sc.out(r, t + rng.uniform(0.01, 0.5), nccl.async_event(w, node, r, hca, fatal=False))
                sc.out(
                    r,
                    t_back + rng.uniform(0.01, 0.5),
                    nccl.async_event(w, node, r, hca, fatal=False, what="port active"),
                )
        plan = sc.plan
        nxt = plan.time_of((plan.iteration_at(t_back) // plan.log_every + 1) * plan.log_every)
        if nxt < t + 17 and rng.random() < 0.5:
            sc.train(nxt + 0.01)  # one step already in flight still logs inside the retry window
        if rng.random() < 0.3:
            sc.kernel(node, t + rng.uniform(40, 70), down, level="warning")
    sc.culprit([node], [sc.hca_component(node, hca, "port")])
    t_detect = _fabric_cascade(sc, t, [(node, hca)])
    finish_failed(sc, t_detect)
    if rng.random() < 0.6:
        _link_metrics(sc, {node.name: (hca, t)}, symbol_ramp=rng.random() < 0.6)
    if not roce and rng.random() < 0.3:
        counters = {
            "SymbolErrorCounter": rng.randint(2000, 65535),
            "LinkErrorRecoveryCounter": rng.randint(3, 40),
            "LinkDownedCounter": rng.randint(1, 4),
            "PortRcvErrors": rng.randint(100, 9000),
            "PortRcvRemotePhysicalErrors": 0,
            "PortRcvSwitchRelayErrors": 0,
            "PortXmitDiscards": rng.randint(0, 50),
            "PortXmitConstraintErrors": 0,
            "PortRcvConstraintErrors": 0,
            "LocalLinkIntegrityErrors": rng.randint(0, 3),
            "ExcessiveBufferOverrunErrors": 0,
            "VL15Dropped": 0,
            "PortXmitWait": rng.randint(10**6, 10**9),
        }
        lid = rng.randint(10, 60000)
        body = [
            f"# Port extended counters: Lid {lid} port {hca.port} (CapMask: 0x5300 CapMask2: 0x0000002)",
            f"PortSelect:{'.' * 22}{hca.port}",
        ]
        body += [f"{k}:{'.' * max(1, 33 - len(k))}{v}" for k, v in counters.items()]
        sc.bundle.put(
            f"logs/{node.name}/perfquery-{hca.name}.txt",
            f"$ perfquery -x -C {hca.name} -P {hca.port}\n" + "\n".join(body) + "\n",
        )


def switch_fault(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    k = rng.randint(2, min(8, max(2, len(w.nodes) - 1)))
    first = rng.randint(0, len(w.nodes) - k)
    leaf = w.nodes[first : first + k]
    rail = rng.randrange(len(w.nodes[0].hcas))
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 40))
    targets: list[tuple[Node, HCA]] = []
    for i, node in enumerate(leaf):
        hca = node.hcas[rail]
        roce = hca.netdev.startswith("enp")
        line = nvidia.mlx5_eth_link(hca, False) if roce else nvidia.mlx5_link(hca, "DOWN")
        if i == 0:
            sc.root_kernel(node, t + rng.uniform(0, 0.4), [line], level="warning")
        else:
            sc.kernel(node, t + rng.uniform(0, 0.8), line, key=True, level="warning")
        targets.append((node, hca))
        sc.culprit([node], [sc.hca_component(node, hca, "port")])
    sc.collateral(f"{k} nodes lost {leaf[0].hcas[rail].name} link at the same time (common leaf switch)")
    t_detect = _fabric_cascade(sc, t, targets)
    finish_failed(sc, t_detect)
    if rng.random() < 0.5:
        step = max(30.0, round((sc.end - w.start) / 120))
        guid = f"0x{w.hexid(16, 'leaf')}"
        series = [
            (
                {
                    "__name__": "infiniband_switch_port_link_downed_total",
                    "guid": guid,
                    "port": str(p + 1),
                    "switch": f"leaf-{rail:02d}-{first // 8 + 1:02d}",
                    "instance": "ib-exporter:9315",
                    "job": "infiniband",
                },
                metrics.step_values(w.start, sc.end, step, t, 0.0, 1.0 if p < k else 0.0),
            )
            for p in range(max(k + 2, 8))
        ]
        sc.bundle.put("metrics/infiniband_switch_port_link_downed_total.json", metrics.query_range(series))


def s16_nic_wedge(sc: Scenario) -> None:
    w, rng = sc.w, sc.rng
    sc.begin()
    node = rng.choice(w.nodes)
    hca = rng.choice(node.hcas)
    t = sc.fault_time()
    sc.train(t - rng.uniform(1, 40))
    sc.root_kernel(node, t, [nvidia.mlx5_cmd_timeout(hca, rng)])
    for k in range(rng.randint(0, 3)):
        sc.kernel(node, t + (k + 1) * rng.uniform(20, 70), nvidia.mlx5_cmd_timeout(hca, rng))
    later: list[str] = []
    if rng.random() < 0.6:
        later.append(f"mlx5_core {hca.bdf} {hca.netdev}: TX timeout detected")
        later.append(
            f"NETDEV WATCHDOG: {hca.netdev} (mlx5_core): transmit queue {rng.randint(0, 15)} timed out"
        )
    if rng.random() < 0.4:
        later += nvidia.mlx5_health(hca, rng)
    if rng.random() < 0.3:
        later.append(
            f"watchdog: BUG: soft lockup - CPU#{rng.randint(0, 127)} stuck for {rng.randint(22, 90)}s! [kworker/u{rng.randint(256, 512)}:3:{rng.randint(1000, 9999)}]"
        )
    if later:
        sc.kernel(node, t + rng.uniform(30, 240), later, level="err")
    sc.culprit([node], [sc.hca_component(node, hca, "nic")])
    own = ranks_on_hca(sc, node, hca)
    if own and w.nccl_debug and rng.random() < 0.4:
        sc.out(own[0], t + rng.uniform(1, 20), nccl.async_event(w, node, own[0], hca, fatal=True))
    t_detect = _fabric_cascade(sc, t + rng.uniform(5, 60), [(node, hca)])
    finish_failed(sc, t_detect)


MODES = (
    Mode(
        "s04-ib-link-flap",
        "attributed",
        "network",
        "fabric",
        7.0,
        s04_link_flap,
        "one HCA port goes down/flaps (cable or transceiver); peers time out toward its IP (status=12)",
    ),
    Mode(
        "ib-leaf-switch-fault",
        "attributed",
        "network",
        "fabric",
        3.0,
        switch_fault,
        "a leaf switch fault drops the same rail's link on several nodes at once",
    ),
    Mode(
        "s16-connectx-fw-timeout",
        "attributed",
        "network",
        "nic",
        3.0,
        s16_nic_wedge,
        "ConnectX firmware command timeouts wedge one NIC; node stays Ready; peers time out toward it",
    ),
)
