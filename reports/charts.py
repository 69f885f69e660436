"""Inline SVG charts drawn from the report's figures (no scripts, no external resources).

Each function returns one ``<svg>`` element as a string, deterministic for its input
(coordinates are written with fixed decimals), with a ``<title>`` and a visible legend
so the chart reads the same on paper as on screen.  All text is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from html import escape

from billing.labels import CLASS_LABELS, CLASS_ORDER, OUTCOME_LABELS

__all__ = [
    "CLASS_COLOURS",
    "OUTCOME_COLOURS",
    "MonthRate",
    "lost_hours_chart",
    "rate_chart",
    "recovery_chart",
]

FONT = "Yoco Report Sans, DejaVu Sans, Verdana, sans-serif"
CLASS_COLOURS: dict[str, str] = {
    "unplanned": "#b8433a",
    "preemptive": "#e0913a",
    "planned": "#8c96a3",
}
OUTCOME_COLOURS: dict[str, str] = {
    "live_migrated": "#2f8a5b",
    "rolled_back": "#e0913a",
    "failed": "#b8433a",
}
AXIS = "#5b6472"
GRID = "#dde2e8"
INK = "#1d2733"

W, H = 680.0, 210.0
LEFT, RIGHT, TOP, BOTTOM = 56.0, 12.0, 30.0, 24.0


def _n(x: float) -> str:
    """A coordinate with at most two decimals, no trailing zeros ("12.5", "3")."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _text(x: float, y: float, s: str, *, size: float = 10, anchor: str = "middle",
          fill: str = AXIS, weight: str = "normal", cls: str = "") -> str:
    # ``cls`` names the text's part (x, y, unit, legend, val): report.css sets each
    # part's size on a phone, where the chart is drawn at about half its width.
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" text-anchor="{anchor}" '
        f'fill="{fill}" font-weight="{weight}"{klass}>{escape(s)}</text>'
    )


def _svg(title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_n(W)} {_n(H)}" '
        f'width="{_n(W)}" height="{_n(H)}" role="img" font-family="{FONT}">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _nice_step(top: float, ticks: int = 4) -> float:
    """A round tick step (1, 2, 2.5 or 5 × 10^k) so that ``ticks`` steps cover ``top``."""
    if top <= 0:
        return 1.0
    raw = top / ticks
    mag = 10.0 ** _floor_log10(raw)
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * mag + 1e-12:
            return m * mag
    return 10.0 * mag


def _floor_log10(x: float) -> int:
    k = 0
    while x >= 10:
        x /= 10
        k += 1
    while x < 1:
        x *= 10
        k -= 1
    return k


def _fmt_tick(v: float, step: float) -> str:
    if step >= 1:
        return f"{v:,.0f}"
    places = 1 if step >= 0.1 else 2 if step >= 0.01 else 3
    return f"{v:,.{places}f}"


def _legend(items: Sequence[tuple[str, str, str]], y: float) -> list[str]:
    """Legend entries (label, colour, kind: 'box' | 'line' | 'dash') laid out left to right."""
    out: list[str] = []
    x = LEFT
    for label, colour, kind in items:
        if kind == "box":
            out.append(
                f'<rect x="{_n(x)}" y="{_n(y - 8)}" width="10" height="10" fill="{colour}"/>'
            )
        else:
            dash = ' stroke-dasharray="5 3"' if kind == "dash" else ""
            out.append(
                f'<line x1="{_n(x)}" y1="{_n(y - 3)}" x2="{_n(x + 14)}" y2="{_n(y - 3)}" '
                f'stroke="{colour}" stroke-width="2"{dash}/>'
            )
        out.append(_text(x + 18, y, label, anchor="start", size=9.5, fill=INK, cls="legend"))
        # room for the label at a phone's larger size (report.css), not only at 9.5
        x += 26 + 10.5 * len(label)
    return out


