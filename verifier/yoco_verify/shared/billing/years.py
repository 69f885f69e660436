# A copy of billing/years.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Contract years and calendar months, as exact instants.

Definitions (DESIGN section 2, docs/definitions.md):

* Contract year ``k`` (``k = 1, 2, ...``) runs from the ``(k-1)``-th anniversary of the
  contract start date (inclusive) to the ``k``-th anniversary (exclusive), each taken at
  local midnight in the contract's IANA time zone.
* A start on 29 February has its anniversary on 28 February in non-leap years (and on
  29 February again in leap years).
* "Local midnight" of a date ``D`` is the first instant whose local date in the zone is
  ``D``.  Where midnight exists once, that is ``D 00:00``.  Where it exists twice (a
  fall-back transition at midnight) it is the earlier of the two.  Where it does not exist
  (a spring-forward gap over midnight) it is the instant of the transition, i.e. the
  first instant of the local date ``D``.  Where the whole of ``D`` is skipped (Pacific/Apia,
  30 December 2011) it is the first instant of the next local date that exists.
* Calendar months (for monthly reports) are calendar months in the contract's time zone:
  ``[local midnight of the 1st, local midnight of the 1st of the next month)``.

Every function returns timezone-aware datetimes in UTC and refuses naive datetimes.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "ContractYear",
    "anniversary",
    "contract_year_bounds",
    "contract_year_dates",
    "local_midnight",
    "month_bounds",
    "parse_month",
    "require_aware",
    "year_of",
    "years_in_term",
    "zone",
]


def require_aware(name: str, value: object) -> datetime:
    """Return ``value`` if it is a timezone-aware ``datetime``.

    Raises ValueError (naming ``name``) for a naive datetime, or for anything that is not a
    ``datetime``.  Promises: the returned value is the same object, with a defined UTC offset.
    """
    if not isinstance(value, datetime):
        raise ValueError(f"{name}: expected a timezone-aware datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}: naive datetime {value.isoformat()} (a time zone is required)")
    return value


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def zone(tz: str) -> ZoneInfo:
    """Return the IANA time zone named ``tz``.

    Raises ValueError when ``tz`` is not a string naming a zone known to the system's
    tz database.  Promises: the same name always yields the same zone object.
    """
    if not isinstance(tz, str) or not tz:
        raise ValueError(f"timezone: expected an IANA zone name, got {tz!r}")
    try:
        return _zone(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"timezone: unknown IANA time zone {tz!r}") from exc


def _check_date(name: str, value: object) -> date:
    if not isinstance(value, date) or isinstance(value, datetime):
        raise ValueError(f"{name}: expected a date, got {value!r}")
    return value


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def anniversary(start_date: date, n: int) -> date:
    """Return the ``n``-th anniversary (``n >= 0``) of ``start_date`` as a local date.

    The 0-th anniversary is ``start_date`` itself.  A 29 February start falls on
    28 February in non-leap years.  Raises ValueError for ``n < 0`` or a year beyond 9999.
    """
    _check_date("start_date", start_date)
    _check_int("n", n, 0)
    year = start_date.year + n
    if year > 9999:
        raise ValueError(f"anniversary {n} of {start_date.isoformat()} is beyond year 9999")
    day = start_date.day
    if start_date.month == 2 and day == 29 and not calendar.isleap(year):
        day = 28
    return date(year, start_date.month, day)


def contract_year_dates(start_date: date, k: int) -> tuple[date, date]:
    """Return the local dates ``(first day, first day of the next year)`` of contract year k.

    Year ``k`` (``k >= 1``) covers the local dates from anniversary ``k-1`` (inclusive) to
    anniversary ``k`` (exclusive).  Raises ValueError for ``k < 1``.
    """
    _check_int("k", k, 1)
    return anniversary(start_date, k - 1), anniversary(start_date, k)


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def local_midnight(day: date, tz: str) -> datetime:
    """Return, in UTC, the first instant whose local date in ``tz`` is ``day`` (or later).

    Promises: ``D 00:00`` local when it exists; the earlier one when it exists twice; the
    transition instant when a DST gap swallows midnight; the first instant of the next
    existing local date when the whole of ``day`` was skipped.  Raises ValueError for an
    unknown zone.
    """
    _check_date("day", day)
    zi = zone(tz)
    naive = datetime.combine(day, time(0))
    candidates = [naive.replace(tzinfo=zi, fold=fold).astimezone(UTC) for fold in (0, 1)]
    valid = [c for c in candidates if _wall(c, zi) == naive]
    if valid:
        return min(valid)
    # Midnight falls in a gap: find the first instant whose local date is >= day.  Zone
    # transitions happen on whole seconds, so a binary search over seconds is exact.
    lo = min(candidates) - timedelta(days=2)  # local date < day
    hi = max(candidates) + timedelta(days=2)  # local date >= day
    lo_s = int(lo.timestamp())
    hi_s = int(hi.timestamp())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if datetime.fromtimestamp(mid, zi).date() >= day:
            hi_s = mid
        else:
            lo_s = mid
    return datetime.fromtimestamp(hi_s, UTC)


