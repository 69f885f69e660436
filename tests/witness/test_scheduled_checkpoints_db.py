"""Scheduled checkpoints: every log with new entries is signed by one scheduler run, a log
that did not grow is not signed again, and runs happen once per interval of an injected
monotonic clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from ledger.cadence import CHECKPOINT_EVERY, describe_interval
from ledger.ingest import ingest
from ledger.models import Checkpoint
from ledger.records import validate_batch
from tests import factories as fx
from yoco.database import unit_of_work
from yoco.scheduler import CheckpointScheduler


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _append(app_ctx: Any, cid: str, n: int = 1) -> None:
    recs, errors = validate_batch(
        [fx.rec("job_progress", cid, fx.later(i + 1), job_id="j1", step=i, step_seconds=1.0)
         for i in range(n)]
    )
    assert not errors, errors
    with unit_of_work(app_ctx.engine) as s:
        ingest(s, recs, None, app_ctx.projectors)


def _signed(app_ctx: Any) -> dict[str, list[int]]:
    with unit_of_work(app_ctx.engine) as s:
        rows = s.execute(
            select(Checkpoint.log_id, Checkpoint.tree_size).order_by(Checkpoint.tree_size)
        ).all()
    out: dict[str, list[int]] = {}
    for log_id, size in rows:
        out.setdefault(log_id, []).append(size)
    return out


def test_one_run_signs_the_grown_log_and_leaves_the_unchanged_one(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    seed([fx.contract("C-1"), fx.contract("C-2")],
         [fx.job_started(), fx.rec("job_started", "C-2", job_id="j1", gpus=8)])
    before = _signed(app_ctx)
    assert set(before) == {"C-1", "C-2"}
    _append(app_ctx, "C-1", 3)

    sched = CheckpointScheduler(app_ctx, 300, clock=FakeClock())
    run = sched.tick()
    assert run is not None
    assert [(h.log_id, h.created) for h in run.heads] == [("C-1", True)]
    after = _signed(app_ctx)
    assert after["C-2"] == before["C-2"]  # unchanged: no new checkpoint row
    assert after["C-1"] == [*before["C-1"], before["C-1"][-1] + 3]


def test_runs_follow_the_injected_clock(seed: Callable[..., None], app_ctx: Any) -> None:
    seed([fx.contract("C-1")], [fx.job_started()], sign=False)
    clock = FakeClock()
    sched = CheckpointScheduler(app_ctx, 300, clock=clock)
    first = sched.tick()  # due at once: the log is signed
    assert first is not None and [h.tree_size for h in first.heads] == [2]
    _append(app_ctx, "C-1")
    clock.now += 299
    assert not sched.due() and sched.tick() is None
    assert _signed(app_ctx)["C-1"] == [2]  # not yet: within the interval
    clock.now += 1
    second = sched.tick()
    assert second is not None and [h.tree_size for h in second.heads] == [3]
    clock.now += 300
    third = sched.tick()  # due, but nothing grew: nothing signed
    assert third is not None and third.heads == [] and sched.runs == 3
    with unit_of_work(app_ctx.engine) as s:
        assert s.execute(select(func.count()).select_from(Checkpoint)).scalar_one() == 2


def test_the_interval_must_be_positive(app_ctx: Any) -> None:
    with pytest.raises(ValueError, match="every"):
        CheckpointScheduler(app_ctx, 0)


def test_interval_words() -> None:
    assert describe_interval(CHECKPOINT_EVERY.total_seconds()) == "5 minutes"
    assert describe_interval(3600) == "1 hour"
    assert describe_interval(90) == "90 seconds"
    with pytest.raises(ValueError, match="interval"):
        describe_interval(0)


def test_checkpoints_are_served_with_their_stored_cosignatures(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    from datetime import UTC, datetime

    from ledger import cosign, note
    from ledger.models import CheckpointCosignature
    from ledger.services import checkpoints_of
    from ledger.witnessing import cosigned_note, cosigned_notes, quorum_met

    seed([fx.contract("C-1")], [fx.job_started()])
    _append(app_ctx, "C-1", 2)
    CheckpointScheduler(app_ctx, 300, clock=FakeClock()).tick()
    w = cosign.Cosigner.generate("witness.example/w")
    with unit_of_work(app_ctx.engine) as s:
        first, second = checkpoints_of(s, "C-1")
        line = w.cosign(note.unverified_text(second.note), 1_800_000_000)
        s.add(CheckpointCosignature(log_id="C-1", tree_size=second.tree_size,
                                    witness=w.key.to_text(), line=line,
                                    cosigned_at=datetime.fromtimestamp(1_800_000_000, UTC)))
    with unit_of_work(app_ctx.engine) as s:
        first, second = checkpoints_of(s, "C-1")
        plain, cosigned = cosigned_notes(s, [first, second])
        assert plain == first.note  # nothing stored for it: the operator's note as it is
        assert cosigned == second.note + line == cosigned_note(s, second)
    assert quorum_met(cosigned, [w.key], 1) and not quorum_met(plain, [w.key], 1)
    assert note.open_checkpoint(cosigned, app_ctx.verifier).size == second.tree_size


def test_a_run_that_finds_another_at_work_looks_again_soon(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    from sqlalchemy.orm import Session

    from billing.schedule import CHECKPOINT_LOCK, CLOSE_DUE_LOCK
    from yoco.scheduler import RETRY_S

    seed([fx.contract("C-1")], [fx.job_started()], sign=False)
    clock = FakeClock()
    sched = CheckpointScheduler(app_ctx, 300, clock=clock)
    with Session(app_ctx.engine) as other, other.begin():  # another checkpoint run
        other.execute(select(func.pg_advisory_xact_lock(CHECKPOINT_LOCK)))
        run = sched.tick()
        assert run is not None and not run.ran and run.heads == []
    assert "C-1" not in _signed(app_ctx)
    clock.now += RETRY_S  # not a whole interval later
    run = sched.tick()
    assert run is not None and run.ran and [h.log_id for h in run.heads] == ["C-1"]
    # A close-due run in progress does not hold checkpoints back (nor they it).
    _append(app_ctx, "C-1")
    clock.now += 300
    with Session(app_ctx.engine) as other, other.begin():
        other.execute(select(func.pg_advisory_xact_lock(CLOSE_DUE_LOCK)))
        run = sched.tick()
        assert run is not None and [h.tree_size for h in run.heads] == [3]


@pytest.mark.slow
def test_yoco_serve_signs_new_entries_in_the_background(
    seed: Callable[..., None], app_ctx: Any, yoco_env: dict[str, str]
) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    seed([fx.contract("C-1")], [fx.job_started()], sign=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli", "serve", "--port", str(port),
         "--close-due-every", "0"],
        # faulthandler: a serve that does not end on SIGTERM is sent SIGABRT below, which
        # dumps every thread's stack into its stderr (the failure's message).
        env={**os.environ, **yoco_env, "YOCO_LEDGER_CHECKPOINT_EVERY_S": "1",
             "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    signed: dict[str, list[int]] = {}
    try:
        deadline = time.monotonic() + 300  # a bound on waiting (a loaded CI), not a figure
        while time.monotonic() < deadline and signed.get("C-1") != [2]:
            assert serve.poll() is None, serve.communicate()
            time.sleep(0.3)
            signed = _signed(app_ctx)
        _append(app_ctx, "C-1", 2)  # appended while it runs: signed by a later run
        while time.monotonic() < deadline and signed.get("C-1") != [2, 4]:
            assert serve.poll() is None, serve.communicate()
            time.sleep(0.3)
            signed = _signed(app_ctx)
    finally:
        serve.terminate()
        try:
            _, stderr = serve.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Seen twice in loaded clean-clone runs: the SIGTERM came while serve was
            # still starting and its SystemExit was dropped inside a weakref callback
            # (fixed: yoco.cli_web._sigterm_handler notes the stop; tests/
            # test_serve_stop.py). Kept: the stacks say it if anything else holds it.
            serve.send_signal(signal.SIGABRT)
            _, stderr = serve.communicate(timeout=60)
            pytest.fail(f"yoco serve did not end within 60 s of SIGTERM; its threads "
                        f"(signed so far: {signed}):\n{stderr[-6000:]}")
    assert signed.get("C-1") == [2, 4], (signed, stderr[-3000:])
    assert serve.returncode == 0, stderr
    assert "signing a checkpoint of every log with new entries every 1 second" in stderr
