"""Streaming ingest of a file: a compact index, then chunks, one transaction."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from billing.projections import PROJECTORS
from ledger.contracts import add_contracts
from ledger.errors import IngestRefused
from ledger.ingest import ingest_file
from ledger.records import parse_contracts, parse_jsonl
from ledger.stream import index_file
from tests import factories as f
from yoco.database import unit_of_work

T0 = datetime(2026, 2, 1, tzinfo=UTC)


def _contract(engine) -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1", start_date="2026-01-01")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)


def _story(n_jobs: int = 12) -> list[dict]:
    out = []
    for j in range(n_jobs):
        t = T0 + timedelta(hours=j)
        out.append(f.rec("job_started", "C-1", t, job_id=f"j{j}", gpus=8))
        fail = f.rec("failure", "C-1", t + timedelta(minutes=1), job_id=f"j{j}",
                     failure_class="unplanned", cause="gpu_lost")
        out.append(fail)
        out.append(f.outcome(fail["event_id"], cid="C-1", at=t + timedelta(minutes=2)))
        out.append(f.rec("job_finished", "C-1", t + timedelta(minutes=30), job_id=f"j{j}",
                         step=10))
    return out


def _size(engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


def test_a_shuffled_file_is_appended_in_small_chunks_with_progress(engine, tmp_path) -> None:
    _contract(engine)
    story = _story()
    random.Random(3).shuffle(story)
    path = tmp_path / "r.jsonl"
    path.write_bytes(f.jsonl(story))
    seen: list[int] = []
    index = index_file(path, progress=seen.append)
    assert index.error_count == 0 and len(index.keys) == len(story)
    assert seen[-1] == path.stat().st_size
    done: list[int] = []
    with unit_of_work(engine) as s:
        result = ingest_file(s, index, PROJECTORS, chunk=5, progress=done.append)
    assert result.appended == len(story) and sum(done) == len(story)
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM outcomes")).scalar_one() == 12
        assert c.execute(
            text("SELECT count(*) FROM job_spans WHERE finished_at IS NOT NULL")
        ).scalar_one() == 12
    # Again: every record is a duplicate, nothing appended.
    with unit_of_work(engine) as s:
        again = ingest_file(s, index_file(path), PROJECTORS, chunk=7)
    assert (again.appended, again.duplicates) == (0, len(story))


def test_a_refusal_in_a_late_chunk_writes_nothing(engine, tmp_path) -> None:
    _contract(engine)
    story = _story()
    # A job that finishes without ever starting: found by the projection, late.
    story.append(f.rec("job_finished", "C-1", T0 + timedelta(days=1), job_id="ghost", step=1))
    path = tmp_path / "r.jsonl"
    path.write_bytes(f.jsonl(story))
    before = _size(engine)
    with pytest.raises(IngestRefused) as exc, unit_of_work(engine) as s:
        ingest_file(s, index_file(path), PROJECTORS, chunk=4)
    [err] = exc.value.errors
    assert err.line == len(story) and err.field == "job_id"
    assert _size(engine) == before


def test_the_index_reports_what_parse_jsonl_reports(tmp_path) -> None:
    good = f.rec("job_started", "C-1", T0, job_id="j", gpus=8)
    clash = dict(good, gpus=9)
    lines = [good, good, {"kind": "nope"}, clash]
    raw = f.jsonl(lines) + b"\n   \n{bad json\n"
    path = tmp_path / "r.jsonl"
    path.write_bytes(raw)
    index = index_file(path)
    records, errors = parse_jsonl(raw)
    assert [k.line for k in index.keys] == [r.line for r in records] == [1]
    assert [str(e) for e in index.errors] == [str(e) for e in errors]
    assert index.error_count == len(errors) == 6  # kind nope: 4 (missing common fields)


def test_a_file_changed_between_the_passes_writes_nothing(engine, tmp_path) -> None:
    _contract(engine)
    story = _story(2)
    path = tmp_path / "r.jsonl"
    path.write_bytes(f.jsonl(story))
    index = index_file(path)
    story[-1]["step"] = 11
    path.write_bytes(f.jsonl(story))
    before = _size(engine)
    with pytest.raises(RuntimeError, match="changed"), unit_of_work(engine) as s:
        ingest_file(s, index, PROJECTORS, chunk=2)
    assert _size(engine) == before
    assert uuid.UUID(story[0]["event_id"]).version == 4
