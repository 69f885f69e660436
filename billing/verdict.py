"""Where the guarantee stands, in words, and how its figures are written: one home.

The CLI (``yoco sla``), the portal and the monthly reports (HTML and PDF) all call this
module, so the same period reads the same everywhere (docs/definitions.md, "Verdicts").

* :func:`verdict` — the standing of a period (met, missed, no covered failures, on
  track, at risk, below so far) from exact integer counts and the Decimal threshold;
* :func:`format_rate` — the resolution rate as a percentage: exact, rounded half to even
  to :data:`RATE_PLACES` decimals, and never written on the other side of the threshold
  from the verdict;
* :func:`format_number`, :func:`format_percent` — other figures with thousands
  separators (money lives in :func:`billing.money.format_money`).

Nothing here uses floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Any

from ledger.errors import ensure

__all__ = [
    "RATE_PLACES",
    "Standing",
    "Verdict",
    "format_elapsed",
    "format_number",
    "format_percent",
    "format_probability",
    "format_rate",
    "format_seconds",
    "rate_percent",
    "verdict",
    "verdict_of_json",
]

#: Decimal places of every resolution rate shown to a person ("93.41 %").
RATE_PLACES = 2


class Standing(StrEnum):
    """The standing of a period against the guarantee (see :func:`verdict`)."""

    MET = "met"
    MISSED = "missed"
    NO_COVERED = "no_covered_failures"
    ON_TRACK = "on_track"
    AT_RISK = "at_risk"
    BELOW = "below"


_WORDS = {
    Standing.MET: "met",
    Standing.MISSED: "missed",
    Standing.NO_COVERED: "no covered failures",
    Standing.ON_TRACK: "on track",
    Standing.AT_RISK: "at risk",
    Standing.BELOW: "below so far",
}
_HEADLINES = {
    Standing.MET: "Guarantee met",
    Standing.MISSED: "Guarantee missed",
    Standing.NO_COVERED: "No covered failures",
    Standing.ON_TRACK: "On track",
    Standing.AT_RISK: "At risk",
    Standing.BELOW: "Below the guarantee so far",
}
#: How a standing looks: ``ok`` (green), ``warn`` (amber), ``bad`` (red), ``none`` (grey).
_TONES = {
    Standing.MET: "ok",
    Standing.ON_TRACK: "ok",
    Standing.NO_COVERED: "none",
    Standing.AT_RISK: "warn",
    Standing.BELOW: "bad",
    Standing.MISSED: "bad",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The standing of one period, with the counts and threshold it was judged on."""

    standing: Standing
    resolved: int
    covered: int
    threshold_percent: Decimal
    closed: bool

    @property
    def word(self) -> str:
        """The standing in a few words: ``met``, ``at risk``, ``below so far``, …"""
        return _WORDS[self.standing]

    @property
    def headline(self) -> str:
        """The standing as a heading: ``Guarantee met``, ``Below the guarantee so far``, …"""
        return _HEADLINES[self.standing]

    @property
    def tone(self) -> str:
        """``ok``, ``warn``, ``bad`` or ``none``: the colour a page gives the standing."""
        return _TONES[self.standing]

    @property
    def guarantee_met(self) -> bool:
        """Whether ``resolved × 100 ≥ covered × threshold`` (always true with 0 covered)."""
        return self.standing in (Standing.MET, Standing.NO_COVERED, Standing.ON_TRACK,
                                 Standing.AT_RISK)

    @property
    def rate(self) -> str:
        """The resolution rate (:func:`format_rate`), coherent with this verdict."""
        return format_rate(self.resolved, self.covered, self.threshold_percent)

    @property
    def rate_with_counts(self) -> str:
        """``93.41 % (142 of 152)``, or ``no covered failures``."""
        if self.covered == 0:
            return self.rate
        return f"{self.rate} ({self.resolved:,} of {self.covered:,})"

    @property
    def headroom(self) -> int | None:
        """How many more unresolved covered failures the period can take and still meet
        the threshold (``resolved × 100 ≥ (covered + k) × threshold``, exact); None when it
        is below already.  Resolved failures to come would add to it."""
        if self.resolved * 100 < self.covered * self.threshold_percent:
            return None
        most = Fraction(self.resolved * 100) / Fraction(self.threshold_percent)
        return int(most) - self.covered  # int() truncates: the largest whole k

    @property
    def headroom_text(self) -> str | None:
        """The headroom in words for a period still running (``Headroom: 6 more unresolved
        failures before falling below 90 %.``); None when closed or below already."""
        k = self.headroom
        if self.closed or k is None:
            return None
        thr = _plain(self.threshold_percent)
        if k == 0:
            return f"No headroom: the next unresolved failure would bring it below {thr} %."
        more = "1 more unresolved failure" if k == 1 else f"{k:,} more unresolved failures"
        return f"Headroom: {more} before falling below {thr} %."

    @property
    def sentence(self) -> str:
        """One sentence saying what the standing means for this period."""
        thr = _plain(self.threshold_percent)
        s = self.standing
        if s is Standing.NO_COVERED:
            if self.closed:
                return "No covered failure in this period: the guarantee is met."
            return "No covered failure so far."
        if s is Standing.MET:
            return f"{self.rate} of covered failures resolved: at or above the guaranteed {thr} %."
        if s is Standing.MISSED:
            return f"{self.rate} of covered failures resolved: below the guaranteed {thr} %."
        if s is Standing.BELOW:
            return (
                f"{self.rate} of covered failures resolved so far: below the guaranteed "
                f"{thr} % while the period is still running."
            )
        if s is Standing.AT_RISK:
            return (
                f"{self.rate} of covered failures resolved so far: at or above the guaranteed "
                f"{thr} %, but one more unresolved failure would bring it below."
            )
        return (
            f"{self.rate} of covered failures resolved so far: at or above the guaranteed "
            f"{thr} %."
        )


