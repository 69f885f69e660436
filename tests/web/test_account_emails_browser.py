"""In Chromium (Debian's, driven by Playwright) against the portal under uvicorn, at
1,366 × 900 and 390 × 844: a customer's admin adds an e-mail recipient of their alerts
on ``/account/alerts``, is told what was wrong with a bad address (the field named,
nothing added), sees the recipient and the audited change, and removes it -- with no
axe-core violation and no sideways scrolling on the page as it stands at each step."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.conftest import PASSWORD, Seed
from tests.web.test_e2e_browser import CHROMIUM_ARGS, PAGE_SHOTS, _check, _chromium

pytestmark = pytest.mark.slow

RELAY = "vendor-relay"


@pytest.fixture
def mail_app(seeded: tuple[Any, Seed]) -> Any:
    """The portal offering e-mail alerts through the operator's relay ``RELAY``."""
    from alerts.services import add_email
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        add_email(s, name=RELAY, host="127.0.0.1", port=25,
                  mail_from="alerts@vendor.example", mail_to=["oncall@vendor.example"])
    return create_app(ctx, WebSettings(secret_key="browser", figures_ttl_seconds=0,
                                       customer_mail_via=RELAY),
                      hasher=password_hasher(cheap=True))


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_a_customer_admin_adds_and_removes_an_email_recipient(
    mail_app: Any, serve: Any, seed: Seed, width: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    host, port = serve(mail_app)
    base = f"http://{host}:{port}"
    PAGE_SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    address = f"sla-{width}@acme.example"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(bypass_csp=True).new_page()
            page.goto(base + "/login")
            page.fill("input[name=email]", seed.users["a"])
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.click("nav.main-nav >> text=Alerts")
            _check(page, base, f"account-emails-empty-{width}", "/account/alerts", width,
                   problems)
            form = page.locator("[data-test=email-form]")
            # An address the browser lets through (its own check passes a domain with no
            # dot) but the portal refuses, naming the field; nothing is added.
            form.locator("input[name=email]").fill("sla@acme")
            form.locator("button[type=submit]").click()
            expect(page.locator("main")).to_contain_text("email: the domain of")
            page.goto(base + "/account/alerts")
            expect(page.locator("[data-test=recipients]")).to_have_count(0)

            form.locator("input[name=email]").fill(address)
            form.locator("input[value=year_missed]").check()
            form.locator("button[type=submit]").click()
            expect(page.locator("[data-test=email-added]")).to_contain_text(address)
            row = page.locator("[data-test=recipients] tbody tr")
            expect(row).to_have_count(1)
            expect(row).to_contain_text("year missed")
            expect(page.locator("[data-test=changes] tbody tr").first).to_contain_text("added")
            _check(page, base, f"account-emails-one-{width}",
                   "/account/alerts?added=" + address.replace("@", "%40"), width, problems)

            page.click(f"[data-test='remove-{address}']")
            expect(page.locator("[data-test=email-removed]")).to_contain_text(address)
            expect(page.locator("[data-test=recipients]")).to_have_count(0)
            expect(page.locator("[data-test=changes] tbody tr").first).to_contain_text(
                "removed")
        finally:
            browser.close()
    assert not problems, "\n".join(problems)
