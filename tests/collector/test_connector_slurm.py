"""SlurmConnector against recorded sacct / scontrol / squeue output of several Slurm releases
(tests/fixtures/slurm/README.md says where each came from) and a faked slurmrestd."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from resource_spies import CallersTransport, record_clients

from hypocenter.collector.connectors.base import ConnectorError, RetryPolicy
from hypocenter.collector.connectors.slurm import JobRef, SlurmConnector, classify, run_command
from hypocenter.sources import RecordSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
FAST = RetryPolicy(timeout_s=5, attempts=3, backoff_s=0.01, max_backoff_s=0.01)
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


class Replay:
    """A runner that answers Slurm commands from a fixture directory, and counts the calls."""

    def __init__(self, root: Path, *, fail: dict[str, list[ConnectorError]] | None = None) -> None:
        self.root = root
        self.calls: list[list[str]] = []
        self.fail = fail or {}

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        argv = list(argv)
        self.calls.append(argv)
        queue = self.fail.get(argv[0])
        if queue:
            raise queue.pop(0)
        answer = self._answer(argv)
        if answer is None:
            raise classify(argv[0], "slurm_load_jobs error: Invalid job id specified")
        return answer

    def _answer(self, argv: list[str]) -> str | None:
        name = None
        if argv[0] == "sacct":
            name = f"sacct-{argv[argv.index('-j') + 1]}.json"
        elif argv[0] == "scontrol" and argv[1:3] == ["show", "job"]:
            name = f"scontrol-job-{argv[3]}.json"
        elif argv[0] == "scontrol" and argv[1:3] == ["show", "node"]:
            files = sorted(self.root.glob("scontrol-node-*.json"))
            return (
                json.dumps({"nodes": [n for p in files for n in json.loads(p.read_text())["nodes"]]})
                if files
                else None
            )
        path = self.root / name if name else None
        return path.read_text() if path is not None and path.is_file() else None


def _scope(version: str, job: str, runner: Replay | None = None) -> tuple[SlurmConnector, Replay]:
    runner = runner or Replay(FIXTURES / version)
    return SlurmConnector(job, runner=runner, policy=FAST, sleep=lambda s: None, now=lambda: NOW), runner


def _texts(scope_sources: list[object]) -> list[str]:
    return [r.text for s in scope_sources if isinstance(s, RecordSource) for r in s.records]


@pytest.mark.parametrize("version", ["23.02", "23.11", "24.05", "25.05"])
def test_each_release_gives_the_example_attempt(version: str) -> None:
    connector, runner = _scope(version, "81234")
    scope = connector.scope()
    ctx = scope.context
    assert ctx.workload.model_dump() == {
        "id": "81234",
        "attempt": 0,
        "name": "llama-pretrain",
        "scheduler": "slurm",
        "cluster": "eos",
    }
    assert ctx.window.start == datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)
    assert ctx.window.end == datetime(2026, 11, 2, 11, 2, tzinfo=timezone.utc)
    assert (ctx.state, ctx.exit_code, ctx.reason) == ("FAILED", 1, "NonZeroExitCode")
    assert ctx.nodes == ["node01", "node02", "node03", "node04"]
    texts = _texts(scope.collected.sources)
    assert texts[:4] == [
        "slurm job 81234 state=FAILED reason=NonZeroExitCode exit_code=1:0 nodes=node[01-04]",
        "slurm step 81234.batch state=FAILED exit_code=1:0 nodes=node01",
        "slurm step 81234.extern state=COMPLETED exit_code=0:0 nodes=node[01-04]",
        "slurm step 81234.0 state=FAILED exit_code=1:0 nodes=node[01-04]",
    ]
    assert [t for t in texts if t.startswith("slurm node")] == [
        f"slurm node node0{i} state=IDLE reason=-" for i in range(1, 5)
    ]
    assert {(c.source, c.status) for c in scope.collected.coverage} == {
        ("slurm/sacct-81234.json", "ok"),
        ("slurm/scontrol-job-81234.json", "ok"),
        ("slurm/nodes-81234.json", "ok"),
    }
    assert runner.calls[0] == ["sacct", "--json", "--duplicates", "-j", "81234"]
    assert ["scontrol", "show", "job", "81234", "--json"] in runner.calls


class Slurm2205(Replay):
    """Slurm 22.05 as captured: scontrol has no --json (squeue has), node output is text."""

    def __init__(self, sacct: str | None, squeue: str = "squeue-job.json") -> None:
        super().__init__(FIXTURES / "22.05")
        self.sacct, self.squeue = sacct, squeue
        self.node_text = "scontrol-node.txt"

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "sacct":
            if self.sacct is None:
                raise classify("sacct", "Slurm accounting storage is disabled")
            return (self.root / self.sacct).read_text()
        if argv[0] == "scontrol" and "--json" in argv:
            raise classify("scontrol", "scontrol: unrecognized option '--json'")
        if argv[0] == "squeue":
            return (self.root / self.squeue).read_text()
        if argv[:3] == ["scontrol", "show", "node"]:
            return (self.root / self.node_text).read_text()
        raise AssertionError(argv)


def test_slurm_2205_captured_job_uses_squeue_and_scontrol_text() -> None:
    runner = Slurm2205("sacct-job.json")
    scope = SlurmConnector("3", runner=runner, policy=FAST, now=lambda: NOW).scope()
    ctx = scope.context
    # dbv0.0.38 sacct says exit 0 for this failed job; the controller's raw status 256 is exit 1.
    assert (ctx.state, ctx.exit_code, ctx.reason, ctx.nodes) == ("FAILED", 1, "NonZeroExitCode", ["vm"])
    assert ctx.workload.cluster == "hyp" and ctx.workload.name == "fail.sh"
    assert ["squeue", "--json", "--states=all", "--jobs", "3"] in runner.calls
    texts = _texts(scope.collected.sources)
    assert "slurm step 3.batch state=FAILED exit_code=0:0 nodes=vm" in texts
    assert "slurm node vm state=IDLE reason=-" in texts


def test_slurm_2205_without_accounting_still_scopes_from_the_controller() -> None:
    scope = SlurmConnector("3", runner=Slurm2205(None), policy=FAST, now=lambda: NOW).scope()
    assert (scope.context.state, scope.context.exit_code) == ("FAILED", 1)
    sacct = next(c for c in scope.collected.coverage if c.source == "slurm/sacct-3.json")
    assert sacct.status == "failed" and "accounting storage is disabled" in (sacct.reason or "")
    assert "slurm job 3 state=FAILED reason=NonZeroExitCode exit_code=1:0 nodes=vm" in _texts(
        scope.collected.sources
    )


def test_slurm_2205_requeued_job_analyses_the_attempt_that_ran() -> None:
    scope = SlurmConnector(
        "2", runner=Slurm2205("sacct-requeued.json", "squeue-requeued.json"), policy=FAST, now=lambda: NOW
    ).scope()
    ctx = scope.context
    assert ctx.workload.attempt == 0 and ctx.state == "REQUEUED" and ctx.nodes == ["vm"]
    assert any("has not started" in n for n in scope.notes)


def test_requeued_job_attempt_is_the_requeue_count() -> None:
    connector, _ = _scope("25.05", "90004")
    scope = connector.scope()
    ctx = scope.context
    assert ctx.workload.attempt == 1
    assert (ctx.state, ctx.exit_code) == ("FAILED", 1)
    assert ctx.nodes == ["gpu-c01", "gpu-c03", "gpu-c04"]
    assert ctx.window.start == datetime.fromtimestamp(1793613600 + 2600, tz=timezone.utc)
    texts = _texts(scope.collected.sources)
    assert sum(t.startswith("slurm job 90004 ") for t in texts) == 1  # only the analysed instance
    assert not any("gpu-c02" in t for t in texts if t.startswith("slurm node"))
    assert any("requeued 1 time" in n for n in scope.notes)


def test_array_task_and_bare_array_id() -> None:
    connector, _ = _scope("23.11", "90001_7")
    ctx = connector.scope().context
    assert ctx.workload.id == "90001_7"
    assert (ctx.state, ctx.exit_code, ctx.reason, ctx.nodes) == (
        "OUT_OF_MEMORY",
        137,
        "OutOfMemory",
        ["gpu-a02"],
    )
    connector, _ = _scope("23.11", "90001")
    with pytest.raises(
        ConnectorError, match=r"job array \(2 tasks: 90001_5, 90001_7\): name one task"
    ) as err:
        connector.scope()
    assert err.value.kind == "permanent"


def test_heterogeneous_job_and_component() -> None:
    connector, _ = _scope("24.05", "90002")
    ctx = connector.scope().context
    assert ctx.nodes == ["gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04"]
    assert (ctx.state, ctx.exit_code) == ("FAILED", 137)  # the killed component, not the cancelled one
    connector, _ = _scope("24.05", "90002+1")
    scope = connector.scope()
    assert scope.context.nodes == ["gpu-b03", "gpu-b04"]
    assert _texts(scope.collected.sources)[0].startswith("slurm job 90002+1 state=FAILED")


@pytest.mark.parametrize("text", ["81234", "81234_7", "81234+1"])
def test_job_ids(text: str) -> None:
    assert JobRef.parse(text).text == text


@pytest.mark.parametrize("text", ["", "abc", "81234.0", "81234_", "81234_7+1", "-1"])
def test_bad_job_ids_are_refused(text: str) -> None:
    with pytest.raises(ConnectorError, match="is not a Slurm job id") as err:
        SlurmConnector(text)
    assert err.value.kind == "permanent"


def test_unknown_job_is_not_found() -> None:
    connector, _ = _scope("24.05", "424242")
    with pytest.raises(ConnectorError, match="not found") as err:
        connector.scope()
    assert err.value.kind == "not_found"


def _answering(docs: dict[str, str]) -> Callable[[Sequence[str], float], str]:
    """A runner whose sacct, scontrol show job and scontrol show node print the given documents."""

    def run(argv: Sequence[str], timeout: float) -> str:
        which = "node" if list(argv[1:3]) == ["show", "node"] else argv[0]
        return docs[which]

    return run


@pytest.mark.parametrize(
    ("sacct", "scontrol", "kind"),
    [
        ('{"jobs": "x"}', '{"jobs": "x"}', "permanent"),  # neither answer is a list of jobs: not understood
        ('{"jobs": 5}', '{"meta": {}}', "permanent"),
        ('{"jobs": [7]}', '{"jobs": [null]}', "permanent"),
        ('{"jobs": []}', '{"jobs": []}', "not_found"),  # well-formed, without the job
        (
            '{"jobs": "x"}',
            '{"jobs": [{"job_id": 1, "name": "other"}]}',
            "not_found",
        ),  # one source says: no such job
    ],
)
def test_answers_without_the_job(sacct: str, scontrol: str, kind: str) -> None:
    runner = _answering({"sacct": sacct, "scontrol": scontrol})
    with pytest.raises(ConnectorError) as err:
        SlurmConnector("81234", runner=runner, policy=FAST, sleep=lambda s: None).scope()
    assert err.value.kind == kind, err.value
    if kind == "permanent":
        assert "answer not understood" in str(err.value)


def test_an_answer_not_understood_beside_the_job_is_a_failed_source() -> None:
    f = FIXTURES / "24.05"
    runner = _answering(
        {"sacct": (f / "sacct-81234.json").read_text(), "scontrol": '{"jobs": "x"}', "node": '{"nodes": 5}'}
    )
    scope = SlurmConnector("81234", runner=runner, policy=FAST, now=lambda: NOW).scope()
    status = {c.source: (c.status, c.reason) for c in scope.collected.coverage}
    assert status["slurm/sacct-81234.json"][0] == "ok"
    for source in ("slurm/scontrol-job-81234.json", "slurm/nodes-81234.json"):
        assert status[source][0] == "failed" and "answer not understood" in (status[source][1] or ""), status


def test_missing_binaries_are_a_clear_permanent_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConnectorError) as err:
        run_command(["sacct", "--json"], 5)
    assert (
        str(err.value) == "sacct not found on PATH: install Slurm's client commands or use --slurm-rest URL"
    )
    assert err.value.kind == "permanent"
    with pytest.raises(ConnectorError, match="sacct not found on PATH") as err:
        SlurmConnector("81234", policy=FAST).scope()
    assert err.value.kind == "permanent"


def test_a_timeout_is_transient(tmp_path: Path) -> None:
    slow = tmp_path / "sacct"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    with pytest.raises(ConnectorError, match=r"did not answer within 0\.2 s") as err:
        run_command([str(slow)], 0.2)
    assert err.value.kind == "transient"


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("sacct: error: Problem talking to the database: Connection refused", "transient"),
        ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", "transient"),
        ("slurm_load_jobs error: Socket timed out on send/recv operation", "transient"),
        ("slurm_load_jobs error: Invalid job id specified", "not_found"),
        ("Slurm accounting storage is disabled", "permanent"),
    ],
)
def test_error_classification(message: str, kind: str) -> None:
    assert classify("x", message).kind == kind


def test_transient_errors_are_retried() -> None:
    down = ConnectorError("scontrol: Unable to contact slurm controller", kind="transient")
    sleeps: list[float] = []
    runner = Replay(FIXTURES / "24.05", fail={"scontrol": [down, down]})
    scope = SlurmConnector("81234", runner=runner, policy=FAST, sleep=sleeps.append, now=lambda: NOW).scope()
    assert scope.context.state == "FAILED"
    assert (
        sum(c[:3] == ["scontrol", "show", "job"] for c in runner.calls) == 3
    )  # two refusals, then the answer
    assert len(sleeps) == 2


def test_controller_down_and_accounting_down_is_transient() -> None:
    down = [ConnectorError("Unable to contact slurm controller", kind="transient") for _ in range(6)]
    db = [ConnectorError("Problem talking to the database", kind="transient") for _ in range(6)]
    runner = Replay(FIXTURES / "24.05", fail={"scontrol": down, "sacct": db})
    with pytest.raises(ConnectorError, match="gave up after 3 tries") as err:
        SlurmConnector("81234", runner=runner, policy=FAST, sleep=lambda s: None).scope()
    assert err.value.kind == "transient"


def test_node_query_failure_only_lowers_coverage() -> None:
    runner = Replay(FIXTURES / "24.05")
    original = runner._answer
    runner._answer = lambda argv: None if argv[1:3] == ["show", "node"] else original(argv)  # type: ignore[method-assign]
    scope = SlurmConnector("81234", runner=runner, policy=FAST, now=lambda: NOW).scope()
    nodes = next(c for c in scope.collected.coverage if c.source == "slurm/nodes-81234.json")
    assert nodes.status == "failed" and "drain reasons not read" in (nodes.reason or "")


# ------------------------------------------------------------------------------------ slurmrestd


def _rest(routes: dict[str, tuple[int, str]], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, body = routes.get(request.url.path, (404, "Not Found"))
        return httpx.Response(status, text=body)

    return httpx.MockTransport(handler)


def test_slurmrestd_is_the_same_scope() -> None:
    f = FIXTURES / "24.05"
    routes = {
        "/slurmdb/v0.0.41/job/81234": (200, (f / "sacct-81234.json").read_text()),
        "/slurm/v0.0.41/job/81234": (200, (f / "scontrol-job-81234.json").read_text()),
        "/slurm/v0.0.41/nodes": (200, (f / "scontrol-node-81234.json").read_text()),
    }
    seen: list[httpx.Request] = []
    rest = SlurmConnector(
        "81234",
        rest_url="http://slurm:6820/",
        rest_token="jwt-abc",
        policy=FAST,
        transport=_rest(routes, seen),
        now=lambda: NOW,
    ).scope()
    cli = _scope("24.05", "81234")[0].scope()
    assert rest.context == cli.context
    assert _texts(rest.collected.sources) == _texts(cli.collected.sources)
    assert all(r.headers["X-SLURM-USER-TOKEN"] == "jwt-abc" for r in seen)


def test_slurmrestd_api_version_is_found() -> None:
    f = FIXTURES / "25.05"
    routes = {
        "/slurmdb/v0.0.43/job/90004": (200, (f / "sacct-90004.json").read_text()),
        "/slurm/v0.0.43/job/90004": (200, (f / "scontrol-job-90004.json").read_text()),
        "/slurm/v0.0.43/nodes": (200, (f / "scontrol-node-90004.json").read_text()),
    }
    seen: list[httpx.Request] = []
    scope = SlurmConnector(
        "90004",
        rest_url="http://slurm:6820",
        rest_token="t",
        policy=FAST,
        transport=_rest(routes, seen),
        now=lambda: NOW,
    ).scope()
    assert scope.context.workload.attempt == 1
    tried = [r.url.path for r in seen]
    assert tried[:3] == [
        "/slurmdb/v0.0.41/job/90004",
        "/slurmdb/v0.0.42/job/90004",
        "/slurmdb/v0.0.43/job/90004",
    ]
    assert "/slurm/v0.0.41/job/90004" not in tried  # the version that answered is kept


def test_slurmrestd_refusal_is_an_auth_error() -> None:
    routes = dict.fromkeys(
        ("/slurmdb/v0.0.41/job/81234", "/slurm/v0.0.41/job/81234"), (401, "Authentication failure")
    )
    with pytest.raises(ConnectorError, match="SLURM_JWT") as err:
        SlurmConnector(
            "81234", rest_url="http://slurm:6820", policy=FAST, transport=_rest(routes, [])
        ).scope()
    assert err.value.kind == "auth"


def test_slurmrestd_unknown_job() -> None:
    body = json.dumps({"jobs": [], "errors": [{"error": "Invalid job id specified", "error_number": 2017}]})
    routes = {"/slurmdb/v0.0.41/job/5": (200, body), "/slurm/v0.0.41/job/5": (500, body)}
    with pytest.raises(ConnectorError) as err:
        SlurmConnector("5", rest_url="http://slurm:6820", policy=FAST, transport=_rest(routes, [])).scope()
    assert err.value.kind == "not_found"


def test_slurmrestd_connections_live_for_one_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client is closed when scope() returns or raises; the caller's transport stays open and
    serves the next scope (base.py, "Resources")."""
    f = FIXTURES / "24.05"
    routes = {
        "/slurmdb/v0.0.41/job/81234": (200, (f / "sacct-81234.json").read_text()),
        "/slurm/v0.0.41/job/81234": (200, (f / "scontrol-job-81234.json").read_text()),
        "/slurm/v0.0.41/nodes": (200, (f / "scontrol-node-81234.json").read_text()),
    }
    transport = CallersTransport(_rest(routes, []).handler)
    opened = record_clients(monkeypatch)
    connector = SlurmConnector(
        "81234",
        rest_url="http://slurm:6820",
        rest_token="t",
        policy=FAST,
        transport=transport,
        now=lambda: NOW,
    )
    assert connector.scope().context == connector.scope().context
    with pytest.raises(ConnectorError):
        SlurmConnector("5", rest_url="http://slurm:6820", policy=FAST, transport=transport).scope()
    assert len(opened) == 3 and all(c.is_closed for c in opened)
    assert not transport.closed


