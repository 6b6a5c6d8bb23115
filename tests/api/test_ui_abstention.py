"""The diagnosis page of an abstention (/ui, real `hypocenter serve`, Debian's chromium): where the
failure began (the first failing rank, its node, its signal, what to check) and the candidates weighed,
introduced as such rather than as competing causes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from server_support import ServerProcess

from bench.realruns.score import bundle
from bench.ui_screenshots import VIEWPORT, bundle_tar

pytestmark = [pytest.mark.slow, pytest.mark.chromium]

SIGKILL = Path(__file__).parents[1] / "fixtures" / "torchrun" / "sigkill"


def test_abstention_page_shows_the_first_failure_and_the_weighed_candidates(
    tmp_path: Path, browser: Any
) -> None:
    (tmp_path / "bundle").mkdir()
    srv = ServerProcess(tmp_path / "store.db").start()
    try:
        with srv.client() as client:
            r = client.post(
                "/v1/bundles",
                content=bundle_tar(bundle(SIGKILL, tmp_path / "bundle")),
                headers={"Content-Type": "application/gzip"},
            )
            assert r.status_code == 200, r.text
            d = r.json()
        assert d["outcome"] == "unattributed" and d["candidates"]
        page = browser.new_page(viewport=VIEWPORT)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{srv.base}/ui/#/d/{d['id']}")
        page.wait_for_selector("section.verdict .first-failure")
        verdict = page.locator("section.verdict").inner_text()
        assert "First failure" in verdict and "rank 2 on localhost · killed by SIGKILL" in verdict
        assert "journalctl -k" in verdict  # what to check next
        cands = page.locator("section[aria-labelledby=cand-h]").inner_text()
        assert "No cause could be attributed" in cands and "Several causes fit" not in cands
        assert "resource / host_oom" in cands and "falls short" in cands
        assert errors == []
    finally:
        srv.stop()
