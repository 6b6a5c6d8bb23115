"""Names the pipeline agrees on: OTLP attribute keys (contract 2), metric node labels, node aliases.

One module so that the receiver, the store's assembly, `replay` and the rule schema read the same
spelling; it imports nothing from the package.
"""

from __future__ import annotations

from collections.abc import Iterable

# OTLP resource/record attributes that tag a record (contract 2), most specific first.
NODE_KEYS = ("host.name", "k8s.node.name")
WORKLOAD_KEYS = (
    "hypocenter.workload.id",
    "slurm.job.id",
    "k8s.job.name",
    "k8s.pod.annotation.kueue.x-k8s.io/workload",
    "k8s.pod.label.jobset.sigs.k8s.io/jobset-name",
    "k8s.pod.label.trainer.kubeflow.org/trainjob-name",
    "k8s.pod.label.training.kubeflow.org/job-name",
    "k8s.pod.label.batch.kubernetes.io/job-name",
)
ATTEMPT_KEYS = (
    "hypocenter.workload.attempt",
    "slurm.job.restart_count",
    "k8s.pod.label.jobset.sigs.k8s.io/restart-attempt",
    "k8s.pod.annotation.jobset.sigs.k8s.io/restart-attempt",
)
STREAM_KEYS = ("log.file.path", "hypocenter.source", "log.file.name")
LINE_KEY = "log.file.record_number"
UID_KEY = "log.record.uid"
STATE_KEY = "hypocenter.attempt.state"
# The ranks the record's node runs (`16-23`), as every process on that node can tell (torchrun's
# RANK - LOCAL_RANK … + LOCAL_WORLD_SIZE): kept per node, so the processes of different nodes add up
# to the attempt's rank map instead of overwriting one another as `hypocenter.attempt.ranks` would.
NODE_RANKS_KEY = "hypocenter.node.ranks"
NODE_RANKS_SCOPE = "ranks@"  # its scope entry: `ranks@<node>` → the ranks
# The process's own global rank: informational (a resource attribute the detector sets).
RANK_KEY = "hypocenter.rank"
# Attributes that describe the attempt's scope: (attribute, AttemptScope field).
SCOPE_KEYS = (
    ("hypocenter.workload.name", "name"),
    ("hypocenter.workload.scheduler", "scheduler"),
    ("hypocenter.workload.cluster", "cluster"),
    ("k8s.cluster.name", "cluster"),
    ("slurm.cluster.name", "cluster"),
    ("hypocenter.attempt.window.start", "window_start"),
    ("hypocenter.attempt.window.end", "window_end"),
    ("hypocenter.attempt.state", "state"),
    ("hypocenter.attempt.exit_code", "exit_code"),
    ("hypocenter.attempt.reason", "reason"),
    ("hypocenter.attempt.nodes", "nodes"),
    ("hypocenter.attempt.ranks", "ranks"),
    ("hypocenter.attempt.timezone", "timezone"),
)

NODE_LABELS = ("hostname", "Hostname", "node", "nodename", "host", "kubernetes_node", "instance")
"""Prometheus-style labels a metric series names its node by, in the order they are tried."""


class NodeNames:
    """Map the names a host goes by in logs (FQDN, upper case, `-ib0` suffixes) to attempt nodes."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self.nodes = sorted(set(nodes))
        self._alias: dict[str, str] = {}
        for n in self.nodes:
            for a in (n, n.lower(), n.split(".", 1)[0].lower()):
                self._alias.setdefault(a, n)

    def aliases(self) -> list[str]:
        return sorted(self._alias)

    def resolve(self, name: str | None) -> str | None:
        if not name:
            return None
        key = name.strip().strip("'\"").lower()
        if ":" in key and not key.startswith("["):  # host:port (Prometheus instance label)
            key = key.rsplit(":", 1)[0]
        hit = self._alias.get(key) or self._alias.get(key.split(".", 1)[0])
        if hit:
            return hit
        for suffix in ("-ib0", "-ib", "-ipoib", "-eth0", "-mgmt"):
            if key.endswith(suffix) and key[: -len(suffix)] in self._alias:
                return self._alias[key[: -len(suffix)]]
        return None if self.nodes else name.strip()