def test_a_host_without_slurm_configuration_gets_a_hint() -> None:
    from hypocenter.collector.connectors.slurm import classify

    err = classify(
        "sacct",
        "sacct: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
        "sacct: error: fetch_config: DNS SRV lookup failed\n"
        "sacct: fatal: Could not establish a configuration source",
    )
    assert err.kind == "permanent" and "SLURM_CONF" in str(err) and "res_nsearch" not in str(err)


@pytest.mark.parametrize("version", ["22.05", "23.02", "23.11", "24.05", "25.05"])
def test_each_release_gives_the_task_layout_of_the_main_step(version: str) -> None:
    runner = Slurm2205("sacct-81234.json", "squeue-81234.json") if version == "22.05" else None
    if runner is not None:
        runner.node_text = "scontrol-node-81234.txt"
    connector, _ = _scope(version, "81234", runner)
    scope = connector.scope()
    # step 81234.0 (torchrun): 4 tasks, one per node; batch and extern are not the job's ranks
    assert scope.tasks == {"node01": [0], "node02": [1], "node03": [2], "node04": [3]}
    assert (scope.context.state, scope.context.exit_code, scope.context.nodes) == (
        "FAILED",
        1,
        ["node01", "node02", "node03", "node04"],
    )
    assert scope.context.workload.cluster == "eos"
