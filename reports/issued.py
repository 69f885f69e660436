"""Issued monthly reports: rendered once per contract and month, kept as issued.

A month's report is *issued* once, over a named signed checkpoint that was signed after
the month ended: its exact HTML and PDF bytes are stored in ``issued_documents``
(:mod:`reports.models`, append-only) and their SHA-256 digests are appended to the
contract's log as a ``report`` entry (:func:`reports.monthly.report_entry`), in the
same transaction.  Issuing again returns the issued document and writes nothing.
Everything rendered later (a month not issued yet, or the same month over a newer
checkpoint) is a *draft* (:class:`reports.monthly.Draft`), marked as such on the page
and recorded nowhere.

Public API (none of them commits):

* :func:`issue_month` — issue one month of one contract, or return the issued one;
* :func:`issued_document` / :func:`list_issued` — read what was issued;
* :func:`due_months` / :func:`issue_due` — what the scheduler issues after a month ends;
* :func:`render_draft` — a draft of a month over a checkpoint (default: the latest).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from billing.amendments import contract_in_force
from billing.years import contract_year_bounds, month_bounds, require_aware
from ledger import journal
from ledger.checkpoints import latest, sign_log
from ledger.contracts import get_contract
from ledger.note import Signer
from reports import monthly as rm
from reports.errors import MonthNotOver, ReportError
from reports.models import IssuedDocument

__all__ = [
    "ISSUE_GRACE",
    "MONTHLY",
    "DueIssueRun",
    "DueResult",
    "IssuedReport",
    "due_months",
    "issue_due",
    "issue_month",
    "issue_rendered",
    "issued_document",
    "list_issued",
    "render_draft",
]

log = logging.getLogger("yoco.reports")

#: The document kind of monthly SLA reports (the ``report`` field of their entries).
MONTHLY = "monthly-sla"
#: How long after a month ends the scheduler waits before issuing its reports, so that
#: records of the month's last minutes (outcomes arrive after their failures) are in.
ISSUE_GRACE = timedelta(hours=1)
#: At most this many months of one contract are issued by one scheduler run (a backlog
#: after a long outage is worked off over several runs).
MAX_MONTHS_PER_RUN = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedReport:
    """An issued report as stored: its bytes (absent when listed without them), digests,
    the checkpoint it was computed over and its ``report`` ledger entry (``seq`` is the
    entry's index in the contract's log).  ``created``: issued by this call."""

    contract_id: str
    document: str
    period: str
    event_id: uuid.UUID
    seq: int
    checkpoint_size: int
    checkpoint_root: str
    html_sha256: str
    pdf_sha256: str
    issued_at: datetime
    html_bytes: bytes = b""
    pdf: bytes = b""
    created: bool = False

    @property
    def month_label(self) -> str:
        """The month, ``YYYY-MM`` (the period of a monthly report)."""
        return self.period

    @property
    def html(self) -> str:
        """The HTML as text (the stored bytes are its UTF-8)."""
        return self.html_bytes.decode("utf-8")

    def entry(self) -> dict[str, Any]:
        """The fields of its ``report`` ledger entry that name it (for lists and APIs)."""
        return {
            "contract_id": self.contract_id,
            "report": self.document,
            "month": self.period,
            "checkpoint_tree_size": self.checkpoint_size,
            "checkpoint_root_hash": self.checkpoint_root,
            "event_id": str(self.event_id),
            "seq": self.seq,
            "html_sha256": self.html_sha256,
            "pdf_sha256": self.pdf_sha256,
            "issued_at": self.issued_at.astimezone(UTC).isoformat(),
        }


def _of(row: IssuedDocument, *, with_bytes: bool, created: bool = False) -> IssuedReport:
    return IssuedReport(
        contract_id=row.contract_id,
        document=row.document,
        period=row.period,
        event_id=row.event_id,
        seq=row.seq,
        checkpoint_size=row.checkpoint_tree_size,
        checkpoint_root=row.checkpoint_root_hash,
        html_sha256=row.html_sha256,
        pdf_sha256=row.pdf_sha256,
        issued_at=row.issued_at,
        html_bytes=bytes(row.html) if with_bytes else b"",
        pdf=bytes(row.pdf) if with_bytes else b"",
        created=created,
    )


def _label(year: int, month: int) -> str:
    return f"{year:04d}-{month:02d}"


def issued_document(
    session: Session,
    contract_id: str,
    period: str,
    document: str = MONTHLY,
    *,
    with_bytes: bool = True,
) -> IssuedReport | None:
    """The issued document of ``contract_id`` for ``period`` (``YYYY-MM``), with its
    stored bytes unless ``with_bytes`` is False; None when it was not issued.  Under the
    portal role, row-level security hides other tenants' documents (None)."""
    q = select(IssuedDocument).where(
        IssuedDocument.contract_id == contract_id,
        IssuedDocument.document == document,
        IssuedDocument.period == period,
    )
    if not with_bytes:
        q = q.options(defer(IssuedDocument.html), defer(IssuedDocument.pdf))
    row = session.execute(q).scalar_one_or_none()
    return None if row is None else _of(row, with_bytes=with_bytes)


