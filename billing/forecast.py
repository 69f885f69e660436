"""Forecast of open contract years from the ledger: how likely each ends below the line.

Read-only services (take a session, never commit): :func:`forecast_contract_year`,
:func:`open_year_forecasts` and :func:`live_history`.  The mathematics is in
:mod:`billing.risk` (:func:`billing.risk.forecast_year`); this module only gathers the
year to date and chooses the priors (docs/risk.md, "Forecast during the year"):

* **Failure rate** (covered failures per day): a Gamma prior worth
  ``weight_days`` (30) of observation at a prior mean taken, in this order, from
  1. the contract's previous contract years (their covered failures per day), or
  2. the published failure law applied to this year's own job spans so far (each span
     contributes GPU-hours × the law's rate for its size × the covered share of the
     default class and cause mix under the year's terms), or
  3. nothing (mean 0; the prior is then Gamma(0.5, 30 days)),
  then updated with the year's covered failures over its elapsed days.
* **Live resolution** (probability a covered failure is resolved live): Beta(9.5, 0.5)
  (mean 0.95, worth ten failures), plus the previous years' resolved / unresolved
  covered failures scaled down to at most 50 failures' worth, then updated with this
  year's.  Pending failures are forecast like future ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing import risk, sla
from billing.amendments import InForce, contract_in_force
from billing.errors import PeriodOutOfRange
from billing.models import BillingYear
from billing.money import credit_minor_units, format_minor, from_minor_units, minor_unit_exponent
from billing.services import check_year, current_year, figures_for, load_period
from billing.terms import Terms
from billing.years import contract_year_bounds
from ledger.contracts import list_contracts
from ledger.records import ContractSpec

__all__ = [
    "DEFAULT_LIVE_PRIOR",
    "HISTORY_WEIGHT",
    "WEIGHT_DAYS",
    "YearForecast",
    "YearHistory",
    "build_forecast",
    "forecast_contract_year",
    "law_rate_mean",
    "live_history",
    "open_year_forecasts",
    "previous_years",
]

#: Prior of the live-resolution probability before any history (mean 0.95, ten failures).
DEFAULT_LIVE_PRIOR = risk.LivePrior(a=9.5, b=0.5)
#: Days of observation the failure-rate prior is worth.
WEIGHT_DAYS = 30.0
#: At most this many failures' worth of previous years enter the live prior.
HISTORY_WEIGHT = 50.0
_DAY = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class YearForecast:
    """One open contract year: its year to date and the forecast of its verdict."""

    contract_id: str
    customer: str
    year: int
    period_start: datetime
    period_end: datetime
    now: datetime
    currency: str
    threshold_percent: Decimal
    ytd: risk.YearToDate
    forecast: risk.Forecast
    credit_if_missed_minor: int
    expected_credit: Decimal
    rate_prior: risk.RatePrior
    rate_prior_basis: str
    live_prior: risk.LivePrior
    live_prior_basis: str
    guarantee_met_so_far: bool

    @property
    def p_miss(self) -> float:
        """Probability that the year ends below the threshold."""
        return self.forecast.p_miss

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: money as decimal strings, probabilities as numbers, times UTC."""
        return {
            "contract_id": self.contract_id,
            "customer": self.customer,
            "year": self.year,
            "period_start": self.period_start.astimezone(UTC).isoformat(),
            "period_end": self.period_end.astimezone(UTC).isoformat(),
            "as_of": self.now.astimezone(UTC).isoformat(),
            "threshold_percent": format(self.threshold_percent, "f"),
            "covered_so_far": self.ytd.covered,
            "resolved_so_far": self.ytd.resolved,
            "pending_so_far": self.ytd.pending,
            "guarantee_met_so_far": self.guarantee_met_so_far,
            "elapsed_days": round(self.ytd.elapsed_days, 6),
            "remaining_days": round(self.ytd.remaining_days, 6),
            "p_miss": self.forecast.p_miss,
            "method": self.forecast.method,
            "standard_error": self.forecast.standard_error,
            "expected_covered_at_end": self.forecast.expected_covered_at_end,
            "expected_resolved_at_end": self.forecast.expected_resolved_at_end,
            "currency": self.currency,
            "credit_if_missed": format_minor(self.credit_if_missed_minor, self.currency),
            "expected_credit": format(self.expected_credit, "f"),
            "rate_prior": {
                "shape": self.rate_prior.shape,
                "rate_days": self.rate_prior.rate,
                "basis": self.rate_prior_basis,
            },
            "live_prior": {
                "a": self.live_prior.a,
                "b": self.live_prior.b,
                "basis": self.live_prior_basis,
            },
        }


def _days(a: datetime, b: datetime) -> float:
    return max((b - a).total_seconds(), 0.0) / _DAY


