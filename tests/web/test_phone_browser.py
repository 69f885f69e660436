"""At a phone's width (390 × 844) in Chromium against `yoco serve`: the monthly report's
charts read at 9 px or more and its failures table needs no side-scroller (each failure
a block, each event id on one line inside the screen); the failures list shows an
incident together and offers the CSV, which downloads."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest

from tests import factories as fx
from tests.web.conftest import PASSWORD
from tests.web.test_e2e_browser import CHROMIUM_ARGS, SHOTS, _chromium, server  # noqa: F401

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def incident(seeded):
    """Three node_power failures of C-A within 8 minutes (one incident)."""
    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    at = fx.T0 + timedelta(days=140)
    recs = [fx.rec("job_started", "C-A", at, job_id=j, gpus=8) for j in ("j2", "j3", "j4")]
    for n, job in enumerate(("j2", "j3", "j4")):
        recs.append(fx.rec("failure", "C-A", at + timedelta(minutes=10 + 4 * n), job_id=job,
                           failure_class="unplanned", cause="node_power", node="node-9",
                           gpu=n, step=n + 1))
    records, errors = validate_batch(recs)
    assert not errors
    with unit_of_work(ctx.engine) as s:
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    return seeded


def test_report_and_failures_on_a_phone(incident, server) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, seed = server
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        context = browser.new_context(accept_downloads=True, viewport=PHONE)
        page = context.new_page()
        page.goto(base + "/login")
        page.fill("input[name=email]", seed.users["a"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page.locator("h1.page-title")).to_have_text("Contracts")

        page.goto(base + "/contracts/C-A/reports/2026-03.html?draft=1")
        page.wait_for_load_state("load")
        page.screenshot(path=str(SHOTS / "phone-report.png"), full_page=True)
        scroll, client = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client
        # Every chart text shown is at least 9 px tall on the screen (it was about 5).
        small = page.evaluate("""() => [...document.querySelectorAll('figure svg text')]
            .filter(t => getComputedStyle(t).display !== 'none')
            .map(t => [t.textContent, t.getBoundingClientRect().height])
            .filter(([s, h]) => h < 9)""")
        assert not small, small
        # The failures table: no cell in a side-scroller, every cell inside the screen.
        cells = page.evaluate("""() => [...document.querySelectorAll('table.failures td')]
            .map(td => { const r = td.getBoundingClientRect(), box = td.closest('.wide');
                         return [r.left, r.right, box.scrollWidth - box.clientWidth]; })""")
        assert cells and all(left >= 0 and right <= client and extra == 0
                             for left, right, extra in cells), cells
        # Each event id on one line, inside the screen; the labels name the columns.
        ids = page.evaluate("""() => [...document.querySelectorAll('table.failures .eid')]
            .map(e => { const r = e.getBoundingClientRect();
                        return [r.right, r.height, parseFloat(getComputedStyle(e).lineHeight)
                                || 1.5 * parseFloat(getComputedStyle(e).fontSize)]; })""")
        assert ids and all(right <= client and height < 1.6 * line
                           for right, height, line in ids), ids
        label = page.evaluate("""() => getComputedStyle(
            document.querySelector('table.failures td:nth-child(3)'), '::before').content""")
        assert label == '"Job"'

        page.goto(base + "/contracts/C-A/failures?year=1")
        head = page.locator("[data-test=incident]")
        expect(head).to_have_count(1)
        expect(head).to_contain_text("Incident: 3 failures of one cause (node power)")
        expect(page.locator("tr.in-incident")).to_have_count(3)
        page.screenshot(path=str(SHOTS / "phone-failures.png"), full_page=True)
        scroll, client = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client
        with page.expect_download() as dl:
            page.click("[data-test=failures-csv]")
        assert dl.value.suggested_filename == "failures-C-A-year-1.csv"
        rows = list(csv.DictReader(io.StringIO(
            Path(dl.value.path()).read_text(encoding="utf-8-sig"))))
        assert len(rows) == len(seed.failures["C-A"]) + 3
        assert sum(r["cause"] == "node power" for r in rows) == 3
        browser.close()


@pytest.mark.parametrize("viewport", [{"width": 1366, "height": 900}, PHONE],
                         ids=["desktop", "phone"])
def test_a_customer_admin_creates_and_revokes_a_token(server, viewport) -> None:  # noqa: F811
    import httpx
    from playwright.sync_api import expect, sync_playwright

    base, seed = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=viewport).new_page()
        page.goto(base + "/login")
        page.fill("input[name=email]", seed.users["a"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.click("nav.main-nav >> text=API tokens")
        page.fill("[data-test=token-form] input[name=name]", "grafana")
        page.check("[data-test=token-form] input[value=read]")
        page.click("[data-test=token-form] button[type=submit]")
        expect(page.locator("[data-test=token-created]")).to_contain_text("grafana")
        text = page.locator("[data-test=token-text]").inner_text().strip()
        scroll, client = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client  # the token's text wraps on a phone
        auth = {"Authorization": f"Bearer {text}"}
        assert httpx.get(base + "/api/v1/contracts", headers=auth).status_code == 200
        page.goto(base + "/account/tokens")
        prefix = "_".join(text.split("_")[:2])
        page.click(f"[data-test=revoke-{prefix}]")
        expect(page.locator("[data-test=token-revoked]")).to_contain_text(prefix)
        assert httpx.get(base + "/api/v1/contracts", headers=auth).status_code == 401
        browser.close()


@pytest.mark.parametrize("viewport", [{"width": 1366, "height": 900}, PHONE],
                         ids=["desktop", "phone"])
def test_a_customer_admin_adds_and_turns_off_a_webhook(server, viewport) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, seed = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=viewport).new_page()
        page.goto(base + "/login")
        page.fill("input[name=email]", seed.users["a"])
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.click("nav.main-nav >> text=Alerts")
        page.fill("[data-test=webhook-form] input[name=url]", "https://10.0.0.7/hook")
        page.click("[data-test=webhook-form] button[type=submit]")
        expect(page.locator("main")).to_contain_text("not a public address")
        page.goto(base + "/account/alerts")
        page.fill("[data-test=webhook-form] input[name=url]", "https://93.184.216.34/hook")
        page.check("[data-test=webhook-form] input[value=year_missed]")
        page.click("[data-test=webhook-form] button[type=submit]")
        expect(page.locator("[data-test=webhook-created]")).to_be_visible()
        expect(page.locator("[data-test=webhook-secret]")).to_contain_text("whsec_")
        scroll, client = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client
        page.goto(base + "/account/alerts")
        row = page.locator("table.data tbody tr").first
        expect(row).to_contain_text("year missed")
        row.locator("button").click()
        expect(page.locator("table.data tbody tr").first).to_contain_text("off")
        browser.close()
