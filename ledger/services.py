"""Proofs from the database: inclusion of an entry, consistency between signed heads."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import proofs, tree
from ledger.checkpoints import at_size, covering
from ledger.errors import LedgerError, UnknownEntry
from ledger.models import Checkpoint, JournalEntry
from ledger.witnessing import cosigned_note


def _event_uuid(event_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(event_id))
    except ValueError:
        raise UnknownEntry(f"{event_id!r} is not an event id (a UUID)") from None


def inclusion_bundle(
    session: Session, event_id: str, tree_size: int | None = None
) -> dict[str, Any]:
    """A self-contained inclusion proof of entry ``event_id`` against the latest signed
    head, or against the signed head of ``tree_size`` (an evidence pack proves its entry
    against the checkpoint of the log archive beside it).

    Raises :class:`UnknownEntry` when there is no such entry, and
    :class:`~ledger.errors.LedgerError` when no signed head (of that size) covers it.
    """
    row = session.execute(
        select(JournalEntry.log_id, JournalEntry.seq, JournalEntry.canonical).where(
            JournalEntry.event_id == _event_uuid(event_id)
        )
    ).one_or_none()
    if row is None:
        raise UnknownEntry(f"no ledger entry has event id {event_id}")
    log_id, seq, canonical = row
    if tree_size is not None:
        cp = at_size(session, log_id, tree_size)
        if cp is None or cp.tree_size <= seq:
            raise LedgerError(
                f"entry {event_id} (log {log_id!r}, seq {seq}) is not under a signed "
                f"checkpoint of size {tree_size}"
            )
    else:
        cp = covering(session, log_id, seq)
    if cp is None:
        raise LedgerError(
            f"entry {event_id} (log {log_id!r}, seq {seq}) is not covered by a signed "
            "checkpoint yet: run `yoco ledger checkpoint` first"
        )
    proof = tree.inclusion_proof(session, log_id, seq, cp.tree_size)
    return proofs.build_inclusion_bundle(
        log=cp.origin,
        event_id=str(_event_uuid(event_id)),
        entry=bytes(canonical),
        leaf_index=seq,
        tree_size=cp.tree_size,
        proof=proof,
        checkpoint=cosigned_note(session, cp),
    )


def checkpoints_of(session: Session, log_id: str) -> list[Checkpoint]:
    """Every signed checkpoint of ``log_id``, oldest first."""
    return list(
        session.execute(
            select(Checkpoint).where(Checkpoint.log_id == log_id).order_by(Checkpoint.tree_size)
        ).scalars()
    )


def consistency_bundle(session: Session, log_id: str, size1: int, size2: int) -> dict[str, Any]:
    """A consistency proof between the signed checkpoints of ``log_id`` at two sizes."""
    heads = {cp.tree_size: cp for cp in checkpoints_of(session, log_id)}
    missing = [s for s in (size1, size2) if s not in heads]
    if missing:
        raise LedgerError(
            f"log {log_id!r} has no signed checkpoint of size {missing[0]} "
            f"(signed sizes: {sorted(heads) or 'none'})"
        )
    if size1 > size2:
        raise LedgerError("the first checkpoint must not be larger than the second")
    proof = tree.consistency_proof(session, log_id, size1, size2) if size1 < size2 else []
    return proofs.build_consistency_bundle(
        log=heads[size1].origin,
        size1=size1,
        size2=size2,
        proof=proof,
        checkpoint1=cosigned_note(session, heads[size1]),
        checkpoint2=cosigned_note(session, heads[size2]),
    )
