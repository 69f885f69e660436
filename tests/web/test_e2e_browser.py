"""End to end in headless Chromium (Debian's, driven by Playwright) against `yoco serve`.

Log in, see the dashboard and its chart, filter failures, open one, download its proof
(and verify it offline) and a PDF report, open a dispute, log out; then the SLA desk's
view.  Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.web.conftest import PASSWORD

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(seeded, tmp_path):
    ctx, seed = seeded
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": ctx.settings.database_url,
        "YOCO_DATA_DIR": str(ctx.settings.data_dir),
        "YOCO_WEB_SECRET_KEY": "e2e-secret",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli", "serve", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/login", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode() if proc.stdout else "died")
            time.sleep(0.1)
        yield base, seed
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_customer_journey_in_a_real_browser(server, tmp_path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from ledger.proofs import verify_bundle

    base, seed = server
    SHOTS.mkdir(parents=True, exist_ok=True)
    key = httpx.get(base + "/public-key").text.strip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        context = browser.new_context(accept_downloads=True, viewport={"width": 1280,
                                                                       "height": 900})
        external: list[str] = []
        context.on("request", lambda r: None if r.url.startswith(base)
                   else external.append(r.url))
        page = context.new_page()
        page.goto(base + "/")
        expect(page).to_have_url(base + "/login")
        page.screenshot(path=str(SHOTS / "01-login.png"))
        page.fill("input[name=email]", seed.users["a"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("h1.page-title")).to_have_text("Contracts")
        page.click("a.contract-card >> text=C-A")
        expect(page.locator("[data-test=verdict]")).to_contain_text("Below the guarantee")
        expect(page.locator("svg.chart rect.bar").first).to_be_visible()
        page.screenshot(path=str(SHOTS / "02-dashboard.png"), full_page=True)

        page.click("nav.tabs >> text=Failures")
        page.select_option("select[name=status]", "rolled_back")
        page.click("form[data-test=filters] button[type=submit]")
        expect(page.locator("[data-test=count]")).to_contain_text("1 failure matches")
        page.screenshot(path=str(SHOTS / "03-failures-filtered.png"), full_page=True)

        page.click("table.failures tbody tr >> nth=0 >> a")
        expect(page.locator("[data-test=status]")).to_have_text("rolled back")
        with page.expect_download() as dl:
            page.click("[data-test=proof-failure]")
        bundle = json.loads(Path(dl.value.path()).read_text())
        verify_bundle(bundle, key)
        page.screenshot(path=str(SHOTS / "04-failure-detail.png"), full_page=True)

        page.fill("[data-test=dispute-form] textarea", "Our logs show 240 lost steps here.")
        page.click("[data-test=dispute-form] button[type=submit]")
        expect(page.locator("#disputes")).to_contain_text("Our logs show 240 lost steps here.")
        page.locator("#disputes").screenshot(path=str(SHOTS / "05-dispute-opened.png"))

        page.click("nav.tabs >> text=Monthly reports")
        with page.expect_download() as dl:
            page.click("[data-test=pdf-2026-03]")
        assert Path(dl.value.path()).read_bytes().startswith(b"%PDF")
        page.screenshot(path=str(SHOTS / "06-reports.png"), full_page=True)

        page.click("nav.tabs >> text=Signed checkpoints")
        page.screenshot(path=str(SHOTS / "07-checkpoints.png"), full_page=True)

        page.click("[data-test=logout]")
        expect(page).to_have_url(base + "/login")
        page.goto(base + "/contracts/C-A")
        expect(page).to_have_url(base + "/login?next=%2Fcontracts%2FC-A")

        # The SLA desk: contracts at risk first, then the disputes queue.
        page.fill("input[name=email]", seed.users["op"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(base + "/contracts/C-A")  # back where the login began
        page.goto(base + "/operator")
        expect(page.locator("table.data tbody tr").first).to_contain_text("C-A")
        page.screenshot(path=str(SHOTS / "08-operator.png"), full_page=True)
        page.goto(base + "/operator/disputes")
        expect(page.locator("main")).to_contain_text("Our logs show 240 lost steps here.")
        page.screenshot(path=str(SHOTS / "09-disputes.png"), full_page=True)
        browser.close()
    assert external == [], f"the pages loaded outside assets: {external}"
