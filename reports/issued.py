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
* :func:`issue_rendered` — issue a report already rendered (the same rule);
* :func:`issued_document` / :func:`list_issued` — read what was issued
  (:mod:`reports.documents`, re-exported);
* :func:`due_months` / :func:`issue_due` — what the scheduler issues after a month ends;
* :func:`render_draft` — a draft of a month over a checkpoint (default: the latest);
* :func:`document_files` — an issued document's PDF and HTML as stored, named as the
  portal names them (what an e-mail of it attaches, ``alerts.send``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.amendments import contract_in_force
from billing.models import BillingYear
from billing.witness_policy import latest_witnessed
from billing.years import contract_year_bounds, month_bounds, require_aware
from ledger import journal
from ledger.checkpoints import latest, sign_log
from ledger.contracts import get_contract
from ledger.note import Signer
from reports import monthly as rm
from reports.documents import IssuedReport, issued_document, list_issued
from reports.errors import ReportError
from reports.models import MONTHLY, STATEMENT
from reports.statement import issue_year_statement, statement_period, statement_stem

#: Issue a rendered report (:func:`reports.monthly.store_issued`).
issue_rendered = rm.store_issued

__all__ = [
    "ISSUE_GRACE",
    "MONTHLY",
    "DueIssueRun",
    "DueResult",
    "IssuedReport",
    "document_files",
    "due_months",
    "due_statements",
    "issue_due",
    "issue_month",
    "issue_rendered",
    "issued_document",
    "list_issued",
    "render_draft",
]

#: How long after a month ends the scheduler waits before issuing its reports, so that
#: records of the month's last minutes (outcomes arrive after their failures) are in.
ISSUE_GRACE = timedelta(hours=1)
#: At most this many months of one contract are issued by one scheduler run (a backlog
#: after a long outage is worked off over several runs).
MAX_MONTHS_PER_RUN = 12


def _label(year: int, month: int) -> str:
    return f"{year:04d}-{month:02d}"


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
    over the signed checkpoint of ``checkpoint_size`` (default: the latest — for a
    contract with a witness policy, the latest signed after the month ended that meets
    it), which must have been signed after the month ended (:class:`MonthNotOver`) and
    meet the contract's witness policy (:class:`NotWitnessed`), its bytes stored and its
    ``report`` entry appended, in the caller's transaction (never committed here).
    Raises the errors of :func:`reports.monthly.prepare_monthly_report`.
    """
    label = _label(year, month)
    rm.parse_month(label)  # BadMonth for a month that is not one
    spec = get_contract(session, contract_id)  # UnknownContract
    found = issued_document(session, contract_id, label)
    if found is not None:
        return found
    if checkpoint_size is None:
        # The newest checkpoint that can be issued over: with a witness policy, new
        # checkpoints are signed faster than witnesses cosign them, so "the latest" would
        # rarely be cosigned yet. Without any, the latest (whose refusal says why).
        _, m_end = month_bounds(year, month, spec.timezone)
        cp, _ = latest_witnessed(session, contract_id, signed_after=m_end)
        checkpoint_size = cp.tree_size if cp is not None else None
    prepared = rm.prepare_monthly_report(session, contract_id, year, month, checkpoint_size)
    rm.require_over(prepared)
    rm.require_witnessed(prepared)
    pdf = (pdf_renderer or _default_pdf)(prepared.html)
    return rm.store_issued(session, rm.finish_report(prepared, pdf))


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
    """One due document handled by :func:`issue_due` (``month``: ``YYYY-MM``, or
    ``year-K`` for a year-end statement): issued (or found issued), or why not."""

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
    """Issue every due month (:func:`due_months`) and year-end statement
    (:func:`due_statements`) of every contract, one transaction each.

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
            years = due_statements(s, cid)
        if not months and not years:
            continue
        if signer is not None:
            with unit_of_work() as s:
                _sign_if_grown(s, signer, cid, origin_prefix)
        jobs: list[tuple[str, Callable[[Session], IssuedReport]]] = [
            (_label(y, m), partial(issue_month, contract_id=cid, year=y, month=m))
            for y, m in months
        ]
        jobs += [
            (statement_period(k), partial(issue_year_statement, contract_id=cid, k=k))
            for k in years
        ]
        created = False
        for period, job in jobs:
            try:
                with unit_of_work() as s:
                    issued = job(s)
            except ReportError as exc:
                run.results.append(DueResult(contract_id=cid, month=period, problem=str(exc)))
                continue
            created = created or issued.created
            run.results.append(DueResult(contract_id=cid, month=period, issued=issued))
        if signer is not None and created:
            with unit_of_work() as s:
                sign_log(s, signer, cid, origin_prefix)
    return run


def due_statements(session: Session, contract_id: str) -> list[int]:
    """The contract years of ``contract_id`` closed by billing whose year-end statement
    has not been issued yet, oldest first."""
    closed = session.execute(
        select(BillingYear.year).where(BillingYear.contract_id == contract_id)
        .order_by(BillingYear.year)
    ).scalars()
    done = {d.period for d in list_issued(session, contract_id, STATEMENT)}
    return [k for k in closed if statement_period(k) not in done]


def _sign_if_grown(session: Session, signer: Signer, contract_id: str, prefix: str) -> None:
    size = journal.log_size(session, contract_id)
    cp = latest(session, contract_id)
    if size > 0 and (cp is None or cp.tree_size < size):
        sign_log(session, signer, contract_id, prefix)



def document_files(
    session: Session, contract_id: str, period: str, document: str
) -> list[tuple[str, str, bytes]]:
    """The issued ``document`` of ``contract_id`` for ``period`` as files to attach:
    ``(file name, MIME type, bytes)`` of its PDF and HTML, the exact stored bytes (their
    SHA-256 digests are the ``report`` entry's).  :class:`ReportError` when nothing was
    issued for it (an e-mail never goes out without the document it announces)."""
    found = issued_document(session, contract_id, period, document)
    if found is None:
        raise ReportError(f"no {document} of {contract_id!r} for {period} was issued")
    if document == STATEMENT:
        stem = statement_stem(contract_id, int(period.removeprefix("year-")))
    else:
        year, month = (int(x) for x in period.split("-"))
        stem = rm.file_stem(contract_id, year, month)
    return [(f"{stem}.pdf", "application/pdf", found.pdf),
            (f"{stem}.html", "text/html", found.html_bytes)]