def list_issued(
    session: Session, contract_id: str, document: str = MONTHLY
) -> list[IssuedReport]:
    """Every issued document of ``contract_id`` (without bytes), by period."""
    rows = session.execute(
        select(IssuedDocument)
        .where(IssuedDocument.contract_id == contract_id, IssuedDocument.document == document)
        .options(defer(IssuedDocument.html), defer(IssuedDocument.pdf))
        .order_by(IssuedDocument.period)
    ).scalars()
    return [_of(r, with_bytes=False) for r in rows]


def issue_rendered(session: Session, report: rm.MonthlyReport) -> IssuedReport:
    """Issue ``report`` as rendered: record its entry and store its bytes, unless its
    month was issued already (then the issued one, ``created`` False).  The contract's
    log stays locked until the caller commits, so two issuers of the same month are
    serialised: the second finds the first's.  Refuses a draft and a month that is not
    over at the report's checkpoint (:class:`MonthNotOver`).  Never commits."""
    if report.draft:
        raise ReportError("a draft is never issued: render the report without `draft`")
    _require_over(report)
    journal.lock_logs(session, [report.contract_id])
    found = issued_document(session, report.contract_id, report.month_label)
    if found is not None:
        return found
    recorded = rm.record_report(session, report)
    row = IssuedDocument(
        contract_id=report.contract_id,
        document=MONTHLY,
        period=report.month_label,
        event_id=recorded.event_id,
        seq=recorded.seq,
        checkpoint_tree_size=report.checkpoint_size,
        checkpoint_root_hash=report.checkpoint_root,
        html=report.html_bytes,
        pdf=report.pdf,
        html_sha256=report.html_sha256,
        pdf_sha256=report.pdf_sha256,
    )
    session.add(row)
    session.flush()
    return _of(row, with_bytes=True, created=True)


def _require_over(report: rm.PreparedReport) -> None:
    if report.period_end > report.as_of:
        raise MonthNotOver(
            f"{report.month_label} of {report.contract_id!r} ends at "
            f"{report.period_end.astimezone(UTC).isoformat()}, after checkpoint "
            f"{report.checkpoint_size} was signed ({report.as_of.astimezone(UTC).isoformat()}): "
            "a report is issued over a checkpoint signed after its month ended — sign one "
            "(`yoco ledger checkpoint`) once the month is over; `yoco reports monthly` "
            "renders a draft meanwhile"
        )


def issue_month(
    session: Session,
    contract_id: str,
    year: int,
    month: int,
    checkpoint_size: int | None = None,
    *,
    pdf_renderer: Callable[[str], bytes] | None = None,
) -> IssuedReport:
    """Issue the report of ``contract_id`` for ``year-month``, or return the issued one.

    A month already issued is returned as stored (``created`` False), whatever
    ``checkpoint_size`` says: a month is issued once.  Otherwise the report is rendered
    over the signed checkpoint of ``checkpoint_size`` (default: the latest), which must
    have been signed after the month ended (:class:`MonthNotOver`), its bytes stored and
    its ``report`` entry appended, in the caller's transaction (never committed here).
    Raises the errors of :func:`reports.monthly.prepare_monthly_report`.
    """
    label = _label(year, month)
    rm.parse_month(label)  # BadMonth for a month that is not one
    get_contract(session, contract_id)  # UnknownContract
    found = issued_document(session, contract_id, label)
    if found is not None:
        return found
    prepared = rm.prepare_monthly_report(session, contract_id, year, month, checkpoint_size)
    _require_over(prepared)
    pdf = (pdf_renderer or _default_pdf)(prepared.html)
    return issue_rendered(session, rm.finish_report(prepared, pdf))


def _default_pdf(html: str) -> bytes:
    from reports.render import html_to_pdf

    return html_to_pdf(html)


def render_draft(
    session: Session,
    contract_id: str,
    year: int,
    month: int,
    checkpoint_size: int | None = None,
    *,
    with_pdf: bool = True,
) -> rm.PreparedReport:
    """A draft of ``contract_id``'s ``year-month`` over a checkpoint (default: the
    latest), marked as a draft on the page and naming the issued report if there is
    one.  Reads only; nothing is recorded.  A :class:`~reports.monthly.MonthlyReport`
    (with its PDF) unless ``with_pdf`` is False."""
    issued = issued_document(session, contract_id, _label(year, month), with_bytes=False)
    mark = rm.Draft(
        issued_checkpoint=issued.checkpoint_size if issued else None,
        issued_seq=issued.seq if issued else None,
    )
    prepared = rm.prepare_monthly_report(
        session, contract_id, year, month, checkpoint_size, draft=mark
    )
    return rm.finish_report(prepared) if with_pdf else prepared


