"""Only the Merkle nodes of height ``ledger.tree.STORED_FROM`` and up are stored.

An append writes the nodes its entries complete from that height up (one row in 128
entries, against about two a leaf when every node was stored); a lower node is
recomputed from the journal's leaf hashes of its aligned block when a root, a proof or
the next append reads it. These tests hold, on a real PostgreSQL as the CLI's login:

* which nodes a log grown in appends of every shape holds (exactly every perfect node of
  height ``STORED_FROM`` and up, nothing lower);
* that roots, inclusion and consistency proofs at sizes on both sides of a block's edge
  are the reference computation's;
* that a log written when every node was stored (its low nodes still there) verifies,
  gives the same roots and proofs, and that a changed or removed low node of such a log
  is named by ``yoco ledger verify``, as is a stored node of either kind of log.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ledger import merkle, tiles, tree
from ledger.checkpoints import sign_all
from ledger.contracts import add_contracts
from ledger.errors import VerificationFailed
from ledger.ingest import ingest
from ledger.note import Signer, Verifier, generate_signer
from ledger.records import parse_contracts, parse_jsonl
from ledger.verify import VerifyReport, verify_log
from tests import factories as f
from tests.ledger.legacy_nodes import store_low_nodes
from yoco.database import unit_of_work

W = 1 << tree.STORED_FROM
#: Appends of every shape: one entry, up to just before a block's edge, across it, more
#: than a block at once, the rest. With the contract's entry: 2·W + 90 entries.
APPENDS = (1, W - 3, 3, W + 40, 45)
SIZE = 1 + sum(APPENDS)


@pytest.fixture
def grown_log(engine: Engine) -> tuple[Verifier, list[bytes]]:
    """Log C-1 appended in the :data:`APPENDS`, each its own transaction (the last two in
    one), signed after each; returns the verifier and the leaf hashes."""
    key, _ = generate_signer("test.example/log")
    signer = Signer.from_text(key)
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
        sign_all(s, signer, "test.example/log")
    records = [f.job_started()] + [
        f.rec("job_progress", at=f.later(k + 1), job_id="j1", step=k, step_seconds=1.0)
        for k in range(sum(APPENDS) - 1)
    ]
    at = 0
    batches = [records[at : (at := at + n)] for n in APPENDS]
    for group in (batches[:1], batches[1:2], batches[2:3], batches[3:]):
        with unit_of_work(engine) as s:
            for batch in group:
                recs, errors = parse_jsonl(f.jsonl(batch))
                assert not errors
                ingest(s, recs)
            sign_all(s, signer, "test.example/log")
    with engine.connect() as c:
        leaves = [
            bytes(h)
            for h in c.execute(
                text("SELECT leaf_hash FROM journal_entries WHERE log_id = 'C-1' ORDER BY seq")
            ).scalars()
        ]
    assert len(leaves) == SIZE
    return Verifier.from_text(signer.verifier_text()), leaves


@pytest.fixture
def tamper(owner_engine: Engine) -> Iterator[Session]:
    """A superuser's session with the nodes' append-only trigger off; rolled back after."""
    with Session(owner_engine) as s:
        s.execute(text("ALTER TABLE merkle_nodes DISABLE TRIGGER merkle_nodes_append_only"))
        yield s
        s.rollback()


def _stored(session: Session) -> set[tuple[int, int]]:
    return {
        (int(lv), int(ix))
        for lv, ix in session.execute(
            text("SELECT level, idx FROM merkle_nodes WHERE log_id = 'C-1'")
        )
    }


def _verify(session: Session, verifier: Verifier, chunk_level: int) -> VerifyReport:
    report = VerifyReport()
    verify_log(session, "C-1", SIZE, verifier, report, chunk_level=chunk_level)
    return report


def test_appends_store_exactly_the_nodes_from_the_stored_height_up(engine, grown_log) -> None:
    _, leaves = grown_log
    levels = tiles.compute_levels(leaves)
    want = {
        (level, idx)
        for level in range(tree.STORED_FROM, len(levels))
        for idx in range(len(levels[level]))
    }
    assert want  # the log is long enough to have some
    with Session(engine) as s:
        assert _stored(s) == want
        found = tree.load_nodes(s, "C-1", sorted(want))
    assert found == {(lv, ix): levels[lv][ix] for lv, ix in want}


#: Sizes on both sides of the blocks' edges, and the whole log.
SIZES = (1, 2, 3, W - 1, W, W + 1, 2 * W - 1, 2 * W, 2 * W + 1, SIZE)


def test_roots_and_proofs_are_the_reference_ones_near_every_block_edge(engine, grown_log) -> None:
    _, leaves = grown_log
    with Session(engine) as s:
        for size in SIZES:
            assert tree.root(s, "C-1", size) == merkle.reference_root(leaves[:size]), size
            for index in {0, size // 2, max(size - W, 0), size - 2, size - 1} - {-1}:
                assert tree.inclusion_proof(s, "C-1", index, size) == (
                    merkle.reference_inclusion_proof(index, leaves[:size])
                ), (index, size)
            for old in {1, size // 3 or 1, W - 1, W, W + 1, size - 1, size}:
                if 0 < old <= size:
                    assert tree.consistency_proof(s, "C-1", old, size) == (
                        merkle.reference_consistency_proof(old, leaves[:size])
                    ), (old, size)


@pytest.mark.parametrize("chunk_level", [0, 3, tree.STORED_FROM, 14])
def test_the_thin_log_verifies_and_a_changed_stored_node_is_named(
    grown_log, tamper, chunk_level
) -> None:
    verifier, leaves = grown_log
    report = _verify(tamper, verifier, chunk_level)
    assert report.entries == SIZE and report.checkpoints == 5
    assert report.nodes == len(_stored(tamper)) == 2 + 1
    assert report.roots["C-1"] == merkle.reference_root(leaves).hex()
    for lv, ix in sorted(_stored(tamper)):
        tamper.execute(text("SAVEPOINT t"))
        tamper.execute(
            text("UPDATE merkle_nodes SET hash = sha256(hash) WHERE log_id = 'C-1' "
                 "AND level = :lv AND idx = :ix"),
            {"lv": lv, "ix": ix},
        )
        with pytest.raises(VerificationFailed) as exc:
            _verify(tamper, verifier, chunk_level)
        assert f"stored Merkle node (level {lv}, index {ix})" in str(exc.value)
        tamper.execute(text("ROLLBACK TO SAVEPOINT t"))
    # A stored node removed, and a low node where a thin log has none.
    for sql, (lv, ix) in (
        (f"DELETE FROM merkle_nodes WHERE log_id = 'C-1' AND level = {tree.STORED_FROM} "
         "AND idx = 1", (tree.STORED_FROM, 1)),
        ("INSERT INTO merkle_nodes VALUES ('C-1', 0, 0, sha256('x'))", (0, 0)),
    ):
        tamper.execute(text("SAVEPOINT t"))
        tamper.execute(text(sql))
        with pytest.raises(VerificationFailed) as exc:
            _verify(tamper, verifier, chunk_level)
        assert f"stored Merkle node (level {lv}, index {ix})" in str(exc.value), sql
        tamper.execute(text("ROLLBACK TO SAVEPOINT t"))


#: Where the code that stored every node stopped: inside the second block.
UPGRADED_AT = W + 37


@pytest.mark.parametrize("chunk_level", [0, 3, tree.STORED_FROM, 14])
def test_a_log_written_with_every_node_verifies_proves_and_names_a_changed_low_node(
    engine, owner_engine, grown_log, chunk_level
) -> None:
    verifier, leaves = grown_log
    with Session(engine) as s:
        thin = _stored(s)
    low = store_low_nodes(owner_engine, "C-1", UPGRADED_AT)
    with Session(engine) as s:
        for size in (W + 1, UPGRADED_AT, SIZE):
            assert tree.root(s, "C-1", size) == merkle.reference_root(leaves[:size])
            assert tree.inclusion_proof(s, "C-1", 5, size) == (
                merkle.reference_inclusion_proof(5, leaves[:size])
            )
    # (The session that turns the trigger off holds the table's lock until it ends.)
    with Session(owner_engine) as tamper:
        tamper.execute(text("ALTER TABLE merkle_nodes DISABLE TRIGGER merkle_nodes_append_only"))
        _check_legacy(tamper, verifier, leaves, thin, low, chunk_level)
        tamper.rollback()


def _check_legacy(
    tamper: Session,
    verifier: Verifier,
    leaves: list[bytes],
    thin: set[tuple[int, int]],
    low: int,
    chunk_level: int,
) -> None:
    levels = tiles.compute_levels(leaves[:UPGRADED_AT])
    assert low == sum(len(levels[h]) for h in range(min(tree.STORED_FROM, len(levels))))
    report = _verify(tamper, verifier, chunk_level)
    assert report.nodes == len(thin) + low
    assert report.roots["C-1"] == merkle.reference_root(leaves).hex()
    for sql, (lv, ix) in (
        ("UPDATE merkle_nodes SET hash = sha256(hash) WHERE log_id = 'C-1' AND level = 0 "
         "AND idx = 7", (0, 7)),
        ("UPDATE merkle_nodes SET hash = sha256(hash) WHERE log_id = 'C-1' AND level = 3 "
         f"AND idx = {UPGRADED_AT // 8 - 1}", (3, UPGRADED_AT // 8 - 1)),
        ("DELETE FROM merkle_nodes WHERE log_id = 'C-1' AND level = 1 AND idx = 9", (1, 9)),
        # The last one of its level: the count of leaf nodes says it must be there.
        ("DELETE FROM merkle_nodes WHERE log_id = 'C-1' AND level = 5 "
         f"AND idx = {UPGRADED_AT // 32 - 1}", (5, UPGRADED_AT // 32 - 1)),
    ):
        tamper.execute(text("SAVEPOINT t"))
        tamper.execute(text(sql))
        with pytest.raises(VerificationFailed) as exc:
            _verify(tamper, verifier, chunk_level)
        assert f"stored Merkle node (level {lv}, index {ix})" in str(exc.value), sql
        tamper.execute(text("ROLLBACK TO SAVEPOINT t"))
