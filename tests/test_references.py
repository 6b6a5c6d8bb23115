"""The repository stands alone: no document or docstring points at a file it does not hold.

Markdown links with a relative target must name a file or directory of the repository, and nothing
may cite the design notes, contracts or research references by a name outside it (`DESIGN.md`,
`shared/…`, "contract-3", "reference §4.1"): docs/design.md is the design document."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# Code is not rendered as links: fenced blocks and inline code spans (any number of backticks).
CODE = re.compile(r"^```.*?^```|(`+)(?:(?!\1).)+?\1", re.MULTILINE | re.DOTALL)
DANGLING = re.compile(
    r"DESIGN\.md|(?:\.\./|/work/|\b)shared/(?:reference|DESIGN)|\bcontract-\d|\b[Rr]eference §"
    r"|failure-signatures\.md|observability-stack\.md|peer-systems\.md"
)
TEXT = (".md", ".py", ".pyi", ".yaml", ".yml", ".proto", ".toml", ".json", ".txt", ".sh", "")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = [REPO / p for p in out.decode().split("\0") if p]
    return [
        f
        for f in files
        if f.suffix in TEXT
        and f.is_file()
        and "node_modules" not in f.parts
        and f.name != "package-lock.json"
        and f.name != Path(__file__).name
    ]


def test_markdown_links_lead_to_files_of_the_repository() -> None:
    broken = []
    for f in _tracked():
        if f.suffix != ".md":
            continue
        for m in LINK.finditer(CODE.sub("", f.read_text(encoding="utf-8", errors="replace"))):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # an anchor here, or a URL
                continue
            if not (f.parent / target).exists():
                broken.append(f"{f.relative_to(REPO)}: {m.group(1)}")
    assert broken == []


def test_nothing_cites_documents_outside_the_repository() -> None:
    found = []
    for f in _tracked():
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if DANGLING.search(line):
                found.append(f"{f.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert found == []
    assert (REPO / "docs" / "design.md").is_file()
