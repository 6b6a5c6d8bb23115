"""The web UI (/ui) and the REST reads it is built on, against a real `hypocenter serve`.

REST: the list pages by cursor without skipping or repeating, searches workloads, answers 304 to
an unchanged ETag and a new ETag once a diagnosis arrives; /v1/fleet/culprits counts what /metrics
counts. Browser: Debian's chromium driven by Playwright (never a downloaded browser) loads the
list, filters it, opens a diagnosis with the keyboard, finds the verdict, the timeline and the
evidence, follows a live update while the page is open, and checks contrast (WCAG AA, from the
computed colours) and that a 1366x768 screen needs no horizontal scrolling. Screenshots are kept
in $UI_SCREENSHOTS_DIR, or in the test's temporary directory (printed).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
import yaml
from server_support import EXAMPLES, ServerProcess, replay

from bench.ui_screenshots import VIEWPORT, bundle_tar

pytestmark = pytest.mark.slow

BY_NAME = {p.name: p for p in EXAMPLES}
FIRST = ("nvlink-xid149", "ambiguous-double-fault", "host-oom")
GRAFANA = "http://grafana.example:3000"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ui")
    srv = ServerProcess(
        tmp / "store.db",
        "--ui-grafana-url",
        GRAFANA + "/",
        "--ui-loki-datasource-uid",
        "loki-uid",
        "--ui-loki-node-label",
        "hostname",
    ).start()
    try:
        with srv.client() as client:
            for name in FIRST:
                r = client.post(
                    "/v1/bundles",
                    content=bundle_tar(BY_NAME[name]),
                    headers={"Content-Type": "application/gzip"},
                )
                assert r.status_code == 200, r.text
        yield srv
    finally:
        srv.stop()


def _ids(client: httpx.Client, **params: Any) -> list[str]:
    return [d["id"] for d in client.get("/v1/diagnoses", params=params).json()["diagnoses"]]


# ----------------------------------------------------------------------------------------------- REST


def test_list_pages_by_cursor_and_searches(server: ServerProcess) -> None:
    with server.client() as client:
        whole = client.get("/v1/diagnoses").json()
        assert whole["total"] == len(whole["diagnoses"]) >= 3 and whole["next_cursor"] is None
        ends = [d["window_end"] for d in whole["diagnoses"]]
        assert ends == sorted(ends, reverse=True)  # newest first
        seen: list[str] = []
        cursor = None
        while True:
            page = client.get(
                "/v1/diagnoses", params={"limit": 1, **({"cursor": cursor} if cursor else {})}
            ).json()
            seen += [d["id"] for d in page["diagnoses"]]
            assert page["total"] == whole["total"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [d["id"] for d in whole["diagnoses"]]
        # search: any part of the workload id, any case; `workload` keeps its exact meaning
        assert [
            d["workload"] for d in client.get("/v1/diagnoses", params={"search": "123"}).json()["diagnoses"]
        ] == ["81234"]
        assert _ids(client, workload="8123") == [] and len(_ids(client, workload="81234")) == 1
        bad = client.get("/v1/diagnoses", params={"cursor": "not-a-cursor"})
        assert bad.status_code == 400 and "cursor" in bad.json()["detail"]
        nvlink = client.get("/v1/diagnoses", params={"workload": "81234"}).json()["diagnoses"][0]
        assert nvlink["summary"].startswith("NVLink") and nvlink["window_end"] == "2026-11-02T11:02:00Z"


def test_list_etag_answers_304_until_a_diagnosis_arrives(server: ServerProcess) -> None:
    with server.client() as client:
        first = client.get("/v1/diagnoses", params={"limit": 5})
        etag = first.headers["etag"]
        again = client.get("/v1/diagnoses", params={"limit": 5}, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        r = client.post(
            "/v1/bundles",
            content=bundle_tar(BY_NAME["ib-link-flap"]),
            headers={"Content-Type": "application/gzip"},
        )
        assert r.status_code == 200
        changed = client.get("/v1/diagnoses", params={"limit": 5}, headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert r.json()["id"] in [d["id"] for d in changed.json()["diagnoses"]]


def test_fleet_counts_what_metrics_counts(server: ServerProcess) -> None:
    with server.client() as client:
        fleet = client.get("/v1/fleet/culprits").json()
    metrics = httpx.get(f"http://{server.metrics}/metrics", timeout=30).text
    from_metrics = {
        (m["cluster"], m["node"]): float(v)
        for m, v in (
            (dict(re.findall(r'(\w+)="([^"]*)"', labels)), value)
            for labels, value in re.findall(
                r"^hypocenter_recent_node_root_causes\{([^}]*)\} (\S+)$", metrics, re.M
            )
        )
    }
    assert from_metrics, "no hypocenter_recent_node_root_causes series"
    assert {(n["cluster"] or "", n["node"]): float(n["diagnoses"]) for n in fleet["nodes"]} == from_metrics
    gpus = {(c["node"], c["kind"], c["component"]) for c in fleet["components"]}
    assert ("node02", "gpu", "0000:3b:00") in gpus
    node02 = next(n for n in fleet["nodes"] if n["node"] == "node02")
    assert node02["list_url"] == "/ui/#/?node=node02&cluster=eos"


def test_ui_is_served_offline_from_the_package(server: ServerProcess) -> None:
    with server.client() as client:
        page = client.get("/ui", follow_redirects=True)
        assert page.status_code == 200 and page.url.path == "/ui/"
        assets = re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', page.text)
        assert "/ui/static/app.js" in assets
        for asset in assets:
            assert client.get(asset).status_code == 200
        modules = ("app.js", "dom.js", "list.js", "detail.js", "timeline.js", "fleet.js", "cost.js")
        for name in modules:
            body = client.get(f"/ui/static/{name}").text
            # no CDN: every import is one of the page's own modules
            for target in re.findall(r'from "([^"]+)"', body):
                assert target.startswith("./") and target[2:] in modules, f"{name} imports {target}"
            # nothing fetched from elsewhere (the SVG namespace is a name, not a request)
            assert re.findall(r"https?://", body.replace("http://www.w3.org/2000/svg", "")) == []
        config = client.get("/ui/config.json").json()
        assert config["grafana_url"] == GRAFANA and config["loki_datasource_uid"] == "loki-uid"


# ----------------------------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = (
        Path(os.environ["UI_SCREENSHOTS_DIR"])
        if os.environ.get("UI_SCREENSHOTS_DIR")
        else tmp_path_factory.mktemp("ui-screenshots")
    )
    out.mkdir(parents=True, exist_ok=True)
    print(f"\nweb UI screenshots: {out}")
    return out


# Every element with its own text: its colour against the first opaque background behind it.
CONTRAST = """() => {
  const rgb = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const bg = (el) => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor); if (c.a >= 0.99) return c; }
    return {r: 255, g: 255, b: 255, a: 1}; };
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest("svg")) continue;
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    const box = el.getBoundingClientRect();
    if (!own || !box.width || getComputedStyle(el).visibility === "hidden" || el.closest("details:not([open]) > :not(summary)")) continue;
    const fg = rgb(getComputedStyle(el).color), back = bg(el);
    const [hi, lo] = [lum(fg), lum(back)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    if (ratio < 4.5) out.push(`${el.tagName}.${el.className} "${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}`);
  }
  return out;
}"""


def _check_page(page: Any) -> None:
    assert page.evaluate(CONTRAST) == [], "text below WCAG AA contrast (4.5:1)"
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"horizontal scrolling at 1366x768: {width}"


@pytest.mark.chromium
def test_list_filters_detail_and_live_update_in_chromium(
    server: ServerProcess, browser: Any, shots: Path
) -> None:
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server.base}/ui/")
    rows = page.locator("table.diagnoses tbody tr[data-id]")
    rows.first.wait_for()
    with server.client() as client:
        listed = client.get("/v1/diagnoses", params={"limit": 50}).json()
    assert rows.count() == listed["total"] >= 3
    # newest first, as the REST list orders them
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == [
        d["id"] for d in listed["diagnoses"]
    ]
    assert f"of {listed['total']} diagnoses" in page.locator("#list-count").inner_text()
    _check_page(page)
    page.screenshot(path=str(shots / "list.png"))

    # pages: the server's cursor, forward and back
    page.goto(f"{server.base}/ui/#/?limit=2")
    page.wait_for_function("() => document.querySelectorAll('tbody tr[data-id]').length === 2")
    first_two = [rows.nth(i).get_attribute("data-id") for i in range(2)]
    assert first_two == [d["id"] for d in listed["diagnoses"][:2]]
    assert page.locator("#list-count").inner_text().startswith(f"1–2 of {listed['total']}")
    page.click("button:has-text('Older')")
    second = [d["id"] for d in listed["diagnoses"][2:4]]
    page.wait_for_function(
        f"() => document.querySelector('#list-count').innerText.startsWith('3–{2 + len(second)} ')"
    )
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == second
    page.click("button:has-text('Newer')")
    page.wait_for_function("() => document.querySelector('#list-count').innerText.startsWith('1–2')")
    assert page.locator("button:has-text('Newer')").is_disabled()
    page.goto(f"{server.base}/ui/")
    page.wait_for_function(
        f"() => document.querySelectorAll('tbody tr[data-id]').length === {listed['total']}"
    )

    # filters: outcome, then a culprit node, then a workload search; each narrows the server's list
    page.select_option("select[name=outcome]", "ambiguous")
    page.wait_for_function("() => document.querySelectorAll('tbody tr[data-id]').length === 1")
    assert "66031" in rows.first.inner_text() and "ambiguous" in rows.first.inner_text()
    assert "outcome=ambiguous" in page.url
    page.click("button:has-text('Reset')")
    page.fill("input[name=node]", "node03")
    page.wait_for_function(
        "() => [...document.querySelectorAll('tbody tr[data-id]')].every(r => r.innerText.includes('node03'))"
        " && document.querySelectorAll('tbody tr[data-id]').length === 1"
    )
    assert "host_oom" in rows.first.inner_text()
    page.click("button:has-text('Reset')")
    page.fill("input[name=search]", "8123")
    page.wait_for_function("() => document.querySelectorAll('tbody tr[data-id]').length === 1")
    assert "81234" in rows.first.inner_text()

    # keyboard: Tab reaches the row, its focus is visible, Enter opens it
    page.locator("input[name=search]").focus()
    for _ in range(15):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.matches('tr[data-id]')"):
            break
    else:
        raise AssertionError("Tab never reached a row of the list")
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("none", ""), "the focused row shows no focus ring"
    page.keyboard.press("Enter")
    page.wait_for_selector("figure.timeline svg")
    assert "#/d/dx-" in page.url

    # the verdict
    verdict = page.locator("section.verdict").inner_text()
    for expected in (
        "attributed",
        "hardware / nvlink",
        "RESET GPU",
        "node02",
        "0000:3b:00",
        "xid-nvlink-fatal",
        "high",
    ):
        assert expected in verdict, expected
    # the timeline: a lane per node with evidence, the root cause on node02's lane, the first cause marked
    lanes = page.locator("svg.timeline-svg text.lane-label").all_text_contents()
    assert lanes[0] == "node02" and {"node01", "node03", "node04"} <= set(lanes)
    assert page.locator("svg.timeline-svg path.ev.cause").count() >= 1
    assert page.locator("svg.timeline-svg circle.ev.symptom").count() >= 3
    # marked where the verdict dates the root cause: its earliest cause line, node02's rank 10 reporting
    # the NVLink error (10:50:58, the stamp before that unstamped line), 5 s before the kernel's Xid 149
    began = page.locator("svg.timeline-svg text.first-label").text_content()
    assert began == "began here: node02 10:50:58"
    ring_y = float(page.locator("svg.timeline-svg circle.first-ring").get_attribute("cy"))
    lane_y = float(page.locator("svg.timeline-svg text.lane-label", has_text="node02").get_attribute("y"))
    assert abs(ring_y - lane_y) < 10, "the first cause is not on node02's lane"
    # the evidence trail: source refs with their lines, the kernel's Xid 149 among them
    trail = page.locator("section[aria-labelledby=ev-h]").inner_text()
    assert "logs/node02/kern.log" in trail and "Xid (PCI:0000:3b:00): 149" in trail
    assert "ROOT CAUSE" in trail.upper() and "not shown" in trail
    assert "the cited lines alone" in trail  # an uploaded bundle: the store keeps no logs to show around them
    # coverage per source, the raw JSON, and the Grafana Explore link on the culprit's logs
    assert "logs/node02" in page.locator("section[aria-labelledby=cov-h]").inner_text()
    doc = json.loads(page.locator("pre.json").text_content())
    assert doc["root_cause"]["subdomain"] == "nvlink"
    href = page.locator("a.ext", has_text="culprit nodes' logs").get_attribute("href")
    url = urlparse(href)
    assert f"{url.scheme}://{url.netloc}" == GRAFANA and url.path == "/explore"
    pane = next(iter(json.loads(parse_qs(url.query)["panes"][0]).values()))
    assert pane["datasource"] == "loki-uid" and pane["queries"][0]["expr"] == '{hostname=~"node02"}'
    assert int(pane["range"]["from"]) < 1793613600000 < int(pane["range"]["to"])  # the window holds 10:00:00Z
    # any node name stays itself in the LogQL string and the regex (a quote would end the string)
    odd = page.evaluate(
        """async () => (await import('/ui/static/detail.js')).lokiNodeSelector('hostname', ['a"b', 'c.d', 'e\\\\f'])"""
    )
    assert odd == r'{hostname=~"a\"b|c\\.d|e\\\\f"}'
    _check_page(page)
    page.screenshot(path=str(shots / "detail.png"), full_page=True)

    # an ambiguous result lists its candidates
    page.goto(f"{server.base}/ui/#/?outcome=ambiguous")
    rows.first.wait_for()
    rows.first.click()
    page.wait_for_selector("section[aria-labelledby=cand-h]")
    candidates = page.locator("ol.candidates li")
    assert candidates.count() == 2 and "gpu-f02" in candidates.nth(0).inner_text()

    # live: a diagnosis made while the page is open appears in the list without a reload
    page.goto(f"{server.base}/ui/")
    rows.first.wait_for()
    before = rows.count()
    r = replay(BY_NAME["gpu-xid79-aer"], server.grpc)
    assert r.returncode == 0, r.stderr
    page.wait_for_function(
        f"() => document.querySelectorAll('tbody tr[data-id]').length > {before}", timeout=30_000
    )
    fresh = page.locator("tbody tr.fresh")
    assert fresh.count() >= 1 and fresh.first.locator(".badge.new").count() == 1
    workload = str(yaml.safe_load((BY_NAME["gpu-xid79-aer"] / "attempt.yaml").read_text())["workload"]["id"])
    assert workload in fresh.first.inner_text()
    page.screenshot(path=str(shots / "live.png"))

    # that attempt came over OTLP, so the store holds its logs: the evidence shows the lines around it
    fresh.first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("section[aria-labelledby=ev-h] .line.r-around")
    trail = page.locator("section[aria-labelledby=ev-h]").inner_text()
    assert "stored lines around each" in trail
    with server.client() as client:
        did = page.evaluate("() => decodeURIComponent(location.hash.slice(4))")
        doc = client.get(f"/v1/diagnoses/{did}").json()
        context = client.get(f"/v1/diagnoses/{did}/context", params={"around": 2}).json()
    assert context["available"] and context["around"] == 2
    cited = {e["ref"] for e in doc["evidence"]}
    shown = {f"{path}:{c['line']}" for path, lines in context["files"].items() for c in lines}
    assert shown - cited, "no line around the evidence"
    for path, lines in context["files"].items():  # every line is within 2 of a cited one of its file
        refs = [int(r.rpartition(":")[2]) for r in cited if r.rpartition(":")[0] == path]
        assert all(min(abs(c["line"] - n) for n in refs) <= 2 for c in lines)
    _check_page(page)
    page.screenshot(path=str(shots / "detail-otlp.png"), full_page=True)

    # the fleet view links each repeat culprit to its diagnoses
    page.goto(f"{server.base}/ui/#/fleet")
    link = page.locator("table.fleet a", has_text="node02").first
    link.wait_for()
    _check_page(page)
    page.screenshot(path=str(shots / "fleet.png"))
    link.click()
    page.wait_for_function("() => location.hash.includes('node=node02')")
    page.wait_for_function("() => document.querySelectorAll('tbody tr[data-id]').length === 1")
    assert "81234" in rows.first.inner_text()
    assert errors == [], errors
    page.close()


@pytest.mark.chromium
def test_api_docs_load_without_the_internet(server: ServerProcess, browser: Any) -> None:
    """/docs (Swagger UI) and /ui draw with every request answered by the server itself."""
    page = browser.new_page(viewport=VIEWPORT)
    elsewhere: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(server.base):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_server)
    page.goto(f"{server.base}/docs")
    page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=30_000)
    assert "/v1/diagnoses" in page.locator(".swagger-ui").inner_text()
    page.goto(f"{server.base}/ui/")
    page.locator("table.diagnoses tbody tr[data-id]").first.wait_for()
    assert elsewhere == []
    page.close()


@pytest.mark.chromium
def test_with_tokens_the_page_asks_for_one(tmp_path: Path, browser: Any) -> None:
    """Behind auth_tokens_file the page and its scripts load without a token (code, no data); the reads
    need one with the read role, which the page asks for once."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("read: [reader-token-1234567890abcdef]\nadmin: [admin-token-1234567890abcdef]\n")
    srv = ServerProcess(tmp_path / "store.db", "--auth-tokens-file", str(tokens)).start()
    try:
        r = httpx.post(
            f"{srv.base}/v1/bundles",
            content=bundle_tar(BY_NAME["nvlink-xid149"]),
            timeout=120,
            headers={
                "Content-Type": "application/gzip",
                "Authorization": "Bearer admin-token-1234567890abcdef",
            },
        )
        assert r.status_code == 200, r.text
        assert httpx.get(f"{srv.base}/v1/diagnoses").status_code == 401
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{srv.base}/ui/")
        page.wait_for_selector("input[name=token]")
        page.fill("input[name=token]", "wrong-token")
        page.keyboard.press("Enter")
        page.wait_for_selector("input[name=token]")
        page.fill("input[name=token]", "reader-token-1234567890abcdef")
        page.keyboard.press("Enter")
        page.locator("table.diagnoses tbody tr[data-id]").first.wait_for()
        assert "81234" in page.locator("table.diagnoses tbody").inner_text()
        page.close()
    finally:
        srv.stop()
