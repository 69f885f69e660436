"""The spool and the parallel validation of `yoco ledger ingest`.

The first pass writes each record's journal row (and the bodies the projectors read) to
a spool, so the second pass does not parse and validate every line again; a large file
is validated by several worker processes, each a range of whole lines. Neither may
change anything: the index, the errors (words, lines, order, count), the rows.
(``tests/ledger/test_ingest_stream_db.py`` appends such a file and compares the ledger.)
"""

from __future__ import annotations

import random
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ledger.stream as stream
from billing.projections import KINDS as BILLING_KINDS
from ledger.journal import encode_entries
from ledger.projections import KINDS
from ledger.records import OrderKey, parse_jsonl
from ledger.stream import index_file, read_spooled
from tests import factories as f

T0 = datetime(2026, 2, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 1, tzinfo=UTC)
PROJECTED = KINDS | BILLING_KINDS


def _story(n_jobs: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j in range(n_jobs):
        t = T0 + timedelta(hours=j)
        out.append(f.rec("job_started", "C-1", t, job_id=f"j{j}", gpus=8))
        fail = f.rec("failure", "C-1", t + timedelta(minutes=1), job_id=f"j{j}",
                     failure_class="unplanned", cause="gpu_lost")
        out.append(fail)
        for m in range(2, 12):
            out.append(f.rec("job_progress", "C-1", t + timedelta(minutes=m), job_id=f"j{j}",
                             step=m, step_seconds=1.0))
        out.append(f.outcome(fail["event_id"], at=t + timedelta(minutes=20)))
        out.append(f.rec("job_finished", "C-1", t + timedelta(minutes=30), job_id=f"j{j}",
                         step=12))
    return out


def _messy(tmp_path: Path) -> Path:
    """Shuffled lines with repeats (same and other content, near and far), bad lines."""
    story = _story(30)
    random.Random(5).shuffle(story)
    lines = [f.jsonl([r]).decode().strip() for r in story]
    lines.insert(3, lines[200])  # an identical repeat, far apart
    other = dict(story[100], step=999)
    lines.append(f.jsonl([other]).decode().strip())  # the same id, other content, last
    lines.insert(250, lines[7])
    lines.insert(120, "{bad json")
    lines.insert(300, '{"kind": "nope"}')
    lines.insert(10, "   ")
    path = tmp_path / "messy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _spooled(index: stream.FileIndex) -> tuple[list[bytes], list[Any]]:
    got = read_spooled(index, list(range(len(index.keys))))
    return got.entries.tails, got.projected


def test_parallel_validation_gives_the_same_index_errors_and_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _messy(tmp_path)
    raw = path.read_bytes()
    with tempfile.TemporaryFile() as one, tempfile.TemporaryFile() as many:
        alone = index_file(path, now=NOW, spool=one, projected_kinds=PROJECTED)
        monkeypatch.setattr(stream, "PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(stream, "RANGES_PER_WORKER", 5)  # 10 ranges, cut mid-story
        from ledger.workers import PrepareWorker

        split = index_file(path, now=NOW, spool=many, projected_kinds=PROJECTED, workers=2,
                           make_worker=PrepareWorker)
        records, errors = parse_jsonl(raw, now=NOW)
        assert [k.line for k in split.keys] == [k.line for k in alone.keys] == [
            r.line for r in records
        ]
        assert split.keys == alone.keys and split.leaves == alone.leaves
        # The keys cross the workers' pipes as plain tuples; they come back OrderKeys
        # (the append pass reads them by name).
        assert {type(k) for k in split.keys} == {OrderKey} and split.plain_keys is None
        assert [k.event_id for k in split.keys] == [r.event_id for r in records]
        assert split.offsets == alone.offsets
        assert [str(e) for e in split.errors] == [str(e) for e in alone.errors] == [
            str(e) for e in errors
        ]
        assert split.error_count == alone.error_count == len(errors) == 6
        # The rows are those the journal would get from the parsed records.
        want = encode_entries(
            (r.kind, r.event_id, r.contract_id, r.occurred_at, r.canonical) for r in records
        )
        assert _spooled(split)[0] == _spooled(alone)[0] == want.tails
        bodies = [(i, r.occurred_at, r.body) for i, r in enumerate(records) if r.kind in PROJECTED]
        assert _spooled(split)[1] == _spooled(alone)[1] == bodies


def test_the_collector_is_paused_only_for_the_block_and_put_back_as_it_was() -> None:
    import gc

    was = gc.isenabled()
    try:
        gc.enable()
        with stream.collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError), stream.collector_paused():
            raise RuntimeError("refused")
        assert gc.isenabled()
        gc.disable()
        with stream.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        (gc.enable if was else gc.disable)()
