# A copy of billing/display.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""How a report shows a figure: the verdict and the text of rates, hours, goodput, money.

Pure functions, moved here from :mod:`reports.monthly` so that the monthly report and the
standalone verifier (``yoco-verify``) format a figure with one and the same rule: the
verifier recomputes each figure from the log's entries, formats it with these functions
and compares the text with what the report shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

from yoco_verify.shared.billing import verdict as _verdict
from yoco_verify.shared.billing.money import format_money
from yoco_verify.shared.billing.sla import SlaFigures, decimal_string

__all__ = [
    "Verdict",
    "cost_text",
    "credit_text",
    "goodput_text",
    "grouped",
    "hours_text",
    "money_text",
    "plain",
    "rate_text",
    "round_half_up",
    "verdict",
]


# The verdict is defined once, in billing.verdict (the portal and `yoco sla` use it too).
Verdict = _verdict.Verdict
verdict = _verdict.verdict


def hours_text(seconds: Decimal) -> str:
    """GPU-seconds as hours: six decimals, rounded half to even once, with separators."""
    return _verdict.format_number(Fraction(seconds) / 3600, 6)


def rate_text(resolved: int, covered: int, threshold: Decimal | None = None) -> str:
    """``93.33 % (14 of 15)`` (billing.verdict.format_rate: never written across the
    threshold when one is given), or ``no covered failures``."""
    if covered == 0:
        return "no covered failures"
    return f"{_verdict.format_rate(resolved, covered, threshold)} ({resolved:,} of {covered:,})"


def goodput_text(figs: SlaFigures) -> str:
    """``0.998765 (99.8765 %)``: six decimals, then that number as a percentage."""
    allocated = Fraction(figs.allocated_gpu_seconds)
    g = Fraction(1) if allocated == 0 else 1 - Fraction(figs.lost_gpu_seconds) / allocated
    six = decimal_string(g)
    pct = decimal_string(Fraction(Decimal(six)) * 100, 4)
    return f"{six} ({pct} %)"


def round_half_up(value: Fraction) -> int:
    """``value`` rounded to an integer, halves away from zero."""
    q, r = divmod(abs(value.numerator), value.denominator)
    if 2 * r >= value.denominator:
        q += 1
    return q if value >= 0 else -q


def grouped(amount: str) -> str:
    """A plain decimal string with thousands separators: ``1234567.5`` → ``1,234,567.5``."""
    neg = amount.startswith("-")
    whole, _, frac = amount.lstrip("-").partition(".")
    out = f"{int(whole):,}" + (f".{frac}" if frac else "")
    return ("-" if neg else "") + out


def money_text(amount: Decimal, currency: str) -> str:
    """``1,000,000.00 USD`` (billing.money.format_money)."""
    return format_money(amount, currency)


def cost_text(seconds: Decimal, price: Decimal | None, currency: str) -> str | None:
    """The cost of ``seconds`` GPU-seconds at ``price`` per GPU-hour, half up to the minor
    unit, as ``1,234.57 USD``; None without a price."""
    if price is None:
        return None
    return format_money(Fraction(seconds) * Fraction(price) / 3600, currency)


def credit_text(credit: Mapping[str, Any], currency: str) -> str:
    """A recorded credit as a report shows it: ``130,000.00 EUR (issued)``."""
    cur = credit.get("currency") or currency
    if credit.get("minor_units") is not None:
        text = format_money(int(credit["minor_units"]), cur, minor=True)
    else:
        text = format_money(Decimal(str(credit["amount"])), cur)
    return text + (f" ({credit['status']})" if credit.get("status") else "")


def plain(d: Decimal) -> str:
    """A Decimal without trailing zeros or exponent: ``12.50`` → ``12.5``."""
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s or "0"
