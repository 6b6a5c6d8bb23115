"""The README's screenshots of the web UI: the list and one diagnosis, on a 1366x768 laptop screen.

    python -m bench.ui_screenshots --out docs/img

Starts a real `hypocenter serve` on a new store, uploads every example bundle (POST /v1/bundles),
and photographs /ui with Debian's chromium (/usr/bin/chromium, driven by Playwright; never a
downloaded browser). Writes ui-list.png and ui-detail.png.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.panel_history import stop_process
from bench.ui_load import EXAMPLES, start_server

CHROMIUM = os.environ.get("HYPOCENTER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1366, "height": 768}
DETAIL_EXAMPLE = "nvlink-xid149"


def launch_chromium(playwright: Any) -> Any:
    """Debian's chromium, headless, as the tests and this script use it."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def bundle_tar(example: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(example, arcname=example.name)
    return buf.getvalue()


def upload(base: str, example: Path) -> dict[str, Any]:
    """POST an example bundle; returns its diagnosis."""
    r = httpx.post(
        f"{base}/v1/bundles",
        content=bundle_tar(example),
        timeout=120.0,
        headers={"Content-Type": "application/gzip"},
    )
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def main() -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hypocenter-ui-shots-") as tmp:
        proc, base = start_server(Path(tmp) / "store.db", Path(tmp) / "server.log")
        try:
            ids = {e.name: upload(base, e)["id"] for e in EXAMPLES}
            with sync_playwright() as pw:
                browser = launch_chromium(pw)
                page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
                page.goto(f"{base}/ui/")
                page.wait_for_selector("table.diagnoses tbody tr[data-id]")
                page.screenshot(path=str(args.out / "ui-list.png"))
                page.goto(f"{base}/ui/#/d/{ids[DETAIL_EXAMPLE]}")
                page.wait_for_selector("figure.timeline svg")
                page.screenshot(path=str(args.out / "ui-detail.png"))
                browser.close()
        finally:
            stop_process(proc)
    for name in ("ui-list.png", "ui-detail.png"):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
