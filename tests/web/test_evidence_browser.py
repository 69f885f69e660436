"""In Chromium (Debian's, driven by Playwright) against the portal under uvicorn, at
1,366 × 900 and 390 × 844: the customer finds the issued month's evidence pack on the reports page (no
axe-core violation, no sideways scrolling), downloads it, and the real ``yoco-verify``
accepts it with the command its README gives."""

from __future__ import annotations

import io
import shlex
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from yoco_verify.cli import run as yoco_verify

from tests import factories as fx
from tests.web.conftest import PASSWORD, Seed
from tests.web.test_e2e_browser import CHROMIUM_ARGS, PAGE_SHOTS, _check, _chromium

pytestmark = pytest.mark.slow


@pytest.fixture
def issued(seeded: tuple[Any, Seed]) -> Any:
    """C-A's March 2026 issued over a checkpoint signed in a transaction of its own (the
    seeded database signs its last head in the transaction that appended entries after
    it began, which a report's as-of instant cannot be earlier than), then signed."""
    from datetime import timedelta

    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from reports import issued as ri
    from yoco.database import unit_of_work

    ctx, _ = seeded
    recs, errors = validate_batch([fx.rec("job_progress", "C-A", fx.T0 + timedelta(days=151),
                                          job_id="j1", step=90001, step_seconds=1.5)])
    assert not errors
    with unit_of_work(ctx.engine) as s:
        ingest(s, recs, None, ctx.projectors)
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    with unit_of_work(ctx.engine) as s:
        doc = ri.issue_month(s, "C-A", 2026, 3)
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    return doc


def test_the_customer_finds_and_downloads_the_evidence_pack(
    issued: Any, app: Any, serve: Any, seed: Seed, tmp_path: Path, capsys: Any,
    monkeypatch: Any,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    # The portal alone (no scheduler issuing the due months beside the test).
    host, port = serve(app)
    base = f"http://{host}:{port}"
    PAGE_SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    packs: dict[str, bytes] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(accept_downloads=True, bypass_csp=True)
            page = context.new_page()
            page.goto(base + "/login")
            page.fill("input[name=email]", seed.users["a"])
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            expect(page.locator("h1.page-title")).to_have_text("Contracts")
            for width in ("desktop", "phone"):
                _check(page, base, "reports-evidence", "/contracts/C-A/reports", width,
                       problems)
                link = page.locator("[data-test=evidence-2026-03]")
                expect(link).to_be_visible()
                expect(link).to_have_text("Evidence pack (ZIP)")
                expect(page.locator("#evidence-help")).to_contain_text("yoco-verify")
                # Only issued months have a pack.
                expect(page.locator("[data-test=evidence-2026-04]")).to_have_count(0)
                rows = page.locator("table.data").first.locator("tbody tr")
                for i in range(rows.count()):
                    row = rows.nth(i)
                    status = row.locator("td[data-label=Status]").inner_text().strip()
                    has_pack = row.locator("a[href$='/evidence.zip']").count() == 1
                    assert has_pack == (status == "issued"), row.inner_text()
                with page.expect_download() as dl:
                    link.click()
                assert dl.value.suggested_filename == "yoco-evidence-C-A-2026-03.zip"
                packs[width] = Path(dl.value.path()).read_bytes()
            context.close()
        finally:
            browser.close()
    assert not problems, "\n".join(problems)
    assert packs["desktop"] == packs["phone"]

    # What was downloaded checks with the command its README gives.
    with zipfile.ZipFile(io.BytesIO(packs["phone"])) as zf:
        zf.extractall(tmp_path)
    [folder] = [p for p in tmp_path.iterdir() if p.name.startswith("yoco-evidence-")]
    key = httpx.get(base + "/public-key").text.strip()
    (folder / "operator.key").write_text(key + "\n")
    [line] = [x.strip() for x in (folder / "README.txt").read_text().splitlines()
              if x.strip().startswith("yoco-verify ")]
    monkeypatch.chdir(folder)
    code = yoco_verify(shlex.split(line)[1:])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.rstrip().endswith("OK: every check passed and every figure matches"), out
