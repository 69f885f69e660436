"""Signed tree heads: sign a log's (size, root) as a C2SP checkpoint note and store it.

A new head is signed only when it is consistent with the last one signed for
the same log: the stored tree must reproduce the old root at the old size, and
a consistency proof between the two must verify.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger import merkle, note, tree
from ledger.errors import CheckpointRefused, LedgerError, LogInconsistent, MissingNodeError
from ledger.models import Checkpoint, JournalEntry, LedgerLog


@dataclass(frozen=True, slots=True)
class SignedHead:
    """A stored checkpoint: which log, its size and root, and the signed note."""

    log_id: str
    tree_size: int
    root_hash: bytes
    note: str
    signed_at: datetime | None
    created: bool


def origin_of(prefix: str, log_id: str) -> str:
    """The checkpoint origin line of a contract's log."""
    return f"{prefix}/{log_id}"


def latest(session: Session, log_id: str) -> Checkpoint | None:
    """The latest signed checkpoint of ``log_id``, if any."""
    return session.execute(
        select(Checkpoint)
        .where(Checkpoint.log_id == log_id)
        .order_by(Checkpoint.tree_size.desc())
        .limit(1)
    ).scalar_one_or_none()


def at_size(session: Session, log_id: str, tree_size: int) -> Checkpoint | None:
    """The checkpoint of ``log_id`` signed at ``tree_size``, if any."""
    return session.execute(
        select(Checkpoint).where(Checkpoint.log_id == log_id, Checkpoint.tree_size == tree_size)
    ).scalar_one_or_none()


def signed_sizes(session: Session, log_id: str) -> list[int]:
    """The tree sizes of ``log_id``'s signed checkpoints, smallest first (for the error
    that names a size nobody signed)."""
    return list(
        session.execute(
            select(Checkpoint.tree_size)
            .where(Checkpoint.log_id == log_id)
            .order_by(Checkpoint.tree_size)
        ).scalars()
    )


def latest_signed_size(session: Session, log_id: str) -> int:
    """The tree size of ``log_id``'s latest signed checkpoint (0: none signed yet)."""
    size = session.execute(
        select(func.max(Checkpoint.tree_size)).where(Checkpoint.log_id == log_id)
    ).scalar_one_or_none()
    return int(size or 0)


def latest_signed_times(session: Session) -> dict[str, datetime]:
    """When the latest checkpoint of each log the session may see was signed, by log id
    (a log with no signed checkpoint is absent)."""
    rows = session.execute(
        select(Checkpoint.log_id, func.max(Checkpoint.signed_at)).group_by(Checkpoint.log_id)
    ).all()
    return {str(log_id): signed_at for log_id, signed_at in rows}


def newest_first(
    session: Session, log_id: str, *, below: int | None = None, limit: int | None = None
) -> list[Checkpoint]:
    """The signed checkpoints of ``log_id``, newest (largest) first; ``below``: only those
    smaller than that tree size; ``limit``: the first ones (a page of keyset pagination)."""
    q = (
        select(Checkpoint)
        .where(Checkpoint.log_id == log_id)
        .order_by(Checkpoint.tree_size.desc())
    )
    if below is not None:
        q = q.where(Checkpoint.tree_size < below)
    if limit is not None:
        q = q.limit(limit)
    return list(session.execute(q).scalars())


def at_sizes(session: Session, log_id: str, sizes: Iterable[int]) -> list[Checkpoint]:
    """The checkpoints of ``log_id`` signed at any of ``sizes``, smallest first (sizes
    nobody signed are absent)."""
    return list(
        session.execute(
            select(Checkpoint)
            .where(Checkpoint.log_id == log_id, Checkpoint.tree_size.in_(sorted(sizes)))
            .order_by(Checkpoint.tree_size)
        ).scalars()
    )


def covering(session: Session, log_id: str, seq: int) -> Checkpoint | None:
    """The latest checkpoint of ``log_id`` whose tree contains entry ``seq``."""
    cp = latest(session, log_id)
    if cp is None or cp.tree_size <= seq:
        return None
    return cp


