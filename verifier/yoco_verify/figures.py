"""Recompute a monthly report's figures from the replayed entries alone.

The same steps as the operator's report (month and contract year to date over the
entries under the report's checkpoint, as of its as-of instant), but every record comes
from the verifier's own replay of the exported entries, and every rule from the shared
pure definitions: the contract in force (:mod:`billing.inforce`), the periods
(:mod:`billing.years`), the figures (:mod:`billing.sla`), the verdict and the text each
figure is shown as (:mod:`billing.display`), the credit (:mod:`billing.money`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from yoco_verify import VerifyError
from yoco_verify.replay import Ledger
from yoco_verify.shared.billing import display, sla
from yoco_verify.shared.billing.inforce import InForce, in_force
from yoco_verify.shared.billing.money import credit_minor_units, format_minor
from yoco_verify.shared.billing.years import contract_year_bounds, month_bounds, year_of

__all__ = ["Recomputed", "credit_view", "recompute", "year_close", "year_problems"]


@dataclass(frozen=True, slots=True)
class Recomputed:
    """The figures of one report recomputed from entries: rows as the report shows them."""

    rows: dict[str, tuple[str, str]]  # figure id -> (month text, year text)
    month: sla.SlaFigures
    year: sla.SlaFigures
    credit_problems: list[str]
    k: int
    in_force: InForce


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).isoformat()


def credit_view(led: Ledger, k: int) -> dict[str, Any] | None:
    """The credit of contract year ``k`` as the entries leave it: the live one (issued,
    partially applied or applied) when there is one, else the latest void one."""
    views = []
    for c in sorted((c for c in led.credits if c.year == k), key=lambda c: -c.seq):
        minor = int(c.body["minor_units"])
        cur = str(c.body["currency"])
        applied = sum(m for _, m in c.applications)
        if c.void_seq is not None:
            status = "void"
        elif applied == 0:
            status = "issued"
        elif applied >= minor:
            status = "applied"
        else:
            status = "partially_applied"
        views.append(
            {
                "credit_id": c.event_id,
                "credit_note": c.body.get("credit_note"),
                "status": status,
                "currency": cur,
                "amount": format_minor(minor, cur),
                "minor_units": minor,
                "seq": c.seq,
            }
        )
    live = [v for v in views if v["status"] != "void"]
    return live[0] if live else (views[0] if views else None)


def _records(led: Ledger, start: datetime, end: datetime) -> dict[str, Any]:
    latest: dict[str, Any] = {}
    for r in led.reclassifications:
        cur = latest.get(r.failure_event_id)
        if cur is None or (r.occurred_at, r.seq, r.event_id) > (
            cur.occurred_at,
            cur.seq,
            cur.event_id,
        ):
            latest[r.failure_event_id] = r
    failures = []
    for f in led.failures.values():
        if not start <= f.occurred_at < end:
            continue
        fix = latest.get(f.event_id)
        if fix is not None:
            f = sla.Failure(
                event_id=f.event_id,
                seq=f.seq,
                occurred_at=f.occurred_at,
                failure_class=fix.failure_class,
                cause=fix.cause,
                job_id=f.job_id,
            )
        failures.append(f)
    ids = {f.event_id for f in failures}
    jobs = [
        span
        for span, _, _ in led.jobs
        if span.started_at < end and (span.finished_at is None or span.finished_at > start)
    ]
    return {
        "failures": failures,
        "outcomes": [o for o in led.outcomes if o.failure_event_id in ids],
        "exclusions": [x for x in led.exclusions if x.failure_event_id in ids],
        "jobs": jobs,
    }


def _check_close(led: Ledger, close: dict[str, Any], k: int) -> list[str]:
    """A year close (or adjustment) states the year's figures as the entries before it
    left them; recompute them from those entries, as of the close's own time."""
    seq = int(close["_seq"])
    before = led.prefix(seq)
    now = datetime.fromisoformat(str(close["occurred_at"]))
    inf = in_force(before.contract, before.amendments, k)
    tz = inf.contract.timezone
    start, end = contract_year_bounds(inf.contract.start_date, tz, k)
    figs = sla.compute_figures(
        terms=inf.terms, period_start=start, period_end=end, now=now, **_records(before, start, end)
    ).to_json()
    stated = close.get("figures") or {}
    return [
        f"{close.get('kind')} of contract year {k} (entry {seq}): {key} stated "
        f"{stated.get(key)!r}, the entries before it give {value!r}"
        for key, value in figs.items()
        if stated.get(key) != value
    ]


