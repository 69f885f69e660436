"""Raising an event: stored once per idempotency key, fanned out to matching destinations.

An event's ``key`` is deterministic: computed from what it is about (a contract year and
the number of times its standing worsened, a close entry's id, a credit's id, a
checkpoint's tree size, the refused records' bytes), never from when or where the
detector ran. The ``alert_events.key`` unique constraint makes a second raise of the same
key a no-op (``INSERT … ON CONFLICT DO NOTHING``), so detectors running from several
places at once store, and so deliver, each event once.
"""

from __future__ import annotations

import unicodedata
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from alerts.models import EVENT_KINDS, OPT_IN_KINDS, AlertEvent
from ledger.models import Contract

__all__ = ["NAMESPACE", "NewEvent", "idempotency_key", "one_line", "raise_event"]

#: Namespace of the ``Idempotency-Key`` UUIDs (uuid5 of the event key).
NAMESPACE = uuid.UUID("5d0c8a4e-8e33-4f4b-9d7e-0a1e7c2b7a11")


#: Unicode categories never kept in a one-line text: controls (CR, LF, DEL …), format
#: characters (bidi overrides such as U+202E) and the line and paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def one_line(text_: str) -> str:
    """``text_`` with every control, format (bidi) and line-separator character written as
    a visible ``\\uXXXX`` escape: one line that is safe as an e-mail header value and
    cannot reorder what follows it. Printable text is unchanged.

    Alert subjects are built from what a refused record said (its ``event_id`` may carry
    CR/LF), so the subject is made one line where it enters (:class:`NewEvent`), and
    again where it leaves (the e-mail's ``Subject``), for rows stored before."""
    if all(unicodedata.category(ch) not in _ESCAPED_CATEGORIES for ch in text_):
        return text_
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in _ESCAPED_CATEGORIES
                   else ch for ch in text_)


def idempotency_key(key: str) -> str:
    """The ``Idempotency-Key`` header value of the event with ``key`` (a UUID, stable)."""
    return str(uuid.uuid5(NAMESPACE, key))


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to raise: ``kind`` (one of :data:`~alerts.models.EVENT_KINDS`), its
    deterministic ``key``, what it is about, a one-line ``subject`` and JSON ``data``."""

    kind: str
    key: str
    occurred_at: datetime
    subject: str
    data: dict[str, Any]
    contract_id: str | None = None
    year: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind: unknown event kind {self.kind!r}")
        if not self.key or not self.key.startswith(self.kind + ":"):
            raise ValueError(f"key: must start with {self.kind + ':'!r}, got {self.key!r}")
        if self.occurred_at.tzinfo is None or self.occurred_at.utcoffset() is None:
            raise ValueError("occurred_at: a time needs a UTC offset")
        # The subject becomes an e-mail header: one line, whatever the record said.
        object.__setattr__(self, "subject", one_line(self.subject))


def raise_event(session: Session, event: NewEvent, *, deliver: bool = True) -> int | None:
    """Store ``event`` unless its key is stored already, with one pending delivery per
    enabled destination it matches; return the new event's id, or None (already raised).
    ``deliver=False`` stores the event without deliveries (in the log, never sent: a
    refusal held back by the flood limit, :func:`alerts.refusals.raise_refusal`).

    A destination matches when its ``event_kinds`` names the kind, or is empty and the
    kind is not opt-in (:data:`~alerts.models.OPT_IN_KINDS`), and its
    ``customer`` is NULL (the operator's) or the event's contract's customer: a tenant's
    destination never receives another tenant's events nor events of no tenant.
    Never commits.
    """
    customer = None
    if event.contract_id is not None:
        customer = session.execute(
            select(Contract.customer).where(Contract.contract_id == event.contract_id)
        ).scalar_one_or_none()
    stmt = (
        insert(AlertEvent)
        .values(
            key=event.key,
            kind=event.kind,
            contract_id=event.contract_id,
            customer=customer,
            year=event.year,
            occurred_at=event.occurred_at.astimezone(UTC),
            subject=event.subject[:500],
            data=event.data,
        )
        .on_conflict_do_nothing(index_elements=[AlertEvent.key])
        .returning(AlertEvent.id)
    )
    event_id = session.execute(stmt).scalar_one_or_none()
    if event_id is None:
        return None
    if not deliver:
        return int(event_id)
    session.execute(
        text(
            "INSERT INTO alert_deliveries (event_id, destination_id) "
            "SELECT :eid, d.id FROM alert_destinations d WHERE d.enabled "
            "AND ((cardinality(d.event_kinds) = 0 AND NOT :opt_in) "
            "OR :kind = ANY(d.event_kinds)) "
            "AND (d.customer IS NULL OR d.customer = :customer) "
            "ORDER BY d.id ON CONFLICT DO NOTHING"
        ),
        {"eid": event_id, "kind": event.kind, "customer": customer,
         "opt_in": event.kind in OPT_IN_KINDS},
    )
    return int(event_id)

