"""Verification reads a log in aligned chunks and compares each chunk's stored nodes.

``ledger.verify.verify_log`` never holds the whole tree: it compares the nodes of levels
0..k inside each chunk of 2**k entries as it goes, then the few nodes above, and keeps
only the nodes the signed roots read. With small chunks (k = 0..3) on a 37-entry log
signed at four sizes, every stored node is inside, on the edge of, or above a chunk;
these tests hold that the chunked check accepts exactly the untouched log, with the
roots the whole-tree reading gives, and names exactly the node that was changed,
removed or added.

The log is one written when every node was stored (``tests/ledger/legacy_nodes.py``):
appends now store only the nodes of height ``ledger.tree.STORED_FROM`` and up, which a
37-entry log has none of, so these are the low nodes such a ledger still holds, and
``tests/ledger/test_thin_nodes_db.py`` holds the same for the stored ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ledger import merkle
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

LEVELS = (0, 1, 2, 3, 14)


@pytest.fixture
def signed_log(engine: Engine, owner_engine: Engine) -> tuple[Verifier, list[bytes]]:
    """Log C-1: a contract entry and 36 records, signed at sizes 1, 8, 20 and 37, with
    every node of its tree stored (as it was written before nodes were thinned out)."""
    key, _ = generate_signer("test.example/log")
    signer = Signer.from_text(key)
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
        sign_all(s, signer, "test.example/log")
    records = [f.job_started()] + [
        f.rec("job_progress", at=f.later(k + 1), job_id="j1", step=k, step_seconds=1.0)
        for k in range(35)
    ]
    for lo, hi in ((0, 7), (7, 19), (19, 36)):
        recs, errors = parse_jsonl(f.jsonl(records[lo:hi]))
        assert not errors
        with unit_of_work(engine) as s:
            ingest(s, recs)
            sign_all(s, signer, "test.example/log")
    with engine.connect() as c:
        leaves = [
            bytes(h)
            for h in c.execute(
                text("SELECT leaf_hash FROM journal_entries WHERE log_id = 'C-1' ORDER BY seq")
            ).scalars()
        ]
    assert len(leaves) == 37
    assert store_low_nodes(owner_engine, "C-1") == 71
    return Verifier.from_text(signer.verifier_text()), leaves


@pytest.fixture
def tamper(owner_engine: Engine) -> Iterator[Session]:
    """A superuser's session with the nodes' append-only trigger off; rolled back after."""
    with Session(owner_engine) as s:
        s.execute(text("ALTER TABLE merkle_nodes DISABLE TRIGGER merkle_nodes_append_only"))
        yield s
        s.rollback()


def _verify(session: Session, verifier: Verifier | None, level: int) -> VerifyReport:
    report = VerifyReport()
    verify_log(session, "C-1", 37, verifier, report, chunk_level=level)
    return report


def _nodes(session: Session) -> list[tuple[int, int]]:
    return [
        (int(lv), int(ix))
        for lv, ix in session.execute(
            text("SELECT level, idx FROM merkle_nodes WHERE log_id = 'C-1' ORDER BY 1, 2")
        )
    ]


def test_every_chunk_size_accepts_the_log_with_the_true_root(engine, signed_log) -> None:
    verifier, leaves = signed_log
    for level in LEVELS:
        with Session(engine) as s:
            report = _verify(s, verifier, level)
        assert report.entries == 37 and report.checkpoints == 4
        assert report.nodes == 37 + 18 + 9 + 4 + 2 + 1  # every perfect node of 37 leaves
        assert report.roots["C-1"] == merkle.reference_root(leaves).hex()


#: Nodes on every side of the chunks' edges (chunks of 1, 4 and 8 entries) and all above.
_CHANGED = [(0, i) for i in (0, 3, 4, 7, 8, 31, 32, 36)] + [(1, i) for i in (0, 1, 2, 3, 4, 17)]


def test_each_changed_node_is_the_one_named(signed_log, tamper) -> None:
    verifier, _ = signed_log
    nodes = _nodes(tamper)
    assert len(nodes) == 71
    for lv, ix in _CHANGED + [n for n in nodes if n[0] >= 2]:
        tamper.execute(text("SAVEPOINT t"))
        tamper.execute(
            text(
                "UPDATE merkle_nodes SET hash = sha256(hash) "
                "WHERE log_id = 'C-1' AND level = :lv AND idx = :ix"
            ),
            {"lv": lv, "ix": ix},
        )
        for level in (0, 2, 3, 14):
            with pytest.raises(VerificationFailed) as exc:
                _verify(tamper, verifier, level)
            assert f"stored Merkle node (level {lv}, index {ix})" in str(exc.value), level
            assert exc.value.seq == ix << lv
        tamper.execute(text("ROLLBACK TO SAVEPOINT t"))


_REMOVED_OR_ADDED = [
    ("DELETE FROM merkle_nodes WHERE log_id = 'C-1' AND level = 1 AND idx = 9", (1, 9)),
    ("DELETE FROM merkle_nodes WHERE log_id = 'C-1' AND level = 5 AND idx = 0", (5, 0)),
    # Nodes no tree of 37 leaves has: past its edge, at a level above, below zero.
    ("INSERT INTO merkle_nodes VALUES ('C-1', 0, 37, sha256('x'))", (0, 37)),
    ("INSERT INTO merkle_nodes VALUES ('C-1', 2, 9, sha256('x'))", (2, 9)),
    ("INSERT INTO merkle_nodes VALUES ('C-1', 6, 0, sha256('x'))", (6, 0)),
    ("INSERT INTO merkle_nodes VALUES ('C-1', 0, -1, sha256('x'))", (0, -1)),
    ("INSERT INTO merkle_nodes VALUES ('C-1', -1, 0, sha256('x'))", (-1, 0)),
]


def test_a_missing_or_an_added_node_is_named(signed_log, tamper) -> None:
    verifier, _ = signed_log
    for sql, (lv, ix) in _REMOVED_OR_ADDED:
        tamper.execute(text("SAVEPOINT t"))
        tamper.execute(text(sql))
        for level in LEVELS:
            with pytest.raises(VerificationFailed) as exc:
                _verify(tamper, verifier, level)
            assert f"stored Merkle node (level {lv}, index {ix})" in str(exc.value), sql
        tamper.execute(text("ROLLBACK TO SAVEPOINT t"))
