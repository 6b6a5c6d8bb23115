"""Prometheus `query_range` JSON and OpenMetrics text, with dcgm-exporter and node_exporter labels.

dcgm-exporter labels follow NVIDIA/dcgm-exporter (`Hostname` before the May 2026 rename,
`hostname` after; `UUID`, `pci_bus_id`, `modelName`, pod labels on Kubernetes); node_exporter
InfiniBand series follow node_exporter's infiniband collector. A metric that the exporter does not export is simply absent: the
benchmark never writes zeros for what nobody measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from bench.world import GPU, HCA, Node, World

Series = tuple[dict[str, str], list[tuple[float, str]]]


def dcgm_labels(world: World, node: Node, gpu: GPU, name: str) -> dict[str, str]:
    labels = {
        "__name__": name,
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.bus_id,
        "device": f"nvidia{gpu.index}",
        "modelName": world.model_name(),
        "DCGM_FI_DRIVER_VERSION": world.stack.driver,
        "instance": f"{node.mgmt_ip}:9400",
        "job": "dcgm-exporter",
    }
    labels["hostname" if world.stack.dcgm_exporter_lower_hostname else "Hostname"] = node.name
    if world.scheduler == "kubernetes":
        labels.update({"pod": node.pod, "namespace": world.namespace, "container": "pytorch"})
    return labels


def ib_labels(node: Node, hca: HCA, name: str) -> dict[str, str]:
    return {
        "__name__": name,
        "device": hca.name,
        "port": str(hca.port),
        "instance": f"{node.name}:9100",
        "job": "node",
    }


def sample(
    start: float, end: float, step: float, value: Callable[[float], float | None], fmt: str = "{:g}"
) -> list[tuple[float, str]]:
    """Samples of `value(t)` every `step` seconds; a None value means the scrape failed (gap)."""
    out: list[tuple[float, str]] = []
    t = start - (start % step)
    while t <= end:
        v = value(t)
        if v is not None:
            out.append((t, fmt.format(v)))
        t += step
    return out


def step_values(
    start: float, end: float, step: float, at: float, before: float, after: float, fmt: str = "{:g}"
) -> list[tuple[float, str]]:
    """A series that is `before` until `at` and `after` from then on (counters that jump, gauges that switch)."""
    return sample(start, end, step, lambda t: after if t >= at else before, fmt)


def constant(
    start: float, end: float, step: float, value: float, fmt: str = "{:g}"
) -> list[tuple[float, str]]:
    return sample(start, end, step, lambda t: value, fmt)


def counter(start: float, end: float, step: float, base: float, per_second: float) -> list[tuple[float, str]]:
    """A monotonically growing counter."""
    return sample(start, end, step, lambda t: base + (t - start) * per_second, "{:.0f}")


def query_range(series: Sequence[Series]) -> str:
    result = [
        {"metric": dict(sorted(labels.items())), "values": [[t if t % 1 else int(t), v] for t, v in values]}
        for labels, values in series
        if values
    ]
    return (
        json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}, separators=(",", ":")
        )
        + "\n"
    )


def openmetrics(
    families: Sequence[tuple[str, str, str, Sequence[tuple[dict[str, str], str, float | None]]]],
) -> str:
    """OpenMetrics text: (name, type, help, [(labels, value, timestamp)]) per family, ending in `# EOF`."""
    lines: list[str] = []
    for name, mtype, helptext, samples in families:
        lines.append(f"# HELP {name} {helptext}")
        lines.append(f"# TYPE {name} {mtype}")
        for labels, value, t in samples:
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
            ts = f" {t:.3f}" if t is not None else ""
            lines.append(f"{name}{{{lab}}} {value}{ts}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
