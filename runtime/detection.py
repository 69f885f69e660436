"""Pure detection decisions of the coordinator and the agents: no I/O, no clock of their
own (every function takes ``now`` or durations measured by its caller on one host's
monotonic clock), so each is unit-tested in-process (tests/runtime/test_detection.py).

This is the first piece of the coordinator as a pure state machine (after
torchft's ``quorum_compute``: the decision is a function of what each party last
reported and when, the I/O around it is the supervisor's and the agents'):

* :func:`coordinator_lost` -- an agent's verdict on its coordinator (a deadline on the
  last time the coordinator's liveness counter advanced, read by a watchdog thread that
  no blocking store call can hold up);
* :func:`partition_verdict` -- the coordinator's verdict on its hosts' silences: the
  silent hosts are lost, *unless* together they are a majority, in which case the
  coordinator is the one cut off (a partition of its own host) and must blame nobody;
* :class:`StepTimes` / :func:`adaptive_deadline` -- how long without a committed step
  counts as hung: ``max(floor, factor x the longest recent step)``, once enough steps were
  seen after the warm-up (before: the conservative startup deadline); checkpoint steps
  apart, never under the startup deadline (:func:`checkpoint_deadline`);
* :class:`BeatGaps` / :func:`node_deadline` -- how long a host may be silent before it is
  lost: while the job is stalled, ``min(node timeout, max(floor, BEAT_GAP_FACTOR x the
  longest recent gap between two heartbeats, the step deadline))``, so a partitioned or
  frozen host on another machine is fenced within a few steady steps, never sooner than
  the heartbeats have been seen to falter; while the job commits steps (its hosts are
  there), the node timeout.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: A host silent for this fraction of the node timeout counts as gone *together* with a
#: host already past the timeout when the coordinator decides whether it is cut off: in a
#: partition every remote host falls silent within a beat interval or two of the others,
#: while the coordinator looks at them one after the other.
QUIET_FRACTION = 0.5

#: Recent step durations kept for the adaptive deadline: its tail is the longest of them,
#: so a step that comes back at least once every this many steps (a checkpoint, an
#: evaluation) keeps the deadline above itself.
STEP_WINDOW = 256
#: Steps observed before the adaptive deadline replaces the startup one (fewer samples
#: say nothing about the tail).
MIN_STEP_SAMPLES = 32
#: The job's first step durations are not samples: allocation, lazy initialisation and
#: compilation make them slower than any later step (the startup deadline covers them).
WARMUP_STEPS = 2
#: The adaptive deadline's quantile of the recent steps: the longest one (one slow step
#: seen in the window is enough to keep the deadline above it).
TAIL_QUANTILE = 1.0


#: A host is never lost for a silence shorter than this (``--node-floor``'s default): five
#: heartbeat intervals (runtime.protocol.NODE_BEAT_INTERVAL_S is 0.1 s), so a beat or two
#: delayed by a busy machine or a retransmitted packet is not a lost host.
NODE_FLOOR_S = 0.5
#: A host's silence must also exceed this many times the longest gap between two
#: heartbeats recently seen from any host (a machine that stalled once may stall again).
BEAT_GAP_FACTOR = 3.0
#: How long a long heartbeat gap keeps the node deadline up (seconds).
BEAT_MEMORY_S = 300.0


def node_deadline(*, timeout_s: float, floor_s: float, longest_gap_s: float,
                  step_deadline_s: float, stalled_s: float = math.inf) -> float:
    """Seconds of silence after which a host is lost (fenced as ``hang``): while the job
    has committed no step for longer than it (``stalled_s``), ``min(timeout_s,
    max(floor_s, BEAT_GAP_FACTOR x longest_gap_s, step_deadline_s))``; while the job
    still commits steps, ``timeout_s``.

    Every step needs every training host, so a job that still commits steps proves its
    hosts are there, whatever their heartbeats say (an oversubscribed host's heartbeat
    thread can wait a second for a CPU): the short deadline needs the stall to
    corroborate the silence. A frozen or cut-off training host stalls the job at once;
    a silent spare host stalls nothing and is set aside after ``timeout_s``, which costs
    the job nothing.

    ``timeout_s`` (``--node-timeout``) is the most a silent host is ever waited for;
    ``step_deadline_s`` is the job's adaptive hang deadline of ordinary steps
    (:func:`adaptive_deadline`: the startup deadline until the steps are known, so the
    node timeout rules then), which keeps a job of long steps as patient with its hosts
    as with its ranks; ``longest_gap_s`` the longest gap between two consecutive
    heartbeats of one host seen recently (:class:`BeatGaps`)."""
    if timeout_s <= 0 or floor_s <= 0 or longest_gap_s < 0 or step_deadline_s < 0 \
            or stalled_s < 0:
        raise ValueError("timeout_s and floor_s must be > 0, the gap, the step deadline "
                         "and the stall >= 0")
    short = min(timeout_s, max(floor_s, BEAT_GAP_FACTOR * longest_gap_s, step_deadline_s))
    return short if stalled_s > short else timeout_s


class BeatGaps:
    """The long gaps between consecutive heartbeats of a host, as the coordinator saw
    them on its own monotonic clock: ``observe(gap_s, now)`` each time a host's heartbeat
    advanced, ``longest(now)`` the longest gap of the last ``memory_s`` seconds. Gaps
    too short to raise :func:`node_deadline` above ``floor_s`` are not kept, so that
    the steady ten beats a second of every host cost nothing."""

    def __init__(self, *, floor_s: float = NODE_FLOOR_S, memory_s: float = BEAT_MEMORY_S
                 ) -> None:
        if floor_s <= 0 or memory_s <= 0:
            raise ValueError("floor_s and memory_s must be > 0")
        self._keep_over = floor_s / BEAT_GAP_FACTOR
        self._memory = memory_s
        self._gaps: deque[tuple[float, float]] = deque()  # (seen at, gap), oldest first

    def observe(self, gap_s: float, now: float) -> None:
        """Note a gap of ``gap_s`` seconds between two heartbeats, ended at ``now``."""
        if gap_s > self._keep_over:
            self._gaps.append((now, gap_s))

    def longest(self, now: float) -> float:
        """The longest gap seen in the last ``memory_s`` seconds before ``now`` (0.0 for
        none worth keeping)."""
        while self._gaps and now - self._gaps[0][0] > self._memory:
            self._gaps.popleft()
        return max((gap for _, gap in self._gaps), default=0.0)


def coordinator_lost(last_advanced: float, now: float, timeout_s: float) -> bool:
    """True when the coordinator's liveness counter last advanced (``last_advanced``, on
    the caller's monotonic clock) more than ``timeout_s`` before ``now``."""
    if timeout_s <= 0:
        raise ValueError("timeout_s must be > 0")
    return now - last_advanced > timeout_s


