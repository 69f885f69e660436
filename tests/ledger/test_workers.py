"""The worker process that prepares batches ahead (``ledger.workers.PrepareWorker``).

Real child processes: what comes back equals what :func:`ledger.ingest.prepare_batch`
gives in this process, in submission order; the child's exception is raised here; a
child that dies is reported, never waited on forever.
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from ledger.prepare import prepare_batch
from ledger.workers import PrepareWorker, WorkerFailed
from tests import factories as f

pytestmark = pytest.mark.slow

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def _batch(n: int, job: str) -> list[dict[str, object]]:
    start = f.job_started(job)
    return [start] + [
        f.rec("job_progress", at=f.later(k + 1), job_id=job, step=k, step_seconds=0.5)
        for k in range(n)
    ]


def test_batches_come_back_in_order_as_here_refusals_as_errors_failures_raised() -> None:
    batches = [_batch(k, f"j{k}") for k in (3, 0, 7)]
    bad = [f.job_started(), f.rec("job_started", job_id="j", gpus=0)]
    with PrepareWorker() as worker:
        for i, b in enumerate(batches):
            worker.submit(b, f"batch {i}", NOW, frozenset({"job_started"}))
        worker.submit(bad, "bad", NOW, None)
        worker.submit(_batch(1, "j"), "naive clock", datetime(2026, 1, 1), None)
        worker.submit(_batch(1, "j"), "fine", NOW, None)
        got = [worker.result() for _ in batches]
        refused = worker.result()
        assert [(e.index, e.field) for e in refused.errors] == [(1, "gpus")]
        with pytest.raises(TypeError, match="offset-naive"):
            worker.result()
        assert not worker.result().errors  # the worker carries on after an exception
    for i, (b, prepared) in enumerate(zip(batches, got, strict=True)):
        here = prepare_batch(b, f"batch {i}", NOW, {"job_started"}, keep_keys=False)
        assert prepared.what == f"batch {i}" and not prepared.errors
        assert prepared.entries == here.entries
        assert prepared.order == here.order and prepared.indexes == here.indexes
        assert prepared.projected == here.projected
        assert [i for i, _, _ in prepared.projected] == [0]


def test_a_worker_that_dies_is_reported_and_close_does_not_hang() -> None:
    worker = PrepareWorker()
    worker.submit(_batch(2, "j"), "one", NOW, None)
    assert len(worker.result().entries) == 3
    worker._child.send_signal(signal.SIGKILL)
    worker.submit(_batch(2, "j"), "two", NOW + timedelta(seconds=1), None)
    with pytest.raises(WorkerFailed, match="ended"):
        worker.result()
    with pytest.raises(WorkerFailed, match="ended"):
        worker.result()
    worker.close()
    with PrepareWorker() as busy:
        busy.submit([f.job_started() for _ in range(3000)], "big", NOW, None)
    # Closed with a batch still in the child: it was ended, not waited on.
    assert busy._child.returncode is not None
