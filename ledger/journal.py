"""The append-only journal: sequence numbers under a lock, leaf hashes, Merkle nodes.

Services here take a session and never commit; the caller's unit of work does.
``seq`` is assigned while the log's row in ``ledger_logs`` is locked (FOR
UPDATE), so concurrent writers queue on it and can neither fork the tree nor
leave a gap (a bigserial would do both).
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ledger import merkle, tree
from ledger.bulk import copy_rows
from ledger.models import JournalEntry, LedgerLog

__all__ = ["JournalEntry", "NewEntry", "StoredEntry", "append_entries", "lock_logs"]


JOURNAL_COLUMNS = (
    "log_id",
    "seq",
    "event_id",
    "kind",
    "contract_id",
    "occurred_at",
    "canonical",
    "leaf_hash",
)
JOURNAL_TYPES = ("text", "int8", "uuid", "text", "text", "timestamptz", "bytea", "bytea")


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
    by_log: dict[str, list[int]] = defaultdict(list)
    for i, entry in enumerate(entries):
        by_log[entry.contract_id].append(i)

    stored: list[StoredEntry | None] = [None] * len(entries)
    rows: list[tuple[Any, ...]] = []
    for log_id, positions in by_log.items():
        base = sizes[log_id]
        hashes: list[bytes] = []
        for offset, i in enumerate(positions):
            entry = entries[i]
            leaf = merkle.leaf_hash(entry.canonical)
            hashes.append(leaf)
            stored[i] = StoredEntry(
                log_id=log_id,
                seq=base + offset,
                event_id=entry.event_id,
                kind=entry.kind,
                leaf_hash=leaf,
            )
            rows.append(
                (
                    log_id,
                    base + offset,
                    entry.event_id,
                    entry.kind,
                    entry.contract_id,
                    entry.occurred_at,
                    entry.canonical,
                    leaf,
                )
            )
        tree.append_leaves(session, log_id, base, hashes)
        sizes[log_id] = base + len(positions)
        session.execute(
            text("UPDATE ledger_logs SET size = :size WHERE log_id = :log_id"),
            {"size": sizes[log_id], "log_id": log_id},
        )
    copy_rows(session, "journal_entries", JOURNAL_COLUMNS, rows, JOURNAL_TYPES)
    result = [s for s in stored if s is not None]
    assert len(result) == len(entries)
    return result


def log_size(session: Session, log_id: str) -> int:
    """The number of entries in log ``log_id`` (0 for a log that does not exist)."""
    size = session.execute(
        select(LedgerLog.size).where(LedgerLog.log_id == log_id)
    ).scalar_one_or_none()
    return int(size or 0)


def entry_body(canonical: bytes) -> dict[str, Any]:
    """The parsed body of canonical entry bytes."""
    body = json.loads(canonical)
    assert isinstance(body, dict)
    return body
