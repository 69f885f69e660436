"""Disputes: a customer contests a failure event; the operator resolves or rejects it.

* ``open_dispute`` writes ``dispute_opened`` (the customer's reason).
* ``resolve_dispute`` writes the correction first — an ``exclusion`` entry (the
  ledger's own kind: the failure leaves coverage) or a ``reclassification`` entry
  (the failure's class and/or cause corrected; the latest reclassification counts in
  every figure) — then ``dispute_resolved`` naming it.
* ``reject_dispute`` writes ``dispute_rejected``.

A failure has at most one open dispute at a time (a second one is refused until the
first is decided: one customer cannot flood the queue with copies), and whoever opened
a dispute may not decide it (``decided_by`` must differ from ``opened_by``).

A correction that touches a closed year marks it as pending an adjustment (see
:mod:`billing.projections`); ``close-year`` run again adjusts it, flipping the
credit if the verdict flips.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing import entries
from billing.errors import (
    DisputeAlreadyOpen,
    DisputeNotOpen,
    SelfDecision,
    UnknownDispute,
    UnknownFailure,
)
from billing.models import Dispute, Reclassification
from billing.terms import FAILURE_CLASSES
from billing.years import require_aware
from ledger import ids, journal
from ledger.contracts import get_contract
from ledger.errors import InvariantBroken
from ledger.models import Failure

__all__ = [
    "DISPUTE_STATUSES",
    "RESOLUTIONS",
    "DisputeResult",
    "list_disputes",
    "open_dispute",
    "reject_dispute",
    "resolve_dispute",
]

RESOLUTIONS = frozenset({"exclusion", "reclassification"})
DISPUTE_STATUSES = frozenset({"open", "resolved", "rejected"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DisputeResult:
    """The dispute after the call, and the entries written."""

    dispute: dict[str, Any]
    event_ids: list[str]


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    return value.strip()


def _uuid(name: str, value: object) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise ValueError(f"{name}: not a UUID: {value!r}") from None


def dispute_json(d: Dispute) -> dict[str, Any]:
    """A dispute as plain JSON."""
    return {
        "dispute_id": str(d.dispute_id),
        "contract_id": d.contract_id,
        "failure_event_id": str(d.failure_event_id),
        "status": d.status,
        "reason": d.reason,
        "opened_by": d.opened_by,
        "opened_at": d.opened_at.astimezone(UTC).isoformat(),
        "resolution": d.resolution,
        "decided_by": d.decided_by,
        "decided_at": d.decided_at.astimezone(UTC).isoformat() if d.decided_at else None,
        "note": d.note,
    }


def open_dispute(
    session: Session,
    contract_id: str,
    failure_event_id: str | uuid.UUID,
    *,
    reason: str,
    opened_by: str = "customer",
    now: datetime | None = None,
) -> DisputeResult:
    """Open a dispute of failure ``failure_event_id`` of ``contract_id``; never commits.

    Raises :class:`~ledger.errors.UnknownContract`, :class:`UnknownFailure` (not a
    failure of that contract), :class:`DisputeAlreadyOpen` (the failure has an open
    dispute: one at a time) or ValueError (empty reason, bad id); nothing written.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    reason = _text("reason", reason)
    opened_by = _text("opened_by", opened_by)
    fid = _uuid("failure_event_id", failure_event_id)
    get_contract(session, contract_id)
    sizes = journal.lock_logs(session, [contract_id])
    owner = session.execute(
        select(Failure.contract_id).where(Failure.event_id == fid)
    ).scalar_one_or_none()
    if owner != contract_id:
        raise UnknownFailure(
            f"failure_event_id: {fid} is not a failure of contract {contract_id!r}"
        )
    # The log is locked (above): no concurrent open of the same failure can slip past.
    already = session.execute(
        select(Dispute.dispute_id).where(
            Dispute.failure_event_id == fid, Dispute.status == "open"
        ).limit(1)
    ).scalar_one_or_none()
    if already is not None:
        raise DisputeAlreadyOpen(
            f"failure_event_id: failure {fid} already has an open dispute ({already}); "
            "it must be decided before another is opened"
        )
    did = ids.random_internal_id()
    entry = entries.make_entry(
        "dispute_opened",
        did,
        contract_id,
        now,
        {"failure_event_id": str(fid), "reason": reason, "opened_by": opened_by},
    )
    entries.append(session, [entry], sizes)
    d = session.get(Dispute, did)
    if d is None:
        raise InvariantBroken(f"dispute {did} was appended but not projected")
    return DisputeResult(dispute=dispute_json(d), event_ids=[str(did)])


