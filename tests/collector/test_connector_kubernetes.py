"""KubernetesConnector against an in-memory API server (tests/kube_fake.py) holding recorded objects
(tests/fixtures/kubernetes/README.md), and its kubeconfig / in-cluster authentication."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

import pytest
from engine_support import analyze_bundle
from kube_fake import FakeKube, documents, example_logs
from resource_spies import CallersTransport, record_clients

from hypocenter.collector.bundle import load_bundle
from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy
from hypocenter.collector.connectors.kube_api import KubeAPI
from hypocenter.collector.connectors.kube_credentials import (
    Credentials,
    credentials,
    from_kubeconfig,
    in_cluster,
)
from hypocenter.collector.connectors.kubernetes import KubernetesConnector
from hypocenter.engine import default_engine
from hypocenter.sources import AttemptInput, RecordSource, TextSource

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "kubernetes"
FAST = RetryPolicy(timeout_s=5, attempts=3, backoff_s=0.0, max_backoff_s=0.0)
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)


def _connector(fake: FakeKube, ref: str, *, kueue: bool = False) -> KubernetesConnector:
    api = KubeAPI(
        Credentials(server="https://k8s.test", headers={"Authorization": "Bearer fake-token"}),
        policy=FAST,
        transport=fake.transport,
        sleep=lambda s: None,
    )
    make = KubernetesConnector.for_kueue if kueue else KubernetesConnector.for_job
    return make(ref, api=api, now=lambda: NOW)


def _example_fake(name: str) -> FakeKube:
    example = ROOT / "examples" / name
    return FakeKube(
        documents(*sorted((example / "events").glob("*.json")), *sorted((FIX / name).glob("*.json"))),
        example_logs(example),
    )


def _texts(sources: list[object]) -> list[str]:
    return [r.text for s in sources if isinstance(s, RecordSource) for r in s.records]


def _node_logs(example: Path) -> list[TextSource]:
    """The node-scoped kernel logs of an example (what the --logs DIR source would add)."""
    return [
        TextSource(name=str(p.relative_to(example)), text=p.read_text(), node=p.parent.name)
        for p in sorted((example / "logs").glob("*/*"))
        if not p.name.endswith(".log") or "kern" in p.name
    ]


def test_kueue_preemption_from_the_workload() -> None:
    fake = _example_fake("kueue-preemption")
    scope = _connector(fake, "team-b/jobset-llm-sft-5f2a1", kueue=True).scope()
    ctx = scope.context
    assert ctx.workload.model_dump() == {
        "id": "team-b/llm-sft",
        "attempt": 0,
        "name": "llm-sft",
        "scheduler": "kueue",
        "cluster": None,
    }
    assert (ctx.state, ctx.reason, ctx.exit_code) == ("PREEMPTED", "Preempted", 143)
    assert ctx.nodes == ["a3-n031", "a3-n032", "a3-n033", "a3-n034"]
    assert ctx.window.end == datetime(2026, 11, 12, 9, 41, 57, tzinfo=timezone.utc)
    names = sorted(s.name for s in scope.collected.sources if isinstance(s, TextSource))
    assert names == [
        "logs/a3-n031/llm-sft-workers-0-0-p8w2k.log",
        "logs/a3-n032/llm-sft-workers-0-1-c4xmt.log",
        "logs/a3-n033/llm-sft-workers-0-2-zq7fd.log",
        "logs/a3-n034/llm-sft-workers-0-3-h2r9v.log",
    ]
    texts = _texts(scope.collected.sources)
    assert any(
        t.startswith(
            "workload jobset-llm-sft-5f2a1 condition type=Preempted status=True reason=InCohortReclamation"
        )
        for t in texts
    )
    # events are asked per involved object: the other team's Workload events are not in scope
    assert not any("llm-pretrain-a-8d04c" in t for t in texts)
    assert all(c.status == "ok" for c in scope.collected.coverage), scope.collected.coverage
    # and the verdict is the example's
    example = ROOT / "examples" / "kueue-preemption"
    d = default_engine().analyze(
        AttemptInput(ctx, [*scope.collected.sources, *_node_logs(example)], scope.collected.coverage)
    )
    expected = analyze_bundle(example)
    assert d.root_cause is not None and expected.root_cause is not None
    assert (d.root_cause.domain, d.root_cause.subdomain) == ("external", "preemption")
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes) == (
        expected.root_cause.domain,
        expected.root_cause.subdomain,
        expected.root_cause.nodes,
    )


def test_pytorchjob_found_without_naming_its_kind() -> None:
    fake = _example_fake("hbm-ecc-xid48")
    scope = _connector(fake, "ml-team/train").scope()
    ctx = scope.context
    assert ctx.workload.id == "ml-team/train" and ctx.workload.scheduler == "kubernetes"
    assert ctx.gpus_per_node == 8  # the pods' nvidia.com/gpu limits: the GPUs a failure costs
    assert (ctx.state, ctx.reason, ctx.exit_code, ctx.workload.attempt) == (
        "FAILED",
        "PyTorchJobFailed",
        1,
        0,
    )
    assert ctx.nodes == ["h100-n07", "h100-n12", "h100-n13", "h100-n21"]
    tried = [r.url.path for r in fake.requests[:2]]
    assert tried == [
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets/train",
        "/apis/kubeflow.org/v1/namespaces/ml-team/pytorchjobs/train",
    ]
    kueue = next(c for c in scope.collected.coverage if c.source == "k8s/workload.json")
    assert (kueue.status, kueue.reason) == ("skipped", "Kueue is not installed")
    example = ROOT / "examples" / "hbm-ecc-xid48"
    d = default_engine().analyze(
        AttemptInput(ctx, [*scope.collected.sources, *_node_logs(example)], scope.collected.coverage)
    )
    expected = load_bundle(example)
    want = default_engine().analyze(expected).root_cause
    assert d.root_cause is not None and want is not None
    assert (d.root_cause.domain, d.root_cause.subdomain, d.root_cause.nodes, d.root_cause.components) == (
        want.domain,
        want.subdomain,
        want.nodes,
        want.components,
    )


def test_batch_job_with_an_oomkilled_previous_container() -> None:
    fake = FakeKube(
        documents(FIX / "oom-job" / "objects.json"),
        {
            (p.name.split(".")[0], p.name.split(".")[1], p.name.endswith(".previous.log")): p.read_text()
            for p in (FIX / "oom-job" / "logs").glob("*.log")
        },
    )
    scope = _connector(fake, "ml-team/job/finetune").scope()
    ctx = scope.context
    assert (ctx.state, ctx.reason, ctx.exit_code, ctx.workload.attempt) == (
        "FAILED",
        "BackoffLimitExceeded",
        137,
        0,
    )
    assert ctx.nodes == ["gpu-k07"]
    assert ctx.gpus_per_node is None  # its pod asks for no nvidia.com/gpu: unknown, not guessed
    assert any("1 failed pod(s) were retried" in n for n in scope.notes)
    logs = {s.name: s for s in scope.collected.sources if isinstance(s, TextSource)}
    assert sorted(logs) == [
        "logs/gpu-k07/finetune-x7k2p.log",
        "logs/gpu-k07/finetune-x7k2p.metrics-sidecar.log",
        "logs/gpu-k07/finetune-x7k2p.previous.log",
    ]
    assert "collating batch 1201" in str(logs["logs/gpu-k07/finetune-x7k2p.previous.log"].text)
    assert logs["logs/gpu-k07/finetune-x7k2p.log"].node == "gpu-k07"
    log_requests = [dict(r.url.params) for r in fake.requests if r.url.path.endswith("/log")]
    assert {"container": "trainer", "timestamps": "true", "previous": "true"} in log_requests
    texts = _texts(scope.collected.sources)
    assert "k8s container finetune-x7k2p/trainer terminated reason=OOMKilled exit_code=137 signal=0" in texts
    assert any(
        t.startswith("k8s event type=Warning reason=BackoffLimitExceeded object=Job/finetune") for t in texts
    )
    d = default_engine().analyze(AttemptInput(ctx, scope.collected.sources, scope.collected.coverage))
    assert d.root_cause is not None and d.root_cause.domain == "resource"


def test_unknown_job_is_not_found_and_refs_are_checked() -> None:
    fake = _example_fake("hbm-ecc-xid48")
    with pytest.raises(
        ConnectorError, match="no JobSet / PyTorchJob / Job named nope in namespace ml-team"
    ) as err:
        _connector(fake, "ml-team/nope").scope()
    assert err.value.kind == "not_found"
    for bad in ("train", "a/b/c/d", "ml-team/deployment/x", "/x"):
        with pytest.raises(ConnectorError, match="expected NAMESPACE/NAME"):
            KubernetesConnector.for_job(bad)


def test_http_errors_are_classified_and_transient_ones_retried() -> None:
    fake = _example_fake("hbm-ecc-xid48")
    fake.fail["/apis/kubeflow.org/v1/namespaces/ml-team/pytorchjobs/train"] = [503, 429]
    scope = _connector(fake, "ml-team/pytorchjob/train").scope()
    assert scope.context.state == "FAILED"
    fake = _example_fake("hbm-ecc-xid48")
    fake.fail["/apis/kubeflow.org/v1/namespaces/ml-team/pytorchjobs/train"] = [503, 503, 503]
    with pytest.raises(ConnectorError, match="gave up after 3 tries") as err:
        _connector(fake, "ml-team/pytorchjob/train").scope()
    assert err.value.kind == "transient"
    fake = _example_fake("hbm-ecc-xid48")
    fake.token = "another"
    with pytest.raises(ConnectorError, match="HTTP 401") as err:
        _connector(fake, "ml-team/train").scope()
    assert err.value.kind == "auth"


def test_a_failing_log_or_event_query_only_lowers_coverage() -> None:
    fake = _example_fake("hbm-ecc-xid48")
    fake.fail["/api/v1/namespaces/ml-team/pods/train-worker-1/log"] = [403]
    fake.fail["/api/v1/namespaces/ml-team/events"] = [500, 500, 500]
    fake.fail["/api/v1/nodes/h100-n13"] = [403]
    scope = _connector(fake, "ml-team/train").scope()
    cov = {c.source: c for c in scope.collected.coverage}
    assert len(cov) == len(scope.collected.coverage), "a source with two coverage entries"
    assert cov["logs/h100-n13/train-worker-1.log"].status == "failed"
    assert cov["k8s/events.json"].status == "partial" and "HTTP 500" in (cov["k8s/events.json"].reason or "")
    assert cov["k8s/nodes.json"].status == "partial" and "h100-n13: " in (cov["k8s/nodes.json"].reason or "")
    assert cov["logs/h100-n21/train-worker-2.log"].status == "ok"


# ------------------------------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=k8s.test",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return {"cert": (d / "cert.pem").read_bytes(), "key": (d / "key.pem").read_bytes()}


def _kubeconfig(tmp_path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "prod",
        "clusters": [{"name": "c1", "cluster": {"server": "https://k8s.test:6443", **(cluster or {})}}],
        "users": [{"name": "u1", "user": user}, {"name": "u2", "user": {"token": "second"}}],
        "contexts": [
            {"name": "prod", "context": {"cluster": "c1", "user": "u1", "namespace": "ml-team"}},
            {"name": "other", "context": {"cluster": "c1", "user": "u2"}},
        ],
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def test_kubeconfig_token_context_and_ca_data(tmp_path: Path, pki: dict[str, bytes]) -> None:
    path = _kubeconfig(
        tmp_path, {"token": "abc"}, {"certificate-authority-data": base64.b64encode(pki["cert"]).decode()}
    )
    creds = from_kubeconfig(path)
    assert (creds.server, creds.headers, creds.namespace) == (
        "https://k8s.test:6443",
        {"Authorization": "Bearer abc"},
        "ml-team",
    )
    assert creds.ca_data == pki["cert"]
    assert creds.ssl_context().verify_mode.name == "CERT_REQUIRED"
    assert from_kubeconfig(path, "other").headers == {"Authorization": "Bearer second"}
    with pytest.raises(ConnectorError, match="no context named 'nope'") as err:
        from_kubeconfig(path, "nope")
    assert err.value.kind == "auth"


def test_kubeconfig_client_certificate_files_token_file_and_insecure(
    tmp_path: Path, pki: dict[str, bytes]
) -> None:
    (tmp_path / "client.crt").write_bytes(pki["cert"])
    (tmp_path / "client.key").write_bytes(pki["key"])
    (tmp_path / "ca.crt").write_bytes(pki["cert"])
    (tmp_path / "token").write_text("from-file\n")
    path = _kubeconfig(
        tmp_path,
        {"client-certificate": "client.crt", "client-key": "client.key", "tokenFile": "token"},
        {"certificate-authority": "ca.crt"},
    )
    creds = from_kubeconfig(path)
    assert creds.client_cert == pki["cert"] and creds.client_key == pki["key"]
    assert creds.headers == {"Authorization": "Bearer from-file"}
    creds.ssl_context()  # loads the client certificate and the CA
    insecure = from_kubeconfig(
        _kubeconfig(
            tmp_path,
            {
                "client-certificate-data": base64.b64encode(pki["cert"]).decode(),
                "client-key-data": base64.b64encode(pki["key"]).decode(),
            },
            {"insecure-skip-tls-verify": True},
        )
    )
    assert insecure.ssl_context().verify_mode.name == "CERT_NONE"


@pytest.mark.parametrize(
    ("user", "cluster", "what"),
    [
        (
            {"token": "abc"},
            {"certificate-authority-data": base64.b64encode(b"not a certificate").decode()},
            "certificate-authority",
        ),
        (
            {
                "client-certificate-data": base64.b64encode(b"no").decode(),
                "client-key-data": base64.b64encode(b"no").decode(),
            },
            {},
            "client certificate and key",
        ),
    ],
)
def test_a_certificate_that_is_no_pem_is_an_auth_error(
    user: dict[str, object], cluster: dict[str, object], what: str, tmp_path: Path
) -> None:
    creds = from_kubeconfig(_kubeconfig(tmp_path, user, cluster))
    with pytest.raises(
        ConnectorError, match=re.escape(f"kubeconfig {tmp_path / 'config'} context prod: {what}: ")
    ) as err:
        creds.ssl_context()
    assert err.value.kind == "auth"


def test_kubeconfig_exec_plugin(tmp_path: Path) -> None:
    seen: list[tuple[list[str], Mapping[str, str]]] = []

    def run(argv: list[str], env: Mapping[str, str]) -> str:
        seen.append((argv, env))
        return json.dumps(
            {
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {"token": "exec-token", "expirationTimestamp": "2026-12-03T00:00:00Z"},
            }
        )

    path = _kubeconfig(
        tmp_path,
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "get-token",
                "args": ["--cluster", "c1"],
                "env": [{"name": "REGION", "value": "eu"}],
            }
        },
    )
    assert from_kubeconfig(path, run=run).headers == {"Authorization": "Bearer exec-token"}
    assert seen[0][0] == ["get-token", "--cluster", "c1"] and seen[0][1]["REGION"] == "eu"


def test_kubeconfig_basic_auth(tmp_path: Path) -> None:
    creds = from_kubeconfig(_kubeconfig(tmp_path, {"username": "admin", "password": "s3cret"}))
    assert creds.headers == {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}


def test_a_server_that_is_no_url_is_an_auth_error(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"token": "abc"}, {"server": "k8s.test:6443"})
    with pytest.raises(
        ConnectorError, match=re.escape("server 'k8s.test:6443' is not an https:// URL")
    ) as err:
        from_kubeconfig(path)  # not a request that fails alike four times, as if the server were down
    assert err.value.kind == "auth"


def test_a_failing_exec_plugin_says_how_it_failed(tmp_path: Path) -> None:
    path = _kubeconfig(
        tmp_path, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}}
    )
    with pytest.raises(ConnectorError, match=r"exec plugin false: exit status 1$") as err:
        from_kubeconfig(path)  # the real command: it prints nothing
    assert err.value.kind == "auth"


def test_bad_kubeconfig_is_a_clear_auth_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: [\n")
    with pytest.raises(ConnectorError, match="kubeconfig") as err:
        from_kubeconfig(path)
    assert err.value.kind == "auth"


def test_in_cluster_service_account(tmp_path: Path, pki: dict[str, bytes]) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes(pki["cert"])
    (sa / "namespace").write_text("team-b")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOME": str(tmp_path)}
    creds = credentials(env=env, service_account=sa)
    assert (creds.server, creds.headers["Authorization"], creds.namespace, creds.origin) == (
        "https://10.96.0.1:443",
        "Bearer sa-token",
        "team-b",
        "in-cluster",
    )
    assert in_cluster({}, sa) is None


def test_a_rotated_service_account_token_is_read_again_on_a_401(tmp_path: Path) -> None:
    """The kubelet rewrites a projected token before the old one expires; a long-running server (its
    Kueue poll) must go on with the new one, not fail with `auth` for the rest of its life."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("first-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOME": str(tmp_path)}
    fake = _example_fake("hbm-ecc-xid48")
    fake.token = "first-token"
    api = KubeAPI(
        credentials(env=env, service_account=sa), policy=FAST, transport=fake.transport, sleep=lambda s: None
    )
    scope = KubernetesConnector.for_job("ml-team/train", api=api, now=lambda: NOW).scope
    assert scope().context.state == "FAILED"
    (sa / "token").write_text("second-token\n")  # rotated, and the first one has expired
    fake.token = "second-token"
    assert scope().context.state == "FAILED"
    fake.token = (
        "a-token-nobody-has"  # a 401 the credentials cannot cure stays an auth error, asked once more at most
    )
    before = len(fake.requests)
    with pytest.raises(ConnectorError, match="HTTP 401") as err:
        scope()
    assert err.value.kind == "auth" and len(fake.requests) - before == 1