def _frame(labels: Sequence[str]) -> tuple[list[str], float, float]:
    """Month labels under the x axis; returns (elements, slot width, plot height)."""
    plot_w = W - LEFT - RIGHT
    plot_h = H - TOP - BOTTOM
    n = max(len(labels), 1)
    slot = plot_w / n
    out = []
    crowded = n > 6  # on a phone every other label is left out (report.css)
    for i, label in enumerate(labels):
        cls = "x odd" if crowded and i % 2 else "x"
        out.append(_text(LEFT + slot * (i + 0.5), H - BOTTOM + 14, label, size=9, cls=cls))
    out.append(
        f'<line x1="{_n(LEFT)}" y1="{_n(H - BOTTOM)}" x2="{_n(W - RIGHT)}" '
        f'y2="{_n(H - BOTTOM)}" stroke="{AXIS}" stroke-width="1"/>'
    )
    return out, slot, plot_h


@dataclass(frozen=True, slots=True)
class MonthRate:
    """One month of the rate chart: its label, the month's counts and the year-to-date ones."""

    label: str
    resolved: int
    covered: int
    ytd_resolved: int
    ytd_covered: int


def rate_chart(months: Sequence[MonthRate], threshold_percent: Decimal) -> str:
    """Resolution rate by month (bars), year to date (line) and the threshold (dashed).

    A month with no covered failure has no bar and is labelled "none"; the y axis runs
    from 0 to 100 %.
    """
    body, slot, plot_h = _frame([m.label for m in months])

    def y_of(pct: float) -> float:
        return TOP + plot_h * (1 - pct / 100)

    for tick in (0, 25, 50, 75, 100):
        y = y_of(tick)
        body.append(
            f'<line x1="{_n(LEFT)}" y1="{_n(y)}" x2="{_n(W - RIGHT)}" y2="{_n(y)}" '
            f'stroke="{GRID}" stroke-width="0.8"/>'
        )
        body.append(_text(LEFT - 6, y + 3.5, f"{tick} %", anchor="end", size=9, cls="y"))
    bar_w = min(slot * 0.55, 38)
    points = []
    for i, m in enumerate(months):
        cx = LEFT + slot * (i + 0.5)
        if m.covered:
            pct = float(Fraction(m.resolved * 100, m.covered))
            y = y_of(pct)
            body.append(
                f'<rect x="{_n(cx - bar_w / 2)}" y="{_n(y)}" width="{_n(bar_w)}" '
                f'height="{_n(TOP + plot_h - y)}" fill="#7fa7d6"/>'
            )
        else:
            body.append(_text(cx, TOP + plot_h - 4, "none", size=8, cls="val"))
        if m.ytd_covered:
            points.append((cx, y_of(float(Fraction(m.ytd_resolved * 100, m.ytd_covered)))))
    ty = y_of(float(threshold_percent))
    body.append(
        f'<line x1="{_n(LEFT)}" y1="{_n(ty)}" x2="{_n(W - RIGHT)}" y2="{_n(ty)}" '
        f'stroke="{INK}" stroke-width="1.4" stroke-dasharray="5 3"/>'
    )
    if points:
        path = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        body.append(
            f'<polyline points="{path}" fill="none" stroke="#1f4e8c" stroke-width="2"/>'
        )
        for x, y in points:
            body.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="2.8" fill="#1f4e8c"/>')
    body += _legend(
        [
            ("month", "#7fa7d6", "box"),
            ("contract year to date", "#1f4e8c", "line"),
            (f"guaranteed {threshold_percent} %", INK, "dash"),
        ],
        16,
    )
    return _svg("Resolution rate by month against the guaranteed threshold", body)