def _same_person(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def _open(
    session: Session, dispute_id: str | uuid.UUID, decided_by: str
) -> tuple[Dispute, dict[str, int]]:
    did = _uuid("dispute_id", dispute_id)
    d = session.get(Dispute, did)
    if d is None:
        raise UnknownDispute(f"dispute_id: no dispute {did}")
    sizes = journal.lock_logs(session, [d.contract_id])
    session.refresh(d)
    if d.status != "open":
        raise DisputeNotOpen(f"dispute_id: dispute {did} is already {d.status}")
    if _same_person(d.opened_by, decided_by):
        raise SelfDecision(
            f"decided_by: {decided_by!r} opened dispute {did} and may not decide it"
        )
    return d, sizes


def resolve_dispute(
    session: Session,
    dispute_id: str | uuid.UUID,
    *,
    resolution: str,
    decided_by: str,
    note: str,
    failure_class: str | None = None,
    cause: str | None = None,
    now: datetime | None = None,
) -> DisputeResult:
    """Resolve an open dispute by an exclusion or a reclassification; never commits.

    ``exclusion`` writes an ``exclusion`` entry (``reason`` = ``note``, ``approved_by``
    = ``decided_by``).  ``reclassification`` needs ``failure_class`` and/or ``cause``
    and writes a ``reclassification`` entry.  Then ``dispute_resolved``.  Raises
    :class:`UnknownDispute`, :class:`DisputeNotOpen`, :class:`SelfDecision` (the
    decider opened it) or ValueError; nothing written.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution: expected one of {sorted(RESOLUTIONS)}, got {resolution!r}")
    decided_by = _text("decided_by", decided_by)
    note = _text("note", note)
    d, sizes = _open(session, dispute_id, decided_by)
    fid = d.failure_event_id
    new: list[journal.NewEntry] = []
    if resolution == "exclusion":
        fix_id = entries.event_id("dispute_exclusion", d.dispute_id)
        new.append(
            entries.make_entry(
                "exclusion",
                fix_id,
                d.contract_id,
                now,
                {
                    "failure_event_id": str(fid),
                    "reason": note,
                    "approved_by": decided_by,
                    "dispute_id": str(d.dispute_id),
                },
            )
        )
    else:
        if failure_class is None and cause is None:
            raise ValueError("failure_class: a reclassification needs a new class and/or cause")
        if failure_class is not None and failure_class not in FAILURE_CLASSES:
            raise ValueError(
                f"failure_class: expected one of {sorted(FAILURE_CLASSES)}, got {failure_class!r}"
            )
        if cause is not None:
            cause = _text("cause", cause)
        cur_class, cur_cause = _current_class(session, fid)
        fix_id = entries.event_id("dispute_reclassification", d.dispute_id)
        new.append(
            entries.make_entry(
                "reclassification",
                fix_id,
                d.contract_id,
                now,
                {
                    "failure_event_id": str(fid),
                    "failure_class": failure_class or cur_class,
                    "cause": cause or cur_cause,
                    "previous_class": cur_class,
                    "previous_cause": cur_cause,
                    "reason": note,
                    "approved_by": decided_by,
                    "dispute_id": str(d.dispute_id),
                },
            )
        )
    decision_id = entries.event_id("dispute_decision", d.dispute_id)
    new.append(
        entries.make_entry(
            "dispute_resolved",
            decision_id,
            d.contract_id,
            now,
            {
                "dispute_id": str(d.dispute_id),
                "failure_event_id": str(fid),
                "resolution": resolution,
                "resolution_event_id": str(fix_id),
                "decided_by": decided_by,
                "note": note,
            },
        )
    )
    entries.append(session, new, sizes)
    session.refresh(d)
    return DisputeResult(dispute=dispute_json(d), event_ids=[str(fix_id), str(decision_id)])


def _current_class(session: Session, fid: uuid.UUID) -> tuple[str, str]:
    latest = session.execute(
        select(Reclassification.failure_class, Reclassification.cause)
        .where(Reclassification.failure_event_id == fid)
        .order_by(
            Reclassification.occurred_at.desc(),
            Reclassification.seq.desc(),
            Reclassification.event_id.desc(),
        )
        .limit(1)
    ).one_or_none()
    if latest is not None:
        return latest[0], latest[1]
    row = session.execute(
        select(Failure.failure_class, Failure.cause).where(Failure.event_id == fid)
    ).one()
    return row[0], row[1]


def reject_dispute(
    session: Session,
    dispute_id: str | uuid.UUID,
    *,
    decided_by: str,
    note: str,
    now: datetime | None = None,
) -> DisputeResult:
    """Reject an open dispute (``dispute_rejected``); never commits.

    Raises :class:`UnknownDispute`, :class:`DisputeNotOpen`, :class:`SelfDecision` or
    ValueError; nothing written.
    """
    now = require_aware("now", now) if now is not None else datetime.now(UTC)
    decided_by = _text("decided_by", decided_by)
    note = _text("note", note)
    d, sizes = _open(session, dispute_id, decided_by)
    decision_id = entries.event_id("dispute_decision", d.dispute_id)
    entries.append(
        session,
        [
            entries.make_entry(
                "dispute_rejected",
                decision_id,
                d.contract_id,
                now,
                {
                    "dispute_id": str(d.dispute_id),
                    "failure_event_id": str(d.failure_event_id),
                    "decided_by": decided_by,
                    "note": note,
                },
            )
        ],
        sizes,
    )
    session.refresh(d)
    return DisputeResult(dispute=dispute_json(d), event_ids=[str(decision_id)])


def list_disputes(
    session: Session, contract_id: str | None = None, status: str | None = None
) -> list[dict[str, Any]]:
    """Disputes (of one contract, with one status), by contract then opening order.

    Raises ValueError for an unknown status and UnknownContract for an unknown contract.
    """
    q = select(Dispute)
    if contract_id is not None:
        get_contract(session, contract_id)
        q = q.where(Dispute.contract_id == contract_id)
    if status is not None:
        if status not in DISPUTE_STATUSES:
            raise ValueError(f"status: expected one of {sorted(DISPUTE_STATUSES)}, got {status!r}")
        q = q.where(Dispute.status == status)
    return [
        dispute_json(d)
        for d in session.execute(q.order_by(Dispute.contract_id, Dispute.seq)).scalars()
    ]


def disputes_of_contract(session: Session, contract_id: str) -> list[Dispute]:
    """Every dispute of contract ``contract_id`` (open and decided), newest first."""
    return list(
        session.execute(
            select(Dispute)
            .where(Dispute.contract_id == contract_id)
            .order_by(Dispute.opened_at.desc(), Dispute.seq.desc())
        ).scalars()
    )


def disputes_of_failure(
    session: Session, contract_id: str, failure_event_id: uuid.UUID
) -> list[Dispute]:
    """The disputes of one failure of contract ``contract_id``, oldest first."""
    return list(
        session.execute(
            select(Dispute)
            .where(Dispute.contract_id == contract_id,
                   Dispute.failure_event_id == failure_event_id)
            .order_by(Dispute.opened_at)
        ).scalars()
    )


def dispute_queue(session: Session, status: str | None = "open") -> list[Dispute]:
    """The disputes with ``status`` (None or empty: any) of every contract the session
    may see (row-level security scopes a portal session to its tenant), oldest first."""
    q = select(Dispute).order_by(Dispute.opened_at)
    if status:
        q = q.where(Dispute.status == status)
    return list(session.execute(q).scalars())


def reclassifications_of_failure(
    session: Session, contract_id: str, failure_event_id: uuid.UUID
) -> list[Reclassification]:
    """The reclassifications recorded in contract ``contract_id`` for one failure, in no
    particular order (the latest in the log counts in the figures)."""
    return list(
        session.execute(
            select(Reclassification).where(
                Reclassification.contract_id == contract_id,
                Reclassification.failure_event_id == failure_event_id,
            )
        ).scalars()
    )
