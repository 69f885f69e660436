"""The forecast of a contract year as the portal shows it (billing.forecast, cached).

:func:`view_forecast` forecasts the year of a :class:`~web.views.YearView` from the
records the view already holds (the year's figures and job spans) and, for a second or
later year, the contract's earlier years read through the caller's scoped session.
Cached per view stamp (contract, year, log size, time): it changes only when they do.
"""

from __future__ import annotations

from typing import Any

from billing.forecast import YearForecast, build_forecast, previous_years
from web.accounts import Principal
from web.cache import view_stamp
from web.views import YearView

__all__ = ["view_forecast"]


def view_forecast(portal: Any, user: Principal, view: YearView) -> YearForecast | None:
    """The forecast of ``view``'s year, or None for a closed year (its verdict is final)
    and for a year that has not started (nothing to forecast from)."""
    if view.closed is not None or view.now < view.start:
        return None

    def compute() -> YearForecast:
        previous = None
        if view.year > 1:
            with portal.db.read(user) as db:
                previous = previous_years(db, view.contract, view.terms, view.year, view.now)
        jobs = view.records.jobs if view.records is not None else []
        return build_forecast(
            contract=view.contract,
            terms=view.terms,
            year=view.year,
            figures=view.figures,
            until=view.now,
            previous=previous,
            jobs=jobs,
        )

    result: YearForecast = portal.cache.views.memo(("forecast", *view_stamp(view)), compute)
    return result
