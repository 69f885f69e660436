"""HTML pages with inline SVG charts for the guarantee-risk figures (no script, no CDN).

:func:`price_page` charts a price of the guarantee (``billing.risk.RiskResult.to_json``):
the distribution of the resolution rate with the threshold, and lost GPU-hours with and
without live migration.  :func:`forecast_page` charts open-year forecasts
(``billing.forecast.YearForecast.to_json``) as bars of the probability of missing.
:func:`probability_bar` is a small inline bar for tables.
"""

from __future__ import annotations

from html import escape
from typing import Any

from yoco_records.textsafe import isolate

__all__ = ["forecast_page", "histogram_svg", "price_page", "probability_bar"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1b1f24}
h1{font-size:1.4rem} h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:1rem 0}
td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#555;font-size:.9rem;max-width:50rem}
"""


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>{body}</body></html>\n"
    )


def histogram_svg(
    bins: list[dict[str, Any]], threshold: float, *, width: int = 640, height: int = 220
) -> str:
    """Bars of ``share`` per bin of ``[from, to)`` on 0..1, with a line at ``threshold``."""
    pad_l, pad_b, pad_t = 48, 28, 12
    w = width - pad_l - 10
    h = height - pad_b - pad_t
    top = max((b["share"] for b in bins), default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="distribution of the resolution rate">'
    ]
    for b in bins:
        x = pad_l + b["from"] * w
        bw = max((b["to"] - b["from"]) * w - 1, 1)
        bh = b["share"] / top * h
        color = "#c0392b" if b.get("below_threshold") else "#2e86c1"
        parts.append(
            f'<rect x="{x:.1f}" y="{pad_t + h - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" '
            f'fill="{color}"><title>{b["from"]:.2f}–{b["to"]:.2f}: '
            f'{b["share"]:.2%}</title></rect>'
        )
    tx = pad_l + threshold * w
    parts.append(
        f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{pad_t}" y2="{pad_t + h}" stroke="#000" '
        'stroke-dasharray="4 3"/>'
    )
    parts.append(
        f'<text x="{tx + 3:.1f}" y="{pad_t + 10}" font-size="11">threshold {threshold:.0%}</text>'
    )
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<text x="{pad_l + v * w:.1f}" y="{height - 8}" font-size="11" '
            f'text-anchor="middle">{v:.0%}</text>'
        )
    parts.append(
        f'<text x="4" y="{pad_t + 10}" font-size="11">{top:.1%}</text>'
        f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{pad_t + h}" y2="{pad_t + h}" stroke="#999"/>'
        "</svg>"
    )
    return "".join(parts)


def _hbars(rows: list[tuple[str, float, str]], *, width: int = 640, scale: float = 1.0) -> str:
    """Horizontal bars: (label, value, value text), values on 0..scale."""
    lh = 22
    label_w = 230
    height = lh * len(rows) + 8
    w = width - label_w - 90
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
    ]
    for i, (label, value, text) in enumerate(rows):
        y = 4 + i * lh
        bw = 0 if scale <= 0 else max(min(value / scale, 1.0), 0.0) * w
        parts.append(
            f'<text x="0" y="{y + 15}" font-size="12">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{bw:.1f}" height="{lh - 8}" '
            f'fill="#2e86c1"/><text x="{label_w + bw + 4:.1f}" y="{y + 15}" '
            f'font-size="12">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def probability_bar(p: float, *, width: int = 120) -> str:
    """A small inline SVG bar of probability ``p`` (red above 50%, amber above 10%)."""
    p = min(max(p, 0.0), 1.0)
    color = "#c0392b" if p >= 0.5 else "#d68910" if p >= 0.1 else "#27ae60"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="10" role="img" '
        f'aria-label="{p:.1%}"><rect width="{width}" height="10" fill="#eee"/>'
        f'<rect width="{p * width:.1f}" height="10" fill="{color}"/></svg>'
    )


def _table(rows: list[tuple[str, str]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td class=n>{escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def price_page(result: dict[str, Any]) -> str:
    """The price of the guarantee as an HTML page (``RiskResult.to_json()``)."""
    ex, mc = result["exact"], result["monte_carlo"]
    cur = result["currency"]
    threshold = float(result["terms"]["threshold_percent"]) / 100
    law = result["law"]
    summary = _table(
        [
            ("failure law", f"rate ∝ GPUs^{law['alpha']:.3f}, MTTF {law['mttf_hours']:.2f} h "
             f"at {law['ref_gpus']:,} GPUs"),
            ("expected failures per year", f"{ex['expected_failures']:,.1f}"),
            ("expected covered failures", f"{ex['expected_covered_failures']:,.1f} "
             f"(p5 {ex['covered_failures_p05']}, p95 {ex['covered_failures_p95']})"),
            ("P(year below the threshold), exact", f"{ex['p_miss']:.4%}"),
            ("P(miss), Monte Carlo", f"{mc['p_miss']:.4%} ± {mc['p_miss_standard_error']:.4%}"),
            ("credit if missed", f"{ex['credit_if_missed']} {cur}"),
            ("expected credit per year", f"{ex['expected_credit_per_year']} {cur}"),
            ("credit p95 per year", f"{ex['credit_p95_per_year']} {cur}"),
            ("expected lost GPU-hours, live migration",
             f"{ex['expected_lost_gpu_hours_live']:,.0f}"),
            ("expected lost GPU-hours, checkpoint-restart only",
             f"{ex['expected_lost_gpu_hours_restart']:,.0f}"),
            ("expected cost, live / restart",
             f"{ex['expected_cost_live']} / {ex['expected_cost_restart']} {cur}"
             if ex["expected_cost_live"] is not None else "no GPU-hour price given"),
        ]
    )
    hist = histogram_svg(result["resolution_rate_histogram"], threshold)
    lost_rows = []
    for name, key in (("live migration", "live"), ("checkpoint-restart", "restart")):
        for q in ("p50", "p95"):
            v = mc[f"lost_gpu_hours_{key}_{q}"] or 0.0
            lost_rows.append((f"{name} {q}", v, f"{v:,.0f} GPU-h"))
    top = max((v for _, v, _ in lost_rows), default=0.0)
    body = (
        summary
        + f"<h2>Resolution rate of a contract year ({mc['samples']:,} simulated years, "
        f"seed {mc['seed']})</h2>"
        + hist
        + f"<p class=note>Years with no covered failure (met by definition): "
        f"{mc['p_no_covered_failures']:.2%}.</p>"
        + "<h2>Lost GPU-hours per contract year</h2>"
        + _hbars(lost_rows, scale=top)
    )
    return _page("Guarantee risk — price", body)


def forecast_page(forecasts: list[dict[str, Any]], *, title: str = "Open contract years") -> str:
    """Open-year forecasts as an HTML page: a bar per year of P(ending below the threshold)."""
    rows = [
        (f"{isolate(f['contract_id'])} year {f['year']}", f["p_miss"], f"{f['p_miss']:.1%}")
        for f in forecasts
    ]
    table = (
        "<table><tr><th>contract</th><th>year</th><th>resolved / covered so far</th>"
        "<th>P(miss)</th><th>expected credit</th></tr>"
        + "".join(
            f"<tr><td>{escape(isolate(f['contract_id']))}</td><td class=n>{f['year']}</td>"
            f"<td class=n>{f['resolved_so_far']} / {f['covered_so_far']}</td>"
            f"<td class=n>{f['p_miss']:.1%}</td>"
            f"<td class=n>{escape(f['expected_credit'])} {escape(f['currency'])}</td></tr>"
            for f in forecasts
        )
        + "</table>"
    )
    chart = _hbars(rows, scale=1.0) if rows else "<p>No open contract year.</p>"
    note = (
        "<p class=note>Probability that each open contract year ends below its threshold, "
        "from the year to date and the contract's own rates (docs/risk.md). The verdict "
        "of a year is decided only at its close.</p>"
    )
    return _page(f"Guarantee risk — {title}", chart + table + note)
