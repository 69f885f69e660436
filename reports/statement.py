"""Year-end statements: a closed contract year and its credit note, as an issued document.

After billing's year close (:func:`billing.closing.close_year`), the year's statement is
rendered (HTML and PDF) over a signed checkpoint that covers the close, from the close's
own ledger entry (the figures and terms it recorded, the latest adjustment when there
is one) and the credit as the checkpoint's entries leave it.  It follows the monthly
reports' path: issued once per contract and year, its bytes kept in
``issued_documents`` (document ``year-statement``, period ``year-K``) and their digests
in a ``report`` entry of the contract's log::

    {"checkpoint_root_hash": "<base64>", "checkpoint_tree_size": 61, "contract_id": "C-1",
     "event_id": "<uuid5>", "html_sha256": "<hex>", "kind": "report",
     "occurred_at": "<the checkpoint's signed_at>", "pdf_sha256": "<hex>",
     "report": "year-statement", "year": 1}

None of these functions commits.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from markupsafe import Markup, escape
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing import services as billing_services
from billing.amendments import contract_in_force
from billing.display import money_text, rate_text, verdict
from billing.models import BillingYear
from billing.witness_policy import WitnessStatus, checkpoint_status, latest_witnessed
from billing.years import contract_year_bounds, contract_year_dates
from ledger import ids, journal
from ledger.canonical import canonical_bytes
from ledger.models import JournalEntry
from reports.documents import IssuedReport, insert_issued, issued_document
from reports.errors import NotWitnessed, ReportError
from reports.models import STATEMENT
from reports.monthly import (
    MONTH_NAMES,
    REPORT_KIND,
    REPORT_NAMESPACE,
    safe_name,
    select_checkpoint,
    witness_context,
)
from reports.render import html_to_pdf, render_template

__all__ = [
    "YearNotClosed",
    "YearStatement",
    "build_year_statement",
    "issue_year_statement",
    "statement_period",
    "statement_stem",
]

TEMPLATE = "statement.html.j2"


class YearNotClosed(ReportError):
    """The contract year is not closed at the checkpoint: no statement yet."""


def statement_stem(contract_id: str, k: int) -> str:
    """The file name (without extension) of contract year ``k``'s statement."""
    return f"yoco-statement-{safe_name(contract_id)}-year-{k}"


def statement_period(k: int) -> str:
    """The period of contract year ``k``'s statement in ``issued_documents``: ``year-K``."""
    return f"year-{k}"


@dataclass(frozen=True, slots=True, kw_only=True)
class YearStatement:
    """A rendered statement, with what it was computed over and its SHA-256 digests."""

    contract_id: str
    year: int
    as_of: datetime
    checkpoint_size: int
    checkpoint_root: str
    html: str
    pdf: bytes
    html_sha256: str
    pdf_sha256: str
    #: The checkpoint against the contract's witness policy (stated on the page).
    witness: WitnessStatus | None = None

    @property
    def html_bytes(self) -> bytes:
        """The HTML as stored (UTF-8): the bytes ``html_sha256`` is the digest of."""
        return self.html.encode("utf-8")


def _long(d: date) -> str:
    return f"{d.day} {MONTH_NAMES[d.month - 1]} {d.year}"


def build_year_statement(
    session: Session, contract_id: str, k: int, checkpoint_size: int | None = None
) -> YearStatement:
    """Render contract year ``k``'s statement over a signed checkpoint (default: the
    latest) that covers the year's latest close.  Reads only.  Raises
    :class:`YearNotClosed`, and the checkpoint errors of
    :func:`reports.monthly.select_checkpoint`."""
    cp = select_checkpoint(session, contract_id, checkpoint_size)
    witness = checkpoint_status(session, cp)
    state = session.get(BillingYear, (contract_id, k))
    if state is None or state.closed_seq >= cp.tree_size:
        raise YearNotClosed(
            f"contract year {k} of {contract_id!r} is not closed at checkpoint "
            f"{cp.tree_size}: a statement is issued after billing's year close"
        )
    close = session.execute(
        select(JournalEntry.seq, JournalEntry.kind, JournalEntry.event_id, JournalEntry.body)
        .where(
            JournalEntry.log_id == contract_id,
            JournalEntry.kind.in_(("year_close", "adjustment")),
            JournalEntry.seq < cp.tree_size,
            JournalEntry.body["year"].astext == str(k),
        )
        .order_by(JournalEntry.seq.desc())
        .limit(1)
    ).one()
    body: dict[str, Any] = dict(close.body)
    figures = body["figures"]
    terms = body["terms"]
    values = body["contract"]
    threshold = Decimal(terms["threshold_percent"])
    contract = contract_in_force(session, contract_id, k, tree_size=cp.tree_size).contract
    start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
    first, after = contract_year_dates(contract.start_date, k)
    resolved, covered = figures["resolved_failures"], figures["covered_failures"]
    v = verdict(resolved, covered, threshold, True)
    credit = billing_services.credit_status(session, contract_id, k, tree_size=cp.tree_size)
    cur = values["currency"]
    as_of = cp.signed_at
    root_b64 = base64.b64encode(bytes(cp.root_hash)).decode()
    applied = remaining = None
    if credit and Decimal(credit.get("applied_amount") or 0):
        applied = money_text(Decimal(credit["applied_amount"]), cur)
        remaining = money_text(Decimal(credit["remaining_amount"]), cur)
    context = {
        "created_w3c": as_of.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "customer": contract.customer,
        "contract_id": contract_id,
        "k": k,
        "tz": contract.timezone,
        "first_day": _long(first),
        "last_day": _long(date.fromordinal(after.toordinal() - 1)),
        "period_start": start.astimezone(UTC).isoformat(),
        "period_end": end.astimezone(UTC).isoformat(),
        "close_kind": "closed" if close.kind == "year_close" else "adjusted",
        "closed_at": str(body.get("occurred_at", "")),
        "close_seq": close.seq,
        "close_event_id": str(close.event_id),
        "threshold": terms["threshold_percent"],
        "credit_percent": terms["credit_percent"],
        "credit_base": money_text(Decimal(values["credit_base"]), cur),
        "verdict": v,
        "rate": rate_text(resolved, covered, threshold),
        "figures": {
            "covered_failures": covered,
            "resolved_failures": resolved,
            "excluded_failures": figures.get("excluded_failures", 0),
            "total_failures": covered + figures.get("excluded_failures", 0)
            + figures.get("not_covered_failures", 0),
        },
        "credit": credit,
        "credit_amount": money_text(Decimal(credit["amount"]), cur) if credit else None,
        "credit_applied": applied,
        "credit_remaining": remaining,
        "no_credit_reason": "the guarantee was met" if v.standing.value != "missed"
        else "none recorded at this checkpoint",
        "checkpoint": {
            "size": cp.tree_size,
            "origin": cp.origin,
            "root_b64": root_b64,
            "signed_at": as_of.astimezone(UTC).isoformat(),
            "note": cp.note,
            # The signed note exactly as signed (escaped, never isolated: a copy of it must
            # verify).  In the <pre> each line is its own bidi paragraph, so a control in the
            # origin line cannot reach past it.
            "note_exact": Markup(escape(cp.note)),  # noqa: S704 - escaped
        },
        "witness": witness_context(witness),
    }
    html = render_template(TEMPLATE, context)
    pdf = html_to_pdf(html)
    return YearStatement(
        contract_id=contract_id,
        year=k,
        as_of=as_of,
        checkpoint_size=cp.tree_size,
        checkpoint_root=root_b64,
        html=html,
        pdf=pdf,
        html_sha256=hashlib.sha256(html.encode("utf-8")).hexdigest(),
        pdf_sha256=hashlib.sha256(pdf).hexdigest(),
        witness=witness,
    )


