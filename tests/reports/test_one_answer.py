"""One answer everywhere: the same contract year through `yoco sla`, the portal and the
monthly report (HTML and PDF) reads the same verdict and the same rate."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from reports import monthly as rm
from tests.reports import scenarios as sc
from tests.reports.pdfcheck import pdf_text
from tests.web.conftest import login
from yoco.cli import build_app
from yoco.database import unit_of_work

runner = CliRunner()


def _cli(*args: str) -> str:
    result = runner.invoke(build_app(), list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _portal(app_ctx: Any, cid: str, year: int) -> tuple[str, str, str]:
    """(standing, word, rate) as the portal's dashboard shows them to the SLA desk."""
    from web.accounts import add_user
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    hasher = password_hasher(cheap=True)
    with unit_of_work(app_ctx.engine) as s:
        add_user(s, hasher, email=f"desk-{cid.lower()}@vendor.example", name="Desk",
                 role="operator", password="correct horse battery")
    app = create_app(app_ctx, WebSettings(secret_key="t", figures_ttl_seconds=0), hasher=hasher)
    with TestClient(app) as c:
        login(c, f"desk-{cid.lower()}@vendor.example", "correct horse battery")
        html = c.get(f"/contracts/{cid}", params={"year": year}).text
        overview = c.get("/operator").text
        confirm = c.get("/operator/years/confirm", params={"contract_id": cid, "year": year})
    standing = re.search(r'data-standing="([a-z_]+)"', html).group(1)  # type: ignore[union-attr]
    rate = re.search(r'data-test="rate">([^<]+)<', html).group(1)  # type: ignore[union-attr]
    row = overview.split("<tbody>", 1)[1].split(f">{cid}</a>", 1)[1].split("</tr>", 1)[0]
    if f">{year} / " in row:  # the SLA desk's overview shows this year
        badge = r'class="badge tone-[a-z]+">([^<]+)<'
    else:  # an ended year: the year-close confirmation says what will be recorded
        row, badge = confirm.text, r'data-test="close-verdict">([^<]+)<'
    word = re.search(badge, row).group(1)  # type: ignore[union-attr]
    return standing, word, rate


@pytest.mark.parametrize(
    ("scenario", "cid", "month", "standing", "word", "rate"),
    [
        # A year still running, below the threshold so far: not "missed" anywhere.
        (sc.tipping, "C-TIP", (2026, 3), "below", "below so far", "80.95 %"),
        # A year that is over and missed.
        (sc.closed_year, "C-CLOSED", (2025, 12), "missed", "missed", "60.00 %"),
    ],
)
def test_cli_portal_and_report_say_the_same(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path,
    scenario: Any, cid: str, month: tuple[int, int], standing: str, word: str, rate: str,
) -> None:
    contract, records = scenario()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, cid, *month)
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(report.pdf)
    pdf_words = " ".join(pdf_text(pdf).split())

    # The report: the year-to-date banner and the summary's rate, in HTML and PDF.
    banner = report.html.split('<div class="banner', 1)[1].split("</div>", 2)
    assert '<span class="verdict' in banner[0] and f">{word}</span>" in banner[0]
    assert f"{rate} ({report.year_to_date.resolved_failures} of " in report.html
    assert f": {word.upper()}" in pdf_words and rate in pdf_words
    as_of = re.search(r"--as-of (\S+)", pdf_words).group(1)  # type: ignore[union-attr]

    # The command line the report names, as a table and as JSON.
    table = _cli("sla", cid, "--as-of", as_of)
    assert word in table and rate in table
    j = json.loads(_cli("sla", cid, "--as-of", as_of, "--json"))
    assert j["standing"] == standing
    assert (j["resolved_failures"], j["covered_failures"]) == (
        report.year_to_date.resolved_failures, report.year_to_date.covered_failures)

    # The portal: the dashboard's verdict and rate, the SLA desk's standing.
    got = _portal(app_ctx, cid, report.contract_year)
    assert got == (standing, word, rate)
