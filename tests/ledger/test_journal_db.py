"""The journal on a real PostgreSQL: migrations, append-only, idempotent ingest, tamper evidence."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import migrations
from ledger import merkle, projections, tree
from ledger.checkpoints import sign_all
from ledger.contracts import add_contracts
from ledger.errors import CheckpointRefused, IngestRefused, VerificationFailed
from ledger.ingest import ingest, line_locator
from ledger.models import Base, JournalEntry, LedgerLog
from ledger.note import Signer, Verifier, generate_signer
from ledger.records import parse_contracts, parse_jsonl
from ledger.verify import verify_all
from tests import factories as f
from yoco.database import make_engine, unit_of_work


def _setup_contracts(engine, *cids: str) -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract(c) for c in cids]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)


def _ingest(engine, records) -> object:
    recs, errors = parse_jsonl(f.jsonl(records))
    assert not errors, errors
    with unit_of_work(engine) as s:
        return ingest(s, recs, line_locator([r.line for r in recs]))


def _count(engine, table: str = "journal_entries") -> int:
    with engine.connect() as c:
        return c.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


@pytest.fixture
def signer() -> Signer:
    key, _ = generate_signer("test.example/log")
    return Signer.from_text(key)


def test_migrations_upgrade_downgrade_upgrade_without_drift(empty_db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    migrations.upgrade(empty_db_url)
    assert migrations.current(empty_db_url) == migrations.head_revision()
    migrations.downgrade(empty_db_url, "base")
    assert migrations.current(empty_db_url) is None
    eng = create_engine(empty_db_url)
    with eng.connect() as c:
        tables = c.execute(
            text(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            )
        ).scalar_one()
    assert tables == 0
    migrations.upgrade(empty_db_url)
    with eng.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    eng.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"


def test_journal_refuses_update_delete_truncate_even_for_the_owner(owner_engine, engine) -> None:
    _setup_contracts(engine, "C-1")
    for sql in (
        "UPDATE journal_entries SET kind = 'x'",
        "DELETE FROM journal_entries",
        "TRUNCATE journal_entries CASCADE",
        "UPDATE merkle_nodes SET hash = '\\x00'",
        "DELETE FROM checkpoints",
    ):
        with owner_engine.begin() as c:
            # A replica role skips ordinary triggers; ours are enabled ALWAYS.
            c.execute(text("SET session_replication_role = replica"))
            with pytest.raises(DBAPIError, match="append-only"):
                c.execute(text(sql))
    assert _count(engine) == 1


def test_application_role_may_only_insert_and_select_the_journal(engine) -> None:
    _setup_contracts(engine, "C-1")
    with engine.connect() as c:
        assert c.execute(text("SELECT current_user")).scalar() == "yoco_app"
    for sql in (
        "UPDATE journal_entries SET kind = 'x'",
        "DELETE FROM journal_entries",
        "ALTER TABLE journal_entries DISABLE TRIGGER ALL",
    ):
        with (
            engine.begin() as c,
            pytest.raises(DBAPIError, match=r"permission denied|must be owner"),
        ):
            c.execute(text(sql))


def test_ingest_is_idempotent_and_refuses_a_reused_event_id(engine) -> None:
    _setup_contracts(engine, "C-1")
    started = f.job_started()
    fail = f.failure(at=f.later(10))
    out = f.outcome(fail["event_id"], at=f.later(11))
    first = _ingest(engine, [started, fail, out])
    assert first.appended == 3 and first.duplicates == 0
    again = _ingest(engine, [started, fail, out])
    assert again.appended == 0 and again.duplicates == 3
    assert _count(engine) == 4  # the contract entry and the three records

    changed = dict(fail, cause="thermal")
    with pytest.raises(IngestRefused) as exc:
        _ingest(engine, [f.job_started(job="j2"), changed])
    err = exc.value.errors[0]
    assert err.line == 2 and err.field == "event_id" and "different content" in err.message
    assert _count(engine) == 4


@pytest.mark.parametrize(
    ("make", "line", "field", "text_"),
    [
        (
            lambda: [
                f.job_started(),
                f.rec(
                    "failure", cid="NOPE", job_id="j", failure_class="unplanned", cause="gpu_lost"
                ),
            ],
            2,
            "contract_id",
            "unknown contract",
        ),
        (
            lambda: [f.job_started(), f.outcome(str(uuid.uuid4()), at=f.later(1))],
            2,
            "failure_event_id",
            "unknown failure",
        ),
        (lambda: [f.rec("job_finished", job_id="never", step=3)], 1, "job_id", "not running"),
        (lambda: [f.job_started(), f.job_started(at=f.later(5))], 2, "job_id", "already running"),
    ],
)
def test_a_batch_with_a_refused_record_writes_nothing(engine, make, line, field, text_) -> None:
    _setup_contracts(engine, "C-1")
    before = {
        t: _count(engine, t) for t in ("journal_entries", "merkle_nodes", "job_spans", "failures")
    }
    with pytest.raises(IngestRefused) as exc:
        _ingest(engine, make())
    errors = exc.value.errors
    assert [(e.line, e.field) for e in errors] == [(line, field)]
    assert text_ in errors[0].message
    after = {t: _count(engine, t) for t in before}
    assert after == before
    with engine.connect() as c:
        assert c.execute(text("SELECT size FROM ledger_logs WHERE log_id = 'C-1'")).scalar() == 1


def test_an_outcome_may_not_name_another_contracts_failure(engine) -> None:
    _setup_contracts(engine, "C-1", "C-2")
    fail = f.failure()
    _ingest(engine, [fail])
    with pytest.raises(IngestRefused) as exc:
        _ingest(engine, [f.outcome(fail["event_id"], cid="C-2", at=f.later(2))])
    assert exc.value.errors[0].field == "failure_event_id"


def test_eight_concurrent_writers_leave_no_gap_and_no_fork(engine, app_url, signer) -> None:
    _setup_contracts(engine, "C-1", "C-2")
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        eng = make_engine(app_url)
        try:
            barrier.wait()
            for batch in range(5):
                cid = "C-1" if (n + batch) % 3 else "C-2"
                recs = [
                    f.failure(cid=cid, job=f"w{n}", at=f.later(n * 100 + batch * 10 + i))
                    for i in range(20)
                ]
                _ingest(eng, recs)
        except BaseException as exc:
            errors.append(exc)
        finally:
            eng.dispose()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with Session(engine) as s:
        for log_id, size in s.execute(select(LedgerLog.log_id, LedgerLog.size)).all():
            seqs = (
                s.execute(
                    select(JournalEntry.seq)
                    .where(JournalEntry.log_id == log_id)
                    .order_by(JournalEntry.seq)
                )
                .scalars()
                .all()
            )
            assert seqs == list(range(size))
        assert s.execute(select(func.sum(LedgerLog.size))).scalar() == 2 + 8 * 5 * 20
        sign_all(s, signer, "test.example/log")
        s.commit()
        report = verify_all(s, Verifier.from_text(signer.verifier_text()))
    assert report.entries == 802


def _tamper(owner_engine, table: str, sql: str) -> None:
    with owner_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {table} DISABLE TRIGGER {table}_append_only"))
        c.execute(text(sql))
        c.execute(text(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_append_only"))


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        # An edited queryable column: the hash still matches the bytes, but the column lies.
        (
            "UPDATE journal_entries SET occurred_at = occurred_at + interval '1 year' WHERE seq = 3",
            "columns",
        ),
        # Edited bytes: the leaf hash no longer matches.
        (
            "UPDATE journal_entries SET canonical = convert_to(replace(convert_from(canonical, 'UTF8'), 'gpu_lost', 'thermal'), 'UTF8') WHERE seq = 3",
            "leaf hash",
        ),
        # Bytes and leaf hash both rewritten: the signed root no longer matches (a log of
        # 7 entries has no stored node: those start at height tree.STORED_FROM).
        (
            "UPDATE journal_entries SET canonical = convert_to(replace(convert_from(canonical, 'UTF8'), 'gpu_lost', 'thermal'), 'UTF8'), "
            "leaf_hash = sha256('\\x00'::bytea || convert_to(replace(convert_from(canonical, 'UTF8'), 'gpu_lost', 'thermal'), 'UTF8')) "
            "WHERE seq = 3",
            "no longer hash to the root signed at size 7",
        ),
    ],
)
def test_verify_names_the_first_edited_entry(engine, owner_engine, signer, sql, needle) -> None:
    _setup_contracts(engine, "C-1")
    recs = [f.failure(at=f.later(i)) for i in range(6)]
    _ingest(engine, recs)
    verifier = Verifier.from_text(signer.verifier_text())
    with unit_of_work(engine) as s:
        sign_all(s, signer, "test.example/log")
    with Session(engine) as s:
        verify_all(s, verifier)
    _tamper(owner_engine, "journal_entries", sql + " AND log_id = 'C-1'")
    with Session(engine) as s, pytest.raises(VerificationFailed) as exc:
        verify_all(s, verifier)
    assert needle in str(exc.value)
    if "root" not in needle:
        assert exc.value.seq == 3
        assert exc.value.event_id == recs[2]["event_id"]


@pytest.mark.parametrize(
    ("entries", "table", "sql"),
    [
        # Below height tree.STORED_FROM the tree is the journal's leaf hashes.
        (4, "journal_entries", "UPDATE journal_entries SET leaf_hash = sha256('evil') WHERE seq = 2"),
        # A stored node (the first full tile's).
        (
            1 << tree.STORED_FROM,
            "merkle_nodes",
            f"UPDATE merkle_nodes SET hash = sha256('evil') WHERE level = {tree.STORED_FROM} "
            "AND idx = 0",
        ),
    ],
    ids=["leaf-hash", "stored-node"],
)
def test_a_tampered_tree_is_not_signed_again(
    engine, owner_engine, signer, entries, table, sql
) -> None:
    _setup_contracts(engine, "C-1")
    _ingest(engine, [f.failure(at=f.later(i)) for i in range(entries)])
    with unit_of_work(engine) as s:
        sign_all(s, signer, "test.example/log")
    _tamper(owner_engine, table, sql)
    _ingest(engine, [f.failure(at=f.later(entries + 10))])
    with unit_of_work(engine) as s, pytest.raises(CheckpointRefused, match="not consistent"):
        sign_all(s, signer, "test.example/log")


def test_a_checkpoint_beyond_the_log_is_detected(engine, owner_engine, signer) -> None:
    _setup_contracts(engine, "C-1")
    recs = [f.failure(at=f.later(i)) for i in range(5)]
    _ingest(engine, recs)
    with unit_of_work(engine) as s:
        sign_all(s, signer, "test.example/log")
    _tamper(owner_engine, "journal_entries", "DELETE FROM journal_entries WHERE seq = 5")
    with Session(engine) as s, pytest.raises(VerificationFailed, match="holds 5 entries"):
        verify_all(s, Verifier.from_text(signer.verifier_text()))


def test_rebuild_reproduces_the_live_projections(engine, rebuild_engine) -> None:
    _setup_contracts(engine, "C-1", "C-2")
    fails = [f.failure(cid=c, at=f.later(i)) for i, c in enumerate(["C-1", "C-2", "C-1", "C-1"])]
    _ingest(engine, [f.job_started(), f.job_started(cid="C-2"), *fails])
    _ingest(
        engine,
        [
            f.outcome(fails[0]["event_id"], "rolled_back", 40, at=f.later(30)),
            f.outcome(fails[0]["event_id"], at=f.later(40)),
            f.outcome(fails[1]["event_id"], cid="C-2", at=f.later(41)),
            f.rec(
                "exclusion",
                failure_event_id=fails[2]["event_id"],
                reason="customer bug",
                approved_by="ops",
                at=f.later(50),
            ),
            f.rec("job_finished", job_id="j1", step=100, at=f.later(60)),
            f.rec("job_started", job_id="j1", gpus=16, at=f.later(70)),
        ],
    )
    with unit_of_work(rebuild_engine) as s:
        live = projections.snapshot(s)
        n = projections.rebuild(s, batch=3)
        rebuilt = projections.snapshot(s)
    assert n == 2 + 12
    assert live == rebuilt
    assert len(live["job_spans"]) == 3 and len(live["outcomes"]) == 3


def test_tree_nodes_in_the_database_match_the_reference(engine) -> None:
    from ledger import tree

    _setup_contracts(engine, "C-1")
    for size in (1, 2, 5):
        _ingest(engine, [f.failure(at=f.later(i)) for i in range(size)])
    with Session(engine) as s:
        leaves = [
            bytes(h)
            for h in s.execute(
                select(JournalEntry.leaf_hash)
                .where(JournalEntry.log_id == "C-1")
                .order_by(JournalEntry.seq)
            ).scalars()
        ]
        assert len(leaves) == 9
        for n in range(1, 10):
            assert tree.root(s, "C-1", n) == merkle.reference_root(leaves[:n])
            for i in range(n):
                proof = tree.inclusion_proof(s, "C-1", i, n)
                merkle.verify_inclusion(i, n, leaves[i], proof, merkle.reference_root(leaves[:n]))


def test_the_queryable_body_is_generated_from_the_hashed_bytes(engine, owner_engine) -> None:
    _setup_contracts(engine, "C-1")
    _ingest(engine, [f.failure()])
    with owner_engine.begin() as c:
        c.execute(text("ALTER TABLE journal_entries DISABLE TRIGGER journal_entries_append_only"))
        with pytest.raises(DBAPIError, match=r"generated column|can only be updated to DEFAULT"):
            c.execute(text("UPDATE journal_entries SET body = '{}'::jsonb WHERE seq = 1"))
    with engine.connect() as c:
        body = c.execute(text("SELECT body FROM journal_entries WHERE seq = 1")).scalar_one()
    assert body["cause"] == "gpu_lost" and body["failure_class"] == "unplanned"