def _stacked(
    labels: Sequence[str],
    stacks: Sequence[Mapping[str, float]],
    order: Sequence[str],
    colours: Mapping[str, str],
    names: Mapping[str, str],
    unit: str,
    title: str,
    integer: bool = False,
) -> str:
    body, slot, plot_h = _frame(labels)
    top = max((sum(s.get(k, 0.0) for k in order) for s in stacks), default=0.0)
    step = _nice_step(top)
    if integer:
        step = max(1.0, float(round(step)))
    ticks = max(1, int(top / step + 0.999999)) if top > 0 else 4
    y_max = step * ticks

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - v / y_max)

    for t in range(ticks + 1):
        v = step * t
        y = y_of(v)
        body.append(
            f'<line x1="{_n(LEFT)}" y1="{_n(y)}" x2="{_n(W - RIGHT)}" y2="{_n(y)}" '
            f'stroke="{GRID}" stroke-width="0.8"/>'
        )
        body.append(_text(LEFT - 6, y + 3.5, _fmt_tick(v, step), anchor="end", size=9,
                          cls="y"))
    body.append(_text(12, TOP + plot_h / 2, unit, size=9, anchor="middle", cls="unit").replace(
        "<text ", f'<text transform="rotate(-90 12 {_n(TOP + plot_h / 2)})" ', 1))
    bar_w = min(slot * 0.55, 38)
    for i, stack in enumerate(stacks):
        cx = LEFT + slot * (i + 0.5)
        base = 0.0
        for key in order:
            v = stack.get(key, 0.0)
            if v <= 0:
                continue
            y1, y0 = y_of(base + v), y_of(base)
            body.append(
                f'<rect x="{_n(cx - bar_w / 2)}" y="{_n(y1)}" width="{_n(bar_w)}" '
                f'height="{_n(max(y0 - y1, 0.6))}" fill="{colours[key]}"/>'
            )
            base += v
    body += _legend([(names[k], colours[k], "box") for k in order], 16)
    return _svg(title, body)


def lost_hours_chart(labels: Sequence[str], by_class: Sequence[Mapping[str, Decimal]]) -> str:
    """Lost GPU-hours by month, stacked by failure class (unplanned, preemptive, planned).

    ``by_class`` holds, per month, lost GPU-*seconds* per class (exact Decimals).
    """
    stacks = [{k: float(v) / 3600 for k, v in m.items()} for m in by_class]
    return _stacked(
        labels,
        stacks,
        CLASS_ORDER,
        CLASS_COLOURS,
        CLASS_LABELS,
        "GPU-hours",
        "Lost GPU-hours by month and failure class",
    )


#: Upper bounds (exclusive) of the recovery-time buckets, in seconds, and their labels.
RECOVERY_BUCKETS: tuple[tuple[float | None, str], ...] = (
    (1, "< 1 s"),
    (5, "1–5 s"),
    (15, "5–15 s"),
    (60, "15–60 s"),
    (300, "1–5 min"),
    (900, "5–15 min"),
    (3600, "15–60 min"),
    (None, "≥ 1 h"),
)


def recovery_bucket(seconds: Decimal) -> int:
    """Index in :data:`RECOVERY_BUCKETS` of a recovery time."""
    for i, (bound, _label) in enumerate(RECOVERY_BUCKETS):
        if bound is None or seconds < Decimal(str(bound)):
            return i
    return len(RECOVERY_BUCKETS) - 1


def recovery_chart(counts: Sequence[Mapping[str, int]]) -> str:
    """Recovery-time distribution of the month's failures that have an outcome.

    ``counts`` holds, per bucket of :data:`RECOVERY_BUCKETS`, the number of failures per
    outcome (live_migrated, rolled_back, failed), drawn stacked.
    """
    stacks = [{k: float(v) for k, v in c.items()} for c in counts]
    return _stacked(
        [label for _b, label in RECOVERY_BUCKETS],
        stacks,
        ("live_migrated", "rolled_back", "failed"),
        OUTCOME_COLOURS,
        OUTCOME_LABELS,
        "failures",
        "Recovery time of the month's failures, by outcome",
        integer=True,
    )