def contract_year_bounds(start_date: date, tz: str, k: int) -> tuple[datetime, datetime]:
    """Return ``(start, end)`` of contract year ``k`` as aware UTC datetimes.

    The year is the half-open interval ``[start, end)``: local midnight (see
    :func:`local_midnight`) in ``tz`` of anniversary ``k-1`` to that of anniversary ``k``.
    Raises ValueError for ``k < 1``, a bad date or an unknown zone.
    """
    first, after = contract_year_dates(start_date, k)
    return local_midnight(first, tz), local_midnight(after, tz)


def year_of(start_date: date, tz: str, instant: datetime) -> int | None:
    """Return the contract year ``k >= 1`` whose ``[start, end)`` contains ``instant``.

    Returns None for an instant before the contract start (local midnight of
    ``start_date``).  Years are numbered on past the contract term (no term is known
    here).  Raises ValueError for a naive ``instant`` or an unknown zone.
    """
    require_aware("instant", instant)
    _check_date("start_date", start_date)
    zi = zone(tz)
    if instant < local_midnight(start_date, tz):
        return None
    local = instant.astimezone(zi).date()
    k = max(1, local.year - start_date.year + 1)
    # Adjust around the estimate; at most a couple of steps either way.
    while k > 1 and instant < contract_year_bounds(start_date, tz, k)[0]:
        k -= 1
    while instant >= contract_year_bounds(start_date, tz, k)[1]:
        k += 1
    return k


_MONTH_TEXT = re.compile(r"([0-9]{4})-([0-9]{2})")


def parse_month(text: object) -> tuple[int, int]:
    """``"YYYY-MM"`` as ``(year, month)``: the one parser of a month the CLI, the reports
    and the portal take. Surrounding blanks are ignored; anything else — another shape, a
    month outside 01..12, a year outside 0001..9998 (the range :func:`month_bounds`
    covers) — raises ValueError naming what was given."""
    m = _MONTH_TEXT.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or not 1 <= int(m.group(2)) <= 12 or not 1 <= int(m.group(1)) <= 9998:
        raise ValueError(f"a month is YYYY-MM (e.g. 2026-03), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def month_bounds(year: int, month: int, tz: str) -> tuple[datetime, datetime]:
    """Return ``(start, end)`` of calendar month ``year-month`` in ``tz``, as aware UTC.

    The month is ``[local midnight of the 1st, local midnight of the 1st of next month)``.
    Raises ValueError for a month outside 1..12, a year outside 1..9998, or an unknown zone.
    """
    _check_int("year", year, 1)
    _check_int("month", month, 1)
    if month > 12:
        raise ValueError(f"month: must be 1..12, got {month}")
    if year > 9998:
        raise ValueError(f"year: must be <= 9998, got {year}")
    first = date(year, month, 1)
    after = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
    return local_midnight(first, tz), local_midnight(after, tz)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContractYear:
    """One contract year of a term: number ``k`` and its local dates ``[start, end)``."""

    k: int
    start: date
    end: date

    def bounds(self, tz: str) -> tuple[datetime, datetime]:
        """Return this year's ``[start, end)`` as aware UTC instants in zone ``tz``."""
        return local_midnight(self.start, tz), local_midnight(self.end, tz)


def years_in_term(start_date: date, term_years: int) -> tuple[ContractYear, ...]:
    """Return the contract years ``1..term_years`` of a term, in order.

    Each year's ``end`` is the next year's ``start``.  Raises ValueError for
    ``term_years < 1``.
    """
    _check_date("start_date", start_date)
    _check_int("term_years", term_years, 1)
    out = []
    for k in range(1, term_years + 1):
        first, after = contract_year_dates(start_date, k)
        out.append(ContractYear(k=k, start=first, end=after))
    return tuple(out)
