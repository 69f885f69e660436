"""The hung-worker deadline on a fake clock: the step watchdog's pure decisions
(runtime/detection.py's StepTimes and deadlines, runtime/coordinator.py's hang phases,
silences and verdict), sequenced by the supervisor's own stall watch
(runtime/watchdog.py's StallWatch), over simulated jobs --
a steady 0.1 s step, a noisy one, one with long checkpoint steps, one with occasional long
steps of its own, and the warm-up. No process, no store, no sleep: every instant is
computed, so the detection times asserted here are fake-clock figures, not elapsed time."""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from runtime import protocol as P
from runtime.coordinator import (
    HANG_HOST_HEARD_S,
    hang_deadline_at_end,
    hang_hosts_heard,
)
from runtime.detection import (
    MIN_STEP_SAMPLES,
    STEP_WINDOW,
    WARMUP_STEPS,
    StepTimes,
    checkpoint_deadline,
)
from runtime.supervisor import LaunchConfig
from runtime.watchdog import Committed, FenceHung, StallWatch, Tick, WatchConfig

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LaunchConfig)}
FLOOR = float(_DEFAULTS["hang_floor_s"])  # type: ignore[arg-type]
FACTOR = float(_DEFAULTS["hang_factor"])  # type: ignore[arg-type]
STARTUP = float(_DEFAULTS["hang_startup_s"])  # type: ignore[arg-type]
POLL = 0.02  # the supervisor's store poll (LaunchConfig.store_poll_interval_s)
FAST = 0.01  # the healthy member's compute: it then waits for the slow one
T0 = 1000.0


@dataclass(frozen=True)
class Fenced:
    """A fence the simulated watchdog decided: when, whom, at which committed step, and
    how long after the stuck step began (the last commit)."""

    at: float
    slots: tuple[str, ...]
    step: int
    after_s: float
    deadline_s: float


class _View:
    """What the simulated supervisor shows the watch: w0's heartbeat (w1 writes none),
    both started, nobody stopped in /proc (a hang it cannot see), one host."""

    def __init__(self) -> None:
        self.w0: bytes | None = None

    def quiet_nodes(self) -> bool:
        return False

    def node_silences(self) -> dict[str, float]:
        return {}

    def host_of(self, slot: str) -> str | None:
        return None

    def stopped(self, slot: str) -> bool:
        return False

    def beat(self, slot: str) -> bytes | None:
        return self.w0 if slot == "w0" else None

    def alive(self, slot: str) -> bool:
        return True

    def eligible(self, slot: str) -> bool:
        return True

    def finished(self, slot: str) -> bool:
        return False


def run_watchdog(durations: list[float], *, hang_at: int | None = None,
                 checkpoint_every: int = 0, extra_s: float = 5.0) -> Fenced | None:
    """Simulate a job of two members: w1's step ``k`` (1-based) takes ``durations[k-1]``
    (w1 is the slow one: the step's time), w0 computes for FAST then waits in the
    collective, writing its heartbeat every BEAT_INTERVAL_S once it has waited that long
    (runtime.membership.Membership.beat). From step ``hang_at`` on w1 never commits (hung,
    but running: /proc cannot see it). The supervisor's stall watch
    (runtime.watchdog.StallWatch) is fed each new commit and a poll every POLL, as
    Supervisor._handle_progress and _handle_watch feed it (one host: no node silences).
    Returns the first fence, or None when nobody was fenced."""
    commits = [T0]
    for k, d in enumerate(durations, 1):
        commits.append(math.inf if hang_at is not None and k >= hang_at
                       else commits[-1] + d)
    # A healthy job ends at its last commit; a hung one is watched ``extra_s`` more.
    end = commits[hang_at - 1] + extra_s if hang_at is not None else commits[-1]

    def committed(t: float) -> int:
        return bisect.bisect_right(commits, t) - 1

    watch = StallWatch(WatchConfig(hang_floor_s=FLOOR, hang_factor=FACTOR,
                                   hang_startup_s=STARTUP, hang_stopped_factor=0.0,
                                   fault_grace_s=0.5, checkpoint_every=checkpoint_every))
    view = _View()
    t = T0
    while t < end:
        t = round(t + POLL, 9)
        step = committed(t)
        waited = t - (commits[step] + FAST)  # w0 waits in step+1 from then on
        if waited >= P.BEAT_INTERVAL_S:
            view.w0 = f"{step + 1} {int(waited / P.BEAT_INTERVAL_S)}".encode()
        if step > 0:  # rank 0 publishes progress from its first commit on
            watch.step(Committed(gen=0, step=step, current_gen=0, recovering=False), t)
        since = watch.advanced_at
        for act in watch.step(Tick(view=view, members=("w0", "w1"), recovering=False,
                                   last_step=step, step_seconds=0.1), t):
            if isinstance(act, FenceHung):
                if since is None:
                    raise AssertionError("fenced while not armed")
                return Fenced(at=t, slots=act.slots, step=step, after_s=t - since,
                              deadline_s=watch.hang_deadline(step))
    return None


def _hang_detection(durations: list[float], hang_at: int, **kw: int) -> Fenced:
    assert run_watchdog(durations[:hang_at - 1], **kw) is None  # healthy until then
    got = run_watchdog(durations, hang_at=hang_at, **kw)
    assert got is not None and got.slots == ("w1",) and got.step == hang_at - 1, got
    return got


