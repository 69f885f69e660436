"""The coordinator's deaths, incidents and their records as a state machine.

What happens between a member's death and its records was the supervisor's own state and
sequencing: a death joins the newest open incident when it began inside its merge window
(one failure, one outcome) or opens one of its own (naming the recorded failure it
happened during); its draft is made durable before the recovery is planned (a coordinator
dying now loses nothing); its failure record waits for the merge window to close and its
exit statuses (the cause) to be known, then catches up with steps its generation
committed but the coordinator had not read; and once the recovery's new generation runs
(or the job fails, or ends), every open incident gets its one outcome. Here that is one
object, :class:`Deaths`, after torchft's ``quorum_compute`` and like
:class:`runtime.watchdog.StallWatch`: it keeps the open incidents and the recovery under
way, is given events (:class:`Died`, :class:`Poll`, :class:`Resolve`) with ``now`` from
the caller's monotonic clock, and returns what to do as data (:class:`Journal`,
:class:`Recover`, :class:`WriteFailure`, :class:`WriteOutcomes`). It owns no clock,
store, process or file: exit statuses, the steps a generation committed and why the
supervisor fenced a member are asked of the :class:`DeathView` passed with the event,
only when a rule needs them.

The rules stay :mod:`runtime.coordinator`'s pure functions (the merge window, when a
record is due, the cause and detail, the steps reached); this module is their one
sequencing. The supervisor (:mod:`runtime.supervisor`) finds the dead (it polls the
processes and the node pool), carries out the actions (writes the drafts and records,
plans the recovery) and feeds the machine; ``tests/runtime/test_deaths.py`` drives it
in-process on a fake clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from runtime import records as R
from runtime.coordinator import (
    EXIT_STATUS_WAIT_S,
    MERGE_WINDOW_S,
    FenceNote,
    RecordDue,
    death_record_due,
    describe_death,
    joined_note,
    joins_incident,
    steps_reached,
)
from runtime.errors import OutcomeTwiceError
from runtime.recovery import FailureClass, Incident, Outcome, Recovery

__all__ = [
    "Action",
    "DeathView",
    "Deaths",
    "DeathsConfig",
    "Died",
    "Draft",
    "Event",
    "Journal",
    "Poll",
    "Recover",
    "Resolve",
    "WriteFailure",
    "WriteOutcomes",
]


class DeathView(Protocol):
    """What :class:`Deaths` asks of the world, only when its rules need it."""

    def exit_statuses(self, slots: Sequence[str], wait_until: float | None
                      ) -> list[tuple[str, int | None]]:
        """Each of ``slots`` with its exit status (None: not known yet); ``wait_until``
        (the caller's monotonic clock): wait for the unknown ones until then (None: do
        not wait)."""
        ...

    def steps_committed_in(self, gen: int) -> int:
        """The last step generation ``gen`` committed, as far as can be read (-1: none)."""
        ...

    def fences(self, slots: Sequence[str]) -> list[FenceNote]:
        """Why the coordinator itself killed each of ``slots`` it fenced (in order)."""
        ...


@dataclass(frozen=True, slots=True)
class DeathsConfig:
    """The merge window and the longest wait for exit statuses (seconds)."""

    window_s: float = MERGE_WINDOW_S
    status_wait_s: float = EXIT_STATUS_WAIT_S


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Died:
    """Members were seen dead at ``now`` (and retired by the caller): ``slots`` in the
    order seen; ``members``, those of them in the current generation (the recovery
    replaces these); ``detected``, when the deaths began (earlier than ``now`` for a
    fenced hang: :func:`runtime.coordinator.death_detected_at`); ``occurred_at``, that
    instant's wall-clock date (the caller's conversion, fixed once: the draft and the
    record carry the same date); ``step``, the step reached as of now; ``gen``, the
    generation that failed."""

    slots: tuple[str, ...]
    members: tuple[str, ...]
    detected: float
    occurred_at: str
    step: int
    gen: int
    view: DeathView


@dataclass(frozen=True, slots=True)
class Poll:
    """Write the failure records that are due; ``block``: every one now (an outcome is
    due, and an outcome must follow its failure), waiting for exit statuses up to the
    limit."""

    block: bool
    view: DeathView


@dataclass(frozen=True, slots=True)
class Resolve:
    """The open incidents get their outcome: ``outcome`` None -- the recovery's own (its
    new generation completed a step: ``live_migrated``, or ``rolled_back`` with its lost
    steps); else that outcome with ``lost_steps`` (the job failed: every step; it ended
    with every step committed: 0). Their failure records are written first."""

    view: DeathView
    outcome: Outcome | None = None
    lost_steps: int = 0


Event = Died | Poll | Resolve


# ----------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Draft:
    """A death acted on whose record is not written yet: what its record would say."""

    incident: Incident
    cause: str
    detail: str


@dataclass(frozen=True, slots=True)
class Journal:
    """Make these drafts durable, replacing the previous ones (none: remove them)."""

    drafts: tuple[Draft, ...]


@dataclass(frozen=True, slots=True)
class Recover:
    """Plan the recovery from ``incident`` (now in :attr:`Deaths.recovery`'s incidents)
    without ``dead``; ``new``: the incident was opened by these deaths (not joined)."""

    incident: Incident
    dead: tuple[str, ...]
    new: bool


@dataclass(frozen=True, slots=True)
class WriteFailure:
    """Write the failure record of ``incident`` (its step as caught up) now."""

    incident: Incident
    cause: str
    detail: str


@dataclass(frozen=True, slots=True)
class WriteOutcomes:
    """Write one outcome for each of ``incidents`` (each once, ever), ``lost_steps``
    lost; the recovery is over."""

    incidents: tuple[Incident, ...]
    outcome: Outcome
    lost_steps: int


Action = Journal | Recover | WriteFailure | WriteOutcomes


class Deaths:
    """The open incidents and the recovery under way, sequenced (see the module doc).

    :attr:`recovery` is also set by the caller's other membership changes (a move, a
    loan, a resume) -- they open their incidents with their records already written --
    and read by them; :attr:`unrecorded` are the deaths acted on whose failure record is
    not written yet. An incident's outcome is given once: a second :class:`Resolve`
    naming it raises :class:`runtime.errors.OutcomeTwiceError`.
    """

    def __init__(self, config: DeathsConfig | None = None) -> None:
        self.config = config or DeathsConfig()
        self.recovery = Recovery()
        self.unrecorded: list[Incident] = []
        self._resolved: set[str] = set()

    def step(self, event: Event, now: float) -> list[Action]:
        """Take ``event`` at ``now`` (the caller's monotonic clock); return what to do,
        in order."""
        if isinstance(event, Died):
            return self._died(event, now)
        if isinstance(event, Poll):
            return self._poll(event.view, now, block=event.block)
        return self._resolve(event, now)

    def _died(self, ev: Died, now: float) -> list[Action]:
        pending = self.recovery.incidents
        last = pending[-1] if pending else None
        # Only into an incident whose record is not written yet: a death seen after it
        # was (a host found frozen seconds later, its stall dated back into the window)
        # would be folded into a record that never names it -- a failure unrecorded.
        if last is not None and not last.emitted and joins_incident(
                last.failure_class, last.detected, ev.detected,
                window_s=self.config.window_s):
            # The same incident seen one process later (a node, a replica group, the whole
            # job): one failure, one outcome; its draft names them too before the plan
            # changes, and the recovery is planned again from all of them.
            pending.pop()
            last.slots += list(ev.slots)
            return [self._journal(ev.view), Recover(incident=last, dead=ev.members,
                                                    new=False)]
        inc = Incident(event_id=R.new_event_id(), failure_class=FailureClass.UNPLANNED,
                       cause="", slots=list(ev.slots), detected=ev.detected, step=ev.step,
                       emitted=False, gen=ev.gen, occurred_at=ev.occurred_at, seen=now)
        first = next((i for i in pending if i.emitted), None)
        if first is not None:
            # A later death during the recovery from a recorded failure: a failure of its
            # own (nothing written is ever rewritten), naming the first.
            inc.joined = joined_note(first.event_id, first.cause)
        self.unrecorded.append(inc)
        # Durable before anything is decided about it: the record itself waits for the
        # merge window, its draft does not.
        return [self._journal(ev.view), Recover(incident=inc, dead=ev.members, new=True)]

    def _describe(self, inc: Incident, rcs: list[tuple[str, int | None]],
                  view: DeathView) -> tuple[str, str]:
        return describe_death(rcs, view.fences(inc.slots), inc.note + inc.joined)

    def _journal(self, view: DeathView) -> Journal:
        drafts = []
        for inc in self.unrecorded:
            cause, detail = self._describe(inc, view.exit_statuses(inc.slots, None), view)
            drafts.append(Draft(incident=inc, cause=cause, detail=detail))
        return Journal(drafts=tuple(drafts))

    def _poll(self, view: DeathView, now: float, *, block: bool) -> list[Action]:
        acts: list[Action] = []
        rec = self.recovery
        for inc in list(self.unrecorded):
            due = death_record_due(now=now, detected=inc.detected, seen=inc.seen,
                                   merging=inc in rec.incidents, block=block,
                                   window_s=self.config.window_s,
                                   status_wait_s=self.config.status_wait_s)
            if due == RecordDue.HOLD:
                continue  # a death seen within the window still joins it
            wait = inc.seen + self.config.status_wait_s if due == RecordDue.NOW else None
            rcs = view.exit_statuses(inc.slots, wait)
            if due == RecordDue.IF_KNOWN and any(rc is None for _, rc in rcs):
                continue
            # Steps the failed generation committed just before the death (rank 0
            # commits, then a peer dies in the next step) were maybe not read yet.
            reached = view.steps_committed_in(inc.gen)
            if reached > inc.step:
                got = steps_reached(recorded_step=inc.step, reached=reached,
                                    outcome=rec.outcome, rollback_step=rec.rollback_step,
                                    lost_steps=rec.lost_steps, absorbed=rec.absorbed)
                inc.step, rec.lost_steps = got.step, got.lost_steps
            cause, detail = self._describe(inc, rcs, view)
            inc.cause, inc.emitted = cause, True
            self.unrecorded.remove(inc)
            acts.append(WriteFailure(incident=inc, cause=cause, detail=detail))
        if acts:
            acts.append(self._journal(view))  # recorded: their drafts go
        return acts

    def _resolve(self, ev: Resolve, now: float) -> list[Action]:
        acts = self._poll(ev.view, now, block=True)
        rec = self.recovery
        if not rec.incidents:
            self.recovery = Recovery()
            return acts
        if ev.outcome is None:
            outcome = rec.outcome or Outcome.LIVE_MIGRATED
            lost = rec.lost_steps if outcome == Outcome.ROLLED_BACK else 0
        else:
            outcome, lost = ev.outcome, ev.lost_steps
        again = [i.event_id for i in rec.incidents if i.event_id in self._resolved]
        if again:
            self.recovery = Recovery()  # (a supervisor stopping on this error records its own)
            raise OutcomeTwiceError(f"failure(s) {', '.join(again)} already have an outcome")
        self._resolved.update(i.event_id for i in rec.incidents)
        acts.append(WriteOutcomes(incidents=tuple(rec.incidents), outcome=outcome,
                                  lost_steps=lost))
        self.recovery = Recovery()
        return acts
