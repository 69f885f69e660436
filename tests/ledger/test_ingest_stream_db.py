"""A stream of batches, validated ahead in a worker process (``ledger.ingest.ingest_stream``).

Each batch must end as :func:`ledger.ingest.ingest_batch` leaves it: the same journal,
Merkle nodes and projections, the same refusals (by index and field, nothing of the
refused batch written, every batch before it kept), idempotent by event id. The worker
only validates and encodes; these tests hold that moving that work to another process
(or keeping only the bodies the projectors read) changed nothing that is stored.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from billing.projections import KINDS as BILLING_KINDS
from billing.projections import PROJECTORS, TABLES
from ledger.contracts import add_contracts
from ledger.errors import IngestRefused
from ledger.ingest import FileBatch, RecordBatch, event_id_taken, ingest_batch, ingest_stream
from ledger.prepare import prepare_batch
from ledger.projections import KINDS, snapshot
from ledger.records import parse_contracts
from ledger.verify import verify_all
from tests import factories as f
from yoco.database import unit_of_work

T0 = datetime(2026, 2, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 1, tzinfo=UTC)
PROJECTED = KINDS | BILLING_KINDS
_peers = itertools.count()


@pytest.fixture
def peer_engine(pg_admin_url: str, template_db: str) -> Iterator[Engine]:
    """A second fresh database (as the CLI's login), to compare two ways of ingesting."""
    from yoco.database import CLI_LOGIN, login_url, make_engine

    name = f"yoco_peer_{os.getpid()}_{next(_peers)}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" OWNER yoco_owner'))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    eng = make_engine(login_url(url, CLI_LOGIN))
    try:
        yield eng
    finally:
        eng.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _contracts(*engines: Engine) -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1"), f.contract("C-2")]))
    assert not errors
    for eng in engines:
        with unit_of_work(eng) as s:
            add_contracts(s, specs)


def _stream() -> list[list[dict[str, Any]]]:
    """Four batches over two contracts, references across batches and out of order within."""
    at = [T0 + timedelta(minutes=m) for m in range(200)]
    batches: list[list[dict[str, Any]]] = []
    fails: list[dict[str, Any]] = []
    for b in range(4):
        batch: list[dict[str, Any]] = []
        for cid in ("C-1", "C-2"):
            job = f"{cid}-job{b}"
            start = f.job_started(job, cid=cid, at=at[b * 40])
            fail = f.failure(job, cid=cid, at=at[b * 40 + 5], step=50)
            fails.append(fail)
            progress = [
                f.rec("job_progress", cid, at[b * 40 + 1 + k], job_id=job, step=k * 10,
                      step_seconds=1.25)
                for k in range(8)
            ]
            # The outcome before its failure, the job's finish before its start.
            batch += [f.outcome(fail["event_id"], cid=cid, at=at[b * 40 + 6]), fail]
            batch += [f.rec("job_finished", cid, at[b * 40 + 30], job_id=job, step=99), start]
            batch += progress
        if b:
            # An outcome of the previous batch's failure: resolved in the ledger.
            old = fails[-4]
            batch.append(
                f.outcome(old["event_id"], result="rolled_back", lost=3, cid=old["contract_id"],
                          at=at[b * 40 + 20])
            )
        batches.append(batch)
    return batches


def _journal(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as c:
        return [
            tuple(r)
            for r in c.execute(
                text(
                    "SELECT log_id, seq, event_id, kind, contract_id, occurred_at, canonical, "
                    "leaf_hash, body FROM journal_entries ORDER BY log_id, seq"
                )
            )
        ]


def _nodes(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as c:
        return [
            tuple(r)
            for r in c.execute(
                text("SELECT log_id, level, idx, hash FROM merkle_nodes ORDER BY 1, 2, 3")
            )
        ]


def _projections(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with unit_of_work(engine) as s:
        return snapshot(s, TABLES)


def _size(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


@pytest.mark.slow
def test_the_stream_stores_what_one_batch_at_a_time_stores(engine, peer_engine) -> None:
    """A worker process, only the projected kinds' bodies sent back: the same ledger."""
    _contracts(engine, peer_engine)
    batches = _stream()
    results = list(
        ingest_stream(
            lambda: unit_of_work(engine),
            [RecordBatch(b, what=f"batch {i}", now=NOW) for i, b in enumerate(batches)],
            PROJECTORS,
            projected_kinds=PROJECTED,
            workers=1,
        )
    )
    expected = [
        ingest_batch(lambda: unit_of_work(peer_engine), RecordBatch(b, now=NOW), PROJECTORS)
        for b in batches
    ]
    assert [(r.appended, r.duplicates, r.by_kind) for r in results] == [
        (r.appended, r.duplicates, r.by_kind) for r in expected
    ]
    assert sum(r.appended for r in results) == sum(map(len, batches))
    assert _journal(engine) == _journal(peer_engine)
    assert _nodes(engine) == _nodes(peer_engine)
    ours, theirs = _projections(engine), _projections(peer_engine)
    assert ours == theirs
    assert len(ours["outcomes"]) == 8 + 3 and len(ours["job_spans"]) == 8
    with unit_of_work(engine) as s:
        report = verify_all(s, None, extra=PROJECTORS, extra_tables=TABLES, kinds=PROJECTED)
    assert report.entries == _size(engine)


def test_a_file_through_the_spool_and_workers_stores_what_one_batch_stores(
    engine, peer_engine, tmp_path, monkeypatch
) -> None:
    """`yoco ledger ingest`'s path: rows spooled by the validation, lines
    validated by two worker processes, appended in small chunks: the same ledger as the
    same records posted as one batch."""
    import ledger.stream

    _contracts(engine, peer_engine)
    records = [r for b in _stream() for r in b]
    path = tmp_path / "r.jsonl"
    path.write_bytes(f.jsonl(records))
    monkeypatch.setattr(ledger.stream, "PARALLEL_MIN_BYTES", 0)
    result = ingest_batch(
        lambda: unit_of_work(engine),
        FileBatch(path, now=NOW, chunk=7, projected_kinds=PROJECTED, workers=2),
        PROJECTORS,
    )
    expected = ingest_batch(
        lambda: unit_of_work(peer_engine), RecordBatch(records, now=NOW), PROJECTORS
    )
    assert (result.appended, result.duplicates, result.by_kind) == (
        expected.appended, expected.duplicates, expected.by_kind
    )
    assert result.appended == len(records)
    assert _journal(engine) == _journal(peer_engine)
    assert _nodes(engine) == _nodes(peer_engine)
    assert _projections(engine) == _projections(peer_engine)


@pytest.mark.slow
def test_a_refused_batch_keeps_the_batches_before_it_and_writes_nothing_of_its_own(
    engine,
) -> None:
    _contracts(engine)
    batches = _stream()
    batches[1][3] = dict(batches[1][3], gpus=0)  # the job_started of C-1's second job
    stream = ingest_stream(
        lambda: unit_of_work(engine),
        [RecordBatch(b, what=f"batch {i}", now=NOW) for i, b in enumerate(batches)],
        PROJECTORS,
        workers=1,
    )
    first = next(stream)
    assert first.appended == len(batches[0])
    with pytest.raises(IngestRefused) as exc:
        next(stream)
    [err] = exc.value.errors
    assert (err.index, err.field) == (3, "gpus") and "batch 1" in str(exc.value)
    assert _size(engine) == 2 + len(batches[0])  # the contracts, then batch 0 only


@pytest.mark.parametrize("workers", [0])
def test_a_refusal_only_the_ledger_finds_names_the_record_and_keeps_what_came_before(
    engine, workers: int
) -> None:
    """An outcome naming a failure that is nowhere: found while appending, by index."""
    _contracts(engine)
    batches = _stream()[:3]
    batches[2].insert(5, f.outcome(str(uuid.uuid4()), cid="C-2", at=T0 + timedelta(days=1)))
    done = []
    with pytest.raises(IngestRefused) as exc:
        for result in ingest_stream(
            lambda: unit_of_work(engine),
            [RecordBatch(b, what=f"batch {i}", now=NOW) for i, b in enumerate(batches)],
            PROJECTORS,
            projected_kinds=PROJECTED,
            workers=workers,
        ):
            done.append(result.appended)
    [err] = exc.value.errors
    assert (err.index, err.field) == (5, "failure_event_id")
    assert done == [len(batches[0]), len(batches[1])]
    assert _size(engine) == 2 + len(batches[0]) + len(batches[1])


def test_a_stream_sent_again_is_stored_once_and_a_changed_record_is_refused(engine) -> None:
    _contracts(engine)
    batches = _stream()
    unit = lambda: unit_of_work(engine)  # noqa: E731
    stream = [RecordBatch(b, now=NOW) for b in batches]
    first = list(ingest_stream(unit, stream, PROJECTORS, workers=0))
    size = _size(engine)
    again = list(ingest_stream(unit, stream, PROJECTORS, workers=0))
    assert [r.appended for r in again] == [0] * len(batches)
    assert [r.duplicates for r in again] == [r.appended for r in first]
    assert _size(engine) == size
    # Half old, half new: the old half is skipped, the new half appended.
    fresh = [f.rec("job_progress", "C-1", T0 + timedelta(days=2), job_id="C-1-job3",
                   step=500 + k, step_seconds=1.0) for k in range(3)]
    [mixed] = ingest_stream(unit, [RecordBatch(batches[3][:4] + fresh, now=NOW)], PROJECTORS,
                            workers=0)
    assert (mixed.appended, mixed.duplicates) == (3, 4)
    changed = dict(batches[0][7], step=12345)
    with pytest.raises(IngestRefused) as exc:
        list(ingest_stream(unit, [RecordBatch([fresh[0], changed], now=NOW)], workers=0))
    [err] = exc.value.errors
    assert (err.index, err.field) == (1, "event_id")
    assert err.message == event_id_taken(changed["event_id"])
    assert _size(engine) == size + 3


def test_a_prepared_batch_keeps_only_the_bodies_asked_for() -> None:
    batch = _stream()[0]
    every = prepare_batch(batch, now=NOW)
    some = prepare_batch(batch, now=NOW, projected_kinds={"failure"}, keep_keys=False)
    assert [i for i, _, _ in every.projected] == list(range(len(batch)))
    assert [batch[i]["kind"] for i, _, _ in some.projected] == ["failure", "failure"]
    assert some.keys is None and every.keys is not None
    assert some.entries == every.entries and some.order == every.order
    refused = prepare_batch([*batch, {"kind": "job_started"}], now=NOW)
    assert refused.errors and not len(refused.entries)
    assert all(e.index == len(batch) for e in refused.errors)
