"""deploy/systemd/hypocenter.service passes `systemd-analyze verify` with no warning (an unknown or
misspelt directive is only a warning there, so any output fails the test), and its hardening keeps
`systemd-analyze security --offline` at an "OK" exposure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "hypocenter.service"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian package systemd; .ci/run installs it)"
)


def _installed(tmp_path: Path, text: str) -> Path:
    """The unit with ExecStart pointing at this environment's `hypocenter` (verify checks it is executable)."""
    exe = shutil.which("hypocenter") or str(Path(sys.executable).with_name("hypocenter"))
    unit = tmp_path / "hypocenter.service"
    unit.write_text(text.replace("/opt/hypocenter/bin/hypocenter", exe))
    return unit


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_unit_verifies_cleanly(tmp_path: Path) -> None:
    text = UNIT.read_text()
    r = _verify(_installed(tmp_path, text))
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    # the check sees a misspelt directive (so a clean run above means something)
    bad = _verify(_installed(tmp_path, text.replace("ProtectHome=yes", "ProtectHomes=yes")))
    assert "ProtectHomes" in bad.stdout + bad.stderr
    for needed in (
        "EnvironmentFile=/etc/hypocenter/hypocenter.env",
        "StateDirectory=hypocenter",
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ):
        assert needed in text, needed


def test_the_unit_is_hardened(tmp_path: Path) -> None:
    assert ANALYZE is not None
    r = subprocess.run(
        [ANALYZE, "security", "--offline=yes", str(_installed(tmp_path, UNIT.read_text()))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    m = re.search(r"Overall exposure level for hypocenter.service: ([0-9.]+)", r.stdout)
    assert m is not None, r.stdout[-1000:] + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout
