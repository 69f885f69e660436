# A copy of billing/money.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Money in exact minor units (ISO 4217), and the renewal credit.

Money is a Decimal or an integer count of minor units, never a float.  Every function here
is exact: results never depend on the ambient ``decimal`` context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction

from yoco_verify.shared.ledger.records import CURRENCY_MINOR_UNITS

__all__ = [
    "CURRENCY_EXPONENTS",
    "credit_minor_units",
    "format_minor",
    "format_money",
    "from_minor_units",
    "minor_unit_exponent",
    "to_minor_units",
]

#: ISO 4217 minor-unit exponents: the ledger's table (``ledger.records``), the one home
#: of the currency list, which contract validation already uses.
CURRENCY_EXPONENTS: Mapping[str, int] = CURRENCY_MINOR_UNITS


def minor_unit_exponent(currency: str) -> int:
    """Return the ISO 4217 minor-unit exponent of ``currency`` (JPY 0, USD 2, KWD 3, CLF 4).

    Codes are matched exactly (three upper-case letters).  Raises ValueError for an
    unknown code, a lower-case code or a non-string.
    """
    if not isinstance(currency, str):
        raise ValueError(f"currency: expected an ISO 4217 code, got {currency!r}")
    try:
        return CURRENCY_EXPONENTS[currency]
    except KeyError:
        raise ValueError(f"currency: unknown ISO 4217 currency code {currency!r}") from None


def _as_decimal(name: str, value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (Decimal, int)):
        raise ValueError(f"{name}: expected a Decimal (never a float), got {value!r}")
    d = Decimal(value)
    if not d.is_finite():
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return d


def to_minor_units(amount: Decimal, currency: str) -> int:
    """Return ``amount`` as an exact integer count of ``currency``'s minor units.

    ``Decimal("12.34")`` USD is 1234; ``Decimal("100.00")`` JPY is 100.  Raises ValueError
    when the value has more precision than the currency allows (``"1.5"`` JPY,
    ``"0.001"`` USD), for floats, non-finite values and unknown currencies.  Negative
    amounts are allowed and give negative counts.
    """
    d = _as_decimal("amount", amount)
    exponent = minor_unit_exponent(currency)
    scaled = Fraction(d) * 10**exponent
    if scaled.denominator != 1:
        raise ValueError(
            f"amount: {d} has more precision than {currency} allows ({exponent} decimal place(s))"
        )
    return scaled.numerator


def from_minor_units(minor: int, currency: str) -> Decimal:
    """Return the Decimal amount of ``minor`` units, at exactly the currency's exponent.

    ``from_minor_units(1234, "USD") == Decimal("12.34")`` with exponent -2.  Raises
    ValueError for a non-integer ``minor`` or an unknown currency.
    """
    if isinstance(minor, bool) or not isinstance(minor, int):
        raise ValueError(f"minor: expected an integer count of minor units, got {minor!r}")
    exponent = minor_unit_exponent(currency)
    sign = 1 if minor < 0 else 0
    digits = tuple(int(c) for c in str(abs(minor)))
    return Decimal((sign, digits, -exponent))


def format_minor(minor: int, currency: str) -> str:
    """Return ``minor`` units as a plain decimal string at the currency's exponent.

    ``format_minor(25000001, "USD") == "250000.01"``; ``format_minor(5, "KWD") == "0.005"``;
    ``format_minor(-5, "USD") == "-0.05"``; ``format_minor(7, "JPY") == "7"``.  No
    grouping, no symbol, no exponent notation.  Raises ValueError like
    :func:`from_minor_units`.
    """
    return format(from_minor_units(minor, currency), "f")


def credit_minor_units(base: Decimal, percent: Decimal, currency: str) -> int:
    """Return the credit ``base * percent / 100`` in minor units, rounded half-up.

    Exact: the product is computed as a rational number and rounded once, half away from
    zero, to the currency's minor unit (1,000,000.02 USD at 25% = 250,000.005 ->
    25000001 cents).  ``base`` must be >= 0 and expressible in the currency (no more
    decimals than its exponent); ``percent`` must satisfy ``0 < percent <= 100``.
    Raises ValueError otherwise, and for floats or unknown currencies.
    """
    b = _as_decimal("base", base)
    p = _as_decimal("percent", percent)
    if b < 0:
        raise ValueError(f"base: must be >= 0, got {b}")
    if not (0 < p <= 100):
        raise ValueError(f"percent: must satisfy 0 < percent <= 100, got {p}")
    to_minor_units(b, currency)  # refuses a base finer than the currency's minor unit
    exponent = minor_unit_exponent(currency)
    exact = Fraction(b) * Fraction(p) * 10**exponent / 100
    # Half-up on a non-negative value: floor(x + 1/2).
    return math.floor(exact + Fraction(1, 2))


def _half_up(value: Fraction) -> int:
    """``value`` rounded to an integer, half away from zero (exact)."""
    q = math.floor(abs(value) + Fraction(1, 2))
    return q if value >= 0 else -q


def format_money(amount: Decimal | Fraction | int, currency: str, *, minor: bool = False) -> str:
    """An amount as people read it: ``"1,050,000.00 EUR"``, ``"250,001 JPY"``.

    Thousands separators, exactly the currency's minor-unit decimals, then the code.
    ``minor=True``: ``amount`` is an integer count of minor units.  An amount finer than
    the minor unit (a cost of lost GPU-hours) is rounded once, half up, as credits are.
    Never a float: raises ValueError for one, and for an unknown currency.
    """
    exponent = minor_unit_exponent(currency)
    if isinstance(amount, (bool, float)):
        raise ValueError(f"amount: expected a Decimal (never a float), got {amount!r}")
    if minor:
        if not isinstance(amount, int):
            raise ValueError(f"minor: expected an integer count of minor units, got {amount!r}")
        units = amount
    else:
        value = (
            Fraction(_as_decimal("amount", amount))
            if isinstance(amount, Decimal)
            else Fraction(amount)
        )
        units = _half_up(value * 10**exponent)
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), 10**exponent)
    text = f"{whole:,}" + (f".{str(frac).rjust(exponent, '0')}" if exponent else "")
    return f"{sign}{text} {currency}"
