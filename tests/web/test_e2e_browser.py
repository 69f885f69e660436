"""End to end in headless Chromium (Debian's, driven by Playwright) against `yoco serve`.

Log in, see the dashboard and its chart, filter failures, open one, download its proof
(and verify it offline) and a PDF report, open a dispute, log out; then the SLA desk's
view.  Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import shutil
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
def _chromium() -> str:
    """The Chromium the browser tests drive: ``$YOCO_CHROMIUM``, else ``chromium`` (Debian)
    or ``chromium-browser``/``google-chrome`` (other systems) on PATH; none is a failure
    naming what to install (docs/install.md), never a skip."""
    given = os.environ.get("YOCO_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium found: install it (Debian: apt-get install chromium; see "
                "docs/install.md) or set YOCO_CHROMIUM to its executable")


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
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
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

        # That failure has an open dispute already (no second form); dispute another one.
        expect(page.locator("[data-test=dispute-form]")).to_have_count(0)
        page.goto(f"{base}/contracts/C-A/failures/{seed.failures['C-A'][0]}")
        page.fill("[data-test=dispute-form] textarea", "Our logs show 240 lost steps here.")
        page.click("[data-test=dispute-form] button[type=submit]")
        expect(page.locator("#disputes")).to_contain_text("Our logs show 240 lost steps here.")
        expect(page.locator("[data-test=dispute-confirmation]")).to_be_visible()
        expect(page.locator("[data-test=dispute-form]")).to_have_count(0)
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


# --------------------------------------------------------------------------- every page

AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
PAGE_SHOTS = SHOTS / "pages"
WIDTHS = {"desktop": (1366, 900), "laptop": (1200, 900), "phone": (390, 844)}
#: The laptop width only for the monthly report (where event ids once ran into the Job column).
LAPTOP_ONLY = {"report-html"}
#: Routes that answer with a file or JSON, a redirect or a form post: not pages to look at.
NOT_PAGES = {
    "/", "/public-key", "/contracts/{contract_id}/entries/{event_id}/proof",
    "/contracts/{contract_id}/reports/{month}.pdf", "/contracts/{contract_id}/checkpoints/consistency",
    "/finance/export.{fmt}", "/api/openapi.json", "/static",
    "/contracts/{contract_id}/failures.csv",  # a download (tests/web/test_failures_csv.py)
    "/contracts/{contract_id}/log.tar.gz",
    # a download (tests/web/test_evidence_pack.py; its page: test_evidence_browser.py)
    "/contracts/{contract_id}/reports/{month}/evidence.zip",
    "/metrics",  # OpenMetrics text for Prometheus (tests/web/test_metrics.py)
}


@pytest.fixture
def old_year(seeded):
    """One more contract (Bravo Labs) whose first year ended in 2025 and waits to be closed."""
    from datetime import timedelta

    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from tests import factories as fx
    from yoco.database import unit_of_work

    ctx, _ = seeded
    specs, errors = parse_contracts(json.dumps([fx.contract(
        "C-OLD", customer="Bravo Labs", start_date="2024-06-01", term_years=3,
        annual_value="1050000.00", currency="EUR", timezone="Europe/Berlin")]).encode())
    assert not errors
    t0 = fx.T0.replace(year=2024, month=7)
    recs = [fx.rec("job_started", "C-OLD", t0, job_id="j1", gpus=64)]
    for n, result in enumerate(["live_migrated", "rolled_back", "rolled_back", None]):
        at = t0 + timedelta(days=30 * n + 3)
        f = fx.rec("failure", "C-OLD", at, job_id="j1", failure_class="unplanned",
                   cause="gpu_lost", node=f"node-{n}", gpu=n, step=1000 + 100 * n)
        recs.append(f)
        if result:
            recs.append(fx.rec("outcome", "C-OLD", at + timedelta(seconds=40),
                               failure_event_id=f["event_id"], outcome=result,
                               lost_steps=0 if result == "live_migrated" else 300,
                               recovery_seconds=0.33071208000183105, step_seconds=1.5,
                               gpus_affected=8))
    records, errors = validate_batch(recs)
    assert not errors
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    return seeded


def _routes(routes) -> list[tuple[str, set[str]]]:
    """(path, methods) of every route, through included routers (none has a prefix)."""
    out: list[tuple[str, set[str]]] = []
    for r in routes:
        if hasattr(r, "path"):
            out.append((r.path, set(getattr(r, "methods", None) or {"GET"})))
        elif hasattr(r, "original_router"):
            out.extend(_routes(r.original_router.routes))
    return out


def _screenshot(page, path: Path) -> None:
    """A full-page screenshot for people (no check reads it). Chromium on a loaded
    machine once answered "Unable to capture screenshot" (a protocol error, the page
    fine): one more try after a moment, then the error stands."""
    from playwright.sync_api import Error

    try:
        page.screenshot(path=str(path), full_page=True)
    except Error as exc:
        if "Unable to capture screenshot" not in str(exc):
            raise
        page.wait_for_timeout(500)
        page.screenshot(path=str(path), full_page=True)


def _check(page, base: str, name: str, url: str, width: str, problems: list[str]) -> None:
    w, h = WIDTHS[width]
    page.set_viewport_size({"width": w, "height": h})
    response = page.goto(base + url)
    assert response is not None
    page.wait_for_load_state("load")
    _screenshot(page, PAGE_SHOTS / f"{name}-{width}.png")
    scroll, client = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    if scroll > client:
        wide = page.evaluate("""() => {
            const cw = document.documentElement.clientWidth;
            const inScroller = e => { for (let a = e.parentElement; a; a = a.parentElement) {
                if (getComputedStyle(a).overflowX !== 'visible') return true; } return false; };
            return [...document.querySelectorAll('body *')]
              .filter(e => e.getBoundingClientRect().right > cw + 1 && !inScroller(e))
              .slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' +
                               Math.round(e.getBoundingClientRect().right)); }""")
        problems.append(f"{name} at {w} px scrolls sideways ({scroll} > {client}): {wide}")
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.evaluate(AXE.read_text(encoding="utf-8"))
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => v.id + ' (' + v.impact + '): ' + v.nodes.slice(0, 3)"
        ".map(n => n.target.join(' ')).join(' | '))")
    problems.extend(f"{name} at {w} px: axe {v}" for v in result)
    # No text runs out of its table cell (an event id into the Job column, say).
    spill = page.evaluate("""() => [...document.querySelectorAll('td *')].filter(e => {
        const td = e.closest('td'), r = e.getBoundingClientRect(), c = td.getBoundingClientRect();
        const box = td.closest('.wide, .table-wrap');  // a table that scrolls on its own
        const scrolls = box && getComputedStyle(box).overflowX !== 'visible';
        return !scrolls && r.width > 0 && (r.right > c.right + 1 || r.left < c.left - 1);
      }).slice(0, 5).map(e => e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 40))""")
    if spill:
        problems.append(f"{name} at {w} px: text outside its cell: {spill}")


def test_every_page_at_desktop_and_phone_width(old_year, tmp_path) -> None:
    """Every portal page, as customer, operator and finance, at 1,366 and 390 px: no
    sideways scrolling, no axe-core violation; the screenshots are kept for people."""
    from playwright.sync_api import sync_playwright

    from web.app import create_app
    from web.settings import WebSettings

    ctx, seed = old_year
    app = create_app(ctx, WebSettings(secret_key="enumerate"))
    routes = {
        path for path, methods in _routes(app.routes)
        if "GET" in methods and not path.startswith("/api/v1")
    }
    fid_resolved, fid_rolled = seed.failures["C-A"][0], seed.failures["C-A"][1]
    pages: list[tuple[str | None, str, str, str]] = [  # (user, name, url, route)
        (None, "login", "/login", "/login"),
        (None, "not-found", "/no-such-page", ""),
        ("a", "contracts", "/contracts", "/contracts"),
        ("a", "dashboard", "/contracts/C-A", "/contracts/{contract_id}"),
        ("a", "failures", "/contracts/C-A/failures", "/contracts/{contract_id}/failures"),
        ("a", "failure-resolved", f"/contracts/C-A/failures/{fid_resolved}",
         "/contracts/{contract_id}/failures/{event_id}"),
        ("a", "failure-rolled-back", f"/contracts/C-A/failures/{fid_rolled}", ""),
        ("a", "reports", "/contracts/C-A/reports", "/contracts/{contract_id}/reports"),
        ("a", "report-html", "/contracts/C-A/reports/2026-03.html",
         "/contracts/{contract_id}/reports/{month}.html"),
        ("a", "credits", "/contracts/C-A/credits", "/contracts/{contract_id}/credits"),
        ("a", "checkpoints", "/contracts/C-A/checkpoints", "/contracts/{contract_id}/checkpoints"),
        ("a", "api-docs", "/api/docs", "/api/docs"),
        ("a", "verify", "/verify", "/verify"),
        ("a", "contract-disputes", "/contracts/C-A/disputes", "/contracts/{contract_id}/disputes"),
        ("a", "account-tokens", "/account/tokens", "/account/tokens"),
        ("a", "account-alerts", "/account/alerts", "/account/alerts"),
        ("a", "dashboard-not-started", "/contracts/C-A?year=2", ""),
        ("op", "operator", "/operator", "/operator"),
        ("op", "disputes", "/operator/disputes", "/operator/disputes"),
        ("op", "years", "/operator/years", "/operator/years"),
        ("op", "risk", "/operator/risk", "/operator/risk"),
        ("op", "alerts", "/operator/alerts", "/operator/alerts"),
        ("op", "year-close", "/operator/years/confirm?contract_id=C-OLD&year=1",
         "/operator/years/confirm"),
        ("op", "dashboard-ended-year", "/contracts/C-OLD?year=1", ""),
        ("op", "failures-old", "/contracts/C-OLD/failures?year=1", ""),
        ("fin", "finance", "/finance", "/finance"),
    ]
    covered = {route for *_, route in pages if route}
    missing = sorted(r for r in routes - covered - NOT_PAGES if not r.startswith("/static"))
    assert not missing, f"pages without a screenshot and checks: {missing}"

    PAGE_SHOTS.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": ctx.settings.database_url,
           "YOCO_DATA_DIR": str(ctx.settings.data_dir), "YOCO_WEB_SECRET_KEY": "e2e-secret"}
    proc = subprocess.Popen([sys.executable, "-m", "yoco.cli", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    problems: list[str] = []
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/login", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "died"
            time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
            for who in (None, "a", "op", "fin"):
                context = browser.new_context(bypass_csp=True)
                page = context.new_page()
                if who is not None:
                    page.goto(base + "/login")
                    page.fill("input[name=email]", seed.users[who])
                    page.fill("input[name=password]", PASSWORD)
                    page.click("button[type=submit]")
                    page.wait_for_load_state("load")
                for user, name, url, _route in pages:
                    if user != who:
                        continue
                    for width in WIDTHS:
                        if width == "laptop" and name not in LAPTOP_ONLY:
                            continue
                        _check(page, base, name, url, width, problems)
                context.close()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not problems, "\n".join(problems)
