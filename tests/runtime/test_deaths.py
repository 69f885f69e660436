"""The deaths' state machine (runtime.deaths) driven in-process on a fake clock: a death
is durable as a draft before its recovery is planned; deaths inside the merge window are
one failure; its record waits for the window and the exit statuses, catches up with the
steps its generation committed, and is written before any outcome; every incident gets
exactly one outcome."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from runtime.coordinator import FenceNote
from runtime.deaths import (
    Action,
    Deaths,
    DeathsConfig,
    Died,
    Journal,
    Poll,
    Recover,
    Resolve,
    WriteFailure,
    WriteOutcomes,
)
from runtime.errors import OutcomeTwiceError
from runtime.recovery import FailureClass, Incident, Outcome, Recovery

WINDOW = 1.0
WAIT = 5.0


class View:
    """Exit statuses, committed steps and fences as a test sets them; counts its looks."""

    def __init__(self) -> None:
        self.rcs: dict[str, int | None] = {}
        self.committed: dict[int, int] = {}
        self.fenced: dict[str, FenceNote] = {}
        self.waits: list[tuple[tuple[str, ...], float | None]] = []

    def exit_statuses(self, slots: Sequence[str], wait_until: float | None
                      ) -> list[tuple[str, int | None]]:
        self.waits.append((tuple(slots), wait_until))
        return [(s, self.rcs.get(s)) for s in slots]

    def steps_committed_in(self, gen: int) -> int:
        return self.committed.get(gen, -1)

    def fences(self, slots: Sequence[str]) -> list[FenceNote]:
        return [self.fenced[s] for s in slots if s in self.fenced]


def _book() -> Deaths:
    return Deaths(DeathsConfig(window_s=WINDOW, status_wait_s=WAIT))


def _died(book: Deaths, view: View, now: float, *slots: str, members: Sequence[str] = (),
          step: int = 10, gen: int = 0, detected: float | None = None) -> list[Action]:
    """A death seen at ``now``, its Recover carried out as the supervisor's _recover does
    (the incident joins the recovery's)."""
    acts = book.step(Died(slots=slots, members=tuple(members or slots),
                          detected=now if detected is None else detected,
                          occurred_at="2026-12-05T00:00:00+00:00", step=step, gen=gen,
                          view=view), now)
    for act in acts:
        if isinstance(act, Recover):
            book.recovery.incidents.append(act.incident)
            book.recovery.gen = gen + 1
    return acts


def test_a_death_is_journalled_before_its_recovery_and_held_in_the_window() -> None:
    book, view = _book(), View()
    acts = _died(book, view, 100.0, "w0")
    journal, recover = acts
    # The draft first (durable before anything is decided), then the plan.
    assert isinstance(journal, Journal) and isinstance(recover, Recover)
    [draft] = journal.drafts
    assert draft.incident is recover.incident and recover.new and recover.dead == ("w0",)
    assert (draft.cause, draft.detail) == ("process_killed", "w0 exit unknown")
    assert draft.incident.step == 10 and not draft.incident.emitted
    # Inside the window its record waits, and the exit status is not even looked at.
    view.waits.clear()
    view.rcs["w0"] = -9
    assert book.step(Poll(block=False, view=view), 100.0 + WINDOW - 1e-6) == []
    assert view.waits == []
    # The window closed and the status known: written, and the drafts go.
    write, empty = book.step(Poll(block=False, view=view), 100.0 + WINDOW)
    assert isinstance(write, WriteFailure) and write.incident is draft.incident
    assert (write.cause, write.detail) == ("process_killed", "w0 exit -9")
    assert write.incident.emitted and write.incident.cause == "process_killed"
    assert empty == Journal(drafts=())
    assert book.unrecorded == [] and book.step(Poll(block=False, view=view), 200.0) == []


def test_deaths_inside_the_window_are_one_failure_planned_again_from_all() -> None:
    book, view = _book(), View()
    [_, first] = _died(book, view, 100.0, "w0")
    assert isinstance(first, Recover)
    # The spare called in dies 0.5 s later (not a member of the failed generation).
    journal, again = _died(book, view, 100.5, "s0", members=["w1"])
    assert isinstance(journal, Journal) and isinstance(again, Recover)
    assert again.incident is first.incident and not again.new and again.dead == ("w1",)
    [draft] = journal.drafts  # one draft, naming both
    assert draft.detail == "w0 exit unknown, s0 exit unknown"
    assert book.recovery.incidents == [first.incident]  # popped and re-planned, once


def test_a_death_after_the_window_is_its_own_failure_naming_the_recorded_one() -> None:
    book, view = _book(), View()
    view.rcs["w0"] = -9
    [_, first] = _died(book, view, 100.0, "w0")
    assert isinstance(first, Recover)
    [written, _] = book.step(Poll(block=False, view=view), 101.5)
    assert isinstance(written, WriteFailure)
    journal, second = _died(book, view, 102.0, "s0")
    assert isinstance(second, Recover) and second.new
    assert second.incident is not first.incident
    [draft] = journal.drafts  # the recorded one's draft is gone; nothing is rewritten
    assert draft.detail == (f"s0 exit unknown; during the recovery from failure "
                            f"{first.incident.event_id} (process_killed)")
    assert book.recovery.incidents == [first.incident, second.incident]


def test_a_death_during_a_move_is_a_failure_of_its_own() -> None:
    # A move's incident is recorded when it starts; a death 0.1 s later does not join a
    # pre-emptive failure: its own record, naming the move's.
    book, view = _book(), View()
    move = Incident(event_id="move-1", failure_class=FailureClass.PREEMPTIVE,
                    cause="ecc_warning", slots=["w0"], detected=100.0, step=10)
    book.recovery = Recovery(incidents=[move], gen=1, outcome=Outcome.LIVE_MIGRATED)
    journal, rec = _died(book, view, 100.1, "w1")
    assert isinstance(journal, Journal) and isinstance(rec, Recover) and rec.new
    assert journal.drafts[0].detail.endswith("during the recovery from failure move-1 "
                                             "(ecc_warning)")


def test_a_record_waits_for_the_exit_status_then_for_at_most_the_limit() -> None:
    book, view = _book(), View()
    _died(book, view, 100.0, "w0")
    book.recovery = Recovery()  # (its recovery done elsewhere: the window does not hold)
    view.waits.clear()
    # Not known yet: looked at, not waited for, not written.
    assert book.step(Poll(block=False, view=view), 102.0) == []
    assert view.waits == [(("w0",), None)]
    # Past the limit: waited for until the limit from when it was seen, then written
    # as the kill the draft said.
    write, _ = book.step(Poll(block=False, view=view), 100.0 + WAIT + 0.1)
    assert view.waits[-1] == (("w0",), 100.0 + WAIT)
    assert isinstance(write, WriteFailure) and write.detail == "w0 exit unknown"


def test_an_outcome_due_writes_the_failure_first_even_inside_the_window() -> None:
    book, view = _book(), View()
    view.rcs["w0"] = 1
    [_, rec] = _died(book, view, 100.0, "w0")
    assert isinstance(rec, Recover)
    acts = book.step(Resolve(view=view), 100.2)
    assert [type(a) for a in acts] == [WriteFailure, Journal, WriteOutcomes]
    assert isinstance(acts[0], WriteFailure) and acts[0].cause == "process_exit"
    out = acts[2]
    assert isinstance(out, WriteOutcomes)
    assert out.incidents == (rec.incident,) and out.outcome == Outcome.LIVE_MIGRATED
    assert out.lost_steps == 0
    assert not book.recovery.active and book.recovery.gen is None


def test_a_record_catches_up_with_the_steps_its_generation_committed() -> None:
    # Rank 0 committed step 12 of generation 3, then a peer died before the commit was
    # read (the death says 10); the recovery rolls back to the checkpoint of step 5 and
    # its survivors cannot rerun one step (transparent mode).
    book, view = _book(), View()
    view.rcs["w1"] = -9
    [_, rec] = _died(book, view, 100.0, "w1", step=10, gen=3)
    assert isinstance(rec, Recover)
    book.recovery.outcome = Outcome.ROLLED_BACK
    book.recovery.rollback_step, book.recovery.absorbed = 5, 1
    book.recovery.lost_steps = 10 - 5 + 1
    view.committed[3] = 12
    acts = book.step(Resolve(view=view), 101.0)
    write, out = acts[0], acts[-1]
    assert isinstance(write, WriteFailure) and write.incident.step == 12
    assert isinstance(out, WriteOutcomes) and out.outcome == Outcome.ROLLED_BACK
    assert out.lost_steps == 12 - 5 + 1


def test_a_fenced_member_is_recorded_with_its_fence_not_its_kill() -> None:
    book, view = _book(), View()
    view.rcs.update({"w0": -9, "w1": -9})
    view.fenced["w0"] = FenceNote(cause="hang", detail="w0 stopped for 3.1 s")
    view.fenced["w1"] = FenceNote(cause="hang", detail="w0 stopped for 3.1 s")
    [journal, _] = _died(book, view, 100.0, "w0", "w1", detected=97.0)
    assert isinstance(journal, Journal)
    [draft] = journal.drafts
    assert (draft.cause, draft.detail) == ("hang", "w0 stopped for 3.1 s")
    assert draft.incident.detected == 97.0  # the stall counts in the recovery


def test_every_incident_gets_exactly_one_outcome() -> None:
    book, view = _book(), View()
    view.rcs["w0"] = -9
    [_, rec] = _died(book, view, 100.0, "w0", step=40)
    assert isinstance(rec, Recover)
    [*_, out] = book.step(Resolve(view=view, outcome=Outcome.FAILED, lost_steps=40), 101.0)
    assert isinstance(out, WriteOutcomes)
    assert (out.outcome, out.lost_steps) == (Outcome.FAILED, 40)
    # Nothing open: a second resolution writes nothing.
    assert book.step(Resolve(view=view), 102.0) == []
    # A bug that puts a resolved incident back is stopped before the records, and the
    # recovery is cleared (the supervisor stopping on it records its own failure).
    book.recovery = Recovery(incidents=[rec.incident], gen=2)
    with pytest.raises(OutcomeTwiceError, match=rec.incident.event_id):
        book.step(Resolve(view=view), 103.0)
    assert not book.recovery.active


def test_a_death_dated_into_the_window_of_a_recorded_failure_is_recorded_itself() -> None:
    # w1 is killed; its record is written when the new generation is ready (inside the
    # window); 3 s later the spare called in is found on a frozen host, its stall dated
    # back to 0.1 s after the kill. Folding it into the written record would leave it
    # unrecorded: it is a failure of its own, naming the first.
    book, view = _book(), View()
    view.rcs["w1"] = -9
    [_, first] = _died(book, view, 100.0, "w1")
    assert isinstance(first, Recover)
    [write, _] = book.step(Poll(block=True, view=view), 100.3)
    assert isinstance(write, WriteFailure) and first.incident.emitted
    view.fenced["w2"] = FenceNote(cause="hang", detail="node host2 silent for 3.02 s")
    journal, second = _died(book, view, 103.1, "w2", detected=100.1)
    assert isinstance(second, Recover) and second.new
    assert second.incident is not first.incident and first.incident.slots == ["w1"]
    assert isinstance(journal, Journal)
    [draft] = journal.drafts
    assert draft.cause == "hang" and first.incident.event_id in draft.detail
