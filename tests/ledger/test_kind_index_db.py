"""Migration 0020: the journal's (contract, kind, time) index leaves job_progress out.

Upgrade and downgrade both ways; the index still serves the lookups it exists for (the
replay of the projected kinds, a contract's entries of one kind) and holds no progress
entry.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import create_engine, text

import migrations
from ledger.contracts import add_contracts
from ledger.ingest import ingest
from ledger.projections import KINDS
from ledger.records import parse_contracts, parse_jsonl
from tests import factories as f
from yoco.database import unit_of_work

INDEX = "ix_journal_entries_contract_id_kind_occurred_at"


def _definition(url: str) -> str:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return str(
                c.execute(
                    text("SELECT indexdef FROM pg_indexes WHERE indexname = :i"), {"i": INDEX}
                ).scalar_one()
            )
    finally:
        eng.dispose()


def test_migration_0020_upgrades_and_downgrades(empty_db_url: str) -> None:
    migrations.upgrade(empty_db_url, "0019")
    assert "WHERE" not in _definition(empty_db_url)
    migrations.upgrade(empty_db_url, "0020")
    assert _definition(empty_db_url).endswith("WHERE (kind <> 'job_progress'::text)")
    migrations.downgrade(empty_db_url, "0019")
    assert "WHERE" not in _definition(empty_db_url)
    migrations.upgrade(empty_db_url)
    assert "WHERE (kind <> 'job_progress'::text)" in _definition(empty_db_url)


def test_the_index_serves_the_rare_kinds_and_leaves_progress_out(
    engine, owner_engine
) -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    progress = [
        f.rec("job_progress", at=f.later(k + 1), job_id="j1", step=k, step_seconds=1.0)
        for k in range(300)
    ]
    recs, errors = parse_jsonl(f.jsonl([f.job_started(), *progress, f.failure(at=f.later(400))]))
    assert not errors
    with unit_of_work(engine) as s:
        ingest(s, recs)
    with owner_engine.begin() as c:
        c.execute(text("ANALYZE journal_entries"))
        # Small tables: make the planner say whether it can use the index at all.
        c.execute(text("SET LOCAL enable_seqscan = off"))
        wanted = ", ".join(f"'{k}'" for k in sorted(KINDS))
        for sql in (
            f"SELECT kind FROM journal_entries WHERE kind IN ({wanted})",
            "SELECT kind FROM journal_entries WHERE contract_id = 'C-1' AND kind = 'failure' "
            f"AND occurred_at > '{(f.T0 - timedelta(days=1)).isoformat()}'",
        ):
            plan = "\n".join(c.execute(text(f"EXPLAIN {sql}")).scalars())
            assert INDEX in plan, plan
        size = c.execute(text("SELECT pg_relation_size(:i)"), {"i": INDEX}).scalar_one()
        pkey = c.execute(text("SELECT pg_relation_size('pk_journal_entries')")).scalar_one()
    # 3 entries indexed (the contract, the job_started, the failure) against 303 in the
    # primary key: one page of leaf tuples, not the primary key's several.
    assert size < pkey
