"""The coordinator's stall watch as a state machine: ``step(event, now) -> actions``.

Two of the coordinator's decisions watch the same things -- whether the committed step
advances, and whose heartbeat still changes -- and were the supervisor's own state and
sequencing (the step watchdog, and the blame after a reported collective fault). Here
they are one object, :class:`StallWatch`, after torchft's ``quorum_compute``: it keeps
its state, is given events (a commit seen, a generation ready, a fault reported, a poll
``Tick``) with ``now`` from the caller's monotonic clock, and returns what to do as data
(:class:`FenceHung`, :class:`FenceReporter`, :class:`Undecided`). It owns no clock, no
store and no process: what it needs to look at -- a member's ``/proc`` state, its
heartbeat, whether it finished, its host's silence -- it asks of the :class:`WatchView`
the caller passes with each ``Tick``, and only when its rules call for the look (reading
``/proc`` and the store every poll costs), exactly as the supervisor did inline.

The rules themselves stay the pure functions of :mod:`runtime.coordinator` (the stopped
rule, the hang phases and verdict, the blame); this module is their one sequencing. The
supervisor (:mod:`runtime.supervisor`) turns its observations into events, calls
:meth:`StallWatch.step` and carries out the actions (fence, kill, log). So a whole stall
-- steady steps, a rank stopped, a slow step, a silent host, the job's end, a failed
collective -- is driven in-process on a fake clock (``tests/runtime/test_watchdog.py``),
and the real-process tests are kept for the real faults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.coordinator import (
    HangPhase,
    blame,
    blame_due,
    blame_quiet_s,
    hang_deadline_at_end,
    hang_hosts_heard,
    hang_phase,
    hang_quiet_s,
    hang_undecided,
    hang_verdict,
    note_stopped,
    observe_beats,
    silent_members,
    stalled_for,
    stopped_look_due,
    stopped_to_fence,
)
from runtime.detection import StepTimes
from runtime.processes import stopped_deadline
from runtime.protocol import BEAT_INTERVAL_S

__all__ = [
    "Action",
    "Committed",
    "Disarm",
    "Event",
    "FaultReported",
    "FenceHung",
    "FenceReporter",
    "GenerationReady",
    "StallWatch",
    "Tick",
    "Undecided",
    "WatchConfig",
    "WatchView",
]


class WatchView(Protocol):
    """What the watch may look at, read when its rules ask (the supervisor's store and
    process pool; a fake in the in-process tests)."""

    def quiet_nodes(self) -> bool:
        """True while a host is silent (the node check decides first)."""

    def node_silences(self) -> Mapping[str, float]:
        """Seconds since each live host's heartbeat last advanced."""

    def host_of(self, slot: str) -> str | None:
        """The host ``slot`` runs on (None: the coordinator's machine)."""

    def stopped(self, slot: str) -> bool:
        """True when ``/proc`` shows ``slot``'s process stopped."""

    def beat(self, slot: str) -> bytes | None:
        """``slot``'s heartbeat as stored now (None: none yet)."""

    def alive(self, slot: str) -> bool:
        """True while ``slot``'s process runs (a dead one is the death path's)."""

    def eligible(self, slot: str) -> bool:
        """True when ``slot`` is alive and started (its model built, waiting to step)."""

    def finished(self, slot: str) -> bool:
        """True when ``slot`` has ended its training loop (its finished mark)."""


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """The deadlines' settings (``yoco run``'s ``--hang-*`` and ``--fault-grace``)."""

    hang_floor_s: float
    hang_factor: float
    hang_startup_s: float
    hang_stopped_factor: float
    fault_grace_s: float
    checkpoint_every: int = 0


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Committed:
    """Rank 0's progress as read: step ``step`` committed in generation ``gen``, while the
    job's current generation is ``current_gen`` and a recovery is (not) ``recovering``."""

    gen: int
    step: int
    current_gen: int
    recovering: bool


@dataclass(frozen=True, slots=True)
class GenerationReady:
    """A recovery's or move's new generation took its first step: the watch re-arms and
    learns the step times afresh."""


@dataclass(frozen=True, slots=True)
class Disarm:
    """A membership change without a recovery (a host lent or grown back): the watch
    waits for the new generation's first commit."""


@dataclass(frozen=True, slots=True)
class FaultReported:
    """``slot``'s collective failed (``error``) while nobody had died: the first report is
    judged once its peers had time to show whether one of them is stuck."""

    slot: str
    error: str


