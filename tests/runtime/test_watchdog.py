"""The stall watch (runtime.watchdog.StallWatch) driven in-process on a fake clock.

Whole stalls, as the supervisor feeds them -- commits seen, polls every 20 ms, a fault
reported -- against a fake view of the members (their /proc state, heartbeats, finished
marks, their hosts' silences). No process, no store, no sleep: every instant is
computed, so the times asserted are fake-clock instants, not elapsed time. The rules'
own arithmetic is tested in test_coordinator.py and test_hang_deadline.py; these test
their sequencing: what is looked at when, what is decided, what is disarmed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from runtime import protocol as P
from runtime.coordinator import blame_quiet_s, hang_quiet_s
from runtime.processes import stopped_deadline
from runtime.supervisor import LaunchConfig
from runtime.watchdog import (
    Action,
    Committed,
    Disarm,
    FaultReported,
    FenceHung,
    FenceReporter,
    GenerationReady,
    StallWatch,
    Tick,
    Undecided,
    WatchConfig,
)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LaunchConfig)}
CONFIG = WatchConfig(
    hang_floor_s=float(_DEFAULTS["hang_floor_s"]),  # type: ignore[arg-type]
    hang_factor=float(_DEFAULTS["hang_factor"]),  # type: ignore[arg-type]
    hang_startup_s=float(_DEFAULTS["hang_startup_s"]),  # type: ignore[arg-type]
    hang_stopped_factor=float(_DEFAULTS["hang_stopped_factor"]),  # type: ignore[arg-type]
    fault_grace_s=float(_DEFAULTS["fault_grace_s"]),  # type: ignore[arg-type]
)
POLL = 0.02  # the supervisor's store poll
STEP = 0.1
T0 = 1000.0
MEMBERS = ("w0", "w1")


@dataclass
class View:
    """A fake :class:`runtime.watchdog.WatchView` that also counts the looks."""

    stopped_now: set[str] = field(default_factory=set)
    beats: dict[str, bytes | None] = field(default_factory=dict)
    finished_now: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    hosts: dict[str, str] = field(default_factory=dict)
    silences: dict[str, float] = field(default_factory=dict)
    quiet: bool = False
    looks: dict[str, int] = field(default_factory=dict)

    def _look(self, what: str) -> None:
        self.looks[what] = self.looks.get(what, 0) + 1

    def quiet_nodes(self) -> bool:
        return self.quiet

    def node_silences(self) -> dict[str, float]:
        return dict(self.silences)

    def host_of(self, slot: str) -> str | None:
        return self.hosts.get(slot)

    def stopped(self, slot: str) -> bool:
        self._look("proc")
        return slot in self.stopped_now

    def beat(self, slot: str) -> bytes | None:
        self._look("beat")
        return self.beats.get(slot)

    def alive(self, slot: str) -> bool:
        return slot not in self.dead

    def eligible(self, slot: str) -> bool:
        return slot not in self.dead

    def finished(self, slot: str) -> bool:
        return slot in self.finished_now


@dataclass
class Job:
    """A two-member job as the supervisor sees it: ``t`` is the fake monotonic clock."""

    watch: StallWatch = field(default_factory=lambda: StallWatch(CONFIG))
    view: View = field(default_factory=View)
    t: float = T0
    gen: int = 0
    step: int = 0
    recovering: bool = False
    members: tuple[str, ...] = MEMBERS
    acts: list[tuple[float, Action]] = field(default_factory=list)

    def tick(self) -> list[Action]:
        got = self.watch.step(Tick(view=self.view, members=self.members,
                                   recovering=self.recovering, last_step=self.step,
                                   step_seconds=STEP), self.t)
        self.acts.extend((self.t, a) for a in got)
        return got

    def commit(self, gen: int | None = None) -> None:
        self.step += 1
        self.watch.step(Committed(gen=self.gen if gen is None else gen, step=self.step,
                                  current_gen=self.gen, recovering=self.recovering), self.t)

    def advance(self, seconds: float, *, waiting: Iterable[str] = ()) -> None:
        """Poll for ``seconds``; the ``waiting`` members write a new heartbeat every
        BEAT_INTERVAL_S (a peer waiting in a collective)."""
        end = self.t + seconds
        next_beat = self.t + P.BEAT_INTERVAL_S
        n = 0
        while self.t < end - 1e-9:
            self.t = round(self.t + POLL, 9)
            if self.t >= next_beat:
                n += 1
                for s in waiting:
                    self.view.beats[s] = f"{self.step + 1} {n}".encode()
                next_beat += P.BEAT_INTERVAL_S
            self.tick()

    def steady(self, steps: int) -> None:
        """``steps`` steps of STEP seconds, polled every POLL."""
        for _ in range(steps):
            for _ in range(round(STEP / POLL)):
                self.t = round(self.t + POLL, 9)
                self.tick()
            self.commit()


def fences(job: Job) -> list[tuple[float, FenceHung]]:
    return [(t, a) for t, a in job.acts if isinstance(a, FenceHung)]


def test_steady_steps_decide_nothing_and_never_read_proc() -> None:
    job = Job()
    job.steady(60)
    assert job.acts == []
    # /proc is read only once a step has stalled for half the stopped deadline; the
    # beats from a quarter of the hang deadline (the floor's 0.1 s: once a 0.1 s step).
    assert "proc" not in job.view.looks


def test_a_stopped_member_is_fenced_at_the_stopped_deadline_not_before() -> None:
    job = Job()
    job.steady(40)
    last_commit = job.t
    job.view.stopped_now.add("w1")
    job.advance(3.0, waiting=["w0"])
    (at, fence), *rest = fences(job)
    assert rest == [] and fence.slots == ("w1",)
    assert "stopped (state T in /proc)" in fence.why
    deadline = stopped_deadline(STEP, CONFIG.hang_stopped_factor)
    assert at - last_commit >= deadline
    assert at - last_commit < deadline + 2 * POLL + 1e-9  # at the first poll past it
    assert fence.since == last_commit  # the stall counts in the recovery
    assert job.watch.stalled_s(job.t) == 0.0  # disarmed until the next commit
    assert job.view.looks["proc"] > 0


def test_every_member_stopped_is_never_fenced_by_the_stopped_rule() -> None:
    # Nobody left holding the state (a frozen machine): not this rule's to fence.
    job = Job()
    job.steady(40)
    job.view.stopped_now.update(MEMBERS)
    job.advance(0.6)
    assert not any("state T" in f.why for _, f in fences(job))


def test_a_hang_proc_cannot_see_is_fenced_when_its_peer_still_beats() -> None:
    job = Job()
    job.steady(40)
    last_commit = job.t
    deadline = job.watch.hang_deadline(job.step)
    job.advance(deadline + 2.0, waiting=["w0"])
    (at, fence), *_ = fences(job)
    assert fence.slots == ("w1",)
    assert "its peers were waiting for it" in fence.why
    assert at - last_commit >= deadline
    assert fence.since == last_commit


def test_a_stall_with_every_member_beating_is_warned_about_and_rearmed() -> None:
    # Every member waits (each beats): nobody is the stuck one -- warn, never fence.
    job = Job()
    job.steady(40)
    last_commit = job.t
    deadline = job.watch.hang_deadline(job.step)
    job.advance(3 * deadline, waiting=MEMBERS)
    assert fences(job) == []
    warned = [(t, a) for t, a in job.acts if isinstance(a, Undecided)]
    assert warned and not warned[0][1].every_member_silent
    first = warned[0][0]
    assert first - last_commit >= deadline + hang_quiet_s(deadline)  # looked again first
    if len(warned) > 1:  # re-armed: the next warning a whole deadline later
        assert warned[1][0] - first >= deadline


def test_every_member_silent_is_undecided_not_fenced() -> None:
    job = Job()
    job.steady(40)
    deadline = job.watch.hang_deadline(job.step)
    job.advance(2 * deadline)
    warned = [a for _, a in job.acts if isinstance(a, Undecided)]
    assert fences(job) == [] and warned and warned[0].every_member_silent


def test_a_quiet_host_defers_every_blame_to_the_node_check() -> None:
    job = Job()
    job.steady(40)
    job.view.quiet = True
    job.view.stopped_now.add("w1")
    job.watch.step(FaultReported(slot="w0", error="gloo timeout"), job.t)
    job.advance(5.0, waiting=["w0"])
    assert job.acts == []


def test_a_member_on_a_host_not_heard_from_is_left_to_the_node_check() -> None:
    job = Job()
    job.view.hosts = {"w0": "host0", "w1": "host1"}
    job.view.silences = {"host0": 0.0, "host1": 1.0}  # host1's agent beat 1 s ago
    job.steady(40)
    job.advance(3.0, waiting=["w0"])
    assert fences(job) == []


def test_a_member_that_finished_stretches_the_deadline_to_the_startup_one() -> None:
    job = Job()
    job.steady(40)
    last_commit = job.t
    job.view.finished_now.add("w0")  # the job's end: a teardown, not a stuck step
    job.advance(CONFIG.hang_startup_s + 1.0, waiting=["w0"])
    (at, fence), *_ = fences(job)
    assert fence.slots == ("w1",)
    assert at - last_commit >= CONFIG.hang_startup_s


def test_a_recovery_disarms_and_the_ready_generation_rearms() -> None:
    job = Job()
    job.steady(40)
    job.recovering = True
    job.advance(5.0, waiting=["w0"])  # the recovery takes its time: not a stall
    assert job.acts == []
    job.commit()  # a commit seen during the recovery does not arm
    job.gen, job.recovering = 1, False
    job.watch.step(GenerationReady(), job.t)
    ready_at = job.t
    assert job.watch.stalled_s(job.t) == 0.0
    job.advance(3.0, waiting=["w0"])
    (_, fence), *_ = fences(job)
    assert fence.since == ready_at


def test_a_commit_of_an_older_generation_does_not_arm() -> None:
    job = Job(gen=2)
    job.commit(gen=1)
    assert job.watch.stalled_s(job.t + 10) == 0.0
    job.commit()
    assert job.watch.stalled_s(job.t + 10) == pytest.approx(10)


def test_a_disarmed_watch_waits_for_the_next_commit_and_forgets_the_gap() -> None:
    # A host lent (the job shrinks): disarmed until the new generation commits, and the
    # time in between is not a step (it must not stretch the deadline).
    job = Job()
    job.steady(40)
    before = job.watch.hang_deadline(job.step)
    job.watch.step(Disarm(), job.t)
    job.advance(5.0, waiting=["w0"])
    assert job.acts == []
    job.gen += 1
    job.commit()
    assert job.watch.hang_deadline(job.step) == pytest.approx(before)
    job.advance(3.0, waiting=["w0"])
    assert [f.slots for _, f in fences(job)] == [("w1",)]


def test_a_failed_collective_blames_the_silent_peer() -> None:
    # A hang deadline longer than the blame's wait, so that the blame decides first.
    job = Job(watch=StallWatch(dataclasses.replace(CONFIG, hang_floor_s=2.0)))
    job.steady(40)
    job.view.beats["w1"] = b"40 0"  # w1 stuck: its heartbeat never changes again
    # w0's collective times out a while after w1 got stuck (the watch has been noting
    # the beats since a quarter of the hang deadline).
    job.advance(0.6, waiting=["w0"])
    job.watch.step(FaultReported(slot="w0", error="gloo timeout"), job.t)
    reported = job.t
    job.advance(2.0, waiting=["w0"])
    (at, fence), *_ = fences(job)
    assert fence.slots == ("w1",) and fence.why == "w0 reported: gloo timeout"
    assert at - reported >= blame_quiet_s(CONFIG.fault_grace_s, STEP, P.BEAT_INTERVAL_S)
    assert not job.watch.fault_pending


def test_a_failed_collective_with_no_peer_stuck_fences_the_reporter() -> None:
    job = Job()
    job.steady(40)
    job.watch.step(FaultReported(slot="w0", error="connection reset"), job.t)
    job.watch.step(FaultReported(slot="w1", error="second report"), job.t)  # first counts
    reported = job.t
    job.advance(1.0, waiting=MEMBERS)  # both wait for the next generation: nobody stuck
    reporters = [(t, a) for t, a in job.acts if isinstance(a, FenceReporter)]
    assert [a for _, a in reporters] == [FenceReporter("w0", "connection reset")]
    assert reporters[0][0] - reported >= blame_quiet_s(CONFIG.fault_grace_s, STEP,
                                                       P.BEAT_INTERVAL_S)
    assert fences(job) == []


def test_a_fault_whose_reporter_died_is_left_to_the_death_path() -> None:
    job = Job()
    job.steady(40)
    job.watch.step(FaultReported(slot="w0", error="gloo timeout"), job.t)
    job.view.dead.add("w0")
    job.advance(0.3, waiting=["w1"])  # under the hang deadline's quiet look
    assert job.acts == [] and job.watch.fault_pending
    job.watch.forget_fault()  # the death's incident explains it
    assert not job.watch.fault_pending