def test_a_steady_tenth_of_a_second_step_gets_its_hang_fenced_within_five_steps() -> None:
    steps = [0.8, 0.4] + [0.1] * 200  # warm-up, then steady
    assert run_watchdog(steps) is None  # never fences a healthy rank
    got = _hang_detection(steps, hang_at=120)
    assert got.deadline_s == FLOOR  # 2 x the longest 0.1 s step is under the floor
    assert got.after_s <= 5 * 0.1  # 4.0-4.2 steps on this fake clock
    assert got.after_s <= FLOOR + POLL


def test_a_hang_during_the_warm_up_waits_for_the_conservative_deadline() -> None:
    steps = [0.8, 0.4] + [0.1] * 60
    hang_at = WARMUP_STEPS + MIN_STEP_SAMPLES - 5  # fewer samples than needed
    got = _hang_detection(steps, hang_at=hang_at)
    assert got.deadline_s == STARTUP
    assert STARTUP <= got.after_s <= STARTUP + POLL
    # The warm-up steps are no samples: after them the tail is the steady step's.
    times = StepTimes()
    clock = T0
    for k, d in enumerate([5.0, 2.0] + [0.1] * MIN_STEP_SAMPLES, 1):
        times.observe(k, clock := clock + d)
    times.observe(k, clock + 9.0)  # (the same step seen again is no sample)
    assert len(times.samples) == MIN_STEP_SAMPLES - 1
    assert times.deadline(floor_s=FLOOR, factor=FACTOR, startup_s=STARTUP) == STARTUP
    times.observe(k + 1, clock + 0.1)
    assert times.deadline(floor_s=FLOOR, factor=FACTOR, startup_s=STARTUP) == FLOOR


def test_a_noisy_step_is_never_fenced_and_a_hang_still_is_within_the_deadline() -> None:
    rng = random.Random(7)
    steps = [0.8, 0.4] + [0.1 * math.exp(rng.gauss(0.0, 0.35)) for _ in range(400)]
    assert run_watchdog(steps) is None
    got = _hang_detection(steps, hang_at=380)
    window = steps[380 - 1 - STEP_WINDOW:380 - 1]
    # The deadline follows the longest recent step (as the supervisor's poll saw it).
    assert got.deadline_s == pytest.approx(FACTOR * max(window), abs=2 * FACTOR * POLL)
    assert got.after_s <= got.deadline_s + POLL


def test_checkpoint_steps_are_judged_apart_and_keep_the_others_fast() -> None:
    # Every 25th step snapshots the state: 1.2 s, twelve ordinary steps.
    steps = [0.8, 0.4] + [1.2 if k % 25 == 0 else 0.1 for k in range(3, 303)]
    assert run_watchdog(steps, checkpoint_every=25) is None
    got = _hang_detection(steps, hang_at=290, checkpoint_every=25)
    assert got.after_s <= 5 * 0.1  # the ordinary steps' deadline is not lengthened
    # A hang in a checkpoint step waits for the checkpoint steps' own deadline.
    got = _hang_detection(steps, hang_at=275, checkpoint_every=25)
    assert got.deadline_s == pytest.approx(max(STARTUP, FACTOR * 1.2), abs=FACTOR * POLL)
    assert checkpoint_deadline([], factor=FACTOR, startup_s=STARTUP) == STARTUP
    assert checkpoint_deadline([4.0], factor=FACTOR, startup_s=STARTUP) == FACTOR * 4.0


def test_occasional_long_steps_seen_in_the_window_are_never_fenced() -> None:
    # The job's own long steps (an evaluation every 20 steps, unknown to the runtime):
    # one is seen before the deadline adapts, and the window keeps one from then on.
    steps = [0.8, 0.4] + [1.0 if k % 20 == 0 else 0.1 for k in range(3, 403)]
    assert run_watchdog(steps) is None
    got = _hang_detection(steps, hang_at=390)
    assert got.deadline_s == pytest.approx(FACTOR * 1.0, abs=FACTOR * POLL)


def test_the_deadline_forgets_a_slow_spell_after_the_window() -> None:
    times = StepTimes(window=8, warmup=0)
    clock = T0
    for k, d in enumerate([0.1] * 4 + [0.5] + [0.1] * 30, 1):
        times.observe(k, clock := clock + d)
    assert max(times.samples) == pytest.approx(0.1)


def test_nobody_is_fenced_at_the_job_end_before_the_startup_deadline() -> None:
    assert hang_deadline_at_end(0.4, startup_s=STARTUP, ending=True) == STARTUP
    assert hang_deadline_at_end(0.4, startup_s=STARTUP, ending=False) == 0.4
    assert hang_deadline_at_end(8.0, startup_s=STARTUP, ending=True) == 8.0


def test_a_member_on_a_host_falling_silent_is_left_to_the_node_check() -> None:
    silences = {"host0": 0.01, "host1": HANG_HOST_HEARD_S + 0.01}
    assert hang_hosts_heard(["host0"], silences)
    assert not hang_hosts_heard(["host0", "host1"], silences)
    assert hang_hosts_heard([None], {})  # one host: the coordinator's own
    assert hang_hosts_heard(["host9"], silences)  # no heartbeat known: not silent


@pytest.mark.parametrize("make", [
    lambda: [0.8, 0.4] + [0.1] * 150,
    lambda: [0.8, 0.4] + [0.3] * 150,
])
def test_detection_is_within_five_steady_steps_for_steps_from_a_tenth_of_a_second(
        make: Callable[[], list[float]]) -> None:
    steps = make()
    got = _hang_detection(steps, hang_at=100)
    assert got.after_s <= 5 * steps[-1]