# --------------------------------------------------------------------------- schedule


def _previous(year: int, month: int) -> tuple[int, int]:
    return (year - 1, 12) if month == 1 else (year, month - 1)


def _next(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def due_months(
    session: Session, contract_id: str, now: datetime, grace: timedelta = ISSUE_GRACE
) -> list[tuple[int, int]]:
    """The months of ``contract_id`` the scheduler should issue at ``now``, oldest first.

    A month is due once it ended (in the contract's time zone) at least ``grace`` before
    ``now``, overlaps the contract's term and has no issued report.  The months after the
    latest issued one are due (a backlog after an outage is caught up, at most
    :data:`MAX_MONTHS_PER_RUN` a run); for a contract with no issued report yet, only the
    latest ended month (history before issuing existed is not issued retroactively).
    """
    require_aware("now", now)
    spec = get_contract(session, contract_id)
    tz = spec.timezone
    local = (now - grace).astimezone(ZoneInfo(tz))
    last = _previous(local.year, local.month)
    term_years = contract_in_force(session, contract_id, 1).term_years  # renewals too
    first_instant, _ = contract_year_bounds(spec.start_date, tz, 1)
    _, end_instant = contract_year_bounds(spec.start_date, tz, term_years)

    def in_term(ym: tuple[int, int]) -> bool:
        start, end = month_bounds(ym[0], ym[1], tz)
        return end > first_instant and start < end_instant

    issued = list_issued(session, contract_id)
    if issued:
        y, m = rm.parse_month(issued[-1].period)
        candidates: list[tuple[int, int]] = []
        ym = _next(y, m)
        while ym <= last and len(candidates) < MAX_MONTHS_PER_RUN:
            candidates.append(ym)
            ym = _next(*ym)
    else:
        candidates = [last]
    done = {r.period for r in issued}
    return [ym for ym in candidates if in_term(ym) and _label(*ym) not in done]


@dataclass(frozen=True, slots=True, kw_only=True)
class DueResult:
    """One due month handled by :func:`issue_due`: issued (or found issued), or why not."""

    contract_id: str
    month: str
    issued: IssuedReport | None = None
    problem: str | None = None


@dataclass(slots=True)
class DueIssueRun:
    """Everything one :func:`issue_due` run did."""

    now: datetime
    results: list[DueResult] = field(default_factory=list)

    @property
    def issued(self) -> list[IssuedReport]:
        """The reports this run issued (not those found issued already)."""
        return [r.issued for r in self.results if r.issued is not None and r.issued.created]


def issue_due(
    unit_of_work: Callable[[], Any],
    *,
    now: datetime,
    signer: Signer | None = None,
    origin_prefix: str = "",
    grace: timedelta = ISSUE_GRACE,
    contract_ids: list[str] | None = None,
) -> DueIssueRun:
    """Issue every due month (:func:`due_months`) of every contract, one transaction each.

    ``unit_of_work()`` gives a session that commits when its block ends.  With a
    ``signer``, the contract's log is signed first when no checkpoint covers it whole
    (so the report rests on everything recorded by then, signed after the month ended),
    and again after issuing, so the ``report`` entry is covered and its inclusion proof
    can be downloaded at once.  A month that cannot be issued (no checkpoint signed after
    it ended, …) is listed with its reason and tried again by the next run.
    """
    require_aware("now", now)
    run = DueIssueRun(now=now)
    with unit_of_work() as s:
        from ledger.contracts import list_contracts

        ids = contract_ids or [c.contract_id for c in list_contracts(s)]
    for cid in ids:
        with unit_of_work() as s:
            months = due_months(s, cid, now, grace)
        if not months:
            continue
        if signer is not None:
            with unit_of_work() as s:
                _sign_if_grown(s, signer, cid, origin_prefix)
        for y, m in months:
            try:
                with unit_of_work() as s:
                    issued = issue_month(s, cid, y, m)
            except ReportError as exc:
                run.results.append(DueResult(contract_id=cid, month=_label(y, m),
                                             problem=str(exc)))
                continue
            run.results.append(DueResult(contract_id=cid, month=_label(y, m), issued=issued))
        if signer is not None and any(r.issued is not None and r.issued.created
                                      for r in run.results if r.contract_id == cid):
            with unit_of_work() as s:
                sign_log(s, signer, cid, origin_prefix)
    return run


def _sign_if_grown(session: Session, signer: Signer, contract_id: str, prefix: str) -> None:
    size = journal.log_size(session, contract_id)
    cp = latest(session, contract_id)
    if size > 0 and (cp is None or cp.tree_size < size):
        sign_log(session, signer, contract_id, prefix)

