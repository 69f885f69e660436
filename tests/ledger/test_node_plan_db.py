"""Merkle node lookups probe the primary key, whatever the statistics say.

Every append reads the frontier of its log (:func:`ledger.tree.append_leaves` through
:func:`ledger.tree.load_nodes`), and so does every root and proof. Written as a join of the
wanted coordinates against ``merkle_nodes`` on ``log_id = %s``, the lookup's plan followed
the statistics: for a log they said was small (a new customer's log, or any log grown
since the last ANALYZE) the planner read every node of the log once per lookup, so a
file's appends into one new log, chunk after chunk in one transaction, grew with the nodes
written so far. These tests take the plan of the statement the code runs, as the CLI's
login, for an empty, a small and a large log, against statistics taken before the log
grew, and require a probe of the primary key on all three columns; and they check that
the nodes found give the same roots and proofs as the reference computation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ledger import journal, merkle, tree

PK = "pk_merkle_nodes"
#: Synthetic nodes of another log, written by the owner: the statistics then describe a
#: table of many nodes in which the logs under test are (said to be) absent.
FILL = text(
    """
    INSERT INTO merkle_nodes (log_id, level, idx, hash)
    SELECT 'STATS-1', 0, g, sha256(int8send(g))
    FROM generate_series(0, CAST(:n AS bigint) - 1) AS g
    """
)


@pytest.fixture
def owner(owner_url: str) -> Iterator[Engine]:
    """The owner role (no SET ROLE): it writes the nodes the statistics are taken on."""
    from yoco.database import make_engine

    eng = make_engine(owner_url, app_role=False)
    yield eng
    eng.dispose()


def _analyze_other_log(owner: Engine, nodes: int) -> None:
    with owner.begin() as c:
        c.execute(text("INSERT INTO ledger_logs (log_id) VALUES ('STATS-1')"))
        c.execute(FILL, {"n": nodes})
    with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("ANALYZE merkle_nodes"))


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _plan_nodes(child)


def _lookup_plan(session: Session, log_id: str, coords: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The plan nodes of :func:`ledger.tree.load_nodes`'s statement for ``coords``."""
    conn = session.connection().connection.driver_connection
    assert conn is not None
    with conn.cursor() as cur:
        cur.execute(
            "EXPLAIN (FORMAT JSON) " + tree._LOAD_NODES_SQL,
            ([lv for lv, _ in coords], [ix for _, ix in coords], log_id),
        )
        (doc,) = cur.fetchone()
    plan = doc[0]["Plan"] if isinstance(doc, list) else json.loads(doc)[0]["Plan"]
    return list(_plan_nodes(plan))


def _assert_probes(nodes: list[dict[str, Any]], what: object) -> None:
    scans = [n for n in nodes if n.get("Relation Name") == "merkle_nodes"]
    assert scans, (what, nodes)
    for n in scans:
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (what, n)
        assert n["Index Name"] == PK, (what, n)
        cond = n["Index Cond"]
        # All three key columns: one node a probe, not every node of the log.
        for column in ("log_id", "level", "idx"):
            assert column in cond, (what, cond)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], what


def _leaves_plan(session: Session, log_id: str, size: int) -> list[dict[str, Any]]:
    """The plan nodes of the statement that reads the leaf hashes of the low nodes of the
    frontier of ``size`` (the last, partial block of ``2**STORED_FROM`` entries)."""
    block = size >> tree.STORED_FROM << tree.STORED_FROM
    conn = session.connection().connection.driver_connection
    assert conn is not None
    with conn.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + tree._LOAD_LEAVES_SQL, ([block], [size], log_id))
        (doc,) = cur.fetchone()
    plan = doc[0]["Plan"] if isinstance(doc, list) else json.loads(doc)[0]["Plan"]
    return list(_plan_nodes(plan))


def _assert_leaf_probes(nodes: list[dict[str, Any]], what: object) -> None:
    scans = [n for n in nodes if n.get("Relation Name") == "journal_entries"]
    assert scans, (what, nodes)
    for n in scans:
        # A range of the primary key (log_id, seq), not every entry of the log.
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (what, n)
        assert n["Index Name"] == "pk_journal_entries", (what, n)
        for column in ("log_id", "seq"):
            assert column in n["Index Cond"], (what, n["Index Cond"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], what


@pytest.mark.parametrize("grown", [0, 1_000, 40_000], ids=["empty", "small", "large"])
def test_node_lookups_probe_the_key_for_a_log_grown_since_analyze(
    engine: Engine, owner: Engine, grown: int
) -> None:
    _analyze_other_log(owner, 50_000)
    entries = journal.encode_entries(
        ("job_progress", uuid.uuid4(), "GROWN-1", None, b'{"n":%d}' % i) for i in range(grown)
    )
    leaves = entries.leaves
    with Session(engine) as s, s.begin():
        s.execute(text("INSERT INTO ledger_logs (log_id) VALUES ('GROWN-1')"))
        # Appended in chunks in one transaction, as a file's ingest does; the statistics
        # still say the log has no nodes. (The nodes below tree.STORED_FROM are
        # recomputed from the leaf hashes of the journal's rows.)
        sizes = {"GROWN-1": 0}
        for start in range(0, grown, 5_000):
            journal.append_encoded(
                s, entries.select(range(start, min(start + 5_000, grown))), sizes
            )
        size = sizes["GROWN-1"]
        for at in (size, size + 1, max(size - 1, 1)):
            coords = merkle.frontier_coords(at) or [(0, 0)]
            stored = [c for c in coords if c[0] >= tree.STORED_FROM] or [(tree.STORED_FROM, 0)]
            _assert_probes(_lookup_plan(s, "GROWN-1", stored), (grown, at))
            _assert_leaf_probes(_leaves_plan(s, "GROWN-1", at), (grown, at))
        if grown:
            assert tree.root(s, "GROWN-1", grown) == merkle.reference_root(leaves)
            for index in (0, grown // 3, grown - 1):
                assert tree.inclusion_proof(s, "GROWN-1", index, grown) == (
                    merkle.reference_inclusion_proof(index, leaves)
                )
            half = grown // 2
            assert tree.consistency_proof(s, "GROWN-1", half, grown) == (
                merkle.reference_consistency_proof(half, leaves)
            )
        s.rollback()