def test_credentials_order_and_nothing_found(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"token": "from-env"})
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{path}", "HOME": str(tmp_path)}
    assert credentials(env=env, service_account=tmp_path / "none").headers == {
        "Authorization": "Bearer from-env"
    }
    with pytest.raises(ConnectorError, match="no Kubernetes credentials") as err:
        credentials(env={"HOME": str(tmp_path / "empty")}, service_account=tmp_path / "none")
    assert err.value.kind == "auth"


def test_the_connector_sends_the_kubeconfig_token(tmp_path: Path) -> None:
    fake = _example_fake("hbm-ecc-xid48")
    fake.token = "abc"
    path = _kubeconfig(tmp_path, {"token": "abc"})
    scope = KubernetesConnector.for_job(
        "ml-team/train", kubeconfig=path, transport=fake.transport, policy=FAST, now=lambda: NOW
    ).scope()
    assert scope.context.state == "FAILED"
    assert {r.url.host for r in fake.requests} == {"k8s.test"}


def test_the_connector_closes_the_api_client_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _example_fake("hbm-ecc-xid48")
    fake.token = "abc"
    transport = CallersTransport(fake.handle)
    opened = record_clients(monkeypatch)
    connector = KubernetesConnector.for_job(
        "ml-team/train",
        kubeconfig=_kubeconfig(tmp_path, {"token": "abc"}),
        transport=transport,
        policy=FAST,
        now=lambda: NOW,
    )
    assert connector.scope().context == connector.scope().context  # a connector serves many scopes
    fake.objects.clear()  # the job is gone: the scope raises, and still closes its client
    with pytest.raises(ConnectorError):
        connector.scope()
    assert len(opened) == 3 and all(c.is_closed for c in opened)
    assert not transport.closed


def test_a_callers_kubeapi_and_transport_stay_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _example_fake("hbm-ecc-xid48")
    transport = CallersTransport(fake.handle)
    opened = record_clients(monkeypatch)
    api = KubeAPI(
        Credentials(server="https://k8s.test", headers={"Authorization": "Bearer fake-token"}),
        policy=FAST,
        transport=transport,
    )
    connector = KubernetesConnector.for_job("ml-team/train", api=api, now=lambda: NOW)
    first = connector.scope()
    api.close()
    assert not transport.closed  # the caller's, whoever closes what
    with api:  # the caller's block: the scopes inside it neither open nor close connections
        second, third = connector.scope(), connector.scope()
        assert not opened[-1].is_closed
    assert first.context == second.context == third.context
    assert len(opened) == 2 and all(c.is_closed for c in opened) and not transport.closed
    with pytest.raises(RuntimeError, match="outside `with api:`"):
        api.get("/api/v1/nodes", what="nodes")
