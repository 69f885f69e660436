"""The coordinator's decisions (runtime/coordinator.py), in-process: no process, no store,
no sleep -- every instant comes from a fake monotonic clock. Which deaths join an open
incident and when their record is written, whom a failed collective blames, the step
watchdog's deadlines, whether the coordinator is the one cut off, and the recovery plan
(live or rollback, members, spares, lost steps)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from runtime import protocol as P
from runtime.coordinator import (
    EXIT_STATUS_WAIT_S,
    MERGE_WINDOW_S,
    Blame,
    Borrow,
    FailJob,
    FenceNote,
    HangPhase,
    MoveDrop,
    MoveNow,
    MoveWait,
    NeedCheckpoint,
    NewProcess,
    PlanRecovery,
    RecordDue,
    RecoveryStep,
    RecoveryView,
    SpareView,
    StartSpares,
    blame,
    blame_due,
    blame_quiet_s,
    death_cause,
    death_detected_at,
    death_record_due,
    describe_death,
    frozen_look_due,
    hang_phase,
    hang_quiet_s,
    hang_verdict,
    host_frozen,
    joined_note,
    joins_incident,
    note_stopped,
    observe_beats,
    plan_move,
    plan_recovery,
    quiet_hosts,
    silent_members,
    stalled_for,
    steps_reached,
    stopped_look_due,
    stopped_to_fence,
    too_many_recoveries,
)
from runtime.detection import MIN_STEP_SAMPLES, StepTimes, partition_verdict
from runtime.processes import STOPPED_FLOOR_S, stopped_deadline
from runtime.recovery import FailureClass, Outcome

UNPLANNED = FailureClass.UNPLANNED


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        """Move the clock on by ``seconds``; returns the new instant."""
        self.t += seconds
        return self.t


# --------------------------------------------------------------------- deaths and records

def test_a_death_just_inside_the_merge_window_joins_the_open_incident() -> None:
    clock = FakeClock()
    first = clock()
    clock.advance(MERGE_WINDOW_S - 1e-6)
    assert joins_incident(UNPLANNED, first, death_detected_at(clock(), []))


def test_a_death_just_outside_the_merge_window_is_a_failure_of_its_own() -> None:
    clock = FakeClock()
    first = clock()
    clock.advance(MERGE_WINDOW_S)  # the window is half-open: at 1 s it has closed
    assert not joins_incident(UNPLANNED, first, death_detected_at(clock(), []))
    # Its record names the failure it happened during (nothing written is rewritten).
    assert joined_note("e-1", "process_killed") == \
        "; during the recovery from failure e-1 (process_killed)"


def test_only_an_unplanned_incident_is_joined() -> None:
    # A move (planned, pre-emptive) is its own failure; a death during it is another.
    for cls in (FailureClass.PLANNED, FailureClass.PREEMPTIVE):
        assert not joins_incident(cls, 10.0, 10.0)
    assert not joins_incident(None, None, 10.0)  # nothing open
    assert joins_incident(UNPLANNED, 10.0, 10.5, window_s=3600.0)
    assert not joins_incident(UNPLANNED, 10.0, 10.0, window_s=0.0)


def test_a_hang_is_dated_when_its_stall_began() -> None:
    # A fenced member's stall began before it was killed: its failure is dated then,
    # and so its recovery time includes the stall; an unfenced death is dated now.
    assert death_detected_at(50.0, []) == 50.0
    assert death_detected_at(50.0, [None, 0.0]) == 50.0
    assert death_detected_at(50.0, [47.5, None, 48.0]) == 47.5
    assert death_detected_at(50.0, [51.0]) == 50.0  # never later than seen


def test_a_death_record_waits_for_its_window_then_for_its_exit_status() -> None:
    clock = FakeClock()
    detected = seen = clock()
    due = {"detected": detected, "seen": seen, "merging": True, "block": False}
    assert death_record_due(now=clock.advance(0.5), **due) == RecordDue.HOLD
    assert death_record_due(now=clock.advance(0.5), **due) == RecordDue.IF_KNOWN
    # Past the wait for an exit status: written now, whatever is known.
    clock.t = seen + EXIT_STATUS_WAIT_S
    assert death_record_due(now=clock(), **due) == RecordDue.IF_KNOWN
    assert death_record_due(now=clock.advance(1e-3), **due) == RecordDue.NOW


def test_a_due_outcome_writes_the_record_at_once() -> None:
    # The outcome must follow its failure: inside the window, blocking writes it now.
    assert death_record_due(now=10.1, detected=10.0, seen=10.0, merging=True,
                            block=True) == RecordDue.NOW
    # An incident no longer the recovery's (the job failed meanwhile) is not held.
    assert death_record_due(now=10.1, detected=10.0, seen=10.0, merging=False,
                            block=False) == RecordDue.IF_KNOWN
    # A hang dated back by its stall is held from that date, not from when it was seen.
    assert death_record_due(now=13.0, detected=10.0, seen=12.9, merging=True,
                            block=False) == RecordDue.IF_KNOWN


@pytest.mark.parametrize(("rc", "cause"), [
    (None, "process_killed"), (-9, "process_killed"), (-15, "process_killed"),
    (-11, "process_crashed"), (-6, "process_crashed"), (1, "process_exit"),
    (0, "process_exit")])
def test_the_cause_of_a_death_comes_from_its_exit_status(rc: int | None, cause: str) -> None:
    assert death_cause(rc) == cause


def test_a_death_is_described_by_its_exit_statuses_or_its_fences() -> None:
    assert describe_death([("w0", -9), ("w2", None)], []) == \
        ("process_killed", "w0 exit -9, w2 exit unknown")
    assert describe_death([("w1", 3)], []) == ("process_exit", "w1 exit 3")
    # Two fenced hosts merged into one incident: the first's cause, each detail once.
    fences = [FenceNote(cause="hang", detail="node h1 silent"),
              FenceNote(cause="node_lost", detail="node h2 lost"),
              FenceNote(cause="hang", detail="node h1 silent")]
    assert describe_death([("w0", -9), ("w1", -9), ("w2", -9)], fences) == \
        ("hang", "node h1 silent; node h2 lost")


def test_a_note_is_kept_whole_at_the_end_of_a_long_detail() -> None:
    note = joined_note("e-1", "hang")
    rcs = [(f"w{i}", -9) for i in range(100)]
    cause, detail = describe_death(rcs, [], note)
    assert cause == "process_killed" and len(detail) == 500 and detail.endswith(note)
    assert detail.startswith("w0 exit -9, w1 exit -9")


def test_steps_committed_before_a_death_count_as_lost_only_in_a_rollback() -> None:
    # Rank 0 committed step 12 before a peer died in step 13; the death was recorded at
    # step 10 (the last progress read): its step becomes 12.
    live = steps_reached(recorded_step=10, reached=12, outcome=Outcome.LIVE_MIGRATED,
                         rollback_step=None, lost_steps=0)
    assert (live.step, live.lost_steps) == (12, 0)
    back = steps_reached(recorded_step=10, reached=12, outcome=Outcome.ROLLED_BACK,
                         rollback_step=5, lost_steps=5)
    assert (back.step, back.lost_steps) == (12, 7)
    same = steps_reached(recorded_step=12, reached=11, outcome=Outcome.ROLLED_BACK,
                         rollback_step=5, lost_steps=7)
    assert (same.step, same.lost_steps) == (12, 7)


# --------------------------------------------------------------------- blame

def test_the_quiet_time_for_blame_is_the_grace_or_two_steady_steps() -> None:
    # Short steps: the 0.5 s grace (the floor).
    assert blame_quiet_s(0.5, 0.1, P.BEAT_INTERVAL_S) == 0.5
    # Long steps: two of them and a beat interval (a healthy busy peer beats within a
    # step of the report).
    assert blame_quiet_s(0.5, 1.0, 0.2) == pytest.approx(2.2)


def test_blame_waits_for_the_quiet_time_and_for_quiet_hosts() -> None:
    clock = FakeClock()
    reported = clock()
    q = 0.5
    kw = {"reported_at": reported, "quiet_s": q, "reporter_alive": True,
          "host_quiet": False}
    assert not blame_due(now=clock.advance(q - 1e-3), **kw)
    assert blame_due(now=clock.advance(1e-3), **kw)
    # A host is quiet: the node check decides first (lost host, or cut off).
    assert not blame_due(now=clock(), **{**kw, "host_quiet": True})
    # The reporter died meanwhile: the death path acts, nobody is blamed here.
    assert not blame_due(now=clock(), **{**kw, "reporter_alive": False})


def test_a_failed_collective_blames_the_silent_peer_not_the_reporter() -> None:
    clock = FakeClock()
    beats = observe_beats({}, {"w0": b"1", "w1": b"1", "w2": b"1"}, clock())
    # w0 (the reporter) and w2 keep beating while they wait; w1 is stuck.
    for i in range(2, 5):
        beats = observe_beats(beats, {"w0": str(i).encode(), "w1": b"1",
                                      "w2": str(i).encode()}, clock.advance(0.2))
    silent = silent_members(beats, ["w0", "w1", "w2"], clock(), quiet_s=0.5)
    assert silent == ["w1"]
    assert blame("w0", silent) == Blame(hung=("w1",))


def test_a_failed_collective_with_no_silent_peer_fences_the_reporter() -> None:
    assert blame("w0", []) == Blame(reporter="w0")
    # Silent alone (it waits for the next generation without beating yet): still itself.
    assert blame("w0", ["w0"]) == Blame(reporter="w0")


def test_a_member_first_observed_now_is_not_silent() -> None:
    clock = FakeClock()
    beats = observe_beats({}, {"w0": None}, clock())
    assert silent_members(beats, ["w0"], clock(), quiet_s=0.5) == []
    beats = observe_beats(beats, {"w0": None, "w1": None}, clock.advance(0.5))
    # w0 has not beaten for 0.5 s of observation; w1 was first seen just now.
    assert silent_members(beats, ["w0", "w1"], clock(), quiet_s=0.5) == ["w0"]
    # Only eligible members (alive, started) count.
    assert silent_members(beats, ["w1"], clock(), quiet_s=0.5) == []
    # A beat that changes restarts its silence.
    beats = observe_beats(beats, {"w0": b"t1", "w1": None}, clock.advance(0.1))
    assert silent_members(beats, ["w0", "w1"], clock(), quiet_s=0.5) == []


# --------------------------------------------------------------------- the watchdog

def test_the_watchdog_is_off_before_the_first_step_and_during_a_recovery() -> None:
    assert stalled_for(10.0, None, recovering=False) is None
    assert stalled_for(10.0, 4.0, recovering=True) is None
    assert stalled_for(10.0, 4.0, recovering=False) == 6.0


def test_a_stopped_member_is_fenced_at_the_floor_deadline() -> None:
    # A 50 ms step: 3 steps are under the floor, so the deadline is the floor.
    fast = stopped_deadline(0.05, 3.0)
    assert fast == STOPPED_FLOOR_S
    clock = FakeClock()
    advanced = clock()
    members = ["w0", "w1", "w2"]
    looks = {"w0": False, "w1": True, "w2": False}
    since: dict[str, float] = {}
    fenced: list[str] = []
    # Looks every 20 ms (the supervisor's store poll) until it fences.
    while not fenced and clock() - advanced < 1.0:
        stalled = clock.advance(0.02) - advanced
        if not stopped_look_due(stalled, fast):
            since = {}
            continue
        since = note_stopped(since, looks, clock())
        fenced = stopped_to_fence(since, members=len(members), now=clock(),
                                  stalled=stalled, deadline_s=fast)
    assert fenced == ["w1"]
    # Looked at from the first poll past D/2 (0.14 s), found stopped on every look for
    # D/2 from then (0.265 s: past D), so fenced at the next poll.
    assert clock() - advanced == pytest.approx(0.28, abs=1e-9)


def test_a_member_found_running_once_starts_its_stopped_time_again() -> None:
    fast = 0.3
    since = note_stopped({}, {"w0": True, "w1": False}, 10.0)
    since = note_stopped(since, {"w0": False, "w1": False}, 10.1)  # a profiler's pause
    since = note_stopped(since, {"w0": True, "w1": False}, 10.2)
    assert since == {"w0": 10.2}
    assert stopped_to_fence(since, members=2, now=10.3, stalled=0.4, deadline_s=fast) == []
    assert stopped_to_fence(since, members=2, now=10.36, stalled=0.46,
                            deadline_s=fast) == ["w0"]


def test_nobody_is_fenced_when_every_member_is_stopped_or_the_stall_is_short() -> None:
    since = {"w0": 10.0, "w1": 10.0}
    # Every member stopped: none would hold the state.
    assert stopped_to_fence(since, members=2, now=11.0, stalled=2.0, deadline_s=0.3) == []
    # Stopped long enough, but the step stalled for less than the deadline.
    assert stopped_to_fence({"w0": 10.0}, members=2, now=11.0, stalled=0.29,
                            deadline_s=0.3) == []


def test_the_stopped_deadline_follows_the_steady_step_above_the_floor() -> None:
    assert stopped_deadline(0.5, 3.0) == pytest.approx(1.5)
    assert not stopped_look_due(0.74, 1.5) and stopped_look_due(0.75, 1.5)


def test_the_hang_deadline_is_the_startup_one_until_enough_steps_then_adaptive() -> None:
    times = StepTimes(warmup=0)
    clock = FakeClock()
    kw = {"floor_s": 0.4, "factor": 2.0, "startup_s": 3.0}
    for step in range(MIN_STEP_SAMPLES):  # one sample short
        times.observe(step, clock.advance(1.0))
    assert times.deadline(**kw) == 3.0
    times.observe(MIN_STEP_SAMPLES, clock.advance(1.0))
    deadline = times.deadline(**kw)
    assert deadline == pytest.approx(2.0)  # 2 x the longest of 1 s steps
    # Its phases: nothing before a quarter, beats noted from a quarter, decided at the end.
    assert hang_phase(deadline / 4 - 1e-6, deadline) == HangPhase.EARLY
    assert hang_phase(deadline / 4, deadline) == HangPhase.OBSERVE
    assert hang_phase(deadline - 1e-6, deadline) == HangPhase.OBSERVE
    assert hang_phase(deadline, deadline) == HangPhase.EXPIRED
    assert hang_quiet_s(deadline) == 1.0 and hang_quiet_s(3.0) == 1.0
    # Fast steps: the floor holds the deadline up; the silence needed never drops under
    # one and a half beat intervals (a waiting peer beats every BEAT_INTERVAL_S).
    fast = StepTimes(warmup=0)
    for step in range(MIN_STEP_SAMPLES + 2):
        fast.observe(step, clock.advance(0.1))
    assert fast.deadline(**kw) == 0.4
    assert hang_quiet_s(0.4) == pytest.approx(1.5 * P.BEAT_INTERVAL_S)
    assert hang_quiet_s(1.0) == 0.5


def test_an_expired_hang_fences_the_silent_members_unless_all_or_none_are() -> None:
    assert hang_verdict(["w2"], 3) == ("w2",)
    assert hang_verdict(["w1", "w2"], 3) == ("w1", "w2")
    assert hang_verdict(["w0", "w1", "w2"], 3) == ()  # every member silent: cannot tell
    assert hang_verdict([], 3) == ()  # every member waiting: cannot tell


def test_a_frozen_host_is_fenced_once_silent_and_stopped_long_enough() -> None:
    # A host on this machine: looked at (/proc) once it missed two 0.1 s heartbeats.
    assert not frozen_look_due(0.19, 0.1) and frozen_look_due(0.2, 0.1)
    deadline = stopped_deadline(0.1, 3.0)  # 3 steady steps of 0.1 s
    clock = FakeClock()
    since = clock()  # first look that found its agent and processes stopped
    kw = {"stopped_since": since, "deadline_s": deadline}
    assert not host_frozen(silent_s=deadline - 0.01, now=clock.advance(0.2), **kw)
    clock.t = since
    assert not host_frozen(silent_s=deadline, now=clock.advance(deadline / 2 - 0.01), **kw)
    assert host_frozen(silent_s=deadline, now=clock.advance(0.02), **kw)  # the next look


def test_a_host_that_missed_three_beats_is_quiet() -> None:
    silence = {"host1": 0.31, "host2": 0.29, "host3": 0.3, "host0": 0.0}
    assert quiet_hosts(silence, quiet_s=0.3) == {"host1", "host3"}
    assert quiet_hosts({}, quiet_s=0.3) == set()


# --------------------------------------------------------------------- cut off or not

def _silences(beat_seen: dict[int, float], now: float) -> dict[int, float]:
    return {rank: now - seen for rank, seen in beat_seen.items()}


def test_a_minority_of_hosts_unreachable_is_lost_a_majority_means_cut_off() -> None:
    timeout = 2.0
    clock = FakeClock()
    t0 = clock()
    # Five hosts; two (a rack) stop beating at t0, the others beat on.
    seen = {0: t0, 1: t0, 2: t0, 3: t0, 4: t0}
    clock.advance(timeout + 0.01)
    seen.update({0: clock(), 1: clock(), 2: clock()})
    v = partition_verdict(_silences(seen, clock()), self_rank=0, timeout_s=timeout)
    assert (v.lose, v.cut_off) == ((3, 4), False)
    # The coordinator's own link cut: three of four others silent together.
    seen = {0: t0, 1: t0, 2: t0, 3: t0, 4: t0}
    seen.update({0: clock(), 1: clock()})
    v = partition_verdict(_silences(seen, clock()), self_rank=0, timeout_s=timeout)
    assert (v.lose, v.cut_off, v.quiet) == ((), True, (2, 3, 4))


def test_exactly_half_unreachable_is_cut_off_and_one_host_is_lost() -> None:
    # Four hosts, two others silent: the coordinator's side has 2 of 4, no strict
    # majority -- it must not blame the other half.
    v = partition_verdict({0: 0.0, 1: 0.1, 2: 2.1, 3: 2.05}, self_rank=0, timeout_s=2.0)
    assert v.cut_off and v.lose == ()
    # One silent host is always lost (a hang), even in a two-host job.
    v = partition_verdict({0: 0.0, 1: 2.1}, self_rank=0, timeout_s=2.0)
    assert (v.lose, v.cut_off) == ((1,), False)


# --------------------------------------------------------------------- the recovery plan

def _spares(*slots: str, ready: bool = True, shard: int = 0) -> tuple[SpareView, ...]:
    return tuple(SpareView(slot=s, alive=True, ready=ready, shard=shard) for s in slots)


def _view(**kw: Any) -> RecoveryView:
    """Two members, w1 dead, w0 holding the state, a ready spare w2, step 10 reached."""
    base = RecoveryView(members=("w0", "w1"), dead=("w1",), survivors=("w0",),
                        holders=("w0",), spares=_spares("w2"), last_step=10)
    return replace(base, **kw)


def _drive(view: RecoveryView, *, checkpoint: tuple[int, str] | None = None,
           next_slot: int = 10, borrowable: int = 0) -> tuple[RecoveryStep, list[str]]:
    """Play the supervisor: do what the plan asks (start spares as wN, borrow
    ``borrowable`` hosts' worth, give the checkpoint) until it decides; returns the
    decision and what was asked, in order."""
    asked: list[str] = []
    for _ in range(10):
        step = plan_recovery(view)
        if isinstance(step, StartSpares):
            asked.append(f"start {step.count}")
            new = tuple(f"w{next_slot + i}" for i in range(step.count))
            next_slot += step.count
            view = replace(view, spares=view.spares + _spares(*new, ready=False),
                           room=None if view.room is None else view.room - step.count)
        elif isinstance(step, Borrow):
            asked.append(f"borrow {step.count}")
            got = tuple(f"b{i}" for i in range(min(step.count, borrowable)))
            view = replace(view, borrowed=True, spares=view.spares + _spares(*got, ready=False))
        elif isinstance(step, NeedCheckpoint):
            asked.append("checkpoint")
            view = replace(view, checkpoint_known=True, checkpoint=checkpoint)
        else:
            return step, asked
    raise AssertionError("the plan never decided")


def test_a_dead_member_is_replaced_by_a_ready_spare_live() -> None:
    step, asked = _drive(_view(spares=_spares("w3", ready=False) + _spares("w2")))
    assert asked == []  # no checkpoint is even looked up
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    # The ready spare first, in the dead member's rank.
    assert step.members == ("w0", "w2") and step.called_in == ("w2",)
    assert (step.outcome, step.lost_steps, step.checkpoint) == (Outcome.LIVE_MIGRATED, 0,
                                                                None)


def test_a_spare_still_starting_is_better_than_a_rollback() -> None:
    step, _ = _drive(_view(spares=_spares("w2", ready=False)))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert step.members == ("w0", "w2")
    # A dead spare is not called in.
    dead_spare = (SpareView(slot="w2", alive=False, ready=False),)
    step, asked = _drive(_view(spares=dead_spare), checkpoint=(5, "/ck/5"))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.ROLLBACK
    assert asked == ["checkpoint"]


def test_no_spare_means_a_rollback_with_the_true_lost_steps() -> None:
    step, asked = _drive(_view(spares=()), checkpoint=(5, "/ck/5"))
    assert asked == ["checkpoint"]
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.ROLLBACK
    # The survivor keeps its rank; the dead member's place gets a cold replacement.
    assert step.members[0] == "w0" and step.members[1] == step.starts[0]
    assert step.starts == (NewProcess(shard=0, replaces="w1", spare=False),)
    assert (step.outcome, step.lost_steps, step.checkpoint) == (Outcome.ROLLED_BACK, 5,
                                                                (5, "/ck/5"))


def test_no_spare_and_no_checkpoint_fails_the_job() -> None:
    step, _ = _drive(_view(spares=()), checkpoint=None)
    assert step == FailJob("no live replica or spare, and no checkpoint to roll back to")


def test_the_whole_job_dead_rolls_back_onto_the_spares() -> None:
    view = _view(dead=("w0", "w1"), survivors=(), holders=(), spares=_spares("w2", "w3"))
    step, _ = _drive(view, checkpoint=(8, "/ck/8"))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.ROLLBACK
    assert step.members == ("w2", "w3") and step.called_in == ("w2", "w3")
    assert step.starts == () and step.lost_steps == 2


def test_no_place_left_for_a_replacement_fails_the_job() -> None:
    step, _ = _drive(_view(spares=(), room=0), checkpoint=(5, "/ck/5"))
    assert step == FailJob("no place left to replace w1 (every node is lost or full)")


def test_a_second_death_during_the_recovery_starts_a_spare_and_stays_live() -> None:
    # The spare called in (w2) died too; w0 still holds the state: a replacement spare
    # is started at once rather than rolling back.
    view = _view(members=("w0", "w2"), dead=("w2",), survivors=("w0",), holders=("w0",),
                 spares=(), replace_spares=True, outcome=Outcome.LIVE_MIGRATED)
    step, asked = _drive(view)
    assert asked == ["start 1"]
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert step.members == ("w0", "w10") and step.outcome == Outcome.LIVE_MIGRATED
    # Without replacement spares the same death rolls back.
    step, asked = _drive(replace(view, replace_spares=False), checkpoint=(5, "/ck/5"))
    assert asked == ["checkpoint"] and isinstance(step, PlanRecovery)
    assert step.mode == P.PlanMode.ROLLBACK


def test_a_live_plan_after_a_rollback_keeps_the_recoverys_rollback_outcome() -> None:
    view = _view(outcome=Outcome.ROLLED_BACK, lost_steps=4)
    step, _ = _drive(view)
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert (step.outcome, step.lost_steps) == (Outcome.ROLLED_BACK, 4)
    # A later rollback never lowers the lost steps already counted.
    step, _ = _drive(replace(view, spares=(), lost_steps=9), checkpoint=(5, "/ck/5"))
    assert isinstance(step, PlanRecovery) and step.lost_steps == 9


def test_spares_started_only_where_there_is_room_then_a_host_is_borrowed() -> None:
    view = _view(members=("w0", "w1", "w2"), dead=("w1", "w2"), survivors=("w0",),
                 holders=("w0",), spares=(), replace_spares=True, room=1, can_borrow=True)
    step, asked = _drive(view, borrowable=1)
    assert asked == ["start 1", "borrow 1"]
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert step.members == ("w0", "w10", "b0")
    # The pool has nothing to lend: a rollback would call in the spare started and
    # needs a cold replacement for w2, for which there is no room: the job fails.
    step, asked = _drive(replace(view, room=1), borrowable=0, checkpoint=(5, "/ck/5"))
    assert asked == ["start 1", "borrow 1", "checkpoint"]
    assert step == FailJob("no place left to replace w2 (every node is lost or full)")


def test_transparent_mode_rollbacks_lose_the_interrupted_step_too() -> None:
    # State not discoverable: rollback only, even with a ready spare; the survivors
    # cannot rerun their interrupted step (one more lost step).
    step, _ = _drive(_view(transparent="rollback: no optimizer found"),
                     checkpoint=(5, "/ck/5"))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.ROLLBACK
    assert step.members == ("w0", "w2") and step.lost_steps == 6 and step.absorbed == 1
    # The failed generation turns out to have committed step 12 before the death (read
    # after the plan): the steps from the checkpoint to 12 are lost, and the interrupted
    # step still is -- 8, not 7 (the job ends 8 steps short).
    later = steps_reached(recorded_step=10, reached=12, outcome=Outcome.ROLLED_BACK,
                          rollback_step=5, lost_steps=step.lost_steps, absorbed=step.absorbed)
    assert (later.step, later.lost_steps) == (12, 8)
    step, _ = _drive(_view(transparent="live"))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE


def _hsdp(**kw: Any) -> RecoveryView:
    """Two replica groups of two shards: w0 (shard 0), w1 (shard 1) | w2 (0), w3 (1);
    w1 dead; spares w4 (shard 0, ready) and w5 (shard 1, starting)."""
    base = RecoveryView(
        members=("w0", "w1", "w2", "w3"), dead=("w1",), survivors=("w0", "w2", "w3"),
        holders=("w0", "w2", "w3"), shards=2,
        shard_of={"w0": 0, "w1": 1, "w2": 0, "w3": 1},
        spares=_spares("w4", shard=0) + _spares("w5", ready=False, shard=1), last_step=10)
    return replace(base, **kw)


def test_hsdp_replaces_a_lost_shard_with_a_spare_built_for_it() -> None:
    step, asked = _drive(_hsdp())
    assert asked == [] and isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert step.members == ("w0", "w5", "w2", "w3") and step.called_in == ("w5",)
    # No spare of that shard: one is started for it (never a spare of another shard).
    step, _ = _drive(_hsdp(spares=_spares("w4", shard=0)))
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.LIVE
    assert step.starts == (NewProcess(shard=1, replaces="w1", spare=True),)
    assert step.members == ("w0", step.starts[0], "w2", "w3") and step.called_in == ()


def test_hsdp_with_no_replica_of_a_shard_left_rolls_back() -> None:
    view = _hsdp(dead=("w1", "w3"), survivors=("w0", "w2"), holders=("w0", "w2"))
    step, asked = _drive(view, checkpoint=(6, "/ck/6"))
    assert asked == ["checkpoint"]
    assert isinstance(step, PlanRecovery) and step.mode == P.PlanMode.ROLLBACK
    assert step.gone_shards == (1,) and step.lost_steps == 4
    assert step.members == ("w0", "w5", "w2", step.starts[0])
    assert step.starts == (NewProcess(shard=1, replaces="w3", spare=True),)
    step, _ = _drive(view, checkpoint=None)
    assert step == FailJob("shard(s) [1] lost in every replica group, and no sharded "
                           "checkpoint to roll back to")


def test_too_many_recoveries() -> None:
    assert not too_many_recoveries(60, 4, 64)
    assert too_many_recoveries(60, 5, 64)


# --------------------------------------------------------------------- moves

def test_a_move_waits_for_a_ready_spare_and_says_when_none_will_come() -> None:
    kw: dict[str, Any] = {"slot": "w0", "members": ["w0", "w1"], "shard_of": {}}
    assert plan_move(ready=[], spares=1, spares_coming=True, **kw) == MoveWait()
    # No spare now, none configured or replenished: the operator is told.
    assert plan_move(ready=[], spares=0, spares_coming=False, **kw) == MoveWait(True)
    assert plan_move(ready=[], spares=0, spares_coming=True, **kw) == MoveWait()
    assert plan_move(ready=["w2"], spares=1, spares_coming=False, **kw) == \
        MoveNow(spare="w2", members=("w2", "w1"), donors=())


def test_a_move_off_a_worker_no_longer_a_member_is_dropped() -> None:
    assert plan_move(slot="w0", members=["w3", "w1"], ready=["w2"], shard_of={},
                     spares=1, spares_coming=True) == MoveDrop()


def test_a_lone_worker_moves_as_a_donor_and_hsdp_needs_its_shards_spare() -> None:
    assert plan_move(slot="w0", members=["w0"], ready=["w1"], shard_of={}, spares=1,
                     spares_coming=True) == MoveNow(spare="w1", members=("w1",),
                                                    donors=("w0",))
    shards = {"w0": 0, "w1": 1, "w4": 0, "w5": 1}
    assert plan_move(slot="w1", members=["w0", "w1"], ready=["w4"], shard_of=shards,
                     spares=1, spares_coming=True) == MoveWait()
    assert plan_move(slot="w1", members=["w0", "w1"], ready=["w4", "w5"], shard_of=shards,
                     spares=2, spares_coming=True) == MoveNow(
                         spare="w5", members=("w0", "w5"), donors=())