def _check_counts(resolved: int, covered: int) -> None:
    for name, v in (("resolved", resolved), ("covered", covered)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
    if resolved > covered:
        raise ValueError(f"resolved ({resolved}) cannot exceed covered ({covered})")


def _threshold(threshold_percent: Decimal) -> Decimal:
    if isinstance(threshold_percent, bool) or not isinstance(threshold_percent, (Decimal, int)):
        raise ValueError(f"threshold_percent: expected a Decimal, got {threshold_percent!r}")
    t = Decimal(threshold_percent)
    if not t.is_finite() or not 0 < t <= 100:
        raise ValueError(f"threshold_percent: must satisfy 0 < p <= 100, got {t}")
    return t


def verdict(resolved: int, covered: int, threshold_percent: Decimal, closed: bool) -> Verdict:
    """The standing of a period with ``resolved`` of ``covered`` covered failures resolved.

    ``closed``: the period had ended at the instant the figures are computed for.
    Exact integer/Decimal arithmetic; "meets" means ``resolved × 100 ≥ covered × threshold``.

    * no covered failures — ``covered == 0`` (the guarantee is met; nothing to judge);
    * closed: **met** (meets) or **missed** (does not);
    * open: **below so far** (does not meet), **at risk** (meets, but one more unresolved
      covered failure would not: ``resolved × 100 < (covered + 1) × threshold``), else
      **on track**.
    """
    _check_counts(resolved, covered)
    thr = _threshold(threshold_percent)
    if covered == 0:
        standing = Standing.NO_COVERED
    elif resolved * 100 < covered * thr:
        standing = Standing.MISSED if closed else Standing.BELOW
    elif closed:
        standing = Standing.MET
    elif resolved * 100 < (covered + 1) * thr:
        standing = Standing.AT_RISK
    else:
        standing = Standing.ON_TRACK
    return Verdict(standing, resolved, covered, thr, bool(closed))


def verdict_of_json(figures: Mapping[str, Any]) -> Verdict:
    """The :class:`Verdict` of a ``yoco sla --json`` object (as the API serves it).

    Judged again from its counts and threshold with :func:`verdict`, *closed* taken
    from the standing the object states; raises ValueError when the counts and the
    stated standing disagree (an object that was altered, or not one of ours).
    """
    stated = Standing(figures["standing"])
    closed = stated in (Standing.MET, Standing.MISSED)
    if stated is Standing.NO_COVERED:
        closed = str(figures.get("computed_at", "")) >= str(figures.get("period_end", "~"))
    v = verdict(int(figures["resolved_failures"]), int(figures["covered_failures"]),
                Decimal(str(figures["threshold_percent"])), closed)
    if v.standing is not stated:
        raise ValueError(
            f"the figures say {stated.value!r} but their counts give {v.standing.value!r}"
        )
    return v


def rate_percent(resolved: int, covered: int) -> Fraction | None:
    """The exact resolution rate in percent (``Fraction``), or None with no covered failure."""
    _check_counts(resolved, covered)
    return None if covered == 0 else Fraction(resolved * 100, covered)


def _round_half_even(value: Fraction, places: int) -> Fraction:
    scaled = value * 10**places
    q, r = divmod(scaled.numerator, scaled.denominator)
    if 2 * r > scaled.denominator or (2 * r == scaled.denominator and q % 2 == 1):
        q += 1
    return Fraction(q, 10**places)


def _fixed(value: Fraction, places: int) -> str:
    """An exact multiple of 10^-places as a plain string with exactly ``places`` decimals."""
    scaled = value * 10**places
    ensure(scaled.denominator == 1, "only for values already rounded")
    n = scaled.numerator
    sign = "-" if n < 0 else ""
    whole, frac = divmod(abs(n), 10**places)
    text = f"{whole:,}"
    if places:
        text += "." + str(frac).rjust(places, "0")
    return sign + text if n else text


def format_rate(
    resolved: int,
    covered: int,
    threshold_percent: Decimal | None = None,
    places: int = RATE_PLACES,
) -> str:
    """The resolution rate as ``"93.41 %"``; ``"no covered failures"`` when covered is 0.

    Exact: ``resolved × 100 / covered`` rounded once, half to even, to ``places`` decimals.
    With ``threshold_percent`` the text never contradicts the verdict: a rate below the
    threshold that would round up to it (89.996 % against 90) is written as the largest
    value below it at that precision (``89.99 %``), and a rate at or above a threshold
    finer than ``places`` (92.125 against 92.125) is rounded up instead of down.
    """
    pct = rate_percent(resolved, covered)
    if pct is None:
        return "no covered failures"
    shown = _round_half_even(pct, places)
    if threshold_percent is not None:
        thr = Fraction(_threshold(threshold_percent))
        step = Fraction(1, 10**places)
        if pct < thr <= shown:
            shown = Fraction(math.ceil(thr / step) - 1) * step
        elif shown < thr <= pct:
            shown = Fraction(math.ceil(thr / step)) * step
    return f"{_fixed(shown, places)} %"


def format_percent(fraction: Decimal | Fraction | int | None, places: int = 2) -> str:
    """A share (``0.9341``) as ``"93.41 %"``, exact, half to even; ``"—"`` for None."""
    if fraction is None:
        return "—"
    if isinstance(fraction, float):
        raise ValueError("format_percent: floats are not accepted")
    return f"{_fixed(_round_half_even(Fraction(fraction) * 100, places), places)} %"


def format_probability(p: float | Decimal | Fraction | None, places: int = 2) -> str:
    """A model's probability (a forecast's chance of missing) as a percentage, on every
    surface alike: ``"21.60 %"``; ``"< 0.01 %"`` / ``"> 99.99 %"`` for a chance that is
    neither nil nor certain but rounds to 0 or 100 (so a page never says "0.00 % chance"
    beside an expected credit above zero); ``"—"`` for None.

    A float is read through its shortest decimal text (``repr``): a probability is an
    estimate, and this is its one formatter.
    """
    if p is None:
        return "—"
    exact = Fraction(Decimal(repr(p))) if isinstance(p, float) else Fraction(p)
    if exact < 0 or exact > 1:
        raise ValueError(f"format_probability: {p!r} is not a probability")
    text = format_percent(exact, places)
    least = Fraction(1, 10**places)  # the smallest step shown, in percent
    if exact > 0 and text == format_percent(0, places):
        return f"< {_fixed(least, places)} %"
    if exact < 1 and text == format_percent(1, places):
        return f"> {_fixed(100 - least, places)} %"
    return text


def format_number(value: Decimal | Fraction | int | None, places: int = 0) -> str:
    """``value`` with thousands separators, rounded half to even to ``places`` decimals.

    ``format_number(Decimal("13625026.573706"), 1) == "13,625,026.6"``; ``"—"`` for None.
    """
    if value is None:
        return "—"
    if isinstance(value, float):
        raise ValueError("format_number: floats are not accepted")
    return _fixed(_round_half_even(Fraction(value), places), places)


def format_elapsed(seconds: Decimal | Fraction | int | float) -> str:
    """How long something has waited, in the largest whole unit that fits: ``45 min``,
    ``5 h``, ``3 days``, ``8 months`` (30-day months), ``2 years`` (365 days); ``under a
    minute`` below that.  For ages shown to people (a failure pending since …), not for
    figures: rounded down, so a wait is never overstated."""
    s = int(seconds)
    if s < 0:
        raise ValueError(f"format_elapsed: a negative wait ({seconds!r})")
    for size, one, many in ((365 * 86400, "year", "years"), (30 * 86400, "month", "months"),
                            (86400, "day", "days"), (3600, "h", "h"), (60, "min", "min")):
        if s >= size:
            n = s // size
            return f"{n} {one if n == 1 else many}"
    return "under a minute"


def format_seconds(value: Decimal | Fraction | int | None) -> str:
    """A duration to the millisecond at most, without trailing zeros: ``0.331 s``, ``2.5 s``."""
    if value is None:
        return "—"
    text = format_number(value, 3)
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} s"


def _plain(d: Decimal) -> str:
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s or "0"
