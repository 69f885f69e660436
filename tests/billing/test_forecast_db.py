"""billing.forecast on a real PostgreSQL, and ``yoco risk`` end to end."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from billing import risk
from billing.errors import PeriodOutOfRange
from billing.forecast import (
    DEFAULT_LIVE_PRIOR,
    WEIGHT_DAYS,
    forecast_contract_year,
    live_history,
    open_year_forecasts,
)
from billing.services import sla_figures
from ledger.errors import UnknownContract
from tests import factories as f
from tests.billing.conftest import Y1, add_contract, counts, failures, ingest_records
from yoco.cli import build_app

MID_Y1 = datetime(2025, 7, 2, tzinfo=UTC)  # 182 days into year 1 (2025-01-01 start)
MID_Y2 = datetime(2026, 7, 2, tzinfo=UTC)

app = build_app()
runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def _pending(cid: str = "C-1", at: datetime = Y1) -> list[dict]:
    return [f.failure(cid=cid, at=at + timedelta(hours=5))]


def test_forecast_uses_the_year_to_date_and_the_pure_model(engine) -> None:
    add_contract(engine)
    recs, _ = failures(resolved=17, unresolved=2)
    ingest_records(engine, recs + _pending())
    with Session(engine) as s:
        fc = forecast_contract_year(s, "C-1", now=MID_Y1)
        figs = sla_figures(s, "C-1", year=1, now=MID_Y1).figures
    assert fc.year == 1
    assert (fc.ytd.covered, fc.ytd.resolved, fc.ytd.pending) == (
        figs.covered_failures, figs.resolved_failures, figs.pending_failures) == (20, 17, 1)
    assert fc.ytd.elapsed_days == pytest.approx(182)
    assert fc.ytd.remaining_days == pytest.approx(365 - 182)
    # No job spans and no earlier year: the rate prior carries no information.
    assert fc.rate_prior == risk.RatePrior.from_mean(0.0, WEIGHT_DAYS)
    assert fc.rate_prior_basis == "no history and no job spans yet"
    assert fc.live_prior == DEFAULT_LIVE_PRIOR
    expected = risk.forecast_year(fc.ytd, Decimal(90), fc.rate_prior, DEFAULT_LIVE_PRIOR)
    assert fc.p_miss == expected.p_miss and 0 < fc.p_miss < 1
    assert fc.credit_if_missed_minor == 25_000_000
    assert fc.expected_credit == (Decimal(repr(fc.p_miss)) * Decimal("250000.00")).quantize(
        Decimal("0.01"))
    j = fc.to_json()
    assert j["covered_so_far"] == 20 and j["credit_if_missed"] == "250000.00"
    assert j["guarantee_met_so_far"] is False  # 17 of 20 so far


def test_job_spans_give_the_law_prior(engine) -> None:
    add_contract(engine)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    ingest_records(engine, [f.job_started("big", gpus=1024, at=start)])
    with Session(engine) as s:
        fc = forecast_contract_year(s, "C-1", now=MID_Y1)
    law = risk.FailureLaw.fit()
    covered = risk.RiskModel(jobs=(risk.JobKind(gpus=1),)).covered_share
    mean = law.rate_per_hour(1024) * 24 * covered
    assert fc.rate_prior.shape == pytest.approx(0.5 + mean * WEIGHT_DAYS)
    assert fc.rate_prior_basis == "published failure law over this year's job spans"
    # ~3 failures a day expected, none seen in half a year: the posterior rate is low.
    assert fc.forecast.rate_posterior.shape / fc.forecast.rate_posterior.rate < mean / 5


def test_previous_years_feed_the_priors_and_closed_years_leave_the_overview(
    engine, close
) -> None:
    add_contract(engine)  # two years from 2025-01-01
    add_contract(engine, "C-2")
    y1, _ = failures(resolved=8, unresolved=1)
    y2, _ = failures(resolved=3, unresolved=3, at=datetime(2026, 2, 1, tzinfo=UTC))
    c2, _ = failures("C-2", resolved=5, at=datetime(2026, 2, 1, tzinfo=UTC))
    ingest_records(engine, y1 + y2 + c2)
    with Session(engine) as s:
        fc = forecast_contract_year(s, "C-1", now=MID_Y2)
        assert fc.year == 2
        assert fc.rate_prior == risk.RatePrior.from_mean(9 / 365, WEIGHT_DAYS)
        assert fc.live_prior == risk.LivePrior(a=9.5 + 8, b=0.5 + 1)
        assert fc.rate_prior_basis == "contract year 1: 9 covered failures in 365 days"
        before = open_year_forecasts(s, now=MID_Y2)
    # Year 1 of both contracts ended but is not closed: still open (only pending-free, so
    # decided); year 2 of each is running.
    assert {(x.contract_id, x.year) for x in before} == {
        ("C-1", 1), ("C-1", 2), ("C-2", 1), ("C-2", 2)}
    by_key = {(x.contract_id, x.year): x for x in before}
    assert by_key[("C-1", 1)].p_miss == 1.0  # 8 of 9: missed, nothing left to happen
    assert by_key[("C-2", 1)].p_miss == 0.0  # no covered failure: met
    ps = [x.p_miss for x in before]
    assert ps == sorted(ps, reverse=True)
    close("C-1", 1, now=datetime(2026, 2, 2, tzinfo=UTC))
    with Session(engine) as s:
        after = open_year_forecasts(s, now=MID_Y2)
        mine = open_year_forecasts(s, now=MID_Y2, contract_ids=["C-2"])
    assert ("C-1", 1) not in {(x.contract_id, x.year) for x in after}
    assert {x.contract_id for x in mine} == {"C-2"}


def test_refusals(engine) -> None:
    add_contract(engine)
    with Session(engine) as s:
        with pytest.raises(PeriodOutOfRange, match="nothing to forecast yet"):
            forecast_contract_year(s, "C-1", 2, now=MID_Y1)
        with pytest.raises(PeriodOutOfRange, match="outside"):
            forecast_contract_year(s, "C-1", 3, now=MID_Y1)
        with pytest.raises(UnknownContract):
            forecast_contract_year(s, "NOPE", now=MID_Y1)
        # Nothing to forecast before the contract starts.
        assert open_year_forecasts(s, now=datetime(2024, 6, 1, tzinfo=UTC)) == []


def test_live_history_by_class(engine) -> None:
    add_contract(engine)
    recs, _ = failures(resolved=4, unresolved=1)
    planned, _ = failures(resolved=2, cls="planned", at=Y1 + timedelta(days=3))
    ingest_records(engine, recs + planned + _pending())
    with Session(engine) as s:
        h = live_history(s, "C-1", now=MID_Y1)
    assert h == {
        "unplanned": {"with_outcome": 5, "live": 4},
        "preemptive": {"with_outcome": 0, "live": 0},
        "planned": {"with_outcome": 2, "live": 2},
    }


# --------------------------------------------------------------------------- CLI


def test_cli_risk_price_plain_json_html_and_refusals(tmp_path: Path) -> None:
    assert "forecast" in yoco("risk", "--help")
    for cmd in ("price", "forecast", "launch-figures", "calibration"):
        assert "Usage" in yoco("risk", cmd, "--help")
    text = yoco("risk", "price", "--job", "gpus=2048", "--gpu-hour-price", "2.50",
                "--samples", "2000")
    assert "P(year below the threshold)" in text and "1,605.0 failures/year" in text
    body = json.loads(yoco("risk", "price", "--job", "gpus=256,count=2,hours=4000",
                           "--live", "unplanned=0.8", "--samples", "2000", "--json"))
    assert body["jobs"][0]["count"] == 2 and body["exact"]["p_miss"] > 0.5
    assert body["monte_carlo"]["p_miss_agrees_with_exact"] is True
    page = tmp_path / "price.html"
    yoco("risk", "price", "--samples", "500", "--html", str(page))
    html = page.read_text()
    assert "<svg" in html and "<script" not in html and "threshold 90%" in html
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"jobs": [{"gpus": 64, "count": 3}], "currency": "JPY",
                                 "credit_base": "1000002", "terms": {"threshold_percent": "95"}}))
    body = json.loads(yoco("risk", "price", "--model", str(model), "--samples", "500", "--json"))
    assert body["exact"]["credit_if_missed"] == "250001" and body["currency"] == "JPY"
    assert body["terms"]["threshold_percent"] == "95"
    # Refused input: exit 2 naming the field, nothing written.
    bad = tmp_path / "bad.html"
    for args, msg in (
        (("--job", "gpus=8,hours=abc"), "hours must be a number"),
        (("--job", "gpus=-8"), "gpus"),
        (("--job", "8"), "expected key=value"),
        (("--live", "unplanned=2"), "live.unplanned"),
        (("--gpu-hour-price", "-1"), "gpu-hour-price"),
        (("--model", str(tmp_path / "missing.json")), "cannot read"),
    ):
        out = yoco("risk", "price", *args, "--html", str(bad), code=2)
        assert msg in out
    model.write_text('{"jobs": [{"gpus": 8}], "colour": 1}')
    assert "unknown field 'colour'" in yoco("risk", "price", "--model", str(model), code=2)
    model.write_text('{"jobs": [\n{"gpus": 8},]}')
    assert "line 2" in yoco("risk", "price", "--model", str(model), code=2)
    assert not bad.exists()


def test_cli_launch_figures_and_calibration() -> None:
    text = yoco("risk", "launch-figures")
    assert "3.04 h/day" in text and "[NOT consistent]" in text
    rows = json.loads(yoco("risk", "launch-figures", "--json", "--gpu-hour-price", "1.00"))
    assert not rows[-1]["consistent"]
    table = json.loads(yoco("risk", "calibration", "--years", "50", "--json"))
    assert table["years"] == 50 and len(table["rows"]) == 10


def test_cli_forecast_and_price_from_a_contract(yoco_env, engine, tmp_path: Path) -> None:
    add_contract(engine, start_date="2025-01-01", gpu_hour_price="3.00")
    add_contract(engine, "C-2", start_date="2025-01-01")
    recs, _ = failures(resolved=17, unresolved=3)
    ingest_records(engine, recs)
    before = counts(engine)
    body = json.loads(yoco("risk", "forecast", "--now", "2025-07-02T00:00:00+00:00", "--json"))
    assert (body[0]["contract_id"], body[0]["year"]) == ("C-1", 1)
    assert body[0]["p_miss"] > body[1]["p_miss"]
    assert body[0]["covered_so_far"] == 20 and body[0]["resolved_so_far"] == 17
    text = yoco("risk", "forecast", "--contract", "C-1", "--year", "1",
                "--now", "2025-07-02T00:00:00+00:00")
    assert "C-1 year 1: P(ends below 90%)" in text
    page = tmp_path / "f.html"
    yoco("risk", "forecast", "--now", "2025-07-02T00:00:00+00:00", "--by", "expected_credit",
         "--html", str(page))
    assert "<svg" in page.read_text() and "C-2" in page.read_text()
    assert "unknown contract" in yoco("risk", "forecast", "--contract", "NOPE", code=2).lower()
    assert "--year needs --contract" in yoco("risk", "forecast", "--year", "1", code=2)
    assert "--by" in yoco("risk", "forecast", "--by", "size", code=2)
    assert "UTC offset" in yoco("risk", "forecast", "--now", "2025-07-02T00:00:00", code=2)
    priced = json.loads(yoco("risk", "price", "--contract", "C-1", "--samples", "500", "--json"))
    assert priced["contract"]["live_history"]["unplanned"] == {"with_outcome": 20, "live": 17}
    assert priced["gpu_hour_price"] == "3.00" and priced["term_years"] == 2
    assert counts(engine) == before  # read-only


def test_build_forecast_is_pure_and_matches_the_service(engine) -> None:
    """The builder the monthly report uses gives the service's forecast from the same data."""
    from billing.amendments import contract_in_force
    from billing.forecast import YearHistory, build_forecast, previous_years
    from billing.services import figures_for, load_period

    add_contract(engine)
    y1, _ = failures(resolved=8, unresolved=1)
    y2, _ = failures(resolved=5, unresolved=1, at=datetime(2026, 2, 1, tzinfo=UTC))
    ingest_records(engine, y1 + y2 + [f.job_started("j", gpus=64, at=datetime(2026, 1, 5, tzinfo=UTC))])
    with Session(engine) as s:
        service = forecast_contract_year(s, "C-1", 2, now=MID_Y2)
        inf = contract_in_force(s, "C-1", 2)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        end = datetime(2027, 1, 1, tzinfo=UTC)
        figs = figures_for(s, inf.contract, start, end, MID_Y2, inf.terms)
        prev = previous_years(s, inf.contract, inf.terms, 2, MID_Y2)
        jobs = load_period(s, "C-1", start, MID_Y2).jobs
    assert prev == YearHistory(years=1, covered=9, resolved=8, unresolved=1, days=365.0)
    built = build_forecast(contract=inf.contract, terms=inf.terms, year=2, figures=figs,
                           until=MID_Y2, previous=prev, jobs=jobs)
    assert built == service
    # Observing less of the year leaves more to happen: the forecast is taken at `until`.
    early = build_forecast(contract=inf.contract, terms=inf.terms, year=2, figures=figs,
                           until=datetime(2026, 3, 1, tzinfo=UTC), previous=prev, jobs=jobs)
    assert early.ytd.remaining_days == pytest.approx(306)
    assert early.to_json()["as_of"] == "2026-03-01T00:00:00+00:00"
    assert YearHistory.from_figures([]) is None
