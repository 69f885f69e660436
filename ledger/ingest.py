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

import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import bulk, journal, merkle, plausibility, projections
from ledger.errors import IngestRefused, InvariantBroken
from ledger.ids import is_producer_event_id
from ledger.models import Contract
from ledger.prepare import PreparedBatch, Problem, order_problems, prepare_batch, prepare_records
from ledger.records import OrderKey, Record, RecordError
from ledger.stream import (
    FileIndex,
    collector_paused,
    index_file,
    read_records,
    read_spooled,
)


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


def append_prepared(
    session: Session,
    prepared: PreparedBatch,
    projectors: Sequence[projections.Projector] = (),
    *,
    locate: Locator | None = None,
    keep_stored: bool = False,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    """Append a batch :func:`prepare_batch` accepted, with the checks that need the ledger.

    The checks and order of :func:`ingest`; refusals name each record by ``locate``
    (default: its element's index in the caller's batch). Never commits.
    """
    if prepared.errors:
        raise IngestRefused(prepared.errors, prepared.what)
    indexes = prepared.indexes
    entries = prepared.entries
    projected = prepared.projected

    def load(part: list[int]) -> _Part:
        chosen = entries.select(part)
        if chosen is entries:
            return _Part(entries, projected)
        at = {p: j for j, p in enumerate(part)}
        return _Part(
            chosen, [(at[i], when, body) for i, when, body in projected if i in at]
        )

    return _ingest_indexed(
        session,
        _Plan(
            entries.event_ids,
            entries.log_ids,
            entries.leaves,
            prepared.order,
            prepared.order_problems,
            locate or (lambda i, fld, msg: RecordError(msg, field=fld, index=indexes[i])),
        ),
        load,
        projectors,
        chunk=max(len(entries), 1),
        keep_stored=keep_stored,
        progress=progress,
        what=prepared.what,
    )


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
    return append_prepared(
        session,
        prepare_records(records, "batch", None),
        extra_projectors,
        locate=locate or index_locator(),
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
    with index.path.open("rb") as fh:
        return _ingest_indexed(
            session,
            _file_plan(index),
            _file_loader(index, fh),
            extra_projectors,
            chunk=chunk,
            keep_stored=False,
            progress=progress,
        )


def _file_plan(index: FileIndex) -> _Plan:
    keys = index.keys
    order, problems = order_problems(keys)
    return _Plan(
        [k.event_id for k in keys],
        [k.contract_id for k in keys],
        index.leaves,
        order,
        problems,
        line_locator([k.line or 0 for k in keys]),
    )


def _file_loader(index: FileIndex, fh: Any) -> Callable[[list[int]], _Part]:
    if index.spool is not None:

        def load_spooled(part: list[int]) -> _Part:
            spooled = read_spooled(index, part)
            return _Part(spooled.entries, spooled.projected)

        return load_spooled

    def load(part: list[int]) -> _Part:
        records = read_records(index, part, fh)
        return _Part(
            journal.encode_entries(
                (r.kind, r.event_id, r.contract_id, r.occurred_at, r.canonical)
                for r in records
            ),
            [(j, r.occurred_at, r.body) for j, r in enumerate(records)],
        )

    return load


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
    ``chunk`` at a time, read back from a temporary spool the validation wrote (see
    :mod:`ledger.stream`). ``projected_kinds`` as for :func:`prepare_batch`: the kinds
    whose bodies the projectors are shown (None: all); the others' are not kept.
    ``workers``: processes that validate a large file's lines at once (0: this one; see
    :func:`ledger.stream.index_file`).
    """

    path: Path
    now: datetime | None = None
    progress: Callable[[int], None] | None = None
    chunk: int = 5000
    projected_kinds: Collection[str] | None = None
    workers: int = 0


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
    if isinstance(batch, FileBatch):
        with collector_paused(), tempfile.TemporaryFile(prefix="yoco-ingest-") as spool:
            return _ingest_spooled(unit, batch, spool, projectors, before_write, progress)
    prepared = prepare_batch(batch.objs, batch.what, batch.now)
    if prepared.errors:
        raise IngestRefused(prepared.errors, prepared.what)
    if before_write is not None:
        if prepared.keys is None:
            raise InvariantBroken("a prepared batch without its keys")
        before_write(prepared.keys)
    with unit() as session:
        # Identical repeats collapse, so record i is not always element i: the refusals
        # name the element of the caller's batch.
        return append_prepared(session, prepared, projectors, progress=progress)


def _prepare_worker() -> Any:
    from ledger.workers import PrepareWorker

    return PrepareWorker()


def _ingest_spooled(
    unit: Callable[[], AbstractContextManager[Session]],
    batch: FileBatch,
    spool: BinaryIO,
    projectors: Sequence[projections.Projector],
    before_write: Callable[[Sequence[OrderKey]], None] | None,
    progress: Callable[[int], None] | None,
) -> IngestResult:
    index = index_file(
        batch.path,
        now=batch.now,
        progress=batch.progress,
        spool=spool,
        projected_kinds=batch.projected_kinds,
        workers=batch.workers,
        make_worker=_prepare_worker if batch.workers > 0 else None,
    )
    what = str(batch.path)
    if index.error_count:
        raise IngestRefused(index.errors, what, count=index.error_count)
    if before_write is not None:
        before_write(index.keys)
    with unit() as session:
        return _ingest_indexed(
            session,
            _file_plan(index),
            _file_loader(index, None),
            projectors,
            chunk=batch.chunk,
            keep_stored=False,
            progress=progress,
            what=what,
        )


def ingest_stream(
    unit: Callable[[], AbstractContextManager[Session]],
    batches: Iterable[RecordBatch],
    projectors: Sequence[projections.Projector] = (),
    *,
    projected_kinds: Collection[str] | None = None,
    workers: int = 1,
) -> Iterator[IngestResult]:
    """Append a stream of batches, validating the next ones while one is written.

    Each batch is what :func:`ingest_batch` makes of it (the same checks, refusals and
    result, one unit of work each, committed in stream order), but its validation and
    encoding (:func:`prepare_batch`) run in ``workers`` worker processes
    (:class:`ledger.workers.PrepareWorker`), up to ``workers + 1`` batches ahead, while
    this process writes the previous batch: with a core to spare, the records' checks and the
    database's work overlap. ``workers=0``
    prepares every batch here, in turn. Yields each batch's result once it is committed.
    A refused batch raises :class:`~ledger.errors.IngestRefused` after every batch
    before it was committed, with nothing of it or of later batches written.
    ``projected_kinds`` as for :func:`prepare_batch`: with it, only the bodies the
    projectors read travel back from the workers.
    """
    kinds = None if projected_kinds is None else frozenset(projected_kinds)

    def write(prepared: PreparedBatch) -> IngestResult:
        if prepared.errors:
            raise IngestRefused(prepared.errors, prepared.what)
        with unit() as session:
            return append_prepared(session, prepared, projectors)

    if workers <= 0:
        for batch in batches:
            yield write(prepare_batch(batch.objs, batch.what, batch.now, kinds, keep_keys=False))
        return
    from ledger.workers import PrepareWorker

    pool = [PrepareWorker() for _ in range(workers)]
    source = iter(batches)
    sent = 0
    done = 0

    def submit() -> None:
        nonlocal sent
        batch = next(source, None)
        if batch is not None:
            pool[sent % workers].submit(list(batch.objs), batch.what, batch.now, kinds)
            sent += 1

    try:
        # Up to workers + 1 batches ahead: every worker busy, one more waiting.
        for _ in range(workers + 1):
            submit()
        while done < sent:
            prepared = pool[done % workers].result()
            done += 1
            submit()
            yield write(prepared)
    finally:
        for worker in pool:
            worker.close()


#: The idempotency probe (:func:`existing_leaves`): the stored bytes of the entries whose
#: event id is in the ``uuid[]`` parameter. A join against the unnested ids, run under
#: :func:`ledger.bulk.index_probes`, is one probe of the unique index an id: its cost
#: grows with the ids, never with the journal, and no statistics can turn it into a scan
#: (ledger.bulk.probe). The array is parsed once, by the function scan, not once a row.
#: The ids are probed in sorted order: consecutive probes then descend to neighbouring
#: pages of the index instead of random ones.
EXISTING_SQL = (
    "SELECT q.id::text, j.canonical "
    "FROM (SELECT u.id FROM unnest(%s::uuid[]) AS u(id) ORDER BY u.id) AS q "
    "JOIN journal_entries j ON j.event_id = q.id"
)


def existing_leaves(session: Session, event_ids: Sequence[str]) -> dict[str, bytes]:
    """Leaf hashes of the canonical bytes of the entries already stored under ``event_ids``.

    ``event_ids`` are canonical (lowercase) UUID strings, and so are the keys returned.
    Promises one unique-index probe per id (:data:`EXISTING_SQL`), whatever the size and
    statistics of the journal (``tests/ledger/test_probe_plan_db.py``).
    """
    leaf_hash = merkle.leaf_hash
    return {
        eid: leaf_hash(bytes(canonical))
        for eid, canonical in bulk.probe(session, EXISTING_SQL, event_ids)
    }


@dataclass(slots=True)
class _Plan:
    """What the checks that need the ledger read of a batch, one element per record."""

    event_ids: Sequence[str]
    contract_ids: Sequence[str]
    #: RFC 9162 leaf hashes of the canonical bytes: equal iff the bytes are.
    leaves: Sequence[bytes]
    order: list[int]
    order_problems: list[Problem]
    locate: Locator


@dataclass(slots=True)
class _Part:
    """A chunk's journal rows, in append order, and the bodies its projectors are shown."""

    entries: journal.EncodedEntries
    projected: list[tuple[int, datetime | None, dict[str, Any]]]


def _ingest_indexed(
    session: Session,
    plan: _Plan,
    load: Callable[[list[int]], _Part],
    extra_projectors: Sequence[projections.Projector],
    *,
    chunk: int,
    keep_stored: bool,
    progress: Callable[[int], None] | None = None,
    what: str = "batch",
) -> IngestResult:
    """What every ingest shares: checks on the compact plan, then appends ``chunk`` at a
    time (refusals name the batch as ``what``)."""
    result = IngestResult()
    event_ids = plan.event_ids
    if not event_ids:
        return result
    locate = plan.locate
    errors: list[RecordError] = []

    contract_ids = sorted(set(plan.contract_ids))
    known_contracts = set(
        session.execute(
            select(Contract.contract_id).where(Contract.contract_id.in_(contract_ids))
        ).scalars()
    )
    unknown = len(known_contracts) < len(contract_ids)
    for i, event_id in enumerate(event_ids):
        if unknown and plan.contract_ids[i] not in known_contracts:
            errors.append(
                locate(i, "contract_id", f"unknown contract {plan.contract_ids[i]!r}")
            )
        if not is_producer_event_id(event_id):
            # validate_record refuses these already; the journal must never take a
            # producer record into the id space of the system's own entries.
            errors.append(locate(i, "event_id", "must be a random UUID v4"))
    if errors:
        raise IngestRefused(errors, what)

    # Append in causal order (the order of a batch's lines never matters): references
    # resolve wherever they stand in the batch; independent records keep their batch order.
    if plan.order_problems:
        raise IngestRefused([locate(i, fld, msg) for i, fld, msg in plan.order_problems], what)
    order = plan.order

    sizes = journal.lock_logs(session, contract_ids)
    existing = existing_leaves(session, event_ids)
    if existing:
        fresh: list[int] = []
        leaves = plan.leaves
        for i in order:
            old = existing.get(event_ids[i])
            if old is None:
                fresh.append(i)
            elif old == leaves[i]:
                # Same bytes means same contract_id, so the producer can read that log.
                result.duplicates += 1
            else:
                # One answer whatever log holds the id and whatever it says: the producer
                # learns nothing about logs it may not read (no probing other tenants' ids).
                errors.append(locate(i, "event_id", event_id_taken(event_ids[i])))
        if errors:
            raise IngestRefused(errors, what)
        del existing
        if progress is not None and result.duplicates:
            progress(result.duplicates)
    else:
        fresh = order

    for start in range(0, len(fresh), chunk):
        part = fresh[start : start + chunk]
        loaded = load(part)
        entries = loaded.entries
        seqs = journal.append_encoded(session, entries, sizes)
        projected = [
            projections.ProjectedEntry(
                entries.log_ids[j],
                seqs[j],
                uuid.UUID(entries.event_ids[j]),
                entries.kinds[j],
                when,
                body,
            )
            for j, when, body in loaded.projected
        ]
        problems = projections.project(session, projected, extra_projectors)
        if not problems:  # the rules that need the job (plausibility): ingest only, not replay
            problems = plausibility.check_outcomes(session, projected)
            problems += plausibility.check_job_ends(session, projected)
        if problems:
            at = [j for j, _, _ in loaded.projected]
            where = {e.event_id: part[j] for e, j in zip(projected, at, strict=True)}
            raise IngestRefused(
                [locate(where[p.event_id], p.field, p.message) for p in problems], what
            )
        result.appended += len(entries)
        result.by_kind.update(entries.kinds)
        if keep_stored:
            result.stored.extend(
                journal.StoredEntry(
                    log_id=log_id, seq=seq, event_id=uuid.UUID(eid), kind=kind, leaf_hash=leaf
                )
                for log_id, seq, eid, kind, leaf in zip(
                    entries.log_ids,
                    seqs,
                    entries.event_ids,
                    entries.kinds,
                    entries.leaves,
                    strict=True,
                )
            )
        if progress is not None:
            progress(len(part))
    return result