@dataclass(frozen=True, slots=True)
class PartitionVerdict:
    """What the coordinator does about its hosts' silences.

    ``lose``: node ranks to fence as lost (silent past the timeout), when the coordinator
    still reaches a majority. ``cut_off``: the coordinator reaches no majority -- the silent
    hosts went quiet together -- so it is the one partitioned: it records nobody's failure
    and stops (``lose`` is then empty)."""

    lose: tuple[int, ...] = ()
    cut_off: bool = False
    quiet: tuple[int, ...] = ()


def partition_verdict(silence_s: Mapping[int, float], *, self_rank: int,
                      timeout_s: float, cut_off_s: float | None = None) -> PartitionVerdict:
    """Decide from how long each live host has been silent (``silence_s``: node rank ->
    seconds since its heartbeat last advanced, measured by the coordinator on its own
    monotonic clock; ``self_rank``, the coordinator's own host, is always reachable).

    * No host past ``timeout_s``: nothing to do.
    * Hosts silent past ``timeout_s``, and the hosts quiet for at least
      :data:`QUIET_FRACTION` of it are two or more and leave the coordinator's side
      without a strict majority of the live hosts: the coordinator is cut off
      (``cut_off``): a partition of its own host, or a correlated loss of most hosts it
      cannot tell from one -- either way it must not blame the majority. Stopping the
      whole job costs far more than losing one host, so this is decided only once one of
      them is silent past ``cut_off_s`` (default: ``timeout_s``; the supervisor passes
      the node timeout while ``timeout_s`` is the shorter adaptive deadline): until
      then nobody is lost and nothing is decided (``quiet`` says who is silent).
    * Otherwise the hosts past the timeout are lost (``lose``), as before.

    A single silent host is always lost, even in a job of two hosts (where no side has a
    majority): one host's silence is the usual hang, and a coordinator that stopped at
    each one would end every two-host job at its first frozen host (docs/runtime.md).
    """
    cut_off_s = timeout_s if cut_off_s is None else cut_off_s
    if timeout_s <= 0 or cut_off_s < timeout_s:
        raise ValueError("timeout_s must be > 0 and cut_off_s >= timeout_s")
    others = {r: s for r, s in silence_s.items() if r != self_rank}
    overdue = tuple(sorted(r for r, s in others.items() if s > timeout_s))
    if not overdue:
        return PartitionVerdict()
    quiet = tuple(sorted(r for r, s in others.items() if s >= QUIET_FRACTION * timeout_s))
    live = len(others) + 1
    reachable = live - len(quiet)
    if len(quiet) >= 2 and 2 * reachable <= live:
        if any(others[r] > cut_off_s for r in overdue):
            return PartitionVerdict(cut_off=True, quiet=quiet)
        return PartitionVerdict(quiet=quiet)
    return PartitionVerdict(lose=overdue, quiet=quiet)


