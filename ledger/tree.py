"""The Merkle tree of each log: perfect-subtree hashes, the high ones kept in ``merkle_nodes``.

A perfect node of height :data:`STORED_FROM` or more is stored once it is complete; a
lower one covers fewer than ``2**STORED_FROM`` leaves and is recomputed, when read,
from the leaf hashes the journal stores anyway (``journal_entries.leaf_hash``, which
``yoco ledger verify`` checks against the canonical bytes). Appending, computing a root
and building a proof each read only the O(log n) stored nodes they need (one query) and
at most a few aligned blocks of ``2**STORED_FROM`` leaf hashes (one more), never the
whole log. Logs written before nodes were thinned out also hold their low nodes; they
are no longer read (``verify`` still checks them).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy.orm import Session

from ledger import merkle
from ledger.bulk import copy_binary, text_field
from ledger.errors import InvariantBroken, LogInconsistent
from ledger.tiles import compute_levels

#: The Merkle nodes' COPY columns and their types (see :func:`node_rows`).
NODE_COLUMNS = ("log_id", "level", "idx", "hash")
NODE_TYPES = ("text", "int2", "int8", "bytea")
_NODE_FIELDS = struct.Struct(">ihiqi32s")

#: The lowest height of a stored node: the tile height of C2SP tlog-tiles
#: (:data:`ledger.tiles.TILE_HEIGHT`), so a stored node of this height is the hash of a
#: full tile of leaves. Writing only these cuts the node rows of an append from about two
#: a leaf (its leaf hash again, and the interior nodes it completes) to one in 128.
STORED_FROM = 8

# The wanted coordinates travel as two arrays, so the statement's text is the same for
# every proof (the driver prepares it once). Each coordinate is looked up by a LATERAL
# subquery with a LIMIT, which the planner cannot flatten into a join: its only index
# path is the primary key with all three columns, one probe a node, whatever the
# statistics. A plain join let the planner, told by the statistics that a log was small
# (a log created or grown since the last ANALYZE), read every node of the log once per
# lookup: an ingest's appends then grew with the nodes written so far in its own
# transaction.
_LOAD_NODES_SQL = (
    "SELECT w.level, w.idx, n.hash FROM unnest(%s::int2[], %s::int8[]) AS w(level, idx) "
    "CROSS JOIN LATERAL (SELECT m.hash FROM merkle_nodes AS m WHERE m.log_id = %s "
    "AND m.level = w.level AND m.idx = w.idx LIMIT 1) AS n"
)


# The leaf hashes of ranges of a log's entries, one range of the journal's primary key
# each (the ranges travel as two arrays, for the same reason as the nodes' coordinates).
_LOAD_LEAVES_SQL = (
    "SELECT e.seq, e.leaf_hash FROM unnest(%s::int8[], %s::int8[]) AS r(lo, hi) "
    "CROSS JOIN LATERAL (SELECT j.seq, j.leaf_hash FROM journal_entries AS j "
    "WHERE j.log_id = %s AND j.seq >= r.lo AND j.seq < r.hi ORDER BY j.seq "
    f"LIMIT {1 << STORED_FROM}) AS e"
)


def load_nodes(
    session: Session, log_id: str, coords: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """The nodes at ``coords`` of log ``log_id``; a node that cannot be had is an error.

    Stored nodes (height :data:`STORED_FROM` and up) come from one query, lower ones from
    the leaf hashes of their aligned blocks of ``2**STORED_FROM`` entries (one more).
    """
    wanted = sorted(set(coords))
    if not wanted:
        return {}
    conn = session.connection().connection.driver_connection
    if conn is None:
        raise InvariantBroken("the session's database connection is closed")
    stored = [c for c in wanted if c[0] >= STORED_FROM]
    low = [c for c in wanted if c[0] < STORED_FROM]
    found: dict[tuple[int, int], bytes] = {}
    with conn.cursor(binary=True) as cur:
        if stored:
            cur.execute(
                _LOAD_NODES_SQL, ([lv for lv, _ in stored], [ix for _, ix in stored], log_id)
            )
            found.update(((level, idx), bytes(h)) for level, idx, h in cur.fetchall())
        if low:
            found.update(_low_nodes(cur, log_id, low))
    missing = [c for c in wanted if c not in found]
    if missing:
        raise LogInconsistent(log_id, f"Merkle nodes (level, index) {missing[:5]} are missing "
                              "(its recorded size is past its tree)")
    return found


def _low_nodes(
    cur: Any, log_id: str, coords: list[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """The nodes at ``coords`` (all below :data:`STORED_FROM`) recomputed from leaf hashes.

    Each lies inside one aligned block of ``2**STORED_FROM`` leaves: the block's leaves
    are read from its start up to the last one a wanted node covers, and hashed up.
    Nodes whose leaves the journal does not hold (yet) are left out.
    """
    ends: dict[int, int] = {}  # block -> end of the leaves wanted from it
    for level, idx in coords:
        block = (idx << level) >> STORED_FROM
        ends[block] = max(ends.get(block, 0), (idx + 1) << level)
    blocks = sorted(ends)
    cur.execute(
        _LOAD_LEAVES_SQL,
        ([b << STORED_FROM for b in blocks], [ends[b] for b in blocks], log_id),
    )
    leaves: dict[int, list[bytes]] = {b: [] for b in blocks}
    for seq, leaf in cur.fetchall():
        held = leaves[seq >> STORED_FROM]
        if seq == ((seq >> STORED_FROM) << STORED_FROM) + len(held):  # contiguous
            held.append(bytes(leaf))
    found: dict[tuple[int, int], bytes] = {}
    by_block: dict[int, list[list[bytes]]] = {}
    for level, idx in coords:
        block = (idx << level) >> STORED_FROM
        levels = by_block.get(block)
        if levels is None:
            levels = by_block[block] = compute_levels(leaves[block])
        at = idx - ((block << STORED_FROM) >> level)
        if level < len(levels) and at < len(levels[level]):
            found[(level, idx)] = levels[level][at]
    return found


def append_leaves(
    session: Session, log_id: str, old_size: int, leaf_hashes: Sequence[bytes]
) -> None:
    """Store the nodes of height :data:`STORED_FROM` and up that appending ``leaf_hashes``
    to a log of ``old_size`` leaves completes.

    The log's first ``old_size`` entries must be in the journal (the frontier's low nodes
    are recomputed from their leaf hashes); the new ones need not be yet.
    """
    if not leaf_hashes:
        return
    frontier = load_nodes(session, log_id, merkle.frontier_coords(old_size))
    nodes = merkle.appended_nodes(old_size, frontier, leaf_hashes, lowest=STORED_FROM)
    if nodes:
        copy_binary(session, "merkle_nodes", NODE_COLUMNS, node_rows(log_id, nodes))


def node_rows(log_id: str, nodes: Iterable[tuple[int, int, bytes]]) -> Iterator[bytes]:
    """The rows of ``nodes`` (``(level, index, hash)``) of log ``log_id``, COPY-encoded.

    The bytes :func:`ledger.bulk.binary_copy_data` writes for :data:`NODE_TYPES` (held
    equal by ``tests/ledger/test_journal_rows.py``), with one ``struct`` call a row.
    """
    head = struct.pack(">h", len(NODE_COLUMNS)) + text_field(log_id)
    pack = _NODE_FIELDS.pack
    for level, idx, h in nodes:
        yield head + pack(2, level, 8, idx, merkle.HASH_SIZE, h)


def root(session: Session, log_id: str, size: int) -> bytes:
    """The RFC 9162 root of the first ``size`` leaves of log ``log_id``."""
    nodes = load_nodes(session, log_id, merkle.frontier_coords(size))
    return merkle.root_from_nodes(size, nodes)


def inclusion_proof(session: Session, log_id: str, index: int, size: int) -> list[bytes]:
    """The RFC 9162 inclusion proof of leaf ``index`` in the tree of ``size`` leaves."""
    nodes = load_nodes(session, log_id, merkle.inclusion_proof_coords(index, size))
    return merkle.inclusion_proof(index, size, nodes)


def consistency_proof(session: Session, log_id: str, size1: int, size2: int) -> list[bytes]:
    """The RFC 9162 consistency proof between trees of ``size1`` and ``size2`` leaves."""
    nodes = load_nodes(session, log_id, merkle.consistency_proof_coords(size1, size2))
    return merkle.consistency_proof(size1, size2, nodes)