@dataclass(frozen=True, slots=True, kw_only=True)
class YearHistory:
    """A contract's previous contract years, summed: what the priors learn from."""

    years: int
    covered: int
    resolved: int
    unresolved: int
    days: float

    @classmethod
    def from_figures(cls, figures: Sequence[sla.SlaFigures]) -> YearHistory | None:
        """The sum of previous years' figures (None when there is none)."""
        if not figures:
            return None
        return cls(
            years=len(figures),
            covered=sum(f.covered_failures for f in figures),
            resolved=sum(f.resolved_failures for f in figures),
            unresolved=sum(
                f.covered_failures - f.resolved_failures - f.pending_failures for f in figures
            ),
            days=sum(_days(f.period_start, f.period_end) for f in figures),
        )


def law_rate_mean(
    jobs: Iterable[sla.JobSpan], terms: Terms, start: datetime, stop: datetime
) -> float:
    """Covered failures per day the published failure law expects of ``jobs`` in ``[start, stop)``.

    Each span contributes its GPU-hours inside the interval × the law's per-job rate for
    its size; times the covered share of the default class and cause mix under
    ``terms``; divided by the interval's days (0 for an empty interval).
    """
    if stop <= start:
        return 0.0
    law = risk.FailureLaw.fit()
    covered = risk.RiskModel(jobs=(risk.JobKind(gpus=1),), terms=terms).covered_share
    expected = 0.0
    for j in jobs:
        lo = max(j.started_at, start)
        hi = stop if j.finished_at is None else min(j.finished_at, stop)
        if hi > lo:
            expected += (hi - lo).total_seconds() / 3600 * law.rate_per_hour(j.gpus)
    return expected * covered / _days(start, stop)


def _refuse_unstarted(contract_id: str, year: int, start: datetime, now: datetime) -> None:
    # A year that has not started has nothing to forecast from: no page, report or
    # operator list may show a chance of missing (or an expected credit) for it.
    if start > now:
        raise PeriodOutOfRange(
            f"year {year} of contract {contract_id!r} starts {start.isoformat()}, after "
            f"{now.isoformat()}: nothing to forecast yet"
        )


def build_forecast(
    *,
    contract: ContractSpec,
    terms: Terms,
    year: int,
    figures: sla.SlaFigures,
    until: datetime,
    previous: YearHistory | None,
    jobs: Iterable[sla.JobSpan],
) -> YearForecast:
    """The forecast of contract year ``year`` from its figures so far (pure).

    ``figures`` are the year's figures counting failures up to ``until`` (the year to
    date: ``figures.period_start`` is the year's start); the rest of the year, from
    ``until`` to the year's end, is forecast; a year that starts after ``until`` is
    refused (:class:`~billing.errors.PeriodOutOfRange`).  ``previous`` sums the contract's earlier
    years; ``jobs`` are the year's job spans (for the law prior when there is no earlier
    year).  Priors as documented in this module and docs/risk.md.
    """
    start = figures.period_start
    _refuse_unstarted(contract.contract_id, year, start, until)
    _, end = contract_year_bounds(contract.start_date, contract.timezone, year)
    stop = min(max(until, start), end)
    ytd = risk.YearToDate(
        covered=figures.covered_failures,
        resolved=figures.resolved_failures,
        pending=figures.pending_failures,
        elapsed_days=_days(start, stop),
        remaining_days=_days(stop, end),
    )
    if previous is not None and previous.days > 0:
        rate_mean = previous.covered / previous.days
        span = "1" if previous.years == 1 else f"1-{previous.years}"
        rate_basis = (
            f"contract year{'s' if previous.years > 1 else ''} {span}: {previous.covered} "
            f"covered failures in {previous.days:.0f} days"
        )
    else:
        rate_mean = law_rate_mean(jobs, terms, start, stop)
        rate_basis = (
            "published failure law over this year's job spans"
            if rate_mean > 0
            else "no history and no job spans yet"
        )
    rate_prior = risk.RatePrior.from_mean(rate_mean, WEIGHT_DAYS)
    hist = 0 if previous is None else previous.resolved + previous.unresolved
    if previous is not None and hist > 0:
        scale = min(1.0, HISTORY_WEIGHT / hist)
        live_prior = risk.LivePrior(
            a=DEFAULT_LIVE_PRIOR.a + previous.resolved * scale,
            b=DEFAULT_LIVE_PRIOR.b + previous.unresolved * scale,
        )
        live_basis = (
            f"Beta(9.5, 0.5) + earlier years ({previous.resolved} resolved, "
            f"{previous.unresolved} unresolved, weighted {scale:.2f})"
        )
    else:
        live_prior = DEFAULT_LIVE_PRIOR
        live_basis = "Beta(9.5, 0.5): mean 0.95, worth ten failures"
    fc = risk.forecast_year(ytd, terms.threshold_percent, rate_prior, live_prior)
    credit = credit_minor_units(contract.credit_base, terms.credit_percent, contract.currency)
    exp = minor_unit_exponent(contract.currency)
    expected = (Decimal(repr(fc.p_miss)) * from_minor_units(credit, contract.currency)).quantize(
        Decimal(1).scaleb(-exp), rounding=ROUND_HALF_UP
    )
    return YearForecast(
        contract_id=contract.contract_id,
        customer=contract.customer,
        year=year,
        period_start=start,
        period_end=end,
        now=stop,
        currency=contract.currency,
        threshold_percent=terms.threshold_percent,
        ytd=ytd,
        forecast=fc,
        credit_if_missed_minor=credit,
        expected_credit=expected,
        rate_prior=rate_prior,
        rate_prior_basis=rate_basis,
        live_prior=live_prior,
        live_prior_basis=live_basis,
        guarantee_met_so_far=figures.guarantee_met,
    )