@dataclass(frozen=True, slots=True)
class Tick:
    """A poll: judge the stall and the reported fault with what ``view`` shows."""

    view: WatchView
    members: tuple[str, ...]
    recovering: bool
    last_step: int
    step_seconds: float


# ----------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class FenceHung:
    """Fence and kill ``slots`` as hung (cause ``hang``): ``why`` for the record's detail,
    ``since`` when the stall began (it counts in the recovery)."""

    slots: tuple[str, ...]
    why: str
    since: float | None


@dataclass(frozen=True, slots=True)
class FenceReporter:
    """Fence and kill ``slot``, whose own collective failed with no peer stuck (cause
    ``collective_error``)."""

    slot: str
    error: str


@dataclass(frozen=True, slots=True)
class Undecided:
    """The step has not advanced for ``stalled`` seconds but no member can be blamed
    (every one silent, or every one waiting): warn; the deadline is re-armed."""

    stalled: float
    every_member_silent: bool


Action = FenceHung | FenceReporter | Undecided
Event = Committed | GenerationReady | Disarm | FaultReported | Tick


@dataclass(slots=True)
class _Reported:
    at: float
    slot: str
    error: str


@dataclass(slots=True)
class StallWatch:
    """The step watchdog and the blame for a reported collective fault (module doc)."""

    cfg: WatchConfig
    #: When the committed step last advanced or a generation became ready; None: not
    #: armed (before the first step, after a fence, until a membership change steps).
    advanced_at: float | None = None
    steps: StepTimes = field(init=False)
    _progress_seen: tuple[int, int] = (-1, -1)
    _stopped_since: dict[str, float] = field(default_factory=dict)
    _beats: dict[str, tuple[bytes | None, float]] = field(default_factory=dict)
    _reported: _Reported | None = None

    def __post_init__(self) -> None:
        self.steps = StepTimes(checkpoint_every=self.cfg.checkpoint_every)

    # ------------------------------------------------------------- reads
    def stalled_s(self, now: float) -> float:
        """Seconds since the job last committed a step (0.0 while not armed)."""
        if self.advanced_at is None:
            return 0.0
        return max(0.0, now - self.advanced_at)

    def hang_deadline(self, last_step: int) -> float:
        """Seconds without a commit after which the job counts as hung, for the step
        after ``last_step`` (a checkpoint step gets the checkpoint steps' allowance):
        :meth:`runtime.detection.StepTimes.deadline`."""
        return self.steps.deadline(
            floor_s=self.cfg.hang_floor_s, factor=self.cfg.hang_factor,
            startup_s=self.cfg.hang_startup_s, checkpoint=self.steps.checkpoint_next(last_step))

    def step_deadline(self) -> float:
        """The hang deadline of an ordinary step (no checkpoint allowance)."""
        return self.steps.deadline(
            floor_s=self.cfg.hang_floor_s, factor=self.cfg.hang_factor,
            startup_s=self.cfg.hang_startup_s)

    @property
    def fault_pending(self) -> bool:
        """True while a reported collective fault waits to be judged."""
        return self._reported is not None

    def silent(self, view: WatchView, members: Sequence[str], now: float, quiet_s: float
               ) -> list[str]:
        """The live, started ``members`` whose heartbeat has not changed for ``quiet_s``
        seconds of observation (looked at now; a member first seen now is not silent)."""
        self._observe(view, members, now)
        eligible = [s for s in members if view.eligible(s)]
        return silent_members(self._beats, eligible, now, quiet_s)

    # ------------------------------------------------------------- the machine
    def step(self, event: Event, now: float) -> list[Action]:
        """Apply ``event`` seen at ``now`` (the caller's monotonic clock); return what to
        do, in order (empty: nothing)."""
        if isinstance(event, Committed):
            seen = (event.gen, event.step)
            if seen != self._progress_seen:
                self._progress_seen = seen
                if event.gen == event.current_gen and not event.recovering:
                    self.advanced_at = now  # the clock restarts at each commit
                    self.steps.observe(event.step, now)
            return []
        if isinstance(event, GenerationReady):
            self.advanced_at = now
            self.steps.restart()
            return []
        if isinstance(event, Disarm):
            self.advanced_at = None
            self.steps.restart()  # the gap to the next commit is not a step
            return []
        if isinstance(event, FaultReported):
            if self._reported is None:
                self._reported = _Reported(at=now, slot=event.slot, error=event.error)
            return []
        # The fault first, then the stall, as one poll: a peer fenced for the fault
        # disarms the stall's clock; a reporter fenced leaves it running.
        return self._judge_fault(event, now) + self._judge_stall(event, now)

    def _observe(self, view: WatchView, members: Sequence[str], now: float) -> None:
        self._beats = observe_beats(self._beats, {s: view.beat(s) for s in members}, now)

    def forget_fault(self) -> None:
        """Drop the reported fault (a death came: its incident explains the fault)."""
        self._reported = None

    def _fence_hung(self, slots: Sequence[str], why: str) -> list[Action]:
        action = FenceHung(tuple(slots), why, self.advanced_at)
        self.advanced_at = None
        return [action]

    def _judge_fault(self, tick: Tick, now: float) -> list[Action]:
        """The blame after a reported collective fault (runtime.coordinator.blame)."""
        rep = self._reported
        if rep is None:
            return []
        view = tick.view
        quiet = blame_quiet_s(self.cfg.fault_grace_s, tick.step_seconds, BEAT_INTERVAL_S)
        self._observe(view, tick.members, now)
        # A host is silent: the node check decides first (not the reporter).
        host_quiet = view.quiet_nodes()
        if not blame_due(reported_at=rep.at, now=now, quiet_s=quiet, host_quiet=host_quiet,
                         reporter_alive=not host_quiet and view.alive(rep.slot)):
            return []
        self._reported = None
        verdict = blame(rep.slot, self.silent(view, tick.members, now, quiet))
        if verdict.hung:
            return self._fence_hung(verdict.hung, f"{rep.slot} reported: {rep.error}")
        return [FenceReporter(rep.slot, rep.error)]

    def _judge_stall(self, tick: Tick, now: float) -> list[Action]:
        """The step watchdog (runtime.coordinator's stalled_for, the stopped-rank rule,
        hang_phase / hang_verdict / hang_undecided, the hosts heard from, the deadline at
        the job's end)."""
        view, members = tick.view, tick.members
        stalled = stalled_for(now, self.advanced_at, recovering=tick.recovering)
        if stalled is None:
            self._stopped_since.clear()
            return []
        if view.quiet_nodes():
            return []  # a host is silent: the node check decides (lost, or we are cut off)
        if self.cfg.hang_stopped_factor:
            fenced = self._judge_stopped(tick, now, stalled)
            if fenced:
                return fenced
        deadline = self.hang_deadline(tick.last_step)
        phase = hang_phase(stalled, deadline)
        if phase == HangPhase.EARLY:
            return []
        self._observe(view, members, now)  # from a quarter of the deadline: who still beats
        if phase == HangPhase.OBSERVE:
            return []
        ending = any(view.finished(s) for s in members)
        deadline = hang_deadline_at_end(deadline, ending=ending,
                                        startup_s=self.cfg.hang_startup_s)
        if hang_phase(stalled, deadline) != HangPhase.EXPIRED:
            return []  # a member has ended its loop: the job's end, not a stuck step
        silent = self.silent(view, members, now, hang_quiet_s(deadline))
        hung = hang_verdict(silent, len(members))
        if hung and not hang_hosts_heard((view.host_of(s) for s in hung),
                                         view.node_silences()):
            return []  # a host falling silent: the node check decides, not this one
        if hung:
            return self._fence_hung(hung, f"no committed step for {stalled:.2f} s (deadline "
                                          f"{deadline:.2f} s); its peers were waiting for it")
        if hang_undecided(stalled, deadline):
            return []  # the silences may not have shown yet: look again at the next poll
        self.advanced_at = now  # warn again after another deadline
        return [Undecided(stalled, every_member_silent=bool(silent))]

    def _judge_stopped(self, tick: Tick, now: float, stalled: float) -> list[Action]:
        """The stopped-rank rule: from half the stopped deadline, each member's ``/proc``
        state is looked at every poll; the members found stopped on every look for half
        the deadline are fenced once the step has stalled for all of it, as long as one
        member is not stopped (it holds the state)."""
        fast = stopped_deadline(tick.step_seconds, self.cfg.hang_stopped_factor)
        if not stopped_look_due(stalled, fast):
            self._stopped_since.clear()
            return []
        self._stopped_since = note_stopped(
            self._stopped_since, {s: tick.view.stopped(s) for s in tick.members}, now)
        stopped = stopped_to_fence(self._stopped_since, members=len(tick.members), now=now,
                                   stalled=stalled, deadline_s=fast)
        if not stopped:
            return []
        self._stopped_since.clear()
        return self._fence_hung(stopped, f"stopped (state T in /proc) with no committed "
                                         f"step for {stalled:.2f} s (deadline {fast:.2f} s)")
