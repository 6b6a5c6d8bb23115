"""Browser security headers: /ui and the API documentation pages send a Content-Security-Policy with
frame-ancestors, X-Frame-Options and nosniff, and still work under them in Debian's chromium (no
policy violation while the list, the fleet view, Swagger UI and ReDoc draw); another site cannot
frame them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_support import EXAMPLES, ServerProcess

from bench.ui_screenshots import VIEWPORT, bundle_tar

pytestmark = pytest.mark.slow

PAGES = ["/ui/", "/ui/static/app.js", "/docs", "/redoc", "/v1/diagnoses", "/healthz"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("headers") / "store.db").start()
    try:
        with srv.client() as client:
            nvlink = next(p for p in EXAMPLES if p.name == "nvlink-xid149")
            r = client.post(
                "/v1/bundles", content=bundle_tar(nvlink), headers={"Content-Type": "application/gzip"}
            )
            assert r.status_code == 200, r.text
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("path", PAGES)
def test_every_answer_forbids_framing_and_sniffing(server: ServerProcess, path: str) -> None:
    r = httpx.get(f"{server.base}{path}", timeout=30)
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    policy = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    if path.startswith("/ui") or path in ("/docs", "/redoc"):
        script = next(d for d in policy.split(";") if d.strip().startswith("script-src"))
        assert "'unsafe-inline'" not in script and "'unsafe-eval'" not in script


def _watched(browser: Any) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport=VIEWPORT)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda exc: refused.append(str(exc)))
    return page, refused


@pytest.mark.chromium
def test_pages_work_under_their_policy(server: ServerProcess, browser: Any) -> None:
    page, refused = _watched(browser)
    page.goto(f"{server.base}/ui/")
    page.locator("table.diagnoses tbody tr[data-id]").first.wait_for()
    page.goto(f"{server.base}/ui/#/fleet")
    bar = page.locator("table.fleet span.bar").first
    bar.wait_for()
    assert bar.evaluate("el => getComputedStyle(el).getPropertyValue('--w')").strip() == "100%"
    page.goto(f"{server.base}/docs")
    page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=30_000)
    page.goto(f"{server.base}/redoc")
    page.wait_for_selector("redoc .api-content, [role='main'] h1", timeout=60_000)
    # ReDoc's "powered by" logo is the one thing any page asks of another site: refused, as it should be
    assert [m for m in refused if "https://cdn.redoc.ly/" not in m] == [], refused
    page.close()


@pytest.mark.chromium
def test_another_site_cannot_frame_the_ui(server: ServerProcess, browser: Any) -> None:
    page, refused = _watched(browser)
    page.set_content(f'<iframe src="{server.base}/ui/" width="800" height="600"></iframe>')
    page.wait_for_timeout(2000)
    frame = page.frames[1]
    assert frame.evaluate("() => document.querySelector('header.top') === null")
    assert any("frame-ancestors" in m for m in refused), refused
    page.close()
