"""Money in minor units and the renewal credit (billing/money.py); no database."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest

from billing.money import (
    CURRENCY_EXPONENTS,
    credit_minor_units,
    format_minor,
    from_minor_units,
    minor_unit_exponent,
    to_minor_units,
)

D = Decimal


@pytest.mark.parametrize(
    "code", ["JPY", "KRW", "CLP", "ISK", "VND", "UGX", "PYG", "XAF", "XOF", "XPF", "BIF"]
)
def test_exponent_zero(code: str) -> None:
    assert minor_unit_exponent(code) == 0


@pytest.mark.parametrize("code", ["BHD", "KWD", "OMR", "JOD", "TND", "IQD", "LYD"])
def test_exponent_three(code: str) -> None:
    assert minor_unit_exponent(code) == 3


@pytest.mark.parametrize("code", ["USD", "EUR", "GBP", "CHF", "CAD", "AUD", "CNY", "INR", "SEK"])
def test_exponent_two(code: str) -> None:
    assert minor_unit_exponent(code) == 2


def test_exponent_four() -> None:
    assert minor_unit_exponent("CLF") == 4


@pytest.mark.parametrize("code", ["usd", "XXX", "XAU", "ABC", "", "US", 840])
def test_unknown_codes_are_refused(code: object) -> None:
    with pytest.raises(ValueError):
        minor_unit_exponent(code)  # type: ignore[arg-type]


def test_table_is_well_formed() -> None:
    assert len(CURRENCY_EXPONENTS) > 150
    for code, exp in CURRENCY_EXPONENTS.items():
        assert len(code) == 3 and code.isupper() and code.isalpha()
        assert exp in (0, 2, 3, 4)


def test_to_minor_units() -> None:
    assert to_minor_units(D("12.34"), "USD") == 1234
    assert to_minor_units(D("12.3"), "USD") == 1230
    assert to_minor_units(D("100.00"), "JPY") == 100  # trailing zeros are fine
    assert to_minor_units(D("1.234"), "KWD") == 1234
    assert to_minor_units(D("-0.05"), "EUR") == -5
    assert to_minor_units(D("1E+3"), "USD") == 100000
    assert to_minor_units(7, "JPY") == 7  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("amount", "code"),
    [("0.001", "USD"), ("1.5", "JPY"), ("0.0001", "KWD"), ("12.345", "EUR")],
)
def test_to_minor_units_refuses_excess_precision(amount: str, code: str) -> None:
    with pytest.raises(ValueError, match="precision"):
        to_minor_units(D(amount), code)


def test_to_minor_units_refuses_floats_and_non_finite() -> None:
    with pytest.raises(ValueError):
        to_minor_units(1.5, "USD")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        to_minor_units(D("NaN"), "USD")
    with pytest.raises(ValueError):
        to_minor_units(D("Infinity"), "USD")


def test_to_minor_units_is_exact_beyond_context_precision() -> None:
    big = D("12345678901234567890123456789012.34")
    with localcontext() as ctx:
        ctx.prec = 5
        assert to_minor_units(big, "USD") == 1234567890123456789012345678901234


def test_format_minor() -> None:
    assert format_minor(25000001, "USD") == "250000.01"
    assert format_minor(5, "USD") == "0.05"
    assert format_minor(-5, "USD") == "-0.05"
    assert format_minor(0, "USD") == "0.00"
    assert format_minor(7, "JPY") == "7"
    assert format_minor(5, "KWD") == "0.005"
    assert format_minor(1234, "BHD") == "1.234"
    assert format_minor(10**30, "EUR") == "1" + "0" * 28 + ".00"
    with pytest.raises(ValueError):
        format_minor(1.0, "USD")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        format_minor(True, "USD")


def test_from_minor_units_round_trips() -> None:
    for code, amount in [("USD", "250000.01"), ("JPY", "1000"), ("KWD", "12.345")]:
        assert to_minor_units(from_minor_units(to_minor_units(D(amount), code), code), code) == (
            to_minor_units(D(amount), code)
        )
    assert str(from_minor_units(1230, "USD")) == "12.30"


# ------------------------------------------------------------------ credits


def test_credit_half_up_tie_usd() -> None:
    # 1,000,000.02 x 25% = 250,000.005 -> 250,000.01
    assert credit_minor_units(D("1000000.02"), D(25), "USD") == 25000001
    assert format_minor(credit_minor_units(D("1000000.02"), D(25), "USD"), "USD") == "250000.01"


def test_credit_below_tie_rounds_down() -> None:
    # 0.01 x 25% = 0.0025 -> 0.00; 0.03 x 25% = 0.0075 -> 0.01
    assert credit_minor_units(D("0.01"), D(25), "USD") == 0
    assert credit_minor_units(D("0.03"), D(25), "USD") == 1


def test_credit_jpy() -> None:
    # 1,000,002 x 25% = 250,000.5 -> 250,001 (half up, not half even)
    assert credit_minor_units(D(1000002), D(25), "JPY") == 250001
    # 1,000,006 x 25% = 250,001.5 -> 250,002
    assert credit_minor_units(D(1000006), D(25), "JPY") == 250002
    assert credit_minor_units(D(1000001), D(25), "JPY") == 250000  # 250,000.25


def test_credit_kwd() -> None:
    # 10.002 x 25% = 2.5005 -> 2.501
    assert credit_minor_units(D("10.002"), D(25), "KWD") == 2501
    assert format_minor(2501, "KWD") == "2.501"
    # 10.001 x 25% = 2.50025 -> 2.500
    assert credit_minor_units(D("10.001"), D(25), "KWD") == 2500


def test_credit_fractional_percent_and_full() -> None:
    # 100.00 x 12.5% = 12.5 exactly
    assert credit_minor_units(D("100.00"), D("12.5"), "USD") == 1250
    # 0.05 x 10% = 0.005 -> 0.01
    assert credit_minor_units(D("0.05"), D(10), "USD") == 1
    assert credit_minor_units(D("123.45"), D(100), "USD") == 12345
    assert credit_minor_units(D(0), D(25), "USD") == 0


def test_credit_is_exact_beyond_context_precision() -> None:
    with localcontext() as ctx:
        ctx.prec = 3
        # 99,999,999,999,999,999,999,999,999,999.96 x 25% = ...999.99 exactly
        base = D("99999999999999999999999999999.96")
        assert credit_minor_units(base, D(25), "USD") == 2499999999999999999999999999999
        # ...999.98 x 25% = ...999.995 -> rounds half up to 25,000,...,000.00
        base = D("99999999999999999999999999999.98")
        assert credit_minor_units(base, D(25), "USD") == 25 * 10**29


def test_credit_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        credit_minor_units(D("-1"), D(25), "USD")
    with pytest.raises(ValueError):
        credit_minor_units(D(100), D(0), "USD")
    with pytest.raises(ValueError):
        credit_minor_units(D(100), D(101), "USD")
    with pytest.raises(ValueError):
        credit_minor_units(D("100.5"), D(25), "JPY")  # base finer than a yen
    with pytest.raises(ValueError):
        credit_minor_units(100.0, D(25), "USD")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        credit_minor_units(D(100), D(25), "XXX")
