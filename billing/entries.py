"""Writing billing's entries into a contract's own log, and projecting them at once.

Every billing entry (``year_close``, ``adjustment``, ``credit``, ``credit_void``,
``credit_application``, ``dispute_*``, ``reclassification``, ``amendment``,
``export``) is a journal entry whose body carries ``kind``, ``event_id``,
``contract_id`` and ``occurred_at`` (what ``ledger verify`` checks the columns
against), appended under the log's lock and projected in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.errors import BillingError
from ledger import ids, journal, projections
from ledger.canonical import canonical_bytes

#: Namespace of billing's deterministic event ids (UUID v5).
NAMESPACE = uuid.UUID("0f6c6f7e-5a53-4c1b-9a3e-6b2f0d1c9e84")
#: The log that records finance exports (they span contracts).
EXPORT_LOG = "yoco:billing-exports"


def event_id(*parts: object) -> uuid.UUID:
    """A deterministic event id for ``parts`` (the same parts always give the same id)."""
    return ids.derived_id(NAMESPACE, ":".join(str(p) for p in parts))


def iso(t: datetime) -> str:
    """``t`` as ISO 8601 in UTC with offset (what entry bodies carry)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"occurred_at: naive datetime {t.isoformat()} (a time zone is required)")
    return t.astimezone(UTC).isoformat()


def make_entry(
    kind: str,
    eid: uuid.UUID,
    contract_id: str,
    occurred_at: datetime,
    payload: Mapping[str, Any],
) -> journal.NewEntry:
    """A journal entry of ``kind`` whose body is ``payload`` plus the four identity fields.

    ``eid`` must come from :func:`event_id` or :func:`ledger.ids.random_internal_id`:
    never a UUID v4, the producers' id space (a producer could otherwise squat the id).
    """
    if ids.is_producer_event_id(eid):
        raise ValueError(f"event id {eid} is a UUID v4, which only producers may use")
    body = {
        **payload,
        "kind": kind,
        "event_id": str(eid),
        "contract_id": contract_id,
        "occurred_at": iso(occurred_at),
    }
    canonical = canonical_bytes(body)
    return journal.NewEntry(
        kind=kind,
        event_id=eid,
        contract_id=contract_id,
        occurred_at=occurred_at.astimezone(UTC),
        canonical=canonical,
        body=journal.entry_body(canonical),
    )


def append(
    session: Session, entries: Sequence[journal.NewEntry], sizes: dict[str, int]
) -> list[projections.ProjectedEntry]:
    """Append ``entries`` to their (already locked) logs and project them; never commits.

    Raises :class:`BillingError` when a projection refuses an entry (the caller's unit
    of work then rolls everything back).
    """
    from billing.projections import PROJECTORS

    stored = journal.append_entries(session, entries, sizes)
    projected = [
        projections.ProjectedEntry(s.log_id, s.seq, s.event_id, s.kind, e.occurred_at, e.body)
        for e, s in zip(entries, stored, strict=True)
    ]
    problems = projections.project(session, projected, PROJECTORS)
    if problems:
        raise BillingError("; ".join(str(p) for p in problems))
    return projected


def existing(session: Session, eid: uuid.UUID) -> journal.Existing | None:
    """The stored entry with event id ``eid``, if any."""
    return journal.find_existing(session, [eid]).get(eid)
