"""The portal's template filters and the inline SVG chart: pure formatting, no request.

:func:`install` registers them on the portal's Jinja environment
(:attr:`web.portal.Portal.templates`); the page response that needs the caller and its
CSRF token is :mod:`web.render`. Every figure goes through billing's one formatter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

from jinja2 import Environment
from markupsafe import Markup, escape

from billing.labels import cause_label, class_label, outcome_label, state_label, status_label
from billing.money import format_money
from billing.verdict import (
    format_elapsed,
    format_number,
    format_percent,
    format_probability,
    format_rate,
    format_seconds,
)
from billing.yearend import closed_verdict_text
from web.views import MonthFigures, month_verdict
from yoco_records.textsafe import isolate, isolate_stored


def _exact(value: Decimal | float | int | None) -> Decimal | int | None:
    # A float reaching a page is an estimate (a forecast's probability), never a figure:
    # written through its shortest decimal text, then formatted like everything else.
    return Decimal(repr(value)) if isinstance(value, float) else value


def pct(value: Decimal | float | None, places: int = 2) -> str:
    """A share (0.934) as a percentage ("93.40 %"); "—" for None (billing's formatter)."""
    return format_percent(_exact(value), places)


def chance(value: Decimal | float | None) -> str:
    """A forecast's probability: ``21.60 %``, ``< 0.01 %`` (billing's one formatter)."""
    return format_probability(value)


def waited(since: datetime | None, now: datetime) -> str:
    """How long since ``since`` at ``now``: ``3 days``, ``8 months`` (billing's formatter)."""
    if since is None:
        return "—"
    return format_elapsed(max(0, int((now - since).total_seconds())))


def num(value: Decimal | float | int | None, places: int = 0) -> str:
    """A number with thousands separators and ``places`` decimals; "—" for None."""
    return format_number(_exact(value), places)


def gpu_hours(seconds: Decimal | int | None) -> str:
    """GPU-seconds as GPU-hours: two decimals, four under 0.1 (a resolved failure's few
    GPU-seconds of recovery read ``0.0056``, not ``0.01``), ``< 0.0001`` below that."""
    if seconds is None:
        return "—"
    hours = Fraction(seconds) / 3600
    if 0 < hours < Fraction(1, 20000):
        return "< 0.0001"
    return format_number(hours, 4 if 0 < hours < Fraction(1, 10) else 2)


def secs(value: Decimal | int | None) -> str:
    """A duration in seconds, to the millisecond at most: ``0.331 s``, ``2.5 s``."""
    return format_seconds(value)


def money(amount: Decimal | str | int | None, currency: str, minor: bool = False) -> str:
    """An amount with separators and its currency: ``1,050,000.00 EUR``; "—" for None."""
    if amount is None or amount == "":
        return "—"
    if isinstance(amount, str):
        amount = Decimal(amount)
    return format_money(amount, currency, minor=minor)


def when(value: datetime | None, tz: str = "UTC", seconds: bool = False) -> str:
    """A time in the zone ``tz``: ``2026-03-02 07:00 EST``."""
    if value is None:
        return "—"
    local = value.astimezone(ZoneInfo(tz))
    return local.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def day(value: datetime | None, tz: str = "UTC") -> str:
    """The local date of an instant in ``tz``."""
    if value is None:
        return "—"
    return value.astimezone(ZoneInfo(tz)).strftime("%Y-%m-%d")


# A state code (a status, a resolution) as words; a failure's class, cause and outcome
# have their own filters: billing.labels is the one wording of each.
label = state_label


_CODE_SPAN = re.compile(r"``?([^`]+?)``?")


def codespans(text: str | None) -> Markup:
    """Plain text with Markdown/reST code spans (```x``` or ````x````) shown as ``<code>``,
    as one bidi isolate (:func:`isolate`)."""
    escaped = str(escape(isolate(text or "")))
    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", escaped))  # noqa: S704 (escaped first)


def install(env: Environment) -> None:
    """Register the portal's filters on a Jinja environment, and the bidi isolation of
    every stored string shown (``yoco_records.textsafe.isolate_stored``, the reports'
    ``finalize`` too)."""
    env.finalize = isolate_stored
    env.filters.update(
        pct=pct, chance=chance, waited=waited, num=num, when=when, day=day, label=label,
        gpu_hours=gpu_hours, secs=secs, money=money, codespans=codespans,
        cause_label=cause_label, class_label=class_label, outcome_label=outcome_label,
        status_label=status_label,
        closed_verdict=closed_verdict_text,
    )
    env.globals["monthly_chart"] = monthly_chart
    env.globals["month_verdict"] = month_verdict


# --------------------------------------------------------------------------- chart

_W, _H = 720, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 18, 28


def monthly_chart(months: Sequence[MonthFigures], threshold: Decimal) -> Markup:
    """An inline SVG bar chart: resolution rate by month against the threshold line.

    Bars are green where the month's rate meets the threshold and red where it does not
    (the guarantee's exact test), each labelled with the rate as billing writes it, so a
    label never reads as meeting the threshold on a red bar; months without covered
    failures show a grey dot, months to come are left empty.  The legend is HTML under
    the chart, so it wraps on a phone instead of shrinking with the drawing.
    """
    thr = float(threshold)  # drawing coordinates only: no figure is computed from them
    # The axis always spans 0-100 %: every year and contract is drawn on the same scale
    # (a floor that followed the data started at 50, 70 or 80 % from one year to the next).
    lo = 0.0
    plot_w = _W - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    n = max(1, len(months))
    slot = plot_w / n
    bar = slot * 0.62

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - (v - lo) / (100 - lo))

    thr_text = escape(format(threshold, "f"))
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-labelledby="chart-title" xmlns="http://www.w3.org/2000/svg">',
        '<title id="chart-title">Resolution rate by month against the guaranteed '
        f"{thr_text} %</title>",
    ]
    step = 25
    for tick in range(0, 101, step):
        ty = y(tick)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" '
            'class="grid"/>'
        )
        # 0 % is the baseline (its label would sit on the first month's); the threshold's
        # own label takes the place of a tick near it; on a phone only 50 % stays.
        if tick and abs(tick - thr) >= step / 2.5:
            minor = "" if tick == 50 else " minor"
            parts.append(
                f'<text x="{_LEFT - 6}" y="{ty + 4:.1f}" class="tick y{minor}" '
                f'text-anchor="end">{tick}%</text>'
            )
    # The threshold before the bars and their labels: a label is never struck through.
    ty = y(thr)
    parts.append(
        f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" class="threshold"/>'
        f'<text x="{_LEFT - 6}" y="{ty + 4:.1f}" class="threshold-label" text-anchor="end">'
        f"{thr_text}%</text>"
    )
    for i, m in enumerate(months):
        cx = _LEFT + slot * i + slot / 2
        odd = " odd" if i % 2 else ""
        parts.append(
            f'<text x="{cx:.1f}" y="{_H - _BOTTOM + 18}" class="tick month{odd}" '
            f'text-anchor="middle">{escape(m.label[2:])}</text>'
        )
        f = m.figures
        if f is None:
            continue
        if not f.covered_failures:
            parts.append(
                f'<circle cx="{cx:.1f}" cy="{_TOP + plot_h - 6:.1f}" r="5" class="none">'
                f"<title>{escape(m.label)}: no covered failures</title></circle>"
            )
            continue
        rate = 100.0 * f.resolved_failures / f.covered_failures
        shown = format_rate(f.resolved_failures, f.covered_failures, threshold)
        top = y(max(rate, lo))
        cls = "ok" if f.guarantee_met else "miss"
        parts.append(
            f'<rect x="{cx - bar / 2:.1f}" y="{top:.1f}" width="{bar:.1f}" '
            f'height="{max(1.0, _TOP + plot_h - top):.1f}" class="bar {cls}">'
            f"<title>{escape(m.label)}: {f.resolved_failures:,} of {f.covered_failures:,} "
            f"covered failures resolved ({escape(shown)})</title></rect>"
        )
        parts.append(
            f'<text x="{cx:.1f}" y="{top - 4:.1f}" class="val" text-anchor="middle">'
            f"{escape(shown.removesuffix(' %'))}</text>"
        )
    parts.append("</svg>")
    parts.append(
        '<p class="chart-legend small"><span class="key ok" aria-hidden="true"></span> at or '
        'above the guarantee <span class="key miss" aria-hidden="true"></span> below it '
        '<span class="key dot" aria-hidden="true"></span> no covered failure '
        f'<span class="key dash" aria-hidden="true"></span> guaranteed {thr_text} %. '
        "Bars: share of the month's covered failures resolved by live migration.</p>"
    )
    return Markup("".join(parts))  # noqa: S704 (every value above is escaped or numeric)
