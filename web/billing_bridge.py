"""What the portal shows and does of billing: credits, disputes, year closes, exports.

Reads go through billing's query functions (:mod:`billing.services`,
:mod:`billing.disputes`) in the caller's (row-level secured) session and are scoped by
contract; actions call billing's services in a unit of work
of the application role, after the caller's right to the contract was checked.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing import disputes as billing_disputes
from billing import services as billing_services
from billing.labels import cause_label, class_label
from billing.money import format_minor, format_money


def credit_rows(
    session: Session,
    contract_ids: list[str] | None,
    *,
    before: tuple[datetime, str, int] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Credits of ``contract_ids`` (None: all the session may see), newest first.

    The order is ``(issued_at, contract_id, seq)`` descending, a total order (``seq`` is
    unique in a contract's log); ``before`` keeps the credits after that key in it, and
    ``limit`` the first ones (keyset pagination).
    """
    out = []
    for c in billing_services.credits_newest_first(
        session, contract_ids, before=before, limit=limit
    ):
        out.append(
            {
                "credit_id": str(c.credit_id),
                "credit_note": c.credit_note,
                "contract_id": c.contract_id,
                "year": c.year,
                "seq": c.seq,
                "issued_at": c.issued_at,
                "status": c.status,
                "currency": c.currency,
                "amount": format_minor(c.amount_minor, c.currency),
                "applied": format_minor(c.applied_minor, c.currency),
                "remaining": format_minor(c.amount_minor - c.applied_minor, c.currency),
                # for people: separators and the currency (billing.money.format_money)
                "amount_text": format_money(c.amount_minor, c.currency, minor=True),
                "applied_text": format_money(c.applied_minor, c.currency, minor=True),
                "remaining_text": format_money(
                    c.amount_minor - c.applied_minor, c.currency, minor=True
                ),
                "covered_failures": c.covered_failures,
                "resolved_failures": c.resolved_failures,
                "threshold_percent": format(c.threshold_percent, "f"),
                "credit_percent": format(c.credit_percent, "f"),
            }
        )
    return out


def year_closes(session: Session, contract_id: str) -> dict[int, dict[str, Any]]:
    """Closed years of a contract: year → verdict and whether an adjustment is pending."""
    rows = billing_services.closed_years(session, contract_id)
    return {
        r.year: {
            "closed_at": r.closed_at,
            "guarantee_met": r.guarantee_met,
            "adjustments": r.adjustments,
            "needs_adjustment": r.pending_seq is not None,
        }
        for r in rows
    }


def credit_status(session: Session, contract_id: str, year: int) -> dict[str, Any] | None:
    """The credit of a contract year as billing reports it, or None (no credit issued)."""
    return billing_services.credit_status(session, contract_id, year)


def _dispute_dict(d: Any) -> dict[str, Any]:
    return {
        "dispute_id": str(d.dispute_id),
        "contract_id": d.contract_id,
        "failure_event_id": str(d.failure_event_id),
        "seq": d.seq,
        "opened_at": d.opened_at,
        "opened_by": d.opened_by,
        "reason": d.reason,
        "status": d.status,
        "resolution": d.resolution,
        "decided_at": d.decided_at,
        "decided_by": d.decided_by,
        "note": d.note,
    }


def disputes_of_contract(session: Session, contract_id: str) -> list[dict[str, Any]]:
    """Every dispute of one contract (open and decided), newest first."""
    return [_dispute_dict(d) for d in billing_disputes.disputes_of_contract(session, contract_id)]


def disputes_of_failure(session: Session, contract_id: str, fid: uuid.UUID) -> list[dict[str, Any]]:
    """Disputes of one failure, oldest first."""
    rows = billing_disputes.disputes_of_failure(session, contract_id, fid)
    return [_dispute_dict(d) for d in rows]


def dispute_queue(session: Session, status: str | None = "open") -> list[dict[str, Any]]:
    """Disputes (open ones by default) the session may see, oldest first."""
    return [_dispute_dict(d) for d in billing_disputes.dispute_queue(session, status)]


def failure_timeline(session: Session, contract_id: str, fid: uuid.UUID) -> list[dict[str, Any]]:
    """Billing's entries about a failure (reclassifications, disputes) as timeline items."""
    items: list[dict[str, Any]] = []
    for r in billing_disputes.reclassifications_of_failure(session, contract_id, fid):
        items.append(
            {
                "kind": "reclassification",
                "event_id": str(r.event_id),
                "seq": r.seq,
                "at": r.occurred_at,
                "title": f"Reclassified: {class_label(r.failure_class)} / {cause_label(r.cause)}",
                "detail": {"Reason": r.reason},
            }
        )
    for d in billing_disputes.disputes_of_failure(session, contract_id, fid):
        items.append(
            {
                "kind": "dispute",
                "event_id": str(d.dispute_id),
                "seq": d.seq,
                "at": d.opened_at,
                "title": f"Dispute opened by {d.opened_by}",
                "detail": {"Reason": d.reason},
            }
        )
        if d.decided_at is not None:
            items.append(
                {
                    "kind": "dispute_decision",
                    "event_id": str(d.decision_event_id or d.dispute_id),
                    "seq": None,
                    "at": d.decided_at,
                    "title": f"Dispute {d.status} by {d.decided_by}",
                    "detail": {"Resolution": d.resolution, "Note": d.note},
                }
            )
    return items


# --------------------------------------------------------------------------- actions


def open_dispute(
    session: Session,
    *,
    contract_id: str,
    failure_event_id: str,
    reason: str,
    opened_by: str,
    now: datetime,
) -> Any:
    """Record a customer's dispute of a failure (``dispute_opened`` in the contract's log)."""
    from billing.disputes import open_dispute as _open

    return _open(session, contract_id, failure_event_id, reason=reason, opened_by=opened_by,
                 now=now)


def decide_dispute(
    session: Session,
    *,
    dispute_id: str,
    decision: str,
    note: str,
    by: str,
    now: datetime,
    failure_class: str | None = None,
    cause: str | None = None,
) -> Any:
    """Decide an open dispute: ``exclusion`` / ``reclassification`` resolve it, ``reject``."""
    from billing.disputes import reject_dispute, resolve_dispute

    if decision == "reject":
        return reject_dispute(session, dispute_id, decided_by=by, note=note, now=now)
    return resolve_dispute(
        session,
        dispute_id,
        resolution=decision,
        decided_by=by,
        note=note,
        failure_class=failure_class or None,
        cause=cause or None,
        now=now,
    )


def close_year(
    session: Session, *, contract_id: str, year: int, host: Any, now: datetime
) -> Any:
    """Close (or adjust) a contract year and sign the log's new head (with the signer of
    ``host``, a :class:`web.portal.Host`)."""
    from billing.closing import close_year as _close

    return _close(
        session, contract_id, year, now=now, signer=host.signer,
        origin_prefix=host.settings.log_origin,
    )


def export(session: Session, *, fmt: str, now: datetime) -> tuple[bytes, str]:
    """The finance export of every credit in ``fmt`` (recorded in finance's log)."""
    from billing.export import export_credits

    result = export_credits(session, fmt, record=True, now=now)
    return result.data, f"yoco-credits-{result.batch_id}.{fmt}"
