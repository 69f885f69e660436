"""The Merkle tree of each log, kept in ``merkle_nodes`` as perfect-subtree hashes.

Appending, computing a root and building a proof each read only the O(log n)
nodes they need (one query), never the whole log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy.orm import Session

from ledger import merkle
from ledger.bulk import copy_binary, text_field
from ledger.errors import InvariantBroken, LogInconsistent

#: The Merkle nodes' COPY columns and their types (see :func:`node_rows`).
NODE_COLUMNS = ("log_id", "level", "idx", "hash")
NODE_TYPES = ("text", "int2", "int8", "bytea")
_NODE_FIELDS = struct.Struct(">ihiqi32s")

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


def load_nodes(
    session: Session, log_id: str, coords: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """Fetch the nodes at ``coords`` of log ``log_id`` in one query; missing nodes are an error."""
    wanted = sorted(set(coords))
    if not wanted:
        return {}
    conn = session.connection().connection.driver_connection
    if conn is None:
        raise InvariantBroken("the session's database connection is closed")
    with conn.cursor(binary=True) as cur:
        cur.execute(
            _LOAD_NODES_SQL, ([lv for lv, _ in wanted], [ix for _, ix in wanted], log_id)
        )
        found = {(level, idx): bytes(h) for level, idx, h in cur.fetchall()}
    missing = [c for c in wanted if c not in found]
    if missing:
        raise LogInconsistent(log_id, f"Merkle nodes (level, index) {missing[:5]} are missing "
                              "(its recorded size is past its tree)")
    return found


def append_leaves(
    session: Session, log_id: str, old_size: int, leaf_hashes: Sequence[bytes]
) -> None:
    """Store the nodes created by appending ``leaf_hashes`` to a log of ``old_size`` leaves."""
    if not leaf_hashes:
        return
    frontier = load_nodes(session, log_id, merkle.frontier_coords(old_size))
    nodes = merkle.appended_nodes(old_size, frontier, leaf_hashes)
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
