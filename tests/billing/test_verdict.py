"""billing.verdict: one definition of each standing, one rate formatter, exact."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from billing.money import format_money
from billing.verdict import (
    Standing,
    format_number,
    format_percent,
    format_rate,
    format_seconds,
    verdict,
)

D = Decimal


@pytest.mark.parametrize(
    ("resolved", "covered", "closed", "standing", "word"),
    [
        (0, 0, True, Standing.NO_COVERED, "no covered failures"),
        (0, 0, False, Standing.NO_COVERED, "no covered failures"),
        (9, 10, True, Standing.MET, "met"),
        (8, 9, True, Standing.MISSED, "missed"),
        (8, 9, False, Standing.BELOW, "below so far"),
        # 9 of 10 meets 90 %, 9 of 11 would not: one more unresolved failure tips it.
        (9, 10, False, Standing.AT_RISK, "at risk"),
        # 19 of 20 is 95 %; 19 of 21 is 90.48 %: still at or above.
        (19, 20, False, Standing.ON_TRACK, "on track"),
    ],
)
def test_each_standing_is_defined_once(resolved, covered, closed, standing, word) -> None:
    v = verdict(resolved, covered, D(90), closed)
    assert v.standing is standing and v.word == word
    assert v.guarantee_met == (resolved * 100 >= covered * 90)


def test_rate_is_exact_half_even_and_never_crosses_the_threshold() -> None:
    assert format_rate(2, 3) == "66.67 %"
    assert format_rate(1, 8) == "12.50 %"  # exact
    assert format_rate(1, 1600) == "0.06 %"  # 0.0625 → half to even
    assert format_rate(0, 0) == "no covered failures"
    # 89.996 % rounds to 90.00 but misses 90: written just below it, as the verdict says.
    assert format_rate(22499, 25000) == "90.00 %"  # 89.996 without a threshold
    assert format_rate(22499, 25000, D(90)) == "89.99 %"
    assert format_rate(948, 1000, D(95)) == "94.80 %"
    # A threshold finer than two decimals: a met rate is never written below it.
    assert format_rate(737, 800, D("92.125")) == "92.13 %"
    assert format_rate(11372, 12345, D(90)) == "92.12 %"
    v = verdict(22499, 25000, D(90), True)
    assert v.rate == "89.99 %" and v.rate_with_counts == "89.99 % (22,499 of 25,000)"


def test_other_figures() -> None:
    assert format_number(D("13625026.573706"), 1) == "13,625,026.6"
    assert format_number(Fraction(1, 3), 6) == "0.333333"
    assert format_number(None) == "—"
    assert format_percent(D("0.93415")) == "93.42 %"
    assert format_seconds(D("0.33071208000183105")) == "0.331 s"
    assert format_seconds(D("2.50")) == "2.5 s"
    with pytest.raises(ValueError, match="float"):
        format_number(0.5)  # type: ignore[arg-type]


def test_money_has_separators_minor_units_and_the_currency() -> None:
    assert format_money(D("1050000"), "EUR") == "1,050,000.00 EUR"
    assert format_money(250001, "JPY", minor=True) == "250,001 JPY"
    assert format_money(5, "KWD", minor=True) == "0.005 KWD"
    assert format_money(Fraction(1000000005, 1000), "USD") == "1,000,000.01 USD"  # half up
    with pytest.raises(ValueError, match="float"):
        format_money(1.5, "USD")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="currency"):
        format_money(D(1), "usd")


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot exceed"):
        verdict(3, 2, D(90), True)
    with pytest.raises(ValueError, match="threshold"):
        verdict(1, 2, D(0), True)


def test_headroom_is_the_largest_number_of_further_unresolved_failures_that_still_meets() -> None:
    from decimal import Decimal

    from billing.verdict import verdict

    for resolved, covered in ((0, 0), (9, 10), (439, 481), (95, 100), (1, 1), (18, 20)):
        v = verdict(resolved, covered, Decimal(90), False)
        k = v.headroom
        if resolved * 100 < covered * 90:
            assert k is None and v.headroom_text is None
            continue
        assert k is not None and k >= 0
        # k more unresolved still meet; k + 1 do not (exact, by the definition)
        assert resolved * 100 >= (covered + k) * 90
        assert resolved * 100 < (covered + k + 1) * 90
    assert verdict(439, 481, Decimal(90), False).headroom_text == (
        "Headroom: 6 more unresolved failures before falling below 90 %.")
    assert verdict(9, 10, Decimal(90), False).headroom_text == (
        "No headroom: the next unresolved failure would bring it below 90 %.")
    assert verdict(10, 10, Decimal(90), False).headroom_text == (
        "Headroom: 1 more unresolved failure before falling below 90 %.")
    assert verdict(10, 10, Decimal(90), True).headroom_text is None  # a closed year
    assert verdict(95, 100, Decimal("95.5"), False).headroom is None
