"""Monthly SLA reports: one contract, one calendar month, over one signed checkpoint.

Public API (the CLI and the portal call these; none of them commits):

* :func:`build_monthly_report` — render the report (HTML and PDF), no writes;
* :func:`issue_monthly_report` — render it and record it in the contract's log as a
  ``report`` entry holding both SHA-256 digests (idempotent);
* :func:`prepare_monthly_report` + :func:`finish_report` — the same in two steps, so a
  batch can render PDFs in other processes (:func:`reports.render.html_to_pdf`);
* :func:`record_report`, :func:`find_issued`, :func:`contracts_active_in`,
  :func:`select_checkpoint`, :func:`parse_month`.

The figures are :func:`billing.sla.compute_figures` over the records of entries with
``seq < checkpoint.tree_size`` (:mod:`reports.data`), as of the checkpoint's signing
time, so they equal ``yoco sla --month/--year`` whenever the checkpoint covers the whole
log and the period is over.  Same month + same checkpoint ⇒ same HTML, same PDF bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from markupsafe import Markup, escape
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from billing import services as billing_services
from billing import sla
from billing import years as billing_years
from billing.amendments import contract_in_force
from billing.display import Verdict, verdict
from billing.display import cost_text as _cost
from billing.display import credit_text as credit_words
from billing.display import goodput_text as _goodput
from billing.display import hours_text as _hours
from billing.display import money_text as _money
from billing.display import rate_text as _rate
from billing.labels import (
    cause_label,
    class_label,
    classes_text,
    outcome_label,
    status_label,
)
from billing.terms import Terms
from billing.verdict import format_probability, format_seconds
from billing.witness_policy import WitnessStatus, checkpoint_status
from billing.years import contract_year_bounds, contract_year_dates, month_bounds, year_of
from ledger import ids, journal
from ledger.canonical import canonical_bytes
from ledger.checkpoints import at_size, latest, signed_sizes
from ledger.contracts import list_contracts
from ledger.models import Checkpoint, JournalEntry
from ledger.records import ContractSpec
from reports import charts
from reports.data import CheckpointRecords, load_at_checkpoint
from reports.documents import IssuedReport, insert_issued, issued_document
from reports.errors import (
    AlreadyIssued,
    BadMonth,
    CheckpointTooOld,
    MonthNotOver,
    MonthOutOfTerm,
    NoCheckpoint,
    NotWitnessed,
    ReportError,
    UnknownCheckpoint,
)
from reports.models import MONTHLY
from reports.render import html_to_pdf, isolated, render_template

__all__ = [
    "REPORT_KIND",
    "Draft",
    "MonthlyReport",
    "PreparedReport",
    "RecordedReport",
    "Verdict",
    "build_monthly_report",
    "contracts_active_in",
    "file_stem",
    "find_issued",
    "finish_report",
    "issue_monthly_report",
    "parse_month",
    "prepare_monthly_report",
    "record_report",
    "report_entry",
    "report_event_id",
    "require_over",
    "require_witnessed",
    "safe_name",
    "select_checkpoint",
    "store_issued",
]

REPORT_KIND = "report"
#: Namespace of report entries' event ids (UUID v5 of contract, month, checkpoint, digests).
REPORT_NAMESPACE = uuid.UUID("0b6f3c0e-4d55-4f4e-9c55-2f1a7c9e5a10")
TEMPLATE = "monthly.html.j2"
#: Format of the machine-readable figures block a report embeds (HTML ``<script
#: id="yoco-report-figures">``, PDF attachment ``yoco-report-figures.json``).
FIGURES_FORMAT = "yoco-report-figures/v1"
FIGURES_ID = "yoco-report-figures"
MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
)  # fmt: skip


# --------------------------------------------------------------------------- inputs


def parse_month(text: str) -> tuple[int, int]:
    """``"YYYY-MM"`` as ``(year, month)`` (billing's parser); :class:`BadMonth` otherwise."""
    try:
        return billing_years.parse_month(text)
    except ValueError as exc:
        raise BadMonth(str(exc)) from None


def _check_month(year: int, month: int) -> None:
    if (
        isinstance(year, bool)
        or isinstance(month, bool)
        or not isinstance(year, int)
        or not isinstance(month, int)
        or not 1 <= month <= 12
        or not 1 <= year <= 9998
    ):
        raise BadMonth(f"a month is a year 1..9998 and a month 1..12, got {year!r}-{month!r}")


def select_checkpoint(
    session: Session, contract_id: str, tree_size: int | None = None
) -> Checkpoint:
    """The signed checkpoint of ``contract_id``'s log of size ``tree_size`` (default: latest).

    Raises :class:`NoCheckpoint` when the log has none and :class:`UnknownCheckpoint`
    (listing the signed sizes) when none has that size.
    """
    if tree_size is None:
        cp = latest(session, contract_id)
        if cp is None:
            raise NoCheckpoint(
                f"contract {contract_id!r} has no signed checkpoint yet: a report rests on "
                "one, so run `yoco ledger checkpoint` first"
            )
        return cp
    if isinstance(tree_size, bool) or not isinstance(tree_size, int) or tree_size < 1:
        raise UnknownCheckpoint(f"a checkpoint is named by its tree size (> 0), got {tree_size!r}")
    cp = at_size(session, contract_id, tree_size)
    if cp is None:
        listed = ", ".join(str(s) for s in signed_sizes(session, contract_id)) or "none"
        raise UnknownCheckpoint(
            f"contract {contract_id!r} has no signed checkpoint of tree size {tree_size} "
            f"(signed sizes: {listed})"
        )
    return cp


def _in_force(
    session: Session, contract_id: str, k: int, tree_size: int | None = None
) -> tuple[ContractSpec, Terms, int]:
    """The contract, terms and term length in force for contract year ``k``, after
    billing's amendments (as ``yoco sla`` uses them)."""
    f = contract_in_force(session, contract_id, k, tree_size=tree_size)
    return f.contract, f.terms, f.term_years


def contracts_active_in(session: Session, year: int, month: int) -> list[str]:
    """Ids of the contracts whose term overlaps calendar month ``year-month`` (in each
    contract's own time zone), sorted."""
    _check_month(year, month)
    active = []
    for row in list_contracts(session):
        start, end = month_bounds(year, month, row.timezone)
        first, _ = contract_year_bounds(row.start_date, row.timezone, 1)
        term_years = _in_force(session, row.contract_id, 1)[2]  # renewals extend the term
        _, last = contract_year_bounds(row.start_date, row.timezone, term_years)
        if end > first and start < last:
            active.append(row.contract_id)
    return active


# --------------------------------------------------------------------------- formatting


def _utc(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


def _utc_short(dt: datetime) -> str:
    d = dt.astimezone(UTC)
    s = d.strftime("%Y-%m-%d %H:%M:%S")
    if d.microsecond:
        s += f".{d.microsecond:06d}".rstrip("0")
    return s


def _long_date(d: date) -> str:
    return f"{d.day} {MONTH_NAMES[d.month - 1]} {d.year}"


def safe_name(contract_id: str) -> str:
    """``contract_id`` for a file name: characters other than letters, digits, ``.``,
    ``_`` and ``-`` become ``_`` (safe on every file system)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", contract_id)


def file_stem(contract_id: str, year: int, month: int) -> str:
    """The file name (without extension) of a report: safe on every file system."""
    return f"yoco-sla-{safe_name(contract_id)}-{year:04d}-{month:02d}"


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedReport:
    """A report's HTML and what it was computed from, before the PDF is rendered."""

    contract_id: str
    customer: str
    year: int
    month: int
    contract_year: int
    period_start: datetime
    period_end: datetime
    as_of: datetime
    checkpoint_size: int
    checkpoint_root: str
    checkpoint_note: str
    figures: sla.SlaFigures
    year_to_date: sla.SlaFigures
    rows: tuple[sla.FailureRow, ...]
    credit: dict[str, Any] | None
    html: str
    #: True for a draft: a rendering that is not (or not yet) the issued report, marked
    #: as such on the page.
    draft: bool = False
    #: The checkpoint against the contract's witness policy (stated on the page).
    witness: WitnessStatus | None = None

    @property
    def month_label(self) -> str:
        """``YYYY-MM``."""
        return f"{self.year:04d}-{self.month:02d}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MonthlyReport(PreparedReport):
    """A rendered report: its HTML and PDF and their SHA-256 digests (lower-case hex)."""

    pdf: bytes
    html_sha256: str
    pdf_sha256: str

    @property
    def html_bytes(self) -> bytes:
        """The HTML as written to disk (UTF-8): the bytes ``html_sha256`` is the digest of."""
        return self.html.encode("utf-8")


@dataclass(frozen=True, slots=True)
class RecordedReport:
    """Where a report's ledger entry stands; ``created`` False: it was already recorded."""

    event_id: uuid.UUID
    seq: int
    created: bool
    body: dict[str, Any] = field(default_factory=dict)


def _credit_status(
    session: Session, contract_id: str, k: int, tree_size: int
) -> dict[str, Any] | None:
    result = billing_services.credit_status(session, contract_id, k, tree_size=tree_size)
    return dict(result) if result else None


def _last_day(year: int, month: int) -> date:
    after = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
    return date.fromordinal(after.toordinal() - 1)


def _months(first: date, last: tuple[int, int]) -> list[tuple[int, int]]:
    y, m = first.year, first.month
    out = []
    while (y, m) <= last:
        out.append((y, m))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def _figures(
    terms: Terms, start: datetime, end: datetime, now: datetime, recs: CheckpointRecords
) -> sla.SlaFigures:
    r = recs.records
    return sla.compute_figures(
        terms=terms,
        period_start=start,
        period_end=end,
        now=now,
        failures=r.failures,
        outcomes=r.outcomes,
        exclusions=r.exclusions,
        jobs=r.jobs,
    )


def _note(text: str, *values: str) -> Markup:
    """``text`` with each ``{}`` filled by one value, escaped and bidi-isolated on its own."""
    return escape(text).format(*(isolated(v) for v in values))


def _row(i: int, row: sla.FailureRow, recs: CheckpointRecords) -> dict[str, Any]:
    f = row.failure
    d = recs.details.get(f.event_id)
    o = row.outcome
    where = [d.node or "—", f"GPU {d.gpu}" if d.gpu is not None else "GPU —"] if d else ["—"]
    if d is not None and not d.node and d.gpu is None:
        where = ["—"]
    # Each note is markup built here: the stored text in it (a reason, an approver, a
    # class) is isolated on its own, so a U+202E in a reason cannot reverse the words
    # this report writes after it.
    notes: list[Markup] = []
    if row.status is sla.FailureStatus.EXCLUDED:
        if row.excluded_by == "exclusion":
            who = recs.approved_by.get(f.event_id)
            notes.append(
                _note("excluded: {} (approved by {})", str(row.reason), who)
                if who
                else _note("excluded: {}", str(row.reason))
            )
        else:
            notes.append(_note("excluded cause: {}", cause_label(str(row.reason))))
    elif row.status is sla.FailureStatus.NOT_COVERED:
        notes.append(_note("class {} is not covered", class_label(f.failure_class)))
    if row.status in (sla.FailureStatus.EXCLUDED, sla.FailureStatus.NOT_COVERED):
        notes.append(_note("outcome: {}", outcome_label(o.outcome) if o else "pending"))
    fix = recs.reclassified.get(f.event_id)
    if fix is not None:
        notes.append(
            _note(
                "reclassified after a dispute (recorded as {} / {}): {}",
                class_label(fix[0]),
                cause_label(fix[1]),
                fix[2],
            )
        )
    n = recs.outcome_counts.get(f.event_id, 0)
    if n > 1:
        notes.append(_note("corrected: latest of {} outcomes counts", str(n)))
    return {
        "n": i,
        "time": _utc_short(f.occurred_at),
        "event_id": f.event_id,
        "job": f.job_id,
        # As words (billing.labels: the wording of every surface); the entry keeps the code.
        "failure_class": class_label(f.failure_class),
        "cause": cause_label(f.cause),
        "where": where,
        "status": row.status.value,
        "status_text": status_label(row.status.value),
        "notes": notes,
        "lost_steps": str(o.lost_steps) if o else "—",
        "recovery": format_seconds(o.recovery_seconds) if o else "—",
        "lost_hours": _hours(row.lost_gpu_seconds) if o else "—",
    }


def _figure_rows(
    m: dict[str, Any], y: dict[str, Any], terms: Terms, has_price: bool, credit_text: str
) -> list[dict[str, Any]]:
    """The rows of the figures table, in order: id, label, and the text each column shows.

    One list for the table the reader sees and the machine-readable block the verifier
    reads (``yoco-verify`` checks that the visible text shows exactly these strings).
    """
    rows: list[tuple[str, str, str, str]] = [
        ("covered", "Covered failures", str(m["covered"]), str(y["covered"])),
        ("resolved", "Resolved (live-migrated, no lost progress)", str(m["resolved"]),
         str(y["resolved"])),
        ("rolled_back", "Rolled back to a checkpoint", str(m["rolled_back"]),
         str(y["rolled_back"])),
        ("failed", "Failed (job did not recover)", str(m["failed"]), str(y["failed"])),
        ("pending", "Pending (no outcome recorded yet)", str(m["pending"]), str(y["pending"])),
        ("rate", "Resolution rate", m["rate"], y["rate"]),
        ("verdict", f"Guarantee (≥ {format(terms.threshold_percent, 'f')} %)",
         m["verdict"].word, y["verdict"].word),
        ("excluded", "Excluded failures", str(m["excluded"]), str(y["excluded"])),
        ("not_covered", "Not covered (class outside the guarantee)", str(m["not_covered"]),
         str(y["not_covered"])),
        ("total", "All failures", str(m["total"]), str(y["total"])),
        ("allocated", "Allocated GPU-hours", m["allocated"], y["allocated"]),
        ("lost", "Lost GPU-hours (all failures)", m["lost"], y["lost"]),
    ]  # fmt: skip
    if has_price:
        rows.append(("lost_cost", "Cost of lost GPU-hours", m["lost_cost"], y["lost_cost"]))
    rows.append(("goodput", "Goodput", m["goodput"], y["goodput"]))
    rows.append(("credit", "Credit status", "—", credit_text))
    out = []
    for rid, label, mv, yv in rows:
        row: dict[str, Any] = {"id": rid, "label": label, "month": mv, "year": yv}
        if rid == "verdict":
            row["month_css"], row["year_css"] = m["verdict"].tone, y["verdict"].tone
        out.append(row)
    return out


def figures_json(block: dict[str, Any]) -> str:
    """``block`` as JSON safe inside ``<script type="application/json">`` (no ``<``, ``>``
    or ``&`` characters: they are escaped as ``\\u003c`` …, which JSON parsers undo)."""
    text = json.dumps(block, sort_keys=True, ensure_ascii=False, indent=1)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _forecast_text(
    session: Session,
    contract: ContractSpec,
    terms: Terms,
    k: int,
    ytd: sla.SlaFigures,
    until: datetime,
    recs: CheckpointRecords,
    tree_size: int,
) -> str | None:
    """The forecast of an open contract year, over the checkpoint's entries only.

    None once the year has ended (its verdict stands).  Earlier years come from the
    same checkpoint, so the sentence never changes for a given report.  Not a figure of
    the figures block: a model's estimate (docs/risk.md), shown next to the verdict.
    """
    from billing.forecast import YearHistory, build_forecast

    _, y_end = contract_year_bounds(contract.start_date, contract.timezone, k)
    if until >= y_end:
        return None
    previous = None
    if k > 1:
        first, _ = contract_year_bounds(contract.start_date, contract.timezone, 1)
        y_start = ytd.period_start
        earlier = load_at_checkpoint(session, contract.contract_id, first, y_start, tree_size)
        previous = YearHistory.from_figures(
            [
                _figures(terms, *contract_year_bounds(contract.start_date, contract.timezone, j),
                         ytd.now, earlier)
                for j in range(1, k)
            ]
        )
    fc = build_forecast(contract=contract, terms=terms, year=k, figures=ytd, until=until,
                        previous=previous, jobs=recs.records.jobs)
    return (
        f"{format_probability(fc.p_miss)} chance that contract year {k} ends below "
        f"{format(terms.threshold_percent, 'f')} % (expected credit "
        f"{_money(fc.expected_credit, contract.currency)}), forecast from the year up to "
        f"{_utc(until)} — an estimate from the year so far and published failure rates, "
        "not the verdict"
    )


@dataclass(frozen=True, slots=True)
class Draft:
    """Marks a rendering as a draft, never to be confused with the issued report: the page
    says so at the top and in every PDF page's header.  ``issued_checkpoint`` and
    ``issued_seq`` name the month's issued report when there is one."""

    issued_checkpoint: int | None = None
    issued_seq: int | None = None


def prepare_monthly_report(
    session: Session,
    contract_id: str,
    year: int,
    month: int,
    checkpoint_size: int | None = None,
    *,
    draft: Draft | None = None,
) -> PreparedReport:
    """Compute the month's figures over one signed checkpoint and render the HTML.

    With ``draft``, the page is marked as a draft over that checkpoint (and names the
    issued report, if any); without it, the rendering is the one that is issued.
    Reads only; never writes.  Raises :class:`~ledger.errors.UnknownContract`,
    :class:`BadMonth`, :class:`MonthOutOfTerm`, :class:`NoCheckpoint`,
    :class:`UnknownCheckpoint` or :class:`CheckpointTooOld` (all ValueErrors).
    """
    _check_month(year, month)
    contract, terms, term_years = _in_force(session, contract_id, 1)
    tz = contract.timezone
    m_start, m_end = month_bounds(year, month, tz)
    first, _ = contract_year_bounds(contract.start_date, tz, 1)
    _, last = contract_year_bounds(contract.start_date, tz, term_years)
    if m_end <= first or m_start >= last:
        raise MonthOutOfTerm(
            f"month {year:04d}-{month:02d} is outside the term of contract {contract_id!r} "
            f"({first.date().isoformat()} to {last.date().isoformat()})"
        )
    cp = select_checkpoint(session, contract_id, checkpoint_size)
    as_of: datetime = cp.signed_at
    if as_of <= m_start:
        raise CheckpointTooOld(
            f"checkpoint {cp.tree_size} of {contract_id!r} was signed at {_utc(as_of)}, "
            f"before {year:04d}-{month:02d} began: sign a newer one (`yoco ledger checkpoint`)"
        )
    witness = checkpoint_status(session, cp)
    k = year_of(contract.start_date, tz, m_start) or 1
    k = min(k, term_years)
    # The terms as the checkpoint's entries leave them: amendments recorded after it
    # never change a report over it.
    contract, terms, _ = _in_force(session, contract_id, k, cp.tree_size)
    y_start, y_end = contract_year_bounds(contract.start_date, tz, k)
    ytd_end = min(m_end, y_end)
    recs = load_at_checkpoint(session, contract_id, min(y_start, m_start), m_end, cp.tree_size)

    figs = _figures(terms, m_start, m_end, as_of, recs)
    ytd = _figures(terms, y_start, ytd_end, as_of, recs)
    forecast_text = _forecast_text(
        session, contract, terms, k, ytd, min(ytd_end, as_of), recs, cp.tree_size
    )
    r = recs.records
    rows = sla.failure_rows(
        terms=terms,
        period_start=m_start,
        period_end=m_end,
        failures=r.failures,
        outcomes=r.outcomes,
        exclusions=r.exclusions,
    )

    # Charts: every calendar month of the contract year up to this one.
    y_first_date, y_end_date = contract_year_dates(contract.start_date, k)
    rate_points: list[charts.MonthRate] = []
    lost_by_month: list[dict[str, Decimal]] = []
    labels: list[str] = []
    cum_r = cum_c = 0
    for cy, cm in _months(y_first_date, (year, month)):
        s, e = month_bounds(cy, cm, tz)
        s, e = max(s, y_start), min(e, ytd_end)
        if e <= s:
            continue
        f = _figures(terms, s, e, as_of, recs)
        cum_r += f.resolved_failures
        cum_c += f.covered_failures
        label = f"{MONTH_NAMES[cm - 1][:3]} {cy % 100:02d}"
        labels.append(label)
        rate_points.append(
            charts.MonthRate(label, f.resolved_failures, f.covered_failures, cum_r, cum_c)
        )
        lost_by_month.append(f.lost_by_class())
    buckets: list[dict[str, int]] = [{} for _ in charts.RECOVERY_BUCKETS]
    for row in rows:
        if row.outcome is not None:
            b = buckets[charts.recovery_bucket(row.outcome.recovery_seconds)]
            b[row.outcome.outcome] = b.get(row.outcome.outcome, 0) + 1
    with_outcome = sum(1 for row in rows if row.outcome is not None)

    credit = _credit_status(session, contract_id, k, cp.tree_size)
    root_b64 = base64.b64encode(bytes(cp.root_hash)).decode()
    closed_month = m_end <= as_of
    closed_year = y_end <= as_of and ytd_end == y_end
    price = contract.gpu_hour_price
    cur = contract.currency

    def column(fg: sla.SlaFigures, closed: bool) -> dict[str, Any]:
        return {
            "covered": fg.covered_failures,
            "resolved": fg.resolved_failures,
            "rolled_back": fg.rolled_back_failures,
            "failed": fg.failed_failures,
            "pending": fg.pending_failures,
            "excluded": fg.excluded_failures,
            "not_covered": fg.not_covered_failures,
            "total": fg.total_failures,
            "verdict": verdict(
                fg.resolved_failures, fg.covered_failures, terms.threshold_percent, closed
            ),
            "rate": _rate(fg.resolved_failures, fg.covered_failures, terms.threshold_percent),
            "allocated": _hours(fg.allocated_gpu_seconds),
            "lost": _hours(fg.lost_gpu_seconds),
            "lost_cost": _cost(fg.lost_gpu_seconds, price, cur),
            "goodput": _goodput(fg),
            "start": _utc(fg.period_start),
            "end": _utc(fg.period_end),
        }

    credit_text = "no credit"
    if credit:
        credit_text = credit_words(credit, cur)
    elif closed_year and not ytd.guarantee_met:
        credit_text = "none recorded yet: the credit is issued at the year close"

    m_col, y_col = column(figs, closed_month), column(ytd, closed_year)
    figure_rows = _figure_rows(m_col, y_col, terms, price is not None, credit_text)
    block = {
        "format": FIGURES_FORMAT,
        "contract_id": contract_id,
        "month": f"{year:04d}-{month:02d}",
        "contract_year": k,
        "log": cp.origin,
        "tree_size": cp.tree_size,
        "root_hash": root_b64,
        "as_of": _utc(as_of),
        "month_period": {"start": _utc(m_start), "end": _utc(m_end), "closed": closed_month},
        "year_period": {"start": _utc(y_start), "end": _utc(ytd_end), "closed": closed_year},
        "rows": figure_rows,
        "values": {"month": figs.to_json(), "year": ytd.to_json()},
    }
    if witness.policy is not None:  # absent without a policy: such reports keep their bytes
        block["witnesses"] = {"policy": witness.policy.to_json(), "met": witness.met}
    key_line = cp.key_id
    note_lines = cp.note.split("\n\n", 1)
    context = {
        "created_w3c": as_of.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "customer": contract.customer,
        "contract_id": contract_id,
        "month_name": f"{MONTH_NAMES[month - 1]} {year}",
        "month": f"{year:04d}-{month:02d}",
        "tz": tz,
        "period_start_utc": _utc(m_start),
        "period_end_utc": _utc(m_end),
        "period_first_day": _long_date(date(year, month, 1)),
        "period_last_day": _long_date(_last_day(year, month)),
        "k": k,
        "year_start_utc": _utc(y_start),
        "year_end_utc": _utc(y_end),
        "year_first_day": _long_date(y_first_date),
        "year_last_day": _long_date(date.fromordinal(y_end_date.toordinal() - 1)),
        "ytd_end_utc": _utc(ytd_end),
        "ytd_as_of_utc": _utc(min(ytd_end, as_of)),
        "month_spans_years": m_end > y_end or m_start < y_start,
        "closed_month": closed_month,
        "closed_year": closed_year,
        "as_of_utc": _utc(as_of),
        "contract": {
            "start": _long_date(contract.start_date),
            "term_years": contract.term_years,
            "currency": cur,
            "annual_value": _money(contract.annual_value, cur),
            "credit_base": _money(contract.credit_base, cur),
            "renewal_value_set": contract.renewal_value is not None,
            "gpu_hour_price": _money(price, cur) if price is not None else None,
            "threshold": format(terms.threshold_percent, "f"),
            "credit_percent": format(terms.credit_percent, "f"),
            "covered_classes": classes_text(terms.covered_classes),
            # causes are terms' text: each one isolated, the list's commas outside
            "excluded_causes": Markup(", ").join(
                isolated(cause_label(c)) for c in sorted(set(terms.excluded_causes))
            )
            or "none",
        },
        "m": m_col,
        "y": y_col,
        "figure_rows": figure_rows,
        "figures_json": Markup(figures_json(block)),  # noqa: S704 - escaped for <script>
        "has_price": price is not None,
        "credit_text": credit_text,
        "forecast_text": forecast_text,
        "credit_note": (credit or {}).get("credit_note"),
        # The charts escape every text they draw: their SVG is safe to insert as is.
        "rate_chart": Markup(charts.rate_chart(rate_points, terms.threshold_percent)),  # noqa: S704
        "lost_chart": Markup(charts.lost_hours_chart(labels, lost_by_month)),  # noqa: S704
        "recovery_chart": (
            Markup(charts.recovery_chart(buckets)) if with_outcome else None  # noqa: S704
        ),
        "rows": [_row(i + 1, row, recs) for i, row in enumerate(rows)],
        "adjustments": [
            _row(i + 1, row, recs)
            for i, row in enumerate(rows)
            if row.excluded_by == "exclusion"
            or row.failure.event_id in recs.reclassified
            or recs.outcome_counts.get(row.failure.event_id, 0) > 1
        ],
        "checkpoint": {
            "size": cp.tree_size,
            "root_b64": root_b64,
            "root_hex": bytes(cp.root_hash).hex(),
            "origin": cp.origin,
            "note": cp.note,
            # The signed note exactly as signed (escaped, never isolated: a copy of it must
            # verify).  In the <pre> each line is its own bidi paragraph, so a control in the
            # origin line cannot reach past it.
            "note_exact": Markup(escape(cp.note)),  # noqa: S704 - escaped
            "note_text": note_lines[0],
            "signed_at": _utc(as_of),
            "verifier_key": key_line,
            "last_seq": cp.tree_size - 1,
        },
        "example_event": rows[0].failure.event_id if rows else None,
        "draft": draft,
        "witness": witness_context(witness),
    }
    html = render_template(TEMPLATE, context)
    return PreparedReport(
        contract_id=contract_id,
        customer=contract.customer,
        year=year,
        month=month,
        contract_year=k,
        period_start=m_start,
        period_end=m_end,
        as_of=as_of,
        checkpoint_size=cp.tree_size,
        checkpoint_root=root_b64,
        checkpoint_note=cp.note,
        figures=figs,
        year_to_date=ytd,
        rows=rows,
        credit=credit,
        html=html,
        draft=draft is not None,
        witness=witness,
    )


def witness_context(status: WitnessStatus) -> dict[str, Any] | None:
    """What a report's page says of its checkpoint and the contract's witness policy
    (None without a policy: the page then says nothing of witnesses)."""
    if status.policy is None:
        return None
    return {
        "met": status.met,
        "label": status.label,
        "words": status.words(),
        "quorum": status.policy.quorum,
        "listed": [{"name": k.name, "key": k.to_text()} for k in status.policy.keys],
    }


def require_witnessed(report: PreparedReport) -> None:
    """Refuse (:class:`~reports.errors.NotWitnessed`) a report whose checkpoint does not
    meet the contract's witness policy: for a contract with one, a report is issued only
    over a checkpoint its witnesses cosigned (a draft says where it stands)."""
    if report.witness is not None and not report.witness.met:
        raise NotWitnessed(
            f"{report.month_label} of {report.contract_id!r}: {report.witness.words()} "
            "A report of this contract is issued only over a checkpoint that meets it: "
            "wait for the witnesses' cosignatures (the checkpoint scheduler and `yoco "
            "ledger checkpoint` submit it; a witness that is down raises `witness_down`)"
        )


def finish_report(prepared: PreparedReport, pdf: bytes | None = None) -> MonthlyReport:
    """Attach the PDF (rendered here from the HTML unless given) and both SHA-256 digests."""
    if pdf is None:
        pdf = html_to_pdf(prepared.html)
    values = {name: getattr(prepared, name) for name in PreparedReport.__dataclass_fields__}
    return MonthlyReport(
        **values,
        pdf=pdf,
        html_sha256=hashlib.sha256(prepared.html.encode("utf-8")).hexdigest(),
        pdf_sha256=hashlib.sha256(pdf).hexdigest(),
    )


def build_monthly_report(
    session: Session,
    contract_id: str,
    year: int,
    month: int,
    checkpoint_size: int | None = None,
    *,
    draft: Draft | None = None,
) -> MonthlyReport:
    """The monthly report of ``contract_id`` for ``year-month`` over one signed checkpoint
    (default: the latest), as HTML and PDF with their SHA-256 digests.  Rendering only:
    nothing is written.  Same arguments and same checkpoint ⇒ identical HTML and PDF.
    Raises the errors of :func:`prepare_monthly_report`.
    """
    return finish_report(
        prepare_monthly_report(session, contract_id, year, month, checkpoint_size, draft=draft)
    )


def report_event_id(report: MonthlyReport) -> uuid.UUID:
    """The deterministic event id of ``report``'s ledger entry (UUID v5 of the contract,
    month, checkpoint size and both digests): the same report always gets the same id."""
    name = (
        f"report:monthly:{report.contract_id}:{report.month_label}:{report.checkpoint_size}:"
        f"{report.html_sha256}:{report.pdf_sha256}"
    )
    return ids.derived_id(REPORT_NAMESPACE, name)


def report_entry(report: MonthlyReport) -> journal.NewEntry:
    """The ``report`` journal entry of ``report``.

    Its body carries ``kind``, ``event_id``, ``contract_id``, ``occurred_at`` (the
    report's as-of instant: the checkpoint's signing time, so it does not change when
    the same report is issued again), ``report`` (``"monthly-sla"``), ``month``,
    ``checkpoint_tree_size``, ``checkpoint_root_hash`` (base64, as in the note),
    ``html_sha256`` and ``pdf_sha256``.
    """
    event_id = report_event_id(report)
    body = {
        "kind": REPORT_KIND,
        "event_id": str(event_id),
        "contract_id": report.contract_id,
        "occurred_at": _utc(report.as_of),
        "report": MONTHLY,
        "month": report.month_label,
        "checkpoint_tree_size": report.checkpoint_size,
        "checkpoint_root_hash": report.checkpoint_root,
        "html_sha256": report.html_sha256,
        "pdf_sha256": report.pdf_sha256,
    }
    canonical = canonical_bytes(body)
    return journal.NewEntry(
        kind=REPORT_KIND,
        event_id=event_id,
        contract_id=report.contract_id,
        occurred_at=report.as_of,
        canonical=canonical,
        body=journal.entry_body(canonical),
    )


def record_report(session: Session, report: MonthlyReport) -> RecordedReport:
    """Append ``report``'s entry to its contract's log (locked), unless already there.

    Idempotent: issuing the same report again finds the same event id with the same
    bytes and writes nothing (``created`` False).  Never commits.  The entry is not
    projected: no figure reads ``report`` entries.
    """
    entry = report_entry(report)
    sizes = journal.lock_logs(session, [report.contract_id])
    old = journal.find_existing(session, [entry.event_id]).get(entry.event_id)
    if old is not None:
        if old.canonical != entry.canonical:  # pragma: no cover - the id hashes the content
            raise ReportError(
                f"report entry {entry.event_id} is already recorded with different content"
            )
        return RecordedReport(entry.event_id, old.seq, False, entry.body)
    stored = journal.append_entries(session, [entry], sizes)
    return RecordedReport(entry.event_id, stored[0].seq, True, entry.body)


def require_over(report: PreparedReport) -> None:
    """Refuse (:class:`~reports.errors.MonthNotOver`) a report whose month was not over
    when its checkpoint was signed: an issued report speaks for a whole month."""
    if report.period_end > report.as_of:
        raise MonthNotOver(
            f"{report.month_label} of {report.contract_id!r} ends at "
            f"{_utc(report.period_end)}, after checkpoint {report.checkpoint_size} was "
            f"signed ({_utc(report.as_of)}): a report is issued over a checkpoint signed "
            "after its month ended — sign one (`yoco ledger checkpoint`) once the month is "
            "over; `yoco reports monthly` renders a draft meanwhile"
        )


def store_issued(session: Session, report: MonthlyReport) -> IssuedReport:
    """Issue ``report`` as rendered: record its entry and store its bytes, unless its
    month was issued already (then the issued one, ``created`` False).  The contract's
    log stays locked until the caller commits, so two issuers of the same month are
    serialised: the second finds the first's.  Refuses a draft and a month that is not
    over at the report's checkpoint (:class:`~reports.errors.MonthNotOver`).  Never
    commits."""
    if report.draft:
        raise ReportError("a draft is never issued: render the report without `draft`")
    require_over(report)
    require_witnessed(report)
    journal.lock_logs(session, [report.contract_id])
    found = issued_document(session, report.contract_id, report.month_label)
    if found is not None:
        return found
    recorded = record_report(session, report)
    return insert_issued(
        session,
        contract_id=report.contract_id,
        period=report.month_label,
        event_id=recorded.event_id,
        seq=recorded.seq,
        checkpoint_size=report.checkpoint_size,
        checkpoint_root=report.checkpoint_root,
        html=report.html_bytes,
        pdf=report.pdf,
        html_sha256=report.html_sha256,
        pdf_sha256=report.pdf_sha256,
    )


def issue_monthly_report(
    session: Session,
    contract_id: str,
    year: int,
    month: int,
    checkpoint_size: int | None = None,
) -> tuple[MonthlyReport, RecordedReport]:
    """Issue the month (:mod:`reports.issued`): render it over the checkpoint (default: the
    latest), store its bytes and record its entry; returns the rendering and its entry.

    A month is issued once: when it was issued before, it is rendered again over the
    issued checkpoint and returned with the existing entry (``created`` False) if the
    bytes are the stored ones; another checkpoint, or other bytes (another software
    version), raise :class:`~reports.errors.AlreadyIssued` — the stored bytes are
    :func:`reports.issued.issued_document`'s.  Never commits.
    """
    label = f"{year:04d}-{month:02d}"
    _check_month(year, month)
    found = issued_document(session, contract_id, label, with_bytes=False)
    if found is not None and checkpoint_size not in (None, found.checkpoint_size):
        raise AlreadyIssued(
            f"{label} of {contract_id!r} was issued over checkpoint {found.checkpoint_size} "
            f"(ledger entry {found.seq}); it is not issued again over {checkpoint_size}"
        )
    size = found.checkpoint_size if found is not None else checkpoint_size
    report = build_monthly_report(session, contract_id, year, month, size)
    stored = store_issued(session, report)
    if (stored.html_sha256, stored.pdf_sha256) != (report.html_sha256, report.pdf_sha256):
        raise AlreadyIssued(
            f"{label} of {contract_id!r} was issued as other bytes (ledger entry "
            f"{stored.seq}); the issued ones are stored and served as issued"
        )
    return report, RecordedReport(
        stored.event_id, stored.seq, stored.created, report_entry(report).body
    )


def find_issued(
    session: Session, sha256_hex: str, contract_id: str | None = None
) -> list[dict[str, Any]]:
    """Bodies of the ``report`` entries whose HTML or PDF digest is ``sha256_hex``.

    An empty list means no report with exactly these bytes was ever issued (e.g. a copy
    with one figure changed).  Raises :class:`ReportError` for a malformed digest.
    """
    digest = sha256_hex.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ReportError(f"a SHA-256 digest is 64 hex digits, got {sha256_hex!r}")
    q = select(JournalEntry.body).where(
        JournalEntry.kind == REPORT_KIND,
        or_(
            JournalEntry.body["html_sha256"].astext == digest,
            JournalEntry.body["pdf_sha256"].astext == digest,
        ),
    )
    if contract_id is not None:
        q = q.where(JournalEntry.contract_id == contract_id)
    return [dict(b) for b in session.execute(q.order_by(JournalEntry.seq)).scalars()]


def issued_reports(
    session: Session, contract_id: str, months: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Bodies of ``contract_id``'s ``report`` entries (optionally only for ``months``),
    in ledger order."""
    q = select(JournalEntry.body).where(
        JournalEntry.contract_id == contract_id, JournalEntry.kind == REPORT_KIND
    )
    if months:
        q = q.where(JournalEntry.body["month"].astext.in_(list(months)))
    return [dict(b) for b in session.execute(q.order_by(JournalEntry.seq)).scalars()]