def quantile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` (nearest rank, the higher one); 0.0 for
    none."""
    if not 0 <= q <= 1:
        raise ValueError("q must be in 0..1")
    xs = sorted(samples)
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def adaptive_deadline(samples: Iterable[float], *, floor_s: float, factor: float,
                      startup_s: float, q: float = TAIL_QUANTILE) -> float:
    """Seconds without a committed step after which a rank is hung: ``max(floor_s,
    factor x the q quantile of the recent step durations)`` (by default the longest).
    With fewer than :data:`MIN_STEP_SAMPLES` samples, ``max(floor_s, startup_s)``: the
    tail of the distribution is not known yet (first steps, compilation)."""
    if floor_s <= 0 or factor <= 0 or startup_s < 0:
        raise ValueError("floor_s and factor must be > 0, startup_s >= 0")
    xs = list(samples)
    if len(xs) < MIN_STEP_SAMPLES:
        return max(floor_s, startup_s)
    return max(floor_s, factor * quantile(xs, q))


def checkpoint_deadline(samples: Iterable[float], *, factor: float, startup_s: float
                        ) -> float:
    """Seconds without a committed step after which a rank is hung while the step is a
    checkpoint step (its writer snapshots the state and waits for the previous write):
    ``max(startup_s, factor x the longest recent checkpoint step)`` -- never less than
    the conservative startup deadline, however fast the ordinary steps are."""
    if factor <= 0 or startup_s < 0:
        raise ValueError("factor must be > 0, startup_s >= 0")
    return max([startup_s, *(factor * x for x in samples)])


class StepTimes:
    """The recent step durations as one party sees them on its own monotonic clock: fed
    ``observe(step, now)`` at each committed step it sees (several steps seen at once
    count as that many steps of the mean duration). The job's first ``warmup`` durations
    are dropped (see :data:`WARMUP_STEPS`); checkpoint steps (every ``checkpoint_every``
    steps) are kept apart (:attr:`checkpoint_samples`), so that they neither lengthen
    the ordinary steps' deadline nor are judged by it."""

    def __init__(self, window: int = STEP_WINDOW, *, warmup: int = WARMUP_STEPS,
                 checkpoint_every: int = 0) -> None:
        if window < 1 or warmup < 0 or checkpoint_every < 0:
            raise ValueError("window must be >= 1, warmup and checkpoint_every >= 0")
        self.samples: deque[float] = deque(maxlen=window)
        self.checkpoint_samples: deque[float] = deque(maxlen=window)
        self._last: tuple[int, float] | None = None
        self._warmup = warmup
        self._every = checkpoint_every

    def observe(self, step: int, now: float) -> None:
        """Note that ``step`` is the committed step as of ``now``."""
        if self._last is not None and step > self._last[0]:
            n = step - self._last[0]
            skip = min(n, self._warmup)
            self._warmup -= skip
            if self._every and step // self._every > self._last[0] // self._every:
                # A checkpoint step among them: the whole gap is one checkpoint sample.
                if skip < n:
                    self.checkpoint_samples.append(now - self._last[1])
            else:
                each = (now - self._last[1]) / n
                self.samples.extend([each] * min(n - skip, self.samples.maxlen or n))
        if self._last is None or step != self._last[0]:
            self._last = (step, now)

    def restart(self) -> None:
        """Forget the last observation (a new generation: the gap is a recovery, not a
        step); the samples stay."""
        self._last = None

    def checkpoint_next(self, last_step: int) -> bool:
        """True when the step after the committed ``last_step`` is a checkpoint step."""
        return bool(self._every) and (last_step + 1) % self._every == 0

    def deadline(self, *, floor_s: float, factor: float, startup_s: float,
                 checkpoint: bool = False) -> float:
        """:func:`adaptive_deadline` over the recent samples; for a checkpoint step
        (``checkpoint``), :func:`checkpoint_deadline` over the recent checkpoint steps."""
        if checkpoint:
            return max(floor_s, checkpoint_deadline(self.checkpoint_samples, factor=factor,
                                                    startup_s=startup_s))
        return adaptive_deadline(self.samples, floor_s=floor_s, factor=factor,
                                 startup_s=startup_s)
