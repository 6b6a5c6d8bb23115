"""tests/ mirrors the package: each test file lives where scripts/test-home says, so a file another
branch adds flat is caught here and re-homed with `scripts/test-home --move`."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS.parent / "scripts" / "test-home"


def _test_home() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("test_home", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("test_home", loader))
    loader.exec_module(module)
    return module


def test_every_flat_test_file_is_one_that_belongs_at_the_top() -> None:
    home = _test_home().home
    misplaced = [
        f"{f.name} -> tests/{home(f.name, f.read_text())}"
        for f in sorted(TESTS.glob("test_*.py"))
        if home(f.name, f.read_text()) != f.name
    ]
    assert misplaced == [], "run scripts/test-home --move on these"


def test_test_files_sit_in_the_package_folders_only() -> None:
    folders = set(_test_home().FOLDERS)
    stray = [
        str(f.relative_to(TESTS))
        for f in TESTS.glob("*/**/test_*.py")
        if f.relative_to(TESTS).parts[0] not in folders
    ]
    assert [p for p in stray if not p.startswith("fixtures/")] == []


def test_every_moved_file_is_at_its_home() -> None:
    homes = _test_home().HOMES
    assert [old for old, new in homes.items() if not (TESTS / new).is_file()] == []


def test_the_script_names_the_home_of_an_old_or_a_new_flat_file(tmp_path: Path) -> None:
    new = tmp_path / "test_quarantine_release.py"
    new.write_text(
        "from hypocenter.server.quarantine import x\nfrom hypocenter.store.base import y\n"
        "from hypocenter.server.service import z\n"
    )
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "tests/test_wording.py", "tests/test_store_migrations.py", str(new)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.splitlines() == [
        "tests/test_lineformat_headers.py",
        "tests/store/test_store_migrations.py",
        "tests/server/test_quarantine_release.py",
    ]


def test_a_moved_file_still_finds_the_repository_and_the_fixtures() -> None:
    mend = _test_home().mend_paths
    text = (
        "ROOT = Path(__file__).resolve().parent.parent\nREPO = Path(__file__).resolve().parents[1]\n"
        'FIX = Path(__file__).parent / "fixtures"\n'
    )
    assert mend(text, 1) == (
        "ROOT = Path(__file__).resolve().parents[2]\nREPO = Path(__file__).resolve().parents[2]\n"
        'FIX = Path(__file__).parents[1] / "fixtures"\n'
    )
