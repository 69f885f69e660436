"""Full verification of the ledger: every leaf hash, every stored node, every signed head.

``verify_all`` streams each log in ``seq`` order and checks that

* the sequence is contiguous from 0 and matches the log's size;
* each entry's leaf hash is SHA-256(0x00 ‖ canonical bytes) as stored, and
  its queryable copy (jsonb body, kind, event id) says what the bytes say;
* every stored perfect-subtree node equals the one recomputed from the leaves;
* every signed checkpoint has a valid signature and the root recomputed at
  its size.

It stops at the first problem and names the entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import merkle, note
from ledger.errors import NoteError, VerificationFailed
from ledger.models import Checkpoint, JournalEntry, LedgerLog, MerkleNode


@dataclass(slots=True)
class VerifyReport:
    """What was checked: logs, entries, nodes and checkpoints."""

    logs: int = 0
    entries: int = 0
    nodes: int = 0
    checkpoints: int = 0
    roots: dict[str, str] = field(default_factory=dict)


def _levels(leaves: list[bytes]) -> list[list[bytes]]:
    """All perfect-subtree hashes, level by level, of a tree with ``leaves``."""
    levels = [leaves]
    current = leaves
    sha = hashlib.sha256
    while len(current) > 1:
        nxt = [
            sha(b"\x01" + current[i] + current[i + 1]).digest()
            for i in range(0, len(current) - 1, 2)
        ]
        levels.append(nxt)
        current = nxt
    return levels


def verify_log(
    session: Session,
    log_id: str,
    size: int,
    verifier: note.Verifier | None,
    report: VerifyReport,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Verify one log; raise :class:`VerificationFailed` naming the first bad entry."""
    sha = hashlib.sha256
    leaves: list[bytes] = []
    stmt = (
        select(
            JournalEntry.seq,
            JournalEntry.event_id,
            JournalEntry.kind,
            JournalEntry.canonical,
            JournalEntry.leaf_hash,
            JournalEntry.body,
        )
        .where(JournalEntry.log_id == log_id)
        .order_by(JournalEntry.seq)
        .execution_options(yield_per=20000)
    )
    for seq, event_id, kind, canonical, stored_leaf, body in session.execute(stmt):
        expected = len(leaves)
        if seq != expected:
            raise VerificationFailed(
                f"log {log_id!r}: entry seq {expected} is missing (next stored is {seq})",
                log_id=log_id,
                seq=expected,
            )
        canonical = bytes(canonical)
        leaf = sha(b"\x00" + canonical).digest()
        where = f"log {log_id!r} seq {seq} (event {event_id})"
        if leaf != bytes(stored_leaf):
            raise VerificationFailed(
                f"{where}: leaf hash does not match its canonical bytes "
                "(the entry was edited after it was written)",
                log_id=log_id,
                seq=seq,
                event_id=str(event_id),
            )
        try:
            parsed = json.loads(canonical)
        except ValueError:
            parsed = None
        if (
            not isinstance(parsed, dict)
            or parsed != body
            or parsed.get("kind") != kind
            or str(parsed.get("event_id")) != str(event_id)
        ):
            raise VerificationFailed(
                f"{where}: the stored copy (body, kind or event id) differs from the "
                "hashed canonical bytes (the entry was edited after it was written)",
                log_id=log_id,
                seq=seq,
                event_id=str(event_id),
            )
        leaves.append(leaf)
        if progress and len(leaves) % 20000 == 0:
            progress(20000)
    if len(leaves) != size:
        raise VerificationFailed(
            f"log {log_id!r}: holds {len(leaves)} entries but its size says {size}",
            log_id=log_id,
            seq=min(len(leaves), size),
        )
    if progress:
        progress(len(leaves) % 20000)
    report.entries += len(leaves)

    levels = _levels(leaves)
    node_stmt = (
        select(MerkleNode.level, MerkleNode.idx, MerkleNode.hash)
        .where(MerkleNode.log_id == log_id)
        .order_by(MerkleNode.level, MerkleNode.idx)
        .execution_options(yield_per=50000)
    )
    expected_nodes = sum(len(level) for level in levels) if leaves else 0
    seen = 0
    for level, idx, h in session.execute(node_stmt):
        ok = level < len(levels) and idx < len(levels[level]) and levels[level][idx] == bytes(h)
        if not ok:
            first = idx << level
            raise VerificationFailed(
                f"log {log_id!r}: stored Merkle node (level {level}, index {idx}) does not "
                f"match the entries; first entry under it is seq {first}",
                log_id=log_id,
                seq=first,
            )
        seen += 1
    if seen != expected_nodes:
        raise VerificationFailed(
            f"log {log_id!r}: {seen} Merkle nodes stored, {expected_nodes} expected",
            log_id=log_id,
        )
    report.nodes += seen

    def get(level: int, idx: int) -> bytes:
        return levels[level][idx]

    for cp in session.execute(
        select(Checkpoint).where(Checkpoint.log_id == log_id).order_by(Checkpoint.tree_size)
    ).scalars():
        if cp.tree_size > size or cp.tree_size <= 0:
            raise VerificationFailed(
                f"log {log_id!r}: checkpoint of size {cp.tree_size} is beyond the log "
                f"({size} entries): entries are missing",
                log_id=log_id,
                seq=size,
            )
        root = merkle.root_from_nodes(cp.tree_size, get)
        if root != bytes(cp.root_hash):
            raise VerificationFailed(
                f"log {log_id!r}: the entries no longer hash to the root signed at size "
                f"{cp.tree_size} ({bytes(cp.root_hash).hex()})",
                log_id=log_id,
            )
        if verifier is not None:
            try:
                signed = note.open_checkpoint(cp.note, verifier)
            except NoteError as exc:
                raise VerificationFailed(
                    f"log {log_id!r}: checkpoint at size {cp.tree_size} has a bad signature: {exc}",
                    log_id=log_id,
                ) from exc
            if signed.size != cp.tree_size or signed.root != root or signed.origin != cp.origin:
                raise VerificationFailed(
                    f"log {log_id!r}: signed note at size {cp.tree_size} does not match its row",
                    log_id=log_id,
                )
        report.checkpoints += 1
    report.roots[log_id] = merkle.root_from_nodes(size, get).hex() if size else ""


def verify_all(
    session: Session,
    verifier: note.Verifier | None,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every log; raise :class:`VerificationFailed` at the first problem."""
    report = VerifyReport()
    for log_id, size in session.execute(
        select(LedgerLog.log_id, LedgerLog.size).order_by(LedgerLog.log_id)
    ).all():
        verify_log(session, log_id, size, verifier, report, progress)
        report.logs += 1
    return report


def total_entries(session: Session) -> int:
    """How many entries the journal holds (for progress bars)."""
    from sqlalchemy import func

    return int(session.execute(select(func.coalesce(func.sum(LedgerLog.size), 0))).scalar_one())
