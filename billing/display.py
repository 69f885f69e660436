"""How a report shows a figure: the verdict and the text of rates, hours, goodput, money.

Pure functions, moved here from :mod:`reports.monthly` so that the monthly report and the
standalone verifier (``yoco-verify``) format a figure with one and the same rule: the
verifier recomputes each figure from the log's entries, formats it with these functions
and compares the text with what the report shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from billing.money import format_minor, minor_unit_exponent
from billing.sla import SlaFigures, decimal_string

__all__ = [
    "Verdict",
    "cost_text",
    "goodput_text",
    "grouped",
    "hours_text",
    "money_text",
    "plain",
    "rate_text",
    "round_half_up",
    "verdict",
]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where the guarantee stands for a period: ``met``, ``at risk`` or ``missed``.

    * missed: resolved × 100 < covered × threshold (for a period still running: so far);
    * at risk: met, the period is still running, and one more unresolved covered failure
      would bring it below the threshold;
    * met: otherwise (including no covered failure at all).
    """

    word: str
    css: str
    text: str


def verdict(resolved: int, covered: int, threshold: Decimal, closed: bool) -> Verdict:
    """The :class:`Verdict` of ``resolved`` of ``covered`` against ``threshold`` percent."""
    thr = format(threshold, "f")
    if covered == 0:
        return Verdict("met", "met", "no covered failures")
    if resolved * 100 < covered * threshold:
        if closed:
            return Verdict("missed", "missed", f"below the guaranteed {thr} %")
        return Verdict(
            "missed", "missed", f"below the guaranteed {thr} % so far; the period is still open"
        )
    if not closed and resolved * 100 < (covered + 1) * threshold:
        return Verdict(
            "at risk",
            "risk",
            f"at or above {thr} % now, but one more unresolved failure would bring it below",
        )
    so_far = "" if closed else " so far"
    return Verdict("met", "met", f"at or above the guaranteed {thr} %{so_far}")


def hours_text(seconds: Decimal) -> str:
    """GPU-seconds as hours, six decimals, rounded half to even once."""
    return decimal_string(Fraction(seconds) / 3600)


def rate_text(resolved: int, covered: int) -> str:
    """``93.33% (14 of 15)``, or ``no covered failures``."""
    if covered == 0:
        return "no covered failures"
    return f"{decimal_string(Fraction(resolved * 100, covered), 2)}% ({resolved} of {covered})"


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
    """``1,000,000.00 USD``."""
    return f"{grouped(format(amount, 'f'))} {currency}"


def cost_text(seconds: Decimal, price: Decimal | None, currency: str) -> str | None:
    """The cost of ``seconds`` GPU-seconds at ``price`` per GPU-hour, half up to the minor
    unit, as ``1,234.57 USD``; None without a price."""
    if price is None:
        return None
    exp = minor_unit_exponent(currency)
    minor = round_half_up(Fraction(seconds) * Fraction(price) / 3600 * 10**exp)
    return f"{grouped(format_minor(minor, currency))} {currency}"


def plain(d: Decimal) -> str:
    """A Decimal without trailing zeros or exponent: ``12.50`` → ``12.5``."""
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s or "0"