def sign_log(session: Session, signer: note.Signer, log_id: str, origin_prefix: str) -> SignedHead:
    """Sign the current head of ``log_id`` (no-op returning the last head if it has not grown)."""
    size = session.execute(
        select(LedgerLog.size).where(LedgerLog.log_id == log_id).with_for_update()
    ).scalar_one_or_none()
    if size is None:
        raise CheckpointRefused(f"no log named {log_id!r}")
    last = latest(session, log_id)
    if last is not None and last.tree_size == size:
        return SignedHead(
            log_id, last.tree_size, bytes(last.root_hash), last.note, last.signed_at, False
        )
    if size == 0:
        raise CheckpointRefused(f"log {log_id!r} is empty: nothing to sign")
    held = session.execute(
        select(func.coalesce(func.max(JournalEntry.seq) + 1, 0)).where(
            JournalEntry.log_id == log_id)
    ).scalar_one()
    if held != size:
        raise LogInconsistent(log_id, f"its recorded size is {size} but its journal holds "
                              f"{held} entries")
    new_root = tree.root(session, log_id, size)
    if last is not None:
        old_root = tree.root(session, log_id, last.tree_size)
        if old_root != bytes(last.root_hash):
            raise CheckpointRefused(
                f"log {log_id!r}: the stored tree no longer has root "
                f"{bytes(last.root_hash).hex()} at size {last.tree_size} (signed earlier); "
                "refusing to sign a head that is not consistent with it — run `yoco ledger verify`"
            )
        proof = tree.consistency_proof(session, log_id, last.tree_size, size)
        merkle.verify_consistency(last.tree_size, size, proof, bytes(last.root_hash), new_root)
    origin = origin_of(origin_prefix, log_id)
    # The key name is the log's origin (C2SP tlog-checkpoint SHOULD): the operator's one
    # key, under each log's own name; the row keeps the key text that verifies the note.
    log_signer = signer.named(origin)
    text = note.sign_checkpoint(log_signer, origin, size, new_root)
    row = Checkpoint(
        log_id=log_id,
        tree_size=size,
        root_hash=new_root,
        origin=origin,
        key_id=log_signer.verifier_text(),
        note=text,
    )
    session.add(row)
    session.flush()
    return SignedHead(log_id, size, new_root, text, row.signed_at, True)


@dataclass(frozen=True, slots=True)
class SignRun:
    """What signing every log did: the heads (signed or unchanged) and, per log that
    could not be signed, the named error that says why."""

    heads: list[SignedHead]
    refused: list[CheckpointRefused]


def sign_every_log(session: Session, signer: note.Signer, origin_prefix: str) -> SignRun:
    """Sign a new head for every log that grew since its last checkpoint, each log on its
    own: a log whose size, tree or journal disagree (or whose new head is not consistent
    with its last one) is left unsigned, with its error in ``refused``, and the other logs
    are signed all the same. Never commits."""
    log_ids = list(session.execute(
        select(LedgerLog.log_id).where(LedgerLog.size > 0).order_by(LedgerLog.log_id)
    ).scalars())
    return _sign_each(session, signer, log_ids, origin_prefix)


def _sign_each(
    session: Session, signer: note.Signer, log_ids: list[str], origin_prefix: str
) -> SignRun:
    heads: list[SignedHead] = []
    refused: list[CheckpointRefused] = []
    for log_id in log_ids:
        savepoint = session.begin_nested()
        try:
            heads.append(sign_log(session, signer, log_id, origin_prefix))
        except CheckpointRefused as exc:
            savepoint.rollback()
            refused.append(exc)
        except (LedgerError, MissingNodeError) as exc:  # a proof that does not verify
            savepoint.rollback()
            refused.append(LogInconsistent(log_id, str(exc)))
        else:
            savepoint.commit()
    return SignRun(heads, refused)


def sign_all(session: Session, signer: note.Signer, origin_prefix: str) -> list[SignedHead]:
    """Sign a new head for every log that grew since its last checkpoint; raise
    :class:`CheckpointRefused` naming every log that could not be signed (after signing
    the others in ``session``: a caller that commits anyway keeps them, see
    :func:`sign_every_log`)."""
    run = sign_every_log(session, signer, origin_prefix)
    if run.refused:
        raise CheckpointRefused("; ".join(str(e) for e in run.refused))
    return run.heads


def sign_grown(session: Session, signer: note.Signer, origin_prefix: str) -> SignRun:
    """Sign a new head for every log with entries beyond its last checkpoint, each log on
    its own as :func:`sign_every_log` does; ``heads`` holds only the heads signed now (a
    log that did not grow is left as it is, no row written). Never commits."""
    newest = (
        select(Checkpoint.log_id, func.max(Checkpoint.tree_size).label("size"))
        .group_by(Checkpoint.log_id)
        .subquery()
    )
    log_ids = list(session.execute(
        select(LedgerLog.log_id)
        .outerjoin(newest, newest.c.log_id == LedgerLog.log_id)
        .where(LedgerLog.size > func.coalesce(newest.c.size, 0))
        .order_by(LedgerLog.log_id)
    ).scalars())
    run = _sign_each(session, signer, log_ids, origin_prefix)
    return SignRun([h for h in run.heads if h.created], run.refused)
