"""Ingestion: validated records become journal entries and projections, all or nothing.

``ingest`` takes records already checked in isolation (``ledger.records``)
and checks what needs the database, with the contracts' logs locked:
the contract exists; an event id already stored carries the same bytes
(then the record is a no-op) and not different ones; outcomes and exclusions
name an earlier failure of the same contract; jobs start and finish in order.
Any refusal raises :class:`~ledger.errors.IngestRefused` listing every bad
record by line (or index) and field, and the caller's unit of work rolls the
whole batch back.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import journal, projections
from ledger.errors import IngestRefused
from ledger.ids import is_producer_event_id
from ledger.models import Contract
from ledger.records import Record, RecordError


@dataclass(slots=True)
class IngestResult:
    """What a batch did: entries appended, identical records skipped, per kind."""

    appended: int = 0
    duplicates: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    stored: list[journal.StoredEntry] = field(default_factory=list)


Locator = Callable[[int, str, str], RecordError]


def event_id_taken(event_id: str) -> str:
    """The refusal of an event id already used with other content, in any log.

    It names no log, sequence number, kind or content, so it is the same answer for an
    id of the producer's own log and for one of a log it may not read.
    """
    return (
        f"event id {event_id} is already used, with different content; an event id is "
        "never reused: give each record a fresh random UUID v4"
    )


def line_locator(lines: Sequence[int]) -> Locator:
    """Errors that name the file line of record ``i``."""
    return lambda i, fld, msg: RecordError(msg, field=fld, line=lines[i])


def index_locator() -> Locator:
    """Errors that name the batch index of record ``i``."""
    return lambda i, fld, msg: RecordError(msg, field=fld, index=i)


def ingest(
    session: Session,
    records: Sequence[Record],
    locate: Locator | None = None,
    extra_projectors: Sequence[projections.Projector] = (),
) -> IngestResult:
    """Append ``records`` to the journal and project them; refuse the batch on any error.

    Never commits.  Records whose event id is already stored with the same
    canonical bytes are skipped (idempotent retry).
    """
    locate = locate or index_locator()
    result = IngestResult()
    if not records:
        return result
    errors: list[RecordError] = []

    contract_ids = sorted({r.contract_id for r in records})
    known_contracts = set(
        session.execute(
            select(Contract.contract_id).where(Contract.contract_id.in_(contract_ids))
        ).scalars()
    )
    for i, r in enumerate(records):
        if r.contract_id not in known_contracts:
            errors.append(locate(i, "contract_id", f"unknown contract {r.contract_id!r}"))
        if not is_producer_event_id(r.event_id):
            # validate_record refuses these already; the journal must never take a
            # producer record into the id space of the system's own entries.
            errors.append(locate(i, "event_id", "must be a random UUID v4"))
    if errors:
        raise IngestRefused(errors)

    sizes = journal.lock_logs(session, contract_ids)
    existing = journal.find_existing(session, (uuid.UUID(r.event_id) for r in records))
    fresh: list[tuple[int, Record]] = []
    for i, r in enumerate(records):
        old = existing.get(uuid.UUID(r.event_id))
        if old is None:
            fresh.append((i, r))
        elif old.canonical == r.canonical:
            # Same bytes means same contract_id, so the producer can read that log.
            result.duplicates += 1
        else:
            # One answer whatever log holds the id and whatever it says: the producer
            # learns nothing about logs it may not read (issue 10, item 2).
            errors.append(locate(i, "event_id", event_id_taken(r.event_id)))
    if errors:
        raise IngestRefused(errors)

    entries = [
        journal.NewEntry(
            kind=r.kind,
            event_id=uuid.UUID(r.event_id),
            contract_id=r.contract_id,
            occurred_at=r.occurred_at,
            canonical=r.canonical,
            body=r.body,
        )
        for _, r in fresh
    ]
    stored = journal.append_entries(session, entries, sizes)
    projected = [
        projections.ProjectedEntry(s.log_id, s.seq, s.event_id, s.kind, e.occurred_at, e.body)
        for e, s in zip(entries, stored, strict=True)
    ]
    problems = projections.project(session, projected, extra_projectors)
    if problems:
        where = {e.event_id: i for (i, _), e in zip(fresh, entries, strict=True)}
        raise IngestRefused([locate(where[p.event_id], p.field, p.message) for p in problems])
    result.appended = len(stored)
    result.stored = stored
    result.by_kind.update(s.kind for s in stored)
    return result
