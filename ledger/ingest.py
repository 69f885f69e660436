"""Ingestion: validated records become journal entries and projections, all or nothing.

``ingest`` takes records already checked in isolation (``ledger.records``)
and checks what needs the database, with the contracts' logs locked:
the contract exists; an event id already stored carries the same bytes
(then the record is a no-op) and not different ones; outcomes and exclusions
name a failure of the same contract (anywhere in the batch, or in the ledger); jobs
start and finish in order. The batch is appended in causal order
(:func:`ledger.records.causal_order`), so the order of its lines does not matter.
Any refusal raises :class:`~ledger.errors.IngestRefused` listing every bad
record by line (or index) and field, and the caller's unit of work rolls the
whole batch back.

:func:`ingest_batch` is the one validate → ingest → commit path: ``yoco ledger
ingest`` (a :class:`FileBatch`), ``POST /api/v1/records``, the runtime's ledger sink and
the demo (a :class:`RecordBatch`) all call it, so a record is refused with the same
words whichever way it came (``tests/ledger/test_one_path_db.py``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import journal, projections
from ledger.errors import IngestRefused
from ledger.ids import is_producer_event_id
from ledger.models import Contract
from ledger.records import OrderKey, Record, RecordError, causal_order, order_key, validate_batch
from ledger.stream import FileIndex, index_file, read_records


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
    canonical bytes are skipped (idempotent retry).  The batch is appended in
    :func:`~ledger.records.causal_order`: an outcome may come before its failure, a
    failure or job_finished before its job_started, anywhere in the batch.
    """
    locate = locate or index_locator()
    return _ingest_indexed(
        session,
        [order_key(r) for r in records],
        [hashlib.sha256(r.canonical).digest() for r in records],
        lambda positions: [records[p] for p in positions],
        locate,
        extra_projectors,
        chunk=max(len(records), 1),
        keep_stored=True,
    )


