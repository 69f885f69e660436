"""The append-only journal: sequence numbers under a lock, leaf hashes, Merkle nodes.

Services here take a session and never commit; the caller's unit of work does.
``seq`` is assigned while the log's row in ``ledger_logs`` is locked (FOR
UPDATE), so concurrent writers queue on it and can neither fork the tree nor
leave a gap (a bigserial would do both).
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ledger import bulk, merkle, tree
from ledger.errors import InvariantBroken
from ledger.models import JournalEntry, LedgerLog

__all__ = [
    "EncodedEntries",
    "JournalEntry",
    "NewEntry",
    "StoredEntry",
    "append_encoded",
    "append_entries",
    "encode_entries",
    "lock_logs",
]


#: The journal's COPY columns, in the order its rows are encoded: ``seq`` first, so that
#: rows can be encoded before the log is locked (in a worker process, even) and numbered
#: afterwards by writing only the row's first field (:func:`numbered_rows`).
JOURNAL_COLUMNS = (
    "seq",
    "event_id",
    "log_id",
    "kind",
    "contract_id",
    "occurred_at",
    "canonical",
    "leaf_hash",
)
JOURNAL_TYPES = ("int8", "uuid", "text", "text", "text", "timestamptz", "bytea", "bytea")

# A row in COPY's binary format (ledger.bulk): the field count, then each field as its
# length and its bytes. The row's head: 8 fields, then seq as an int8.
_ROW_HEAD = struct.Struct(">hiq")
_UUID_FIELD = struct.Struct(">i16s")
_TIME_FIELD = struct.Struct(">iqi")  # occurred_at as an int8, then canonical's length
_LENGTH = struct.Struct(">i")
_LEAF_HEAD = _LENGTH.pack(merkle.HASH_SIZE)


@dataclass(slots=True)
class EncodedEntries:
    """Journal rows in COPY's binary format, all but their sequence numbers.

    One element per entry in every list: ``tails`` are the rows' bytes after ``seq``
    (what :func:`numbered_rows` completes), ``leaves`` the RFC 9162 leaf hashes of the
    canonical bytes. Plain lists of ``str`` and ``bytes``, so a worker process can send
    them cheaply (:func:`ledger.ingest.ingest_stream`).
    """

    log_ids: list[str]
    kinds: list[str]
    event_ids: list[str]
    tails: list[bytes]
    leaves: list[bytes]

    def __len__(self) -> int:
        return len(self.tails)

    def select(self, positions: Sequence[int]) -> EncodedEntries:
        """The entries at ``positions``, in that order (the same object for all, in order)."""
        if len(positions) == len(self.tails) and all(
            p == i for i, p in enumerate(positions)
        ):
            return self
        return EncodedEntries(
            [self.log_ids[p] for p in positions],
            [self.kinds[p] for p in positions],
            [self.event_ids[p] for p in positions],
            [self.tails[p] for p in positions],
            [self.leaves[p] for p in positions],
        )


def encode_entries(
    entries: Iterable[tuple[str, str | uuid.UUID, str, datetime | None, bytes]],
) -> EncodedEntries:
    """Encode ``(kind, event_id, contract_id, occurred_at, canonical)`` tuples as journal rows.

    The entry's log is its contract's (``log_id`` = ``contract_id``). ``event_id`` is a
    :class:`uuid.UUID` or its canonical lowercase text; ``occurred_at`` an aware datetime
    or None. The bytes are those :func:`ledger.bulk.binary_copy_data` writes for
    :data:`JOURNAL_TYPES` (held equal by ``tests/ledger/test_journal_rows.py``), computed
    with a few ``struct`` calls a row instead of one encoder call a value.
    """
    log_ids: list[str] = []
    kinds: list[str] = []
    event_ids: list[str] = []
    tails: list[bytes] = []
    leaves: list[bytes] = []
    # Most rows share their log, kind and contract: their three fields are encoded once.
    names: dict[tuple[str, str], bytes] = {}
    uuid_field = _UUID_FIELD.pack
    time_field = _TIME_FIELD.pack
    length = _LENGTH.pack
    epoch = bulk.PG_EPOCH
    leaf_hash = merkle.leaf_hash
    for kind, event_id, contract_id, occurred_at, canonical in entries:
        if type(event_id) is str:
            eid = event_id
            raw = bytes.fromhex(event_id.replace("-", ""))
            if len(raw) != 16:
                raise ValueError(f"not a UUID: {event_id!r}")
        else:
            if not isinstance(event_id, uuid.UUID):
                raise ValueError(f"not a UUID: {event_id!r}")
            eid = str(event_id)
            raw = event_id.bytes
        named = names.get((kind, contract_id))
        if named is None:
            named = names[(kind, contract_id)] = (
                bulk.text_field(contract_id) + bulk.text_field(kind) + bulk.text_field(contract_id)
            )
        if occurred_at is None:
            when = bulk.NULL_FIELD + length(len(canonical))
        else:
            if occurred_at.tzinfo is None:
                raise ValueError(f"a timestamptz needs an aware datetime, got {occurred_at!r}")
            d = occurred_at - epoch  # microseconds since 2000-01-01 00:00 UTC, exactly
            when = time_field(
                8, (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds, len(canonical)
            )
        leaf = leaf_hash(canonical)
        tails.append(b"".join((uuid_field(16, raw), named, when, canonical, _LEAF_HEAD, leaf)))
        log_ids.append(contract_id)
        kinds.append(kind)
        event_ids.append(eid)
        leaves.append(leaf)
    return EncodedEntries(log_ids, kinds, event_ids, tails, leaves)


def numbered_rows(entries: EncodedEntries, seqs: Sequence[int]) -> Iterator[bytes]:
    """The rows of ``entries`` with their sequence numbers ``seqs``, as COPY data pieces."""
    head = _ROW_HEAD.pack
    for seq, tail in zip(seqs, entries.tails, strict=True):
        yield head(len(JOURNAL_COLUMNS), 8, seq)
        yield tail


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEntry:
    """An entry to append: its identity, its canonical bytes and the parsed body."""

    kind: str
    event_id: uuid.UUID
    contract_id: str
    occurred_at: datetime | None
    canonical: bytes
    body: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEntry:
    """Where an appended entry now stands in its log."""

    log_id: str
    seq: int
    event_id: uuid.UUID
    kind: str
    leaf_hash: bytes


@dataclass(frozen=True, slots=True)
class Existing:
    """An event id already in the journal, with its stored canonical bytes."""

    event_id: uuid.UUID
    canonical: bytes
    log_id: str
    seq: int


def lock_logs(session: Session, log_ids: Iterable[str]) -> dict[str, int]:
    """Create missing logs, lock them (in id order, so writers never deadlock), return sizes."""
    ids = sorted(set(log_ids))
    if not ids:
        return {}
    session.execute(
        pg_insert(LedgerLog).on_conflict_do_nothing(index_elements=["log_id"]),
        [{"log_id": i} for i in ids],
    )
    rows = session.execute(
        select(LedgerLog.log_id, LedgerLog.size)
        .where(LedgerLog.log_id.in_(ids))
        .order_by(LedgerLog.log_id)
        .with_for_update()
    ).all()
    return {log_id: size for log_id, size in rows}


def find_existing(session: Session, event_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Existing]:
    """The entries already stored under any of ``event_ids``."""
    ids = list(set(event_ids))
    found: dict[uuid.UUID, Existing] = {}
    for start in range(0, len(ids), 10000):
        rows = session.execute(
            select(
                JournalEntry.event_id,
                JournalEntry.canonical,
                JournalEntry.log_id,
                JournalEntry.seq,
            ).where(JournalEntry.event_id.in_(ids[start : start + 10000]))
        ).all()
        for eid, canonical, log_id, seq in rows:
            found[eid] = Existing(eid, bytes(canonical), log_id, seq)
    return found


def append_entries(
    session: Session, entries: Sequence[NewEntry], sizes: dict[str, int] | None = None
) -> list[StoredEntry]:
    """Append ``entries`` (already validated, none stored yet) to their contracts' logs.

    Entries keep their order within each log.  ``sizes`` are the locked log
    sizes from :func:`lock_logs`; the logs are locked here when not given.
    Returns where each entry was stored, in input order.
    """
    if not entries:
        return []
    if sizes is None:
        sizes = lock_logs(session, (e.contract_id for e in entries))
    encoded = encode_entries(
        (e.kind, e.event_id, e.contract_id, e.occurred_at, e.canonical) for e in entries
    )
    seqs = append_encoded(session, encoded, sizes)
    return [
        StoredEntry(
            log_id=e.contract_id, seq=seq, event_id=e.event_id, kind=e.kind, leaf_hash=leaf
        )
        for e, seq, leaf in zip(entries, seqs, encoded.leaves, strict=True)
    ]


def append_encoded(
    session: Session, entries: EncodedEntries, sizes: dict[str, int]
) -> list[int]:
    """Append encoded ``entries`` (none stored yet) to their logs; return their ``seq``s.

    ``sizes`` are the logs' sizes under the lock of :func:`lock_logs`; they are advanced.
    Entries keep their order within each log. Writes the Merkle nodes the entries
    complete, the logs' new sizes and the journal rows (one COPY for all of them).
    """
    if not len(entries):
        return []
    log_ids = entries.log_ids
    first = log_ids[0]
    if all(log_id == first for log_id in log_ids):
        base = sizes[first]
        seqs = list(range(base, base + len(log_ids)))
        by_log = {first: (base, entries.leaves)}
    else:
        seqs = []
        leaves: dict[str, list[bytes]] = {}
        bases: dict[str, int] = {}
        for log_id, leaf in zip(log_ids, entries.leaves, strict=True):
            at = leaves.get(log_id)
            if at is None:
                at = leaves[log_id] = []
                bases[log_id] = sizes[log_id]
            seqs.append(bases[log_id] + len(at))
            at.append(leaf)
        by_log = {log_id: (bases[log_id], hashes) for log_id, hashes in leaves.items()}
    for log_id, (base, hashes) in by_log.items():
        tree.append_leaves(session, log_id, base, hashes)
        sizes[log_id] = base + len(hashes)
        session.execute(
            text("UPDATE ledger_logs SET size = :size WHERE log_id = :log_id"),
            {"size": sizes[log_id], "log_id": log_id},
        )
    bulk.copy_binary(session, "journal_entries", JOURNAL_COLUMNS, numbered_rows(entries, seqs))
    return seqs


def log_size(session: Session, log_id: str) -> int:
    """The number of entries in log ``log_id`` (0 for a log that does not exist)."""
    size = session.execute(
        select(LedgerLog.size).where(LedgerLog.log_id == log_id)
    ).scalar_one_or_none()
    return int(size or 0)


def log_sizes(session: Session) -> dict[str, int]:
    """The size of every log the session may see (row-level security scopes a portal
    session to its tenant's logs), by log id."""
    return {
        log_id: int(size)
        for log_id, size in session.execute(select(LedgerLog.log_id, LedgerLog.size))
    }


def log_of_entry(session: Session, event_id: uuid.UUID) -> str | None:
    """The id of the log that holds entry ``event_id``; None when no entry (that the
    session sees) has that id."""
    log_id: str | None = session.execute(
        select(JournalEntry.log_id).where(JournalEntry.event_id == event_id)
    ).scalar_one_or_none()
    return log_id


def entry_body(canonical: bytes) -> dict[str, Any]:
    """The parsed body of canonical entry bytes."""
    body = json.loads(canonical)
    if not isinstance(body, dict):
        raise InvariantBroken("a journal entry's body is not a JSON object")
    return body