def statement_entry(st: YearStatement) -> journal.NewEntry:
    """The ``report`` journal entry of a statement (the shape in the module docstring)."""
    name = (
        f"report:{STATEMENT}:{st.contract_id}:{st.year}:{st.checkpoint_size}:"
        f"{st.html_sha256}:{st.pdf_sha256}"
    )
    event_id: uuid.UUID = ids.derived_id(REPORT_NAMESPACE, name)
    body = {
        "kind": REPORT_KIND,
        "event_id": str(event_id),
        "contract_id": st.contract_id,
        "occurred_at": st.as_of.astimezone(UTC).isoformat(),
        "report": STATEMENT,
        "year": st.year,
        "checkpoint_tree_size": st.checkpoint_size,
        "checkpoint_root_hash": st.checkpoint_root,
        "html_sha256": st.html_sha256,
        "pdf_sha256": st.pdf_sha256,
    }
    canonical = canonical_bytes(body)
    return journal.NewEntry(
        kind=REPORT_KIND,
        event_id=event_id,
        contract_id=st.contract_id,
        occurred_at=st.as_of,
        canonical=canonical,
        body=journal.entry_body(canonical),
    )


def issue_year_statement(
    session: Session, contract_id: str, k: int, checkpoint_size: int | None = None
) -> IssuedReport:
    """Issue contract year ``k``'s statement once (stored bytes and a ``report`` entry,
    under the contract's log lock), or return the issued one (``created`` False).

    Over the checkpoint of ``checkpoint_size`` (default: the latest; for a contract with a
    witness policy, the latest that meets it and covers the close). Raises
    :class:`~reports.errors.NotWitnessed` when that checkpoint does not meet the
    contract's witness policy, and the errors of :func:`build_year_statement`."""
    period = statement_period(k)
    found = issued_document(session, contract_id, period, STATEMENT)
    if found is not None:
        return found
    if checkpoint_size is None:
        state = session.get(BillingYear, (contract_id, k))
        cp, _ = latest_witnessed(session, contract_id)
        if cp is not None and state is not None and cp.tree_size > state.closed_seq:
            checkpoint_size = cp.tree_size
    st = build_year_statement(session, contract_id, k, checkpoint_size)
    if st.witness is not None and not st.witness.met:
        raise NotWitnessed(
            f"the statement of contract year {k} of {contract_id!r}: {st.witness.words()} "
            "A statement of this contract is issued only over a checkpoint that meets it."
        )
    sizes = journal.lock_logs(session, [contract_id])
    found = issued_document(session, contract_id, period, STATEMENT)
    if found is not None:
        return found
    entry = statement_entry(st)
    old = journal.find_existing(session, [entry.event_id]).get(entry.event_id)
    seq = old.seq if old is not None else journal.append_entries(session, [entry], sizes)[0].seq
    return insert_issued(
        session,
        contract_id=contract_id,
        period=period,
        document=STATEMENT,
        event_id=entry.event_id,
        seq=seq,
        checkpoint_size=st.checkpoint_size,
        checkpoint_root=st.checkpoint_root,
        html=st.html_bytes,
        pdf=st.pdf,
        html_sha256=st.html_sha256,
        pdf_sha256=st.pdf_sha256,
    )