def ingest_file(
    session: Session,
    index: FileIndex,
    extra_projectors: Sequence[projections.Projector] = (),
    *,
    chunk: int = 5000,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    """Append the records of an indexed JSONL file (:func:`ledger.stream.index_file`).

    The same checks and the same causal order as :func:`ingest`, all in the caller's
    one transaction (all or nothing), but the records are re-read from the file
    ``chunk`` at a time, so memory stays bounded by the index. ``progress`` is called
    with the number of records handled after each chunk. Never commits.
    """
    keys = index.keys
    with index.path.open("rb") as fh:
        return _ingest_indexed(
            session,
            keys,
            index.digests,
            lambda positions: read_records(index, positions, fh),
            line_locator([k.line or 0 for k in keys]),
            extra_projectors,
            chunk=chunk,
            keep_stored=False,
            progress=progress,
        )


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records as parsed JSON objects, located by their index in ``objs``.

    The API's posted array, the runtime's outbox batch, the demo's simulated stream.
    ``what`` names the batch in the refusal's message; ``now`` is the clock records are
    checked against (default: the time of the call).
    """

    objs: Sequence[Any]
    what: str = "batch"
    now: datetime | None = None


@dataclass(frozen=True, slots=True)
class FileBatch:
    """A JSONL file, located by line, validated and appended in bounded memory.

    ``progress`` is called with the bytes validated so far; the records are appended
    ``chunk`` at a time, re-read from the file (see :mod:`ledger.stream`).
    """

    path: Path
    now: datetime | None = None
    progress: Callable[[int], None] | None = None
    chunk: int = 5000


@dataclass(frozen=True, slots=True)
class _Checked:
    """A validated batch: what the one ingest path needs of it."""

    what: str
    keys: Sequence[OrderKey]
    digests: Sequence[bytes]
    loader: Callable[[], AbstractContextManager[Callable[[list[int]], list[Record]]]]
    locate: Locator
    chunk: int
    keep_stored: bool


def _check(batch: RecordBatch | FileBatch) -> _Checked:
    """Validate every record of ``batch`` (no database); refuse it whole on any error."""
    if isinstance(batch, FileBatch):
        index = index_file(batch.path, now=batch.now, progress=batch.progress)
        what = str(batch.path)
        if index.error_count:
            raise IngestRefused(index.errors, what, count=index.error_count)

        @contextmanager
        def reread() -> Iterator[Callable[[list[int]], list[Record]]]:
            with index.path.open("rb") as fh:
                yield lambda positions: read_records(index, positions, fh)

        return _Checked(
            what=what,
            keys=index.keys,
            digests=index.digests,
            loader=reread,
            locate=line_locator([k.line or 0 for k in index.keys]),
            chunk=batch.chunk,
            keep_stored=False,
        )
    records, errors = validate_batch(list(batch.objs), now=batch.now)
    if errors:
        raise IngestRefused(errors, batch.what)

    @contextmanager
    def held() -> Iterator[Callable[[list[int]], list[Record]]]:
        yield lambda positions: [records[p] for p in positions]

    return _Checked(
        what=batch.what,
        keys=[order_key(r) for r in records],
        digests=[hashlib.sha256(r.canonical).digest() for r in records],
        loader=held,
        # Identical repeats collapse, so record i is not always element i: name the
        # element of the caller's batch.
        locate=lambda i, fld, msg: RecordError(msg, field=fld, index=records[i].index),
        chunk=max(len(records), 1),
        keep_stored=True,
    )


def ingest_batch(
    unit: Callable[[], AbstractContextManager[Session]],
    batch: RecordBatch | FileBatch,
    projectors: Sequence[projections.Projector] = (),
    *,
    before_write: Callable[[Sequence[OrderKey]], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    """Validate ``batch``, then append it inside one unit of work: the one ingest path.

    Promises, in order:
    1. every record is checked on its own (the rules of :mod:`yoco_records.schema`),
       before any database session is opened; on any error
       :class:`~ledger.errors.IngestRefused` lists every bad record by line (a file) or
       index (a batch) and field, and nothing is written;
    2. ``before_write(keys)`` sees the validated records (one :class:`OrderKey` each, in
       batch order) and may refuse them by raising (the API's token scope) or prepare
       (a progress bar's total);
    3. ``unit()`` is entered (the caller's unit of work: ``yoco.database.unit_of_work``,
       the portal's ``PortalDb.write``, both :func:`ledger.sessions.unit_of_work`) and
       the records are appended with the checks that need the ledger (see
       :func:`ingest`); a refusal there raises ``IngestRefused`` too and the unit rolls
       everything back. The unit commits; this function never does.

    ``progress`` is called with the number of records handled after each chunk.
    """
    checked = _check(batch)
    if before_write is not None:
        before_write(checked.keys)
    with checked.loader() as load, unit() as session:
        return _ingest_indexed(
            session,
            checked.keys,
            checked.digests,
            load,
            checked.locate,
            projectors,
            chunk=checked.chunk,
            keep_stored=checked.keep_stored,
            progress=progress,
            what=checked.what,
        )


def _existing_digests(session: Session, event_ids: Sequence[str]) -> dict[str, bytes]:
    """SHA-256 of the canonical bytes of the entries already stored under ``event_ids``.

    ``event_ids`` are canonical (lowercase) UUID strings, and so are the keys returned.
    The ids go to the server as one ``uuid[]`` parameter: an ``IN`` list of 10,000
    bound parameters cost more to build and parse than the index probes themselves.
    """
    found: dict[str, bytes] = {}
    ids = sorted(set(event_ids))
    conn = session.connection().connection.driver_connection
    assert conn is not None
    with conn.cursor(binary=True) as cur:
        for start in range(0, len(ids), 50000):
            cur.execute(
                "SELECT event_id::text, canonical FROM journal_entries "
                "WHERE event_id = ANY(%s::text[]::uuid[])",
                (ids[start : start + 50000],),
            )
            for eid, canonical in cur:
                found[eid] = hashlib.sha256(bytes(canonical)).digest()
    return found


def _ingest_indexed(
    session: Session,
    keys: Sequence[OrderKey],
    digests: Sequence[bytes],
    load: Callable[[list[int]], list[Record]],
    locate: Locator,
    extra_projectors: Sequence[projections.Projector],
    *,
    chunk: int,
    keep_stored: bool,
    progress: Callable[[int], None] | None = None,
    what: str = "batch",
) -> IngestResult:
    """What every ingest shares: checks on the compact keys, then appends ``chunk`` at a
    time (refusals name the batch as ``what``)."""
    result = IngestResult()
    if not keys:
        return result
    errors: list[RecordError] = []

    contract_ids = sorted({k.contract_id for k in keys})
    known_contracts = set(
        session.execute(
            select(Contract.contract_id).where(Contract.contract_id.in_(contract_ids))
        ).scalars()
    )
    for i, k in enumerate(keys):
        if k.contract_id not in known_contracts:
            errors.append(locate(i, "contract_id", f"unknown contract {k.contract_id!r}"))
        if not is_producer_event_id(k.event_id):
            # validate_record refuses these already; the journal must never take a
            # producer record into the id space of the system's own entries.
            errors.append(locate(i, "event_id", "must be a random UUID v4"))
    if errors:
        raise IngestRefused(errors, what)

    # Append in causal order (issue 10, item 5): references resolve wherever they stand
    # in the batch; independent records keep their batch order.
    order, order_errors = causal_order(keys)
    if order_errors:
        at = {(k.line, k.index): i for i, k in enumerate(keys)}
        raise IngestRefused(
            [locate(at[(e.line, e.index)], e.field, e.message) for e in order_errors], what
        )

    sizes = journal.lock_logs(session, contract_ids)
    existing = _existing_digests(session, [k.event_id for k in keys])
    fresh: list[int] = []
    for i in order:
        old = existing.get(keys[i].event_id) if existing else None
        if old is None:
            fresh.append(i)
        elif old == digests[i]:
            # Same bytes means same contract_id, so the producer can read that log.
            result.duplicates += 1
        else:
            # One answer whatever log holds the id and whatever it says: the producer
            # learns nothing about logs it may not read (issue 10, item 2).
            errors.append(locate(i, "event_id", event_id_taken(keys[i].event_id)))
    if errors:
        raise IngestRefused(errors, what)
    del existing
    if progress is not None and result.duplicates:
        progress(result.duplicates)

    for start in range(0, len(fresh), chunk):
        part = fresh[start : start + chunk]
        entries = [
            journal.NewEntry(
                kind=r.kind,
                event_id=uuid.UUID(r.event_id),
                contract_id=r.contract_id,
                occurred_at=r.occurred_at,
                canonical=r.canonical,
                body=r.body,
            )
            for r in load(part)
        ]
        stored = journal.append_entries(session, entries, sizes)
        projected = [
            projections.ProjectedEntry(
                s.log_id, s.seq, s.event_id, s.kind, e.occurred_at, e.body
            )
            for e, s in zip(entries, stored, strict=True)
        ]
        problems = projections.project(session, projected, extra_projectors)
        if problems:
            where = {e.event_id: i for i, e in zip(part, entries, strict=True)}
            raise IngestRefused(
                [locate(where[p.event_id], p.field, p.message) for p in problems], what
            )
        result.appended += len(stored)
        result.by_kind.update(st.kind for st in stored)
        if keep_stored:
            result.stored.extend(stored)
        if progress is not None:
            progress(len(part))
    return result
