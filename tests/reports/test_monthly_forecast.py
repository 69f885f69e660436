"""The forecast next to the verdict in a monthly report: over the checkpoint, unchanged
verdict, none once the year has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from billing.forecast import forecast_contract_year
from billing.years import month_bounds
from reports import monthly as rm
from tests.reports import scenarios as sc
from yoco.database import unit_of_work


def _forecast_line(html: str) -> str:
    return html.split('<div class="forecast">', 1)[1].split("</div>", 1)[0]


def test_report_shows_the_years_forecast_next_to_the_verdict(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.tipping()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        march = rm.build_monthly_report(s, "C-TIP", 2026, 3)
        again = rm.build_monthly_report(s, "C-TIP", 2026, 3)
    html = march.html.decode() if isinstance(march.html, bytes) else march.html
    line = _forecast_line(html)
    # The verdict is unchanged (missed so far); the forecast sits beside it.
    assert march.year_to_date.guarantee_met is False
    assert "contract year 1 ends below 90 %" in line and "not the verdict" in line
    # It is billing's forecast of the year observed up to the end of March (New York),
    # from the same entries: every entry of this scenario is under the checkpoint.
    _, april = month_bounds(2026, 3, "America/New_York")
    with Session(app_ctx.engine) as s:
        fc = forecast_contract_year(s, "C-TIP", 1, now=april)
    assert fc.ytd.covered == march.year_to_date.covered_failures == 21
    # The dashboard's formatter (billing.verdict.format_probability): one text everywhere.
    from billing.verdict import format_probability

    assert line.startswith(f"Forecast: {format_probability(fc.p_miss)} chance")
    assert "expected credit" in line and "USD" in line
    # Over the same checkpoint the report, forecast included, does not change.
    html2 = again.html.decode() if isinstance(again.html, bytes) else again.html
    assert _forecast_line(html2) == line


def test_no_forecast_once_the_year_has_ended(seed: Callable[..., None], app_ctx: Any) -> None:
    contract, records = sc.closed_year()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, "C-CLOSED", 2025, 12)
    html = report.html.decode() if isinstance(report.html, bytes) else report.html
    assert '<div class="forecast">' not in html


def test_a_failures_recovery_time_is_shown_to_the_millisecond(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    """A runtime's recovery time (measured to the nanosecond) is printed as the portal
    prints it (billing.verdict.format_seconds), not as 0.30850648880004883."""
    import random

    from tests import factories as f

    rng = random.Random(7)
    cid = "C-REC"
    recs = sc.job(rng, cid, "train-1", 8, sc.at(2026, 3, 1), None)
    recs += sc.failure_with(rng, cid, sc.at(2026, 3, 5), "live_migrated",
                            recovery=0.30850648880004883)
    seed([f.contract(cid, start_date="2026-01-01")], recs)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, cid, 2026, 3)
    html = report.html.decode() if isinstance(report.html, bytes) else report.html
    failures = html.split('id="failures"', 1)[1].split("</table>", 1)[0]
    assert '<td class="num">0.309 s</td>' in failures
    assert "0.3085064888" not in failures
