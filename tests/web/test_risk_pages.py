"""The SLA desk's risk view and the forecast on a contract page (TestClient, real database)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI

from billing.forecast import open_year_forecasts
from billing.money import format_money


@pytest.fixture
def app(seeded: tuple[Any, Any]) -> FastAPI:
    """The portal of tests/web/conftest.py on a clock stopped when the test starts: a
    forecast depends on how much of the year has passed, and these tests compare the page
    with billing's forecast computed after it (on a running clock a loaded machine saw
    the expected credit move by a cent in between)."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    stopped = datetime.now(UTC)
    return create_app(
        ctx,
        WebSettings(secret_key="test-secret", figures_ttl_seconds=0),
        hasher=password_hasher(cheap=True),
        clock=lambda: stopped,
    )


def _rows(html: str) -> list[tuple[str, str]]:
    return re.findall(r'data-contract="([^"]+)" data-year="(\d+)"', html)


def test_operator_risk_view_lists_open_years_by_probability_and_by_credit(
    app, client_for, seeded
) -> None:
    ctx, _ = seeded
    op = client_for("op")
    r = op.get("/operator/risk")
    assert r.status_code == 200
    html = r.text
    assert "P(ends below)" in html and "Expected credit" in html
    rows = _rows(html)
    assert {c for c, _ in rows} == {"C-A", "C-A2", "C-B"}
    # The same forecasts billing gives, in the same order (riskiest first).
    from sqlalchemy.orm import Session

    with Session(ctx.engine) as s:
        want = open_year_forecasts(s, now=app.state.portal.now())
    assert rows == [(f.contract_id, str(f.year)) for f in want]
    ps = [f.p_miss for f in want]
    assert ps == sorted(ps, reverse=True)
    # Each row shows its probability and expected credit as billing computed them.
    first = want[0]
    assert format_money(first.expected_credit, first.currency) in html
    assert format_money(first.credit_if_missed_minor, first.currency, minor=True) in html
    by_credit = op.get("/operator/risk", params={"by": "expected_credit"})
    assert by_credit.status_code == 200
    credits = sorted(want, key=lambda f: (-f.expected_credit, -f.p_miss, f.contract_id, f.year))
    assert _rows(by_credit.text) == [(f.contract_id, str(f.year)) for f in credits]
    assert op.get("/operator/risk", params={"by": "size"}).status_code in (400, 422)


def test_risk_view_is_for_operators_only(client_for) -> None:
    assert client_for("a").get("/operator/risk").status_code == 404
    assert client_for("fin").get("/operator/risk").status_code in (403, 404)
    anonymous = client_for().get("/operator/risk", follow_redirects=False)
    assert anonymous.status_code in (303, 401)


def test_contract_page_shows_the_forecast_next_to_the_verdict(app, client_for, seeded) -> None:
    from billing.forecast import forecast_contract_year
    from web.filters import chance

    ctx, _ = seeded
    html = client_for("a").get("/contracts/C-A").text
    line = html.split('data-test="forecast">', 1)[1].split("</p>", 1)[0]
    from sqlalchemy.orm import Session

    with Session(ctx.engine) as s:
        fc = forecast_contract_year(s, "C-A", now=app.state.portal.now())
    assert line.startswith(f"Forecast: {chance(fc.p_miss)} chance this year ends below 90 %")
    assert f"expected credit {format_money(fc.expected_credit, 'USD')}" in line and "not the verdict" in line
    # The verdict itself is unchanged; below the threshold there is no headroom to show.
    assert "Below the guarantee so far" in html
    assert 'data-test="headroom"' not in html


def test_a_year_that_has_not_started_shows_no_figures_and_no_forecast(
    app, client_for, seeded
) -> None:
    from billing.forecast import forecast_contract_year
    from billing.years import contract_year_bounds

    ctx, _ = seeded
    now = app.state.portal.now()
    from datetime import date

    start, _ = contract_year_bounds(date(2026, 1, 1), "UTC", 2)
    assert start > now  # the seeded contracts' second year is still to come
    html = client_for("a").get("/contracts/C-A", params={"year": 2}).text
    assert 'data-standing="not_started"' in html
    assert "starts on 2027-01-01" in html
    assert 'data-test="forecast"' not in html
    assert "chance" not in html and "Goodput" not in html
    # The operator's list of open years leaves it out too (as before).
    rows = _rows(client_for("op").get("/operator/risk").text)
    assert ("C-A", "2") not in rows
    import pytest
    from sqlalchemy.orm import Session

    from billing.errors import PeriodOutOfRange

    with Session(ctx.engine) as s, pytest.raises(PeriodOutOfRange, match="nothing to forecast"):
        forecast_contract_year(s, "C-A", 2, now=now)


def test_a_forecast_never_reads_as_nil_or_certain_when_it_is_neither() -> None:
    from decimal import Decimal

    import pytest

    from billing.verdict import format_probability

    assert format_probability(0.216) == "21.60 %"
    assert format_probability(0.0) == "0.00 %"
    assert format_probability(1.0) == "100.00 %"
    assert format_probability(4e-7) == "< 0.01 %"
    assert format_probability(0.99999) == "> 99.99 %"
    assert format_probability(Decimal("0.00005")) == "< 0.01 %"  # half to even: 0.00
    assert format_probability(Decimal("0.00015")) == "0.02 %"
    assert format_probability(None) == "—"
    with pytest.raises(ValueError, match="not a probability"):
        format_probability(1.5)
