"""Contract-year views: the figures, the monthly series and the failure rows of one year.

One load of the year's records gives everything the dashboard, the failures list and
the operator overview show.  They are kept in the portal's one cache (``web.cache``:
:class:`web.cache.ViewCache`, under its rule).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from billing import sla
from billing.services import load_period
from billing.terms import Terms
from billing.verdict import Standing, Verdict, rate_percent, verdict
from billing.years import contract_year_bounds, month_bounds
from ledger.journal import log_size
from ledger.records import ContractSpec


@dataclass(frozen=True, slots=True)
class MonthFigures:
    """Figures of one calendar month (clipped to the contract year)."""

    label: str
    start: datetime
    end: datetime
    figures: sla.SlaFigures | None


@dataclass(frozen=True, slots=True)
class Row:
    """A failure row of the list, with its month (YYYY-MM in the contract's zone)."""

    row: sla.FailureRow
    month: str

    @property
    def event_id(self) -> str:
        """The failure's event id."""
        return self.row.failure.event_id


@dataclass(frozen=True, slots=True)
class YearView:
    """Everything shown about one contract year, computed at ``now``."""

    contract: ContractSpec
    terms: Terms
    year: int
    start: datetime
    end: datetime
    now: datetime
    log_size: int
    figures: sla.SlaFigures
    months: tuple[MonthFigures, ...]
    rows: tuple[Row, ...]
    by_id: dict[str, Row] = field(repr=False)
    credit: dict[str, Any] | None = None
    closed: dict[str, Any] | None = None
    cause_list: tuple[str, ...] = ()
    #: The year's records as loaded (refreshing the figures at a later ``now`` while the
    #: log has not grown needs no reload).
    records: Any = field(default=None, repr=False, compare=False)

    @property
    def causes(self) -> list[str]:
        """Causes that occur this year, sorted (computed once, with the view)."""
        return list(self.cause_list)


def _months(start: datetime, end: datetime, tz: str) -> list[tuple[str, datetime, datetime]]:
    zone = ZoneInfo(tz)
    local = start.astimezone(zone)
    y, m = local.year, local.month
    out = []
    while True:
        ms, me = month_bounds(y, m, tz)
        if ms >= end:
            break
        out.append((f"{y:04d}-{m:02d}", max(ms, start), min(me, end)))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def compute_year_view(
    session: Session, contract: ContractSpec, terms: Terms, year: int, now: datetime
) -> YearView:
    """Load contract year ``year`` once and compute its figures, months and rows.

    ``contract`` and ``terms`` are those in force for that year (after amendments).
    """
    start, end = contract_year_bounds(contract.start_date, contract.timezone, year)
    size = log_size(session, contract.contract_id)
    recs = load_period(session, contract.contract_id, start, end)
    return _build_view(session, contract, terms, year, now, size, recs)


def refresh_year_view(session: Session, view: YearView, now: datetime) -> YearView:
    """``view`` computed again at ``now`` from the records it was computed from.

    Only for a log that has not grown since (the caller checks the size): the records
    are the same, only what depends on the time changes — allocated GPU-hours run to
    ``min(period end, now)``, and months begin.  So the failure rows are kept, and so
    are the figures of months that had ended by ``view.now`` (identical at any later
    time but for their ``now``); the year's figures and the later months are computed
    again.
    """
    return _build_view(
        session, view.contract, view.terms, view.year, now, view.log_size, view.records,
        previous=view,
    )


def _build_view(
    session: Session,
    contract: ContractSpec,
    terms: Terms,
    year: int,
    now: datetime,
    size: int,
    recs: Any,
    previous: YearView | None = None,
) -> YearView:
    start, end = contract_year_bounds(contract.start_date, contract.timezone, year)
    if previous is not None and previous.now > now:
        previous = None  # a clock that went back: compute everything
    figures = sla.compute_figures(
        terms=terms,
        period_start=start,
        period_end=end,
        now=now,
        failures=recs.failures,
        outcomes=recs.outcomes,
        exclusions=recs.exclusions,
        jobs=recs.jobs,
    )
    kept: dict[str, sla.SlaFigures] = {}
    if previous is None:
        rows = sla.failure_rows(
            terms=terms,
            period_start=start,
            period_end=end,
            failures=recs.failures,
            outcomes=recs.outcomes,
            exclusions=recs.exclusions,
        )
    else:
        rows = tuple(r.row for r in previous.rows)
        kept = {
            m.label: replace(m.figures, now=now)
            for m in previous.months
            if m.figures is not None and m.end <= previous.now
        }
    month_list = _months(start, end, contract.timezone)
    zone = ZoneInfo(contract.timezone)
    by_month: dict[str, list[sla.Failure]] = defaultdict(list)
    for f in recs.failures:
        by_month[f.occurred_at.astimezone(zone).strftime("%Y-%m")].append(f)
    outcomes_of: dict[str, list[sla.Outcome]] = defaultdict(list)
    for o in recs.outcomes:
        outcomes_of[o.failure_event_id].append(o)
    excl_of: dict[str, list[sla.Exclusion]] = defaultdict(list)
    for x in recs.exclusions:
        excl_of[x.failure_event_id].append(x)
    months = []
    for label, ms, me in month_list:
        if ms >= now:
            months.append(MonthFigures(label, ms, me, None))
            continue
        if label in kept:
            months.append(MonthFigures(label, ms, me, kept[label]))
            continue
        fs = by_month.get(label, [])
        months.append(
            MonthFigures(
                label,
                ms,
                me,
                sla.compute_figures(
                    terms=terms,
                    period_start=ms,
                    period_end=me,
                    now=now,
                    failures=fs,
                    outcomes=[o for f in fs for o in outcomes_of.get(f.event_id, ())],
                    exclusions=[x for f in fs for x in excl_of.get(f.event_id, ())],
                    jobs=recs.jobs,
                ),
            )
        )
    view_rows = tuple(
        Row(r, r.failure.occurred_at.astimezone(zone).strftime("%Y-%m")) for r in rows
    )
    from web import billing_bridge

    credit = billing_bridge.credit_status(session, contract.contract_id, year)
    closed = billing_bridge.year_closes(session, contract.contract_id).get(year)
    return YearView(
        contract=contract,
        terms=terms,
        year=year,
        start=start,
        end=end,
        now=now,
        log_size=size,
        figures=figures,
        months=tuple(months),
        rows=view_rows,
        by_id={r.event_id: r for r in view_rows},
        credit=credit,
        closed=closed,
        cause_list=tuple(sorted({r.row.failure.cause for r in view_rows})),
        records=recs,
    )


def settle() -> None:
    """After a year view was made: collect the young garbage (cheap: the two younger
    generations), then move every object still alive out of the cyclic collector's
    reach (:func:`gc.freeze`).

    A view holds a year's records — hundreds of thousands of objects that live until
    the view is replaced — and each full collection walked them all, finding nothing:
    with the interpreter lock held, several times a minute per worker under load
    (``gc.callbacks``), which every request in flight waited for; after this, a
    hundredth of that (docs/benchmarks-portal.md, "Figures behind the code").  Frozen
    objects are still freed by reference counting when a view is dropped (its records
    hold no reference cycles); a cycle among frozen objects would be kept.
    """
    import gc

    gc.collect(1)
    gc.freeze()


def year_verdict(view: YearView) -> Verdict:
    """Where the guarantee stands for the year of ``view`` (:func:`billing.verdict.verdict`):
    closed once ``view.now`` has reached the year's end."""
    f = view.figures
    return verdict(f.resolved_failures, f.covered_failures, f.threshold_percent,
                   view.now >= view.end)


def month_verdict(month: MonthFigures, now: datetime) -> Verdict | None:
    """The standing of one month on its own (None for a month still to come)."""
    f = month.figures
    if f is None:
        return None
    return verdict(f.resolved_failures, f.covered_failures, f.threshold_percent,
                   now >= month.end)


#: Order of standings on the SLA desk: the ones that need attention first.
_URGENCY = {
    Standing.MISSED: 0, Standing.BELOW: 1, Standing.AT_RISK: 2,
    Standing.ON_TRACK: 3, Standing.MET: 4, Standing.NO_COVERED: 5,
}


def projected_margin(view: YearView) -> tuple[bool, Fraction]:
    """(needs attention, margin): whether the year is below its threshold or at risk
    (:func:`year_verdict`), and its resolution rate minus the threshold in points, exact.

    Pending failures count as unresolved, as in the figures.  The margin sorts contracts
    most at risk first; with no covered failure it is the full headroom (100 points).
    """
    v = year_verdict(view)
    pct = rate_percent(v.resolved, v.covered)
    margin = Fraction(100) if pct is None else pct - Fraction(v.threshold_percent)
    return v.standing in (Standing.MISSED, Standing.BELOW, Standing.AT_RISK), margin


def urgency(view: YearView) -> tuple[int, Fraction]:
    """A sort key: missed, below so far, at risk, on track, met, no covered failures; then
    the lowest margin first."""
    return _URGENCY[year_verdict(view).standing], projected_margin(view)[1]


def elapsed_share(view: YearView) -> float:
    """The share of the contract year that has passed at ``view.now`` (0..1)."""
    total = (view.end - view.start) / timedelta(seconds=1)
    done = (min(max(view.now, view.start), view.end) - view.start) / timedelta(seconds=1)
    return done / total if total > 0 else 1.0