def recompute(led: Ledger, block: dict[str, Any]) -> Recomputed:
    """The figures of the report described by ``block`` (its month, as-of instant and
    the options its table shows), from ``led`` (the entries under its checkpoint)."""
    try:
        year, month = (int(x) for x in str(block["month"]).split("-"))
        as_of = datetime.fromisoformat(str(block["as_of"]))
    except (KeyError, ValueError):
        raise VerifyError("report: its figures block has no valid month or as_of") from None
    if as_of.tzinfo is None:
        raise VerifyError("report: as_of has no time zone")
    base = led.contract
    first = in_force(base, led.amendments, 1)
    tz = first.contract.timezone
    m_start, m_end = month_bounds(year, month, tz)
    k = year_of(base.start_date, tz, m_start) or 1
    k = min(k, first.term_years)
    inf = in_force(base, led.amendments, k)
    contract, terms = inf.contract, inf.terms
    y_start, y_end = contract_year_bounds(contract.start_date, tz, k)
    ytd_end = min(m_end, y_end)
    recs = _records(led, min(y_start, m_start), m_end)

    def figs(start: datetime, end: datetime) -> sla.SlaFigures:
        return sla.compute_figures(
            terms=terms, period_start=start, period_end=end, now=as_of, **recs
        )

    fm, fy = figs(m_start, m_end), figs(y_start, ytd_end)
    closed_month = m_end <= as_of
    closed_year = y_end <= as_of and ytd_end == y_end
    price, cur = contract.gpu_hour_price, contract.currency

    def col(fg: sla.SlaFigures, closed: bool) -> dict[str, str]:
        v = display.verdict(
            fg.resolved_failures, fg.covered_failures, terms.threshold_percent, closed
        )
        return {
            "covered": str(fg.covered_failures),
            "resolved": str(fg.resolved_failures),
            "rolled_back": str(fg.rolled_back_failures),
            "failed": str(fg.failed_failures),
            "pending": str(fg.pending_failures),
            "rate": display.rate_text(
                fg.resolved_failures, fg.covered_failures, terms.threshold_percent
            ),
            "verdict": v.word,
            "excluded": str(fg.excluded_failures),
            "not_covered": str(fg.not_covered_failures),
            "total": str(fg.total_failures),
            "allocated": display.hours_text(fg.allocated_gpu_seconds),
            "lost": display.hours_text(fg.lost_gpu_seconds),
            "lost_cost": display.cost_text(fg.lost_gpu_seconds, price, cur) or "",
            "goodput": display.goodput_text(fg),
        }

    cm, cy = col(fm, closed_month), col(fy, closed_year)
    rows = {key: (cm[key], cy[key]) for key in cm}
    if price is None:
        del rows["lost_cost"]

    credit = credit_view(led, k)
    if credit:
        text = display.credit_text(credit, cur)
    elif closed_year and not fy.guarantee_met:
        text = "none recorded yet: the credit is issued at the year close"
    else:
        text = "no credit"
    rows["credit"] = ("—", text)
    closed = (fy.resolved_failures, fy.covered_failures, fy.guarantee_met)
    problems = year_problems(led, k, inf, closed if closed_year else None)
    return Recomputed(rows, fm, fy, problems, k, inf)


def year_problems(
    led: Ledger, k: int, inf: InForce, closed: tuple[int, int, bool] | None
) -> list[str]:
    """What is wrong with contract year ``k``'s close and credit in ``led``: a credit the
    rule does not give (the terms' ``credit_percent`` of the credit base, half up), a
    close (or adjustment) whose figures the entries before it do not give, and -- given
    the ``closed`` year's resolved and covered failures and whether its guarantee was
    met -- a missed year with no live credit or a met one
    with a live credit.  The one check of a year's close, for a monthly report's year
    column and a year-end statement alike."""
    contract, terms = inf.contract, inf.terms
    credit = credit_view(led, k)
    problems: list[str] = []
    for c in led.credits:
        if c.year != k:
            continue
        want = credit_minor_units(contract.credit_base, terms.credit_percent, contract.currency)
        got = int(c.body["minor_units"])
        if got != want:
            problems.append(
                f"credit {c.body.get('credit_note')}: {format_minor(got, contract.currency)} "
                f"{contract.currency} recorded, the rule gives "
                f"{format_minor(want, contract.currency)} ({format(terms.credit_percent, 'f')} % "
                f"of {format(contract.credit_base, 'f')})"
            )
    closes = [c for c in led.year_closes if int(c.get("year", 0)) == k]
    for close in closes:
        problems.extend(_check_close(led, close, k))
    if closes and closed is not None:
        resolved, covered, met = closed
        live = credit is not None and credit["status"] != "void"
        if not met and not live:
            problems.append(
                f"contract year {k} is closed and its guarantee is missed "
                f"({display.rate_text(resolved, covered)}), but no live credit is recorded"
            )
        if met and live:
            problems.append(f"contract year {k} meets its guarantee, but a live credit is recorded")
    return problems


def year_close(led: Ledger, k: int) -> dict[str, Any] | None:
    """The latest close (or adjustment) of contract year ``k`` in ``led``, with its entry
    number under ``_seq``; None when the year was never closed."""
    closes = [c for c in led.year_closes if int(c.get("year", 0)) == k]
    return max(closes, key=lambda c: int(c["_seq"])) if closes else None
