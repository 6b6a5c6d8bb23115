"""Ship the top-level rule catalog (`rules/`) inside the wheel as `hypocenter/catalog/`.

The catalog lives at the top of the repository because users read and edit it there; installed
copies need it inside the package. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithCatalog(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).parent / "rules"
        dst = Path(self.build_lib) / "hypocenter" / "catalog"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": BuildWithCatalog})
