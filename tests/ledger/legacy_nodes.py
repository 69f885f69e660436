"""A log as it was written when every Merkle node was stored, for the tests.

Appends store only the nodes of height :data:`ledger.tree.STORED_FROM` and up. A ledger
written before that also holds every lower node of its entries of then (their leaf
hashes at level 0, and the interior nodes they completed): :func:`store_low_nodes`
writes those for the first ``upto`` entries of a log, as that code wrote them.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledger import tiles, tree


def store_low_nodes(owner_engine: Engine, log_id: str, upto: int | None = None) -> int:
    """Insert every node below ``STORED_FROM`` over the first ``upto`` entries (None: all)
    of ``log_id``, computed from the journal's leaf hashes; return how many."""
    with owner_engine.begin() as c:
        leaves = [
            bytes(h)
            for h in c.execute(
                text("SELECT leaf_hash FROM journal_entries WHERE log_id = :log ORDER BY seq"),
                {"log": log_id},
            ).scalars()
        ][:upto]
        levels = tiles.compute_levels(leaves) if leaves else []
        rows = [
            {"log": log_id, "level": level, "idx": idx, "hash": h}
            for level, hashes in enumerate(levels[: tree.STORED_FROM])
            for idx, h in enumerate(hashes)
        ]
        if rows:
            c.execute(
                text(
                    "INSERT INTO merkle_nodes (log_id, level, idx, hash) "
                    "VALUES (:log, :level, :idx, :hash)"
                ),
                rows,
            )
    return len(rows)
