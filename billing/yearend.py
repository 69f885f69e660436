"""The one wording of a contract year's span, state and closing verdict.

The credits page, the finance export (CSV/XLSX) and the command line (``yoco billing
status``/``credits``/``close-year``) say the same things of a year with these words: its
span as its first and *last* day, both included (``2024-02-29 to 2025-02-27``: a year
ends at the midnight that starts its anniversary, which is not one of its days), its
state (``not started``, ``open``, ``ended, closing``, ``closed``) and, once closed, its
verdict (``guarantee met`` / ``guarantee missed``).

Pure functions, no I/O.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Final

from billing.years import contract_year_dates, require_aware

__all__ = [
    "YEAR_STATES",
    "closed_verdict_text",
    "period_text",
    "year_days",
    "year_state",
    "year_state_label",
]

#: A contract year's states and their words, in the order a year goes through them.
YEAR_STATES: Final = {
    "not_started": "not started",
    "open": "open",
    "closing": "ended, closing",
    "closed": "closed",
}


def year_days(start_date: date, k: int) -> tuple[date, date]:
    """Contract year ``k``'s first and last local day, both included (the last is the day
    before the anniversary).  Raises ValueError for ``k < 1``."""
    first, after = contract_year_dates(start_date, k)
    return first, after - timedelta(days=1)


def period_text(first: date, last: date) -> str:
    """A span of days, both included, as every surface writes it: ``2024-02-29 to
    2025-02-27``."""
    return f"{first.isoformat()} to {last.isoformat()}"


def year_state(start: datetime, end: datetime, now: datetime, closed: bool) -> str:
    """The state (a key of :data:`YEAR_STATES`) of a year spanning ``[start, end)`` at
    ``now``: ``closed`` once closed, whatever the clock says; else ``not_started``,
    ``open`` or (ended, not closed yet) ``closing``.  Raises ValueError for a naive time."""
    for name, value in (("start", start), ("end", end), ("now", now)):
        require_aware(name, value)
    if closed:
        return "closed"
    if now < start:
        return "not_started"
    return "open" if now < end else "closing"


def year_state_label(state: str) -> str:
    """The words of a year state: ``closing`` → "ended, closing".  Raises ValueError for an
    unknown state."""
    try:
        return YEAR_STATES[state]
    except KeyError:
        raise ValueError(f"state: unknown contract-year state {state!r}") from None


def closed_verdict_text(guarantee_met: bool) -> str:
    """A closed year's verdict: "guarantee met" or "guarantee missed"."""
    return "guarantee met" if guarantee_met else "guarantee missed"
