"""Contract years and months (billing/years.py); no database."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from billing.years import (
    ContractYear,
    anniversary,
    contract_year_bounds,
    contract_year_dates,
    local_midnight,
    month_bounds,
    require_aware,
    year_of,
    years_in_term,
)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# ------------------------------------------------------------------ anniversaries


def test_anniversary_of_an_ordinary_date() -> None:
    assert anniversary(date(2025, 3, 15), 0) == date(2025, 3, 15)
    assert anniversary(date(2025, 3, 15), 3) == date(2028, 3, 15)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, date(2024, 2, 29)),
        (1, date(2025, 2, 28)),
        (2, date(2026, 2, 28)),
        (3, date(2027, 2, 28)),
        (4, date(2028, 2, 29)),  # leap again: back on the 29th
        (5, date(2029, 2, 28)),
        (76, date(2100, 2, 28)),  # 2100 is not a leap year
        (76 + 4, date(2104, 2, 29)),
    ],
)
def test_29_february_start(n: int, expected: date) -> None:
    assert anniversary(date(2024, 2, 29), n) == expected


def test_28_february_start_stays_on_the_28th() -> None:
    assert anniversary(date(2023, 2, 28), 1) == date(2024, 2, 28)


def test_anniversary_refuses_negative_n() -> None:
    with pytest.raises(ValueError):
        anniversary(date(2024, 1, 1), -1)


# ------------------------------------------------------------------ year bounds


def test_year_bounds_utc() -> None:
    assert contract_year_bounds(date(2026, 1, 1), "UTC", 1) == (utc(2026, 1, 1), utc(2027, 1, 1))
    assert contract_year_bounds(date(2026, 1, 1), "UTC", 2) == (utc(2027, 1, 1), utc(2028, 1, 1))


def test_year_bounds_are_aware_utc() -> None:
    start, end = contract_year_bounds(date(2026, 7, 1), "Europe/Paris", 1)
    assert start.utcoffset() == timedelta(0)
    assert end.utcoffset() == timedelta(0)
    # Paris is UTC+2 in July.
    assert start == utc(2026, 6, 30, 22)
    assert end == utc(2027, 6, 30, 22)


def test_year_bounds_new_york_midnight() -> None:
    start, end = contract_year_bounds(date(2026, 1, 1), "America/New_York", 1)
    assert start == utc(2026, 1, 1, 5)  # EST, UTC-5
    assert end == utc(2027, 1, 1, 5)


def test_29_february_year_bounds() -> None:
    s = date(2024, 2, 29)
    assert contract_year_bounds(s, "UTC", 1) == (utc(2024, 2, 29), utc(2025, 2, 28))
    assert contract_year_bounds(s, "UTC", 2) == (utc(2025, 2, 28), utc(2026, 2, 28))
    # Year 4 ends on the leap-year 29 February, so it is one day longer.
    assert contract_year_bounds(s, "UTC", 4) == (utc(2027, 2, 28), utc(2028, 2, 29))
    assert contract_year_bounds(s, "UTC", 5) == (utc(2028, 2, 29), utc(2029, 2, 28))


def test_consecutive_years_tile_without_gap() -> None:
    s = date(2024, 2, 29)
    for k in range(1, 12):
        assert (
            contract_year_bounds(s, "Australia/Sydney", k)[1]
            == (contract_year_bounds(s, "Australia/Sydney", k + 1)[0])
        )


def test_year_bounds_refuse_bad_input() -> None:
    with pytest.raises(ValueError):
        contract_year_bounds(date(2026, 1, 1), "UTC", 0)
    with pytest.raises(ValueError):
        contract_year_bounds(date(2026, 1, 1), "Mars/Olympus_Mons", 1)
    with pytest.raises(ValueError):
        contract_year_bounds(datetime(2026, 1, 1, tzinfo=UTC), "UTC", 1)  # not a date


def test_contract_year_dates() -> None:
    assert contract_year_dates(date(2024, 2, 29), 2) == (date(2025, 2, 28), date(2026, 2, 28))


# ------------------------------------------------------------------ DST and midnight


def test_midnight_in_a_dst_gap_is_the_first_instant_of_the_date() -> None:
    # Sao Paulo, 2018-11-04: clocks jumped from 00:00 to 01:00 (-03:00 -> -02:00).
    m = local_midnight(date(2018, 11, 4), "America/Sao_Paulo")
    assert m == utc(2018, 11, 4, 3)
    local = m.astimezone(ZoneInfo("America/Sao_Paulo"))
    assert (local.date(), local.hour) == (date(2018, 11, 4), 1)
    # One second earlier is still 3 November locally.
    before = (m - timedelta(seconds=1)).astimezone(ZoneInfo("America/Sao_Paulo"))
    assert before.date() == date(2018, 11, 3)


def test_contract_year_starting_in_a_dst_gap() -> None:
    start, _ = contract_year_bounds(date(2022, 9, 11), "America/Santiago", 1)
    assert start == utc(2022, 9, 11, 4)  # the transition instant, 01:00 local -03:00


def test_ambiguous_midnight_takes_the_earlier_instant() -> None:
    # Havana, 2023-11-05: 01:00 CDT fell back to 00:00 CST, so 00:00 occurred twice.
    assert local_midnight(date(2023, 11, 5), "America/Havana") == utc(2023, 11, 5, 4)


def test_skipped_day_maps_to_the_next_existing_date() -> None:
    # Samoa skipped 30 December 2011 entirely.
    apia = "Pacific/Apia"
    assert local_midnight(date(2011, 12, 30), apia) == local_midnight(date(2011, 12, 31), apia)


def test_year_bounds_across_dst_changes_are_local_midnight() -> None:
    start, end = contract_year_bounds(date(2026, 4, 1), "America/New_York", 1)
    ny = ZoneInfo("America/New_York")
    assert start.astimezone(ny).replace(tzinfo=None) == datetime(2026, 4, 1)
    assert end.astimezone(ny).replace(tzinfo=None) == datetime(2027, 4, 1)


# ------------------------------------------------------------------ year_of


def test_failure_at_year_boundary_depends_on_contract_zone() -> None:
    instant = datetime.fromisoformat("2026-12-31T23:30:00-05:00")  # 2027-01-01T04:30Z
    assert year_of(date(2026, 1, 1), "America/New_York", instant) == 1
    assert year_of(date(2026, 1, 1), "UTC", instant) == 2


def test_year_of_boundaries_are_half_open() -> None:
    s = date(2026, 1, 1)
    start2, _ = contract_year_bounds(s, "America/New_York", 2)
    assert year_of(s, "America/New_York", start2) == 2
    assert year_of(s, "America/New_York", start2 - timedelta(microseconds=1)) == 1


def test_year_of_before_start_is_none() -> None:
    s = date(2026, 1, 1)
    assert year_of(s, "UTC", utc(2025, 12, 31, 23, 59, 59)) is None
    assert year_of(s, "UTC", utc(2026, 1, 1)) == 1
    # Tokyo midnight of 1 January is 15:00 UTC on 31 December.
    assert year_of(s, "Asia/Tokyo", utc(2025, 12, 31, 15)) == 1
    assert year_of(s, "Asia/Tokyo", utc(2025, 12, 31, 14, 59)) is None


def test_year_of_29_february_start() -> None:
    s = date(2024, 2, 29)
    assert year_of(s, "UTC", utc(2025, 2, 27, 23)) == 1
    assert year_of(s, "UTC", utc(2025, 2, 28)) == 2
    assert year_of(s, "UTC", utc(2028, 2, 28, 12)) == 4
    assert year_of(s, "UTC", utc(2028, 2, 29)) == 5


def test_year_of_far_beyond_term_keeps_counting() -> None:
    assert year_of(date(2026, 6, 15), "UTC", utc(2036, 6, 15)) == 11
    assert year_of(date(2026, 6, 15), "UTC", utc(2036, 6, 14)) == 10


def test_year_of_agrees_with_bounds() -> None:
    s = date(2024, 2, 29)
    tz = "Pacific/Auckland"
    for k in range(1, 9):
        start, end = contract_year_bounds(s, tz, k)
        for instant in (start, start + timedelta(days=100), end - timedelta(microseconds=1)):
            assert year_of(s, tz, instant) == k


def test_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        year_of(date(2026, 1, 1), "UTC", datetime(2026, 6, 1))
    with pytest.raises(ValueError, match="naive"):
        require_aware("x", datetime(2026, 6, 1))


# ------------------------------------------------------------------ months and terms


def test_month_bounds_are_local_calendar_months() -> None:
    start, end = month_bounds(2026, 3, "America/New_York")
    assert start == utc(2026, 3, 1, 5)  # EST
    assert end == utc(2026, 4, 1, 4)  # EDT after 8 March
    assert month_bounds(2026, 12, "UTC") == (utc(2026, 12, 1), utc(2027, 1, 1))
    assert month_bounds(2028, 2, "UTC") == (utc(2028, 2, 1), utc(2028, 3, 1))


def test_month_bounds_refuse_bad_month() -> None:
    for month in (0, 13):
        with pytest.raises(ValueError):
            month_bounds(2026, month, "UTC")


def test_years_in_term() -> None:
    years = years_in_term(date(2024, 2, 29), 3)
    assert years == (
        ContractYear(k=1, start=date(2024, 2, 29), end=date(2025, 2, 28)),
        ContractYear(k=2, start=date(2025, 2, 28), end=date(2026, 2, 28)),
        ContractYear(k=3, start=date(2026, 2, 28), end=date(2027, 2, 28)),
    )
    assert years[0].bounds("UTC") == contract_year_bounds(date(2024, 2, 29), "UTC", 1)
    with pytest.raises(ValueError):
        years_in_term(date(2024, 2, 29), 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2026-03", (2026, 3)), (" 2026-12\n", (2026, 12)), ("0001-01", (1, 1)),
     ("9998-12", (9998, 12))],
)
def test_parse_month_accepts(text, expected) -> None:
    from billing.years import parse_month

    assert parse_month(text) == expected


@pytest.mark.parametrize(
    "text", ["2026-3", "2026-13", "2026-00", "0000-05", "9999-01", "2026-03-01", "26-03", "",
             "２０２６-03", None, 202603],
)
def test_parse_month_refuses(text) -> None:
    from billing.years import parse_month

    with pytest.raises(ValueError, match="a month is YYYY-MM"):
        parse_month(text)


def test_one_month_parser_behind_cli_reports_and_portal() -> None:
    # The CLI, the reports and the portal answer the same inputs the same way.
    from billing.years import parse_month
    from reports.errors import BadMonth
    from reports.monthly import parse_month as report_month
    from web.errors import NotFound
    from web.services import parse_month as portal_month

    for text in ("2026-03", " 2026-12 ", "9998-12"):
        assert report_month(text) == portal_month(text) == parse_month(text)
    for text in ("2026-3", "2026-13", "9999-01", "0000-01"):
        with pytest.raises(BadMonth):
            report_month(text)
        with pytest.raises(NotFound):
            portal_month(text)