def previous_years(
    session: Session, contract: ContractSpec, terms: Terms, year: int, now: datetime
) -> YearHistory | None:
    """The contract's years before ``year`` summed (their figures as of ``now``), or None.

    Uses every entry recorded so far and ``terms`` (the year's) for coverage.
    """
    figs = []
    for j in range(1, year):
        ps, pe = contract_year_bounds(contract.start_date, contract.timezone, j)
        figs.append(figures_for(session, contract, ps, pe, now, terms))
    return YearHistory.from_figures(figs)


def forecast_contract_year(
    session: Session,
    contract_id: str,
    year: int | None = None,
    *,
    now: datetime | None = None,
    in_force: InForce | None = None,
) -> YearForecast:
    """The forecast of contract year ``year`` (default: the current one) as of ``now``.

    Uses every entry recorded so far.  A year that has not started is refused
    (:class:`~billing.errors.PeriodOutOfRange`); a year that has ended but is not closed
    has no remaining time, so only its pending failures are uncertain.  Raises
    :class:`~ledger.errors.UnknownContract` for an unknown contract.
    """
    now = now or datetime.now(UTC)
    if in_force is None:
        base = contract_in_force(session, contract_id, 1)
        k = current_year(base.contract, now) if year is None else year
        check_year(base.contract, k)
        in_force = base if k == 1 else contract_in_force(session, contract_id, k)
    else:
        k = year if year is not None else current_year(in_force.contract, now)
    contract, terms = in_force.contract, in_force.terms
    start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
    _refuse_unstarted(contract_id, k, start, now)
    stop = min(end, now)
    fig = figures_for(session, contract, start, end, now, terms)
    jobs = load_period(session, contract_id, start, stop).jobs if stop > start else []
    return build_forecast(
        contract=contract,
        terms=terms,
        year=k,
        figures=fig,
        until=now,
        previous=previous_years(session, contract, terms, k, now),
        jobs=jobs,
    )


def open_year_forecasts(
    session: Session,
    *,
    now: datetime | None = None,
    contract_ids: list[str] | None = None,
) -> list[YearForecast]:
    """Forecasts of every open contract year (started, not closed), riskiest first.

    Sorted by probability of missing (descending), then expected credit (descending),
    then contract id and year.  ``contract_ids`` restricts the contracts (a tenant's
    view); unknown ids are ignored.
    """
    now = now or datetime.now(UTC)
    wanted = None if contract_ids is None else set(contract_ids)
    closed = {
        (c, y) for c, y in session.execute(select(BillingYear.contract_id, BillingYear.year))
    }
    out: list[YearForecast] = []
    for c in list_contracts(session):
        if wanted is not None and c.contract_id not in wanted:
            continue
        base = contract_in_force(session, c.contract_id, 1)
        for k in range(1, base.term_years + 1):
            start, _ = contract_year_bounds(base.contract.start_date, base.contract.timezone, k)
            if start > now:
                break
            if (c.contract_id, k) in closed:
                continue
            in_force = base if k == 1 else contract_in_force(session, c.contract_id, k)
            out.append(
                forecast_contract_year(session, c.contract_id, k, now=now, in_force=in_force)
            )
    out.sort(key=lambda f: (-f.p_miss, -f.expected_credit, f.contract_id, f.year))
    return out


def live_history(
    session: Session, contract_id: str, *, now: datetime | None = None
) -> dict[str, dict[str, int]]:
    """Per failure class, the contract's failures with an outcome and how many were live.

    Over its whole history up to ``now`` (every class, covered or not; latest outcomes;
    pending failures are left out).  Returns ``{class: {"with_outcome": n, "live": k}}``.
    Raises :class:`~ledger.errors.UnknownContract` for an unknown contract.
    """
    now = now or datetime.now(UTC)
    base = contract_in_force(session, contract_id, 1).contract
    start, _ = contract_year_bounds(base.start_date, base.timezone, 1)
    out = {c: {"with_outcome": 0, "live": 0} for c in ("unplanned", "preemptive", "planned")}
    if now <= start:
        return out
    records = load_period(session, contract_id, start, now)
    latest = sla.latest_outcomes(records.outcomes)
    for f in records.failures:
        o = latest.get(f.event_id)
        if o is None:
            continue
        out[f.failure_class]["with_outcome"] += 1
        out[f.failure_class]["live"] += int(sla.is_resolved(o))
    return out
