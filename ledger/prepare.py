"""A batch checked and encoded without the database, ready to be appended.

:func:`prepare_batch` is the part of ingest that needs no database: every record's own
rules (:func:`ledger.records.validate_batch`), the batch's causal order, the leaf hashes
and the journal rows in COPY's binary format but for their sequence numbers
(:func:`ledger.journal.encode_entries`). :func:`ledger.ingest.append_prepared` does the
rest under the logs' lock. The two halves can run in different processes
(:func:`ledger.ingest.ingest_stream` runs this one in :mod:`ledger.workers`): a
:class:`PreparedBatch` is plain lists of ``str`` and ``bytes``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ledger import journal
from ledger.records import OrderKey, Record, RecordError, causal_order, order_key, validate_batch

__all__ = ["PreparedBatch", "Problem", "order_problems", "prepare_batch", "prepare_records"]

#: A refusal found without the database, before it is located: ``(record, field, message)``.
Problem = tuple[int, str, str]


@dataclass(slots=True)
class PreparedBatch:
    """A batch checked and encoded without the database: what the append needs, in columns.

    Built by :func:`prepare_batch` (in this process, or in a worker process by
    :func:`ingest_stream`: every field is a plain list, ``bytes`` or ``str``, cheap to
    send). ``errors`` are the records' own refusals (the batch is then refused as a
    whole); ``indexes`` name each kept record's element in the caller's batch; ``order``
    is the :func:`~ledger.records.causal_order` of the records, ``order_problems`` its
    refusals; ``entries`` the journal rows, all but their sequence numbers; ``projected``
    ``(record, occurred_at, body)`` of the records the projectors are shown (every one,
    or those of the kinds asked for); ``keys`` the records' order keys (kept only in
    this process).
    """

    what: str
    errors: list[RecordError]
    indexes: list[int | None]
    order: list[int]
    order_problems: list[Problem]
    entries: journal.EncodedEntries
    projected: list[tuple[int, datetime | None, dict[str, Any]]]
    keys: list[OrderKey] | None = None


def order_problems(keys: Sequence[OrderKey]) -> tuple[list[int], list[Problem]]:
    """The :func:`~ledger.records.causal_order` of ``keys``, and its refusals as
    ``(record, field, message)`` (record: the position in ``keys``)."""
    order, errors = causal_order(keys)
    if not errors:
        return order, []
    at = {(k.line, k.index): i for i, k in enumerate(keys)}
    return order, [(at[(e.line, e.index)], e.field, e.message) for e in errors]


def prepare_records(
    records: Sequence[Record], what: str, projected_kinds: Collection[str] | None
) -> PreparedBatch:
    """The :class:`PreparedBatch` of records already validated (see :func:`prepare_batch`)."""
    keys = [order_key(r) for r in records]
    order, problems = order_problems(keys)
    entries = journal.encode_entries(
        (r.kind, r.event_id, r.contract_id, r.occurred_at, r.canonical) for r in records
    )
    projected: list[tuple[int, datetime | None, dict[str, Any]]]
    if projected_kinds is None:
        projected = [(i, r.occurred_at, r.body) for i, r in enumerate(records)]
    else:
        projected = [
            (i, r.occurred_at, r.body) for i, r in enumerate(records) if r.kind in projected_kinds
        ]
    return PreparedBatch(
        what=what,
        errors=[],
        indexes=[r.index for r in records],
        order=order,
        order_problems=problems,
        entries=entries,
        projected=projected,
        keys=keys,
    )


def prepare_batch(
    objs: Sequence[Any],
    what: str = "batch",
    now: datetime | None = None,
    projected_kinds: Collection[str] | None = None,
    *,
    keep_keys: bool = True,
) -> PreparedBatch:
    """Validate and encode a batch of parsed records; no database.

    Promises: every record checked by :func:`~ledger.records.validate_batch` (identical
    repeats collapsed); on any refusal a batch whose ``errors`` list every one, and
    nothing else; otherwise the batch's causal order and its journal rows (canonical
    bytes, leaf hashes), ready for :func:`ledger.ingest.append_prepared`. ``projected_kinds`` (None:
    all) are the entry kinds whose bodies are kept for the projectors; it may leave out
    only kinds no projector reads (as :func:`ledger.projections.replay` does).
    """
    records, errors = validate_batch(list(objs), now=now)
    if errors:
        return PreparedBatch(what, errors, [], [], [], journal.encode_entries(()), [])
    prepared = prepare_records(records, what, projected_kinds)
    if not keep_keys:
        prepared.keys = None
    return prepared
