"""deploy/otelcol and the compose stack's collector config, checked without otelcol (which cannot run
here): every component and every field used must be one the collector documents, the pipelines must
name defined components, and the filelog receivers must set what hypocenter needs (DESIGN contract 2:
log.file.path, log.file.record_number, the workload and attempt attributes). Then the job agent's
tagging runs end to end through rotel (a real OTLP collector) into a real `hypocenter serve`.

The field lists below were taken from the collector's own documentation (README configuration tables
and config.schema.yaml files) in the open-telemetry/opentelemetry-collector-contrib and
open-telemetry/opentelemetry-collector repositories; the source of each is given beside it. `ANY`
marks a mapping whose keys are user data (attribute values, operator lists are checked separately).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from server_support import REPO, ServerProcess, analyze

from hypocenter.cli.replay import ReplayReport, Sender, plan, state_record
from hypocenter.collector import otlp
from hypocenter.names import NODE_KEYS

pytestmark = pytest.mark.slow

OTELCOL = REPO / "deploy" / "otelcol"
CONFIGS = [
    OTELCOL / "node-agent.yaml",
    OTELCOL / "job-agent.yaml",
    OTELCOL / "gateway.yaml",
    REPO / "deploy" / "compose" / "otelcol.yaml",
]
ANY = object()
Spec = dict[str, Any]

# configtls.ClientConfig / ServerConfig (opentelemetry-collector config/configtls/README.md)
TLS_CLIENT: Spec = {
    "insecure": None,
    "insecure_skip_verify": None,
    "ca_file": None,
    "cert_file": None,
    "key_file": None,
    "server_name_override": None,
    "min_version": None,
}
TLS_SERVER: Spec = {
    "cert_file": None,
    "key_file": None,
    "client_ca_file": None,
    "ca_file": None,
    "min_version": None,
    "reload_interval": None,
}
AUTH: Spec = {"authenticator": None}  # configauth (opentelemetry-collector config/configauth)
RETRY: Spec = {"enabled": None, "initial_interval": None, "max_interval": None, "max_elapsed_time": None}
# exporter/otlpexporter/README.md + config/configgrpc ClientConfig + exporterhelper (queue, retry)
OTLP_EXPORTER: Spec = {
    "endpoint": None,
    "tls": TLS_CLIENT,
    "auth": AUTH,
    "compression": None,
    "headers": ANY,
    "timeout": None,
    "retry_on_failure": RETRY,
    "sending_queue": {"enabled": None, "num_consumers": None, "queue_size": None, "storage": None},
}
STORAGE_RETRY = RETRY
FILELOG: Spec = {  # receiver/filelogreceiver/README.md, "Configuration" table
    "include": None,
    "exclude": None,
    "exclude_older_than": None,
    "start_at": None,
    "multiline": ANY,
    "force_flush_period": None,
    "encoding": None,
    "include_file_name": None,
    "include_file_path": None,
    "include_file_name_resolved": None,
    "include_file_path_resolved": None,
    "include_file_record_number": None,
    "poll_interval": None,
    "fingerprint_size": None,
    "max_log_size": None,
    "max_concurrent_files": None,
    "attributes": ANY,
    "resource": ANY,
    "operators": "operators",
    "storage": None,
    "retry_on_failure": STORAGE_RETRY,
}
KNOWN: dict[str, dict[str, Spec]] = {
    "receivers": {
        "filelog": FILELOG,
        # receiver/journaldreceiver/README.md, "Configuration" table
        "journald": {
            "directory": None,
            "files": None,
            "start_at": None,
            "units": None,
            "identifiers": None,
            "matches": ANY,
            "priority": None,
            "grep": None,
            "dmesg": None,
            "storage": None,
            "all": None,
            "retry_on_failure": STORAGE_RETRY,
            "operators": "operators",
        },
        # receiver/otlpreceiver/README.md + configgrpc.ServerConfig / confighttp.ServerConfig
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": None, "tls": TLS_SERVER, "auth": AUTH, "max_recv_msg_size_mib": None},
                "http": {"endpoint": None, "tls": TLS_SERVER, "auth": AUTH},
            }
        },
    },
    "processors": {
        # processor/memorylimiterprocessor/README.md
        "memory_limiter": {
            "check_interval": None,
            "limit_mib": None,
            "spike_limit_mib": None,
            "limit_percentage": None,
            "spike_limit_percentage": None,
        },
        # processor/batchprocessor/README.md
        "batch": {"timeout": None, "send_batch_size": None, "send_batch_max_size": None},
        # processor/resourcedetectionprocessor/config.schema.yaml (+ internal/system config: hostname_sources)
        "resourcedetection": {
            "detectors": None,
            "override": None,
            "timeout": None,
            "refresh_interval": None,
            "system": {"hostname_sources": None, "resource_attributes": ANY},
            "env": ANY,
        },
        # processor/resourceprocessor/README.md (actions of processor/attributesprocessor)
        "resource": {"attributes": "attribute_actions"},
        # processor/k8sattributesprocessor/config.schema.yaml (+ internal/k8sconfig api_config: auth_type)
        "k8sattributes": {
            "auth_type": None,
            "passthrough": None,
            "wait_for_metadata": None,
            "wait_for_metadata_timeout": None,
            "filter": {
                "node": None,
                "node_from_env_var": None,
                "namespace": None,
                "fields": ANY,
                "labels": ANY,
            },
            "pod_association": "pod_association",
            "exclude": ANY,
            "extract": {
                "metadata": None,
                "labels": "field_extract",
                "annotations": "field_extract",
                "otel_annotations": None,
                "deployment_name_from_replicaset": None,
            },
        },
    },
    "exporters": {
        "otlp": OTLP_EXPORTER,
        # exporter/loadbalancingexporter/config.schema.yaml
        "loadbalancing": {
            "routing_key": None,
            "routing_attributes": None,
            "timeout": None,
            "retry_on_failure": RETRY,
            "sending_queue": ANY,
            "protocol": {"otlp": {k: v for k, v in OTLP_EXPORTER.items() if k != "endpoint"}},
            "resolver": {
                "static": {"hostnames": None},
                "dns": {"hostname": None, "port": None, "interval": None, "timeout": None},
                "k8s": {"service": None, "ports": None, "timeout": None, "return_hostnames": None},
                "aws_cloud_map": ANY,
            },
        },
    },
    "extensions": {
        # extension/bearertokenauthextension/config.schema.yaml
        "bearertokenauth": {
            "token": None,
            "tokens": None,
            "filename": None,
            "header": None,
            "scheme": None,
            "file_retry": {"enabled": None, "max_retries": None, "retry_interval": None},
        },
        # extension/storage/filestorage/README.md
        "file_storage": {
            "directory": None,
            "timeout": None,
            "create_directory": None,
            "fsync": None,
            "compaction": ANY,
        },
        # extension/healthcheckextension/README.md
        "health_check": {"endpoint": None, "path": None},
    },
}
# pkg/stanza/docs/operators/*.md, "Configuration Fields" tables
COMMON_OPERATOR = {"type", "id", "output", "if", "on_error"}
OPERATORS: dict[str, set[str]] = {
    "regex_parser": COMMON_OPERATOR | {"regex", "parse_from", "parse_to", "timestamp", "severity", "cache"},
    "move": COMMON_OPERATOR | {"from", "to"},
    "container": COMMON_OPERATOR
    | {"format", "add_metadata_from_filepath", "max_log_size", "parse_from", "parse_to", "severity"},
    "add": COMMON_OPERATOR | {"field", "value"},
}
ATTRIBUTE_ACTION = {"key", "value", "from_attribute", "from_context", "pattern", "action", "converted_type"}
ACTIONS = {"insert", "update", "upsert", "delete", "hash", "extract", "convert"}
FIELD_EXTRACT = {"tag_name", "key", "key_regex", "from"}


def check_fields(value: Any, spec: Any, where: str) -> list[str]:
    """Problems with `value` against `spec` (None: a leaf, ANY: free-form, a dict: known keys)."""
    if spec is None or spec is ANY:
        return []
    if isinstance(spec, str):  # lists of structured items
        items = value if isinstance(value, list) else []
        allowed = {
            "operators": None,
            "attribute_actions": ATTRIBUTE_ACTION,
            "field_extract": FIELD_EXTRACT,
            "pod_association": {"sources"},
        }[spec]
        out = []
        for i, item in enumerate(items):
            if spec == "operators":
                known = OPERATORS.get(item.get("type"))
                if known is None:
                    out.append(f"{where}[{i}]: unknown operator type {item.get('type')!r}")
                    continue
                allowed = known
            assert allowed is not None
            out += [f"{where}[{i}].{k}: not a documented field" for k in item if k not in allowed]
            if spec == "attribute_actions" and item.get("action") not in ACTIONS:
                out.append(f"{where}[{i}].action: {item.get('action')!r} is not an action")
            if spec == "pod_association":
                out += [
                    f"{where}[{i}].sources: {s}" for s in item.get("sources", []) if set(s) - {"from", "name"}
                ]
        return out
    if not isinstance(value, dict):
        return [f"{where}: expected a mapping"]
    out = []
    for key, sub in value.items():
        if key not in spec:
            out.append(f"{where}.{key}: not a documented field")
        else:
            out += check_fields(sub, spec[key], f"{where}.{key}")
    return out


def check_config(doc: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for section in ("receivers", "processors", "exporters", "extensions"):
        for name, body in (doc.get(section) or {}).items():
            kind = name.split("/", 1)[0]
            if kind not in KNOWN[section]:
                problems.append(f"{section}.{name}: unknown component {kind!r}")
                continue
            problems += check_fields(body or {}, KNOWN[section][kind], f"{section}.{name}")
    service = doc.get("service", {})
    problems += [
        f"service.extensions: {e} is not defined"
        for e in service.get("extensions", [])
        if e not in (doc.get("extensions") or {})
    ]
    for pname, pipe in service.get("pipelines", {}).items():
        if pname.split("/", 1)[0] not in ("logs", "metrics", "traces"):
            problems.append(f"service.pipelines.{pname}: not a signal")
        for section in ("receivers", "processors", "exporters"):
            problems += [
                f"service.pipelines.{pname}.{section}: {c} is not defined"
                for c in pipe.get(section, [])
                if c not in (doc.get(section) or {})
            ]
    for name, body in (doc.get("exporters") or {}).items():  # every authenticator named is defined
        auth = (body or {}).get("auth") or (body or {}).get("protocol", {}).get("otlp", {}).get("auth") or {}
        if auth and auth.get("authenticator") not in (doc.get("extensions") or {}):
            problems.append(f"exporters.{name}.auth: {auth.get('authenticator')} is not an extension")
    return problems


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_component_and_field_is_documented(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert check_config(doc) == []
    # the check is not a rubber stamp: a misspelt field and an unknown component are caught
    broken = yaml.safe_load(path.read_text())
    first = next(iter(broken["receivers"]))
    broken["receivers"][first]["include_file_paths"] = True
    broken["processors"] = {**(broken.get("processors") or {}), "no_such_processor": {}}
    assert len(check_config(broken)) == 2


def test_the_agents_tag_records_the_way_hypocenter_reads_them() -> None:
    node = yaml.safe_load((OTELCOL / "node-agent.yaml").read_text())
    job = yaml.safe_load((OTELCOL / "job-agent.yaml").read_text())
    for doc in (node, job):
        for name, body in doc["receivers"].items():
            if name.startswith("filelog"):
                assert body["include_file_path"] is True and body["include_file_record_number"] is True, name
        # secure by default: TLS with a CA and a bearer token, never `insecure`
        exp = doc["exporters"]["otlp"]
        assert "insecure" not in exp["tls"] and exp["auth"]["authenticator"].startswith("bearertokenauth")
    assert otlp.LINE_KEY == "log.file.record_number" and "log.file.path" in otlp.STREAM_KEYS
    # the workload keys the agents set are the ones the server reads
    move = node["receivers"]["filelog/slurm-jobs"]["operators"][-1]
    assert re.fullmatch(r'resource\["(.+)"\]', move["to"]).group(1) in otlp.WORKLOAD_KEYS  # type: ignore[union-attr]
    tags = [
        x["tag_name"]
        for x in node["processors"]["k8sattributes"]["extract"]["labels"]
        + node["processors"]["k8sattributes"]["extract"]["annotations"]
    ]
    assert set(tags) - {"k8s.pod.label.jobset.sigs.k8s.io/restart-attempt"} <= set(otlp.WORKLOAD_KEYS)
    assert "k8s.pod.label.jobset.sigs.k8s.io/restart-attempt" in otlp.ATTEMPT_KEYS
    keys = [a["key"] for a in job["processors"]["resource/slurm-job"]["attributes"]]
    scope_keys = {k for k, _ in otlp.SCOPE_KEYS}
    assert keys[0] in otlp.WORKLOAD_KEYS and keys[1] in otlp.ATTEMPT_KEYS and set(keys[2:]) <= scope_keys
    gateway = yaml.safe_load((OTELCOL / "gateway.yaml").read_text())
    lb = gateway["exporters"]["loadbalancing"]
    # one node's streams to one replica, the nodes spread over the replicas (not every node log on the
    # replica that the empty workload hashes to)
    assert lb["routing_key"] == "attributes" and lb["routing_attributes"] == [NODE_KEYS[0]] == ["host.name"]
    alloy = (OTELCOL / "alloy-loki.alloy").read_text()
    assert '"host" = constants.hostname' in alloy


# ------------------------------------------------------------------------------------ end to end

rotel = pytest.importorskip("rotel", reason="rotel (PyPI) is in the test extra: pip install -e '.[test]'")
AGENT = Path(rotel.__file__).parent / "rotel-agent"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expand(value: str, env: dict[str, str]) -> str:
    """The collector's ${env:NAME} / ${env:NAME:-default} expansion (confmap envprovider; the default
    syntax came with open-telemetry/opentelemetry-collector#10907)."""

    def one(m: re.Match[str]) -> str:
        return env.get(m.group(1)) or (m.group(2) or "")

    return re.sub(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", one, value)


def test_the_job_agent_tagging_gets_the_attempt_diagnosed(tmp_path: Path) -> None:
    """The example's job logs leave the node the way a filelog receiver sends them (host.name, log.file.path,
    log.file.record_number, no workload); a rotel collector adds job-agent.yaml's resource attributes,
    evaluated with the job's Slurm environment; node logs go straight in, as the node agent sends them."""
    bundle = REPO / "examples" / "nvlink-xid149"
    expected = analyze(bundle)
    ctx, node_streams, app_streams, metric_groups = plan(bundle)
    slurm_env = {
        "SLURM_JOB_ID": ctx.workload.id,
        "SLURM_JOB_NODELIST": "node[01-04]",
        "SLURM_CLUSTER_NAME": "eos",
        "SLURM_JOB_START_TIME": str(int(ctx.window.start.timestamp())),
    }  # no SLURM_RESTART_COUNT: 0
    job = yaml.safe_load((OTELCOL / "job-agent.yaml").read_text())
    attrs = {
        a["key"]: _expand(str(a["value"]), slurm_env)
        for a in job["processors"]["resource/slurm-job"]["attributes"]
    }
    assert attrs["hypocenter.workload.attempt"] == "0"
    srv = ServerProcess(tmp_path / "store.db").start()
    port = _free_port()
    log = tmp_path / "rotel.log"
    with (tmp_path / "rotel.out").open("wb") as out:
        proc = subprocess.Popen(
            [
                str(AGENT),
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{_free_port()}",
                "--exporter",
                "otlp",
                "--otlp-exporter-endpoint",
                f"http://{srv.grpc}",
                "--otlp-exporter-protocol",
                "grpc",
                "--otlp-receiver-traces-disabled",
                "--otel-resource-attributes",
                ",".join(f"{k}={v}" for k, v in attrs.items()),
                "--pid-file",
                str(tmp_path / "rotel.pid"),
                "--log-file",
                str(log),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        report = ReplayReport()
        direct, via_agent = Sender(srv.grpc, False, 30), Sender(f"127.0.0.1:{port}", False, 30)
        try:
            for stream in node_streams:
                direct.send_logs(stream, report)
            for res, series in metric_groups:
                direct.send_metrics(res, series, report)
            for stream in app_streams:  # what filelog + resourcedetection know: the host, nothing of the job
                stream.resource = {k: v for k, v in stream.resource.items() if k == "host.name"}
                via_agent.send_logs(stream, report)
            direct.send_logs(state_record(ctx), report)  # the end of the job, as the epilog's scope gives it
        finally:
            direct.close()
            via_agent.close()
        want = report.log_records
        with srv.client() as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and client.get("/readyz").json().get("log_entries") != want:
                time.sleep(0.1)
            assert client.get("/readyz").json().get("log_entries") == want, (
                log.read_text(errors="replace")[-2000:] if log.exists() else "no rotel log"
            )
            row = client.get(f"/v1/attempts/{ctx.workload.id}/0").json()
            got = client.post(f"/v1/attempts/{ctx.workload.id}/0/analyze").json()
    finally:
        proc.terminate()
        proc.wait(10)
        srv.stop()
    assert row["scope"]["nodes"] == "node[01-04]" and row["scope"]["scheduler"] == "slurm"
    assert got["attempt"]["nodes"] == expected["attempt"]["nodes"]
    assert got["attempt"]["window"]["start"] == expected["attempt"]["window"]["start"]
    assert (got["outcome"], got["root_cause"]["rule"], got["root_cause"]["nodes"]) == (
        expected["outcome"],
        expected["root_cause"]["rule"],
        expected["root_cause"]["nodes"],
    )
