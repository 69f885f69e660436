"""The idempotency probe never turns into a scan of the journal.

`yoco ledger ingest` looks up every event id of a file in the journal before it appends.
Written as ``event_id = ANY(%s::text::uuid[])``, that lookup's plan followed the
statistics: once they said the ids were a sizeable part of the journal, the planner
chose a sequential scan that re-parsed the whole id list for every row (a 28,040-line
file after ``yoco demo`` sat for 19 minutes). These tests take the plan of the exact
statement the code runs (:data:`ledger.ingest.EXISTING_SQL`, under
:func:`ledger.bulk.index_probes`), as the CLI's login, for 1, 10,000 and 100,000 ids
against an empty, a small and a larger journal, each freshly ANALYZEd, and require the
unique index on ``event_id`` every time; and they ingest the reported case end to end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from billing.projections import FAILURE_TIMES
from ledger import bulk
from ledger.bulk import uuid_array
from ledger.contracts import add_contracts
from ledger.ingest import (
    EXISTING_SQL,
    FileBatch,
    RecordBatch,
    existing_leaves,
    ingest_batch,
    ingest_stream,
)
from ledger.projections import FAILURES_BY_ID
from ledger.records import parse_contracts
from tests import factories as f
from yoco.app import extra_projectors
from yoco.database import make_engine, unit_of_work
from yoco.simulate import StreamConfig, simulate

INDEX = "uq_journal_entries_event_id"
#: Synthetic journal rows, written by the owner in one statement: the plan depends on
#: the journal's size and statistics, not on what the entries say.
FILL = text(
    """
    INSERT INTO journal_entries (log_id, seq, event_id, kind, contract_id, occurred_at,
                                 canonical, leaf_hash)
    SELECT 'PLAN-1', g, gen_random_uuid(), 'job_progress', 'PLAN-1', now(),
           convert_to('{"n":' || g || '}', 'UTF8'), sha256(int8send(g))
    FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g
    """
)


@pytest.fixture
def owner(owner_url: str) -> Iterator[Engine]:
    """The owner role (no SET ROLE): it may write the journal rows the plans are taken on."""
    eng = make_engine(owner_url, app_role=False)
    yield eng
    eng.dispose()


def _grow(owner: Engine, size: int) -> list[str]:
    """Grow the journal to ``size`` rows, ANALYZE it; return some stored event ids."""
    with owner.begin() as c:
        c.execute(text("INSERT INTO ledger_logs (log_id) VALUES ('PLAN-1') ON CONFLICT DO NOTHING"))
        have = c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one()
        if size > have:
            c.execute(FILL, {"lo": have, "hi": size - 1})
            # the log's size follows its journal (migration 0021 checks it at commit)
            c.execute(text("UPDATE ledger_logs SET size = :n WHERE log_id = 'PLAN-1'"),
                      {"n": size})
        stored = c.execute(
            text("SELECT event_id::text FROM journal_entries ORDER BY seq DESC LIMIT 5000")
        ).scalars()
        ids = list(stored)
    # Statistics that say how big the journal is: what made the old plan flip.
    with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("ANALYZE journal_entries"))
    return ids


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _probe_plan(
    session: Session, ids: list[str], sql: str = EXISTING_SQL
) -> list[dict[str, Any]]:
    """The plan nodes of a probe as the code runs it, and the settings put back after."""
    conn = session.connection().connection.driver_connection
    assert conn is not None
    with conn.cursor() as cur:
        with bulk.index_probes(cur):
            cur.execute("EXPLAIN (FORMAT JSON) " + sql, (uuid_array(ids),))
            (doc,) = cur.fetchone()
        cur.execute("SHOW enable_seqscan")
        assert cur.fetchone() == ("on",), "index_probes must restore the planner's settings"
    plan = doc[0]["Plan"] if isinstance(doc, list) else json.loads(doc)[0]["Plan"]
    return list(_nodes(plan))


@pytest.mark.parametrize("journal", [0, 20_000, 150_000], ids=["empty", "small", "large"])
def test_the_probe_uses_the_unique_index_whatever_the_statistics(
    engine: Engine, owner: Engine, journal: int
) -> None:
    stored = _grow(owner, journal)
    for count in (1, 10_000, 100_000):
        # Half of the ids (up to 5,000) are in the journal, the rest are new.
        hits = stored[: min(len(stored), count // 2)]
        ids = hits + [str(uuid.uuid4()) for _ in range(count - len(hits))]
        with Session(engine) as s, s.begin():
            nodes = _probe_plan(s, ids)
            scans = [n for n in nodes if n.get("Relation Name") == "journal_entries"]
            assert scans, nodes
            for n in scans:
                assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (journal, count, n)
                assert n["Index Name"] == INDEX, (journal, count, n)
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], (journal, count)
            # And the probe finds exactly the stored ones.
            assert set(existing_leaves(s, ids)) == set(hits)
            # The projections' lookups of failures by id go the same way.
            for sql in (FAILURES_BY_ID, FAILURE_TIMES):
                nodes = _probe_plan(s, ids, sql)
                assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], (sql, count)
                assert [
                    n for n in nodes
                    if n.get("Relation Name") == "failures" and "Index" in n["Node Type"]
                ], (sql, nodes)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _jsonl(records: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    return path


def _simulated(contract_id: str, count: int, seed: int) -> list[dict[str, Any]]:
    """The first ``count`` records of a simulated stream (in time order: references kept)."""
    config = StreamConfig(
        contract_id=contract_id, start=T0, end=T0 + timedelta(days=90),
        records=count * 2, seed=seed, parallel_jobs=8,
    )
    records = list(islice(simulate(config), count))
    assert len(records) == count
    return records


def test_a_second_load_larger_than_half_the_ledger_completes(
    engine: Engine, owner: Engine, tmp_path: Path
) -> None:
    """The reported case: a 28,040-line file after 22,624 entries (``yoco demo``'s size)."""
    specs, errors = parse_contracts(
        f.jsonl([f.contract("DEMO-1", start_date="2026-01-01"), f.contract("NEW-1")])
    )
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    first = _simulated("DEMO-1", 22_624, 7)
    unit = lambda: unit_of_work(engine)  # noqa: E731
    projectors = extra_projectors()
    for _ in ingest_stream(unit, [RecordBatch(first)], projectors, workers=0):
        pass
    # ANALYZE as autovacuum would have by now: the statistics that flipped the old plan.
    with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("ANALYZE journal_entries"))
        before = c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one()

    second = _simulated("NEW-1", 28_040, 8)
    path = _jsonl(second, tmp_path / "second.jsonl")
    result = ingest_batch(unit, FileBatch(path), projectors)
    assert result.appended == len(second) and result.duplicates == 0
    with engine.connect() as c:
        after = c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one()
    assert after == before + len(second)
    ids = [r["event_id"] for r in second]
    with Session(engine) as s, s.begin():
        assert set(existing_leaves(s, ids)) == set(ids)
    # The same file again: every line found by the probe, nothing appended.
    again = ingest_batch(unit, FileBatch(path), projectors)
    assert (again.appended, again.duplicates) == (0, len(second))
