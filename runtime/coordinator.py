"""The coordinator's decisions, pure: what the supervisor does about what it observed.

No I/O, no store, no clock of its own: every function takes what the supervisor saw
(which processes died and with which exit status, whose heartbeat changed when, which
spares are ready, the newest checkpoint when it matters) and ``now``, an instant of the
caller's monotonic clock, and returns a decision as data. The supervisor
(:mod:`runtime.supervisor`) is the I/O around them: it gathers the observations, calls
these functions and carries out what they return -- starts processes, fences, publishes
plans, writes records -- so each decision is tested in-process with a fake clock
(tests/runtime/test_coordinator.py), and the real-process tests are kept for the real
faults. Together with :mod:`runtime.detection` (the agents' coordinator deadline, the
partition verdict, the adaptive hang deadline) this is the coordinator's pure core, after
torchft's ``quorum_compute``.

The decisions here:

* **Deaths and their records** -- when a set of deaths began (:func:`death_detected_at`),
  whether it joins the open incident (:func:`joins_incident`, :data:`MERGE_WINDOW_S`),
  when its record is due (:func:`death_record_due`), its cause and detail
  (:func:`describe_death`), and the steps it lost when the failed generation had
  committed more than was seen (:func:`steps_reached`).
* **Blame after a reported collective fault** -- how long a peer must be silent
  (:func:`blame_quiet_s`), when to decide (:func:`blame_due`), and whom to fence: the
  stuck peers, else the reporter (:func:`blame`); silence comes from
  :func:`observe_beats` / :func:`silent_members`.
* **The step watchdog** -- the stopped-rank rule (:func:`stopped_look_due`,
  :func:`note_stopped`, :func:`stopped_to_fence`), its rule for a whole host on this
  machine (:func:`frozen_look_due`, :func:`host_frozen`), the hosts quiet enough to defer
  every blame (:func:`quiet_hosts`), and the hang deadline (:func:`hang_phase`,
  :func:`hang_quiet_s`, :func:`hang_verdict`, :func:`hang_hosts_heard`,
  :func:`hang_undecided`, :func:`hang_deadline_at_end`).
* **Moves** -- a pre-emptive or planned move waits, is dropped or is made
  (:func:`plan_move`).
* **The recovery plan** -- live migration or rollback, the members, the spares called in
  or started, the survivors that hold the state, the lost steps
  (:func:`plan_recovery`, driven by the supervisor until it returns a final decision).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from runtime.protocol import BEAT_INTERVAL_S, NODE_BEAT_INTERVAL_S, PlanMode
from runtime.recovery import FailureClass, Outcome

#: Deaths this close to an unplanned failure's detection are the same incident (a node,
#: a replica group or the whole job going down is seen one process at a time): one
#: failure record naming every dead worker, one outcome. The record waits for the
#: window to close; its draft (runtime.outbox.Outbox.write_drafts) is durable at the
#: first death, before the recovery is planned, so a supervisor dying inside the window
#: loses nothing: ``--resume`` records the draft (see Supervisor._resume).
MERGE_WINDOW_S = 1.0

#: How long a death's failure record waits for its exit status (the cause) at most.
EXIT_STATUS_WAIT_S = 5.0


# ----------------------------------------------------------------- deaths and records
def death_detected_at(now: float, fenced_since: Sequence[float | None]) -> float:
    """When deaths seen at ``now`` began: ``now``, or earlier when one of them was fenced
    for a stall that began before (``fenced_since``: each fenced dead member's
    ``Fence.since``; None or 0 for none) -- a hang's stall counts in its recovery."""
    return min([now, *(s for s in fenced_since if s)])


def joins_incident(last_class: FailureClass | None, last_detected: float | None,
                   detected: float, *, window_s: float = MERGE_WINDOW_S) -> bool:
    """True when deaths that began at ``detected`` are part of the newest open incident
    (class ``last_class``, detected at ``last_detected``; None: there is none): it is
    unplanned and they began less than ``window_s`` after it. A later death is a failure
    of its own (nothing written is ever rewritten)."""
    return (last_class == FailureClass.UNPLANNED and last_detected is not None
            and detected - last_detected < window_s)


class RecordDue(StrEnum):
    """When a death's failure record is written (see :func:`death_record_due`)."""

    HOLD = "hold"  # its merge window is open: a death seen meanwhile still joins it
    IF_KNOWN = "if_known"  # now, if every exit status is known (else look again later)
    NOW = "now"  # now: wait for the exit statuses (up to the limit), then write it


def death_record_due(*, now: float, detected: float, seen: float, merging: bool,
                     block: bool, window_s: float = MERGE_WINDOW_S,
                     status_wait_s: float = EXIT_STATUS_WAIT_S) -> RecordDue:
    """When to write the failure record of deaths detected at ``detected`` and seen at
    ``seen``: held while their merge window is open and their incident is still the
    recovery's (``merging``); then once their exit statuses (the cause) are known, or
    after ``status_wait_s`` without them. ``block``: the outcome is due, the record must
    be written now (waiting for the exit statuses up to the limit)."""
    if not block and now - detected < window_s and merging:
        return RecordDue.HOLD
    if block or now - seen > status_wait_s:
        return RecordDue.NOW
    return RecordDue.IF_KNOWN


def death_cause(rc: int | None) -> str:
    """The failure cause of a process that died with exit status ``rc`` (None: not known
    yet, read as a kill -- what the draft says until the record is written)."""
    if rc is None or rc in (-signal.SIGKILL, -signal.SIGTERM):
        return "process_killed"
    if rc < 0:
        return "process_crashed"
    return "process_exit"


@dataclass(frozen=True, slots=True)
class FenceNote:
    """Why the supervisor itself killed a member (its ``Fence``'s cause and detail)."""

    cause: str
    detail: str


def describe_death(rcs: Sequence[tuple[str, int | None]], fences: Sequence[FenceNote],
                   note: str = "") -> tuple[str, str]:
    """The cause and detail (at most 500 characters) of a death's failure record:
    ``rcs``, each dead slot with its exit status (None: not known yet); ``fences``, why
    the fenced ones among them were killed (the first fence's cause wins; the detail
    names each distinct one); ``note`` (the host borrowed for it, the failure it joined)
    is kept whole at the end."""
    if fences:
        cause = fences[0].cause
        detail = "; ".join(dict.fromkeys(f.detail for f in fences))[:500]
    else:
        cause = death_cause(rcs[0][1])
        detail = ", ".join(f"{s} exit {'unknown' if rc is None else rc}" for s, rc in rcs)
    if note:
        detail = detail[:max(500 - len(note), 0)] + note
        detail = detail[:500]
    return cause, detail


def joined_note(event_id: str, cause: str) -> str:
    """The detail's tail of a death during the recovery from the recorded failure
    ``event_id`` (``cause``): a failure of its own that names the first."""
    return f"; during the recovery from failure {event_id} ({cause})"


@dataclass(frozen=True, slots=True)
class StepsReached:
    """A death's step, and the recovery's lost steps, once the failed generation's
    committed step is known (see :func:`steps_reached`)."""

    step: int
    lost_steps: int


def steps_reached(*, recorded_step: int, reached: int, outcome: Outcome | None,
                  rollback_step: int | None, lost_steps: int,
                  absorbed: int = 0) -> StepsReached:
    """A death's step is the highest its generation committed (``reached``: rank 0
    commits, then a peer dies in the next step, before that commit was read); a rollback
    in progress then lost the steps up to it from its checkpoint (``rollback_step``), plus
    the ``absorbed`` steps its survivors cannot rerun (the plan's, see
    :class:`PlanRecovery`)."""
    if reached <= recorded_step:
        return StepsReached(step=recorded_step, lost_steps=lost_steps)
    if outcome == Outcome.ROLLED_BACK and rollback_step is not None:
        lost_steps = max(lost_steps, reached - rollback_step + absorbed)
    return StepsReached(step=reached, lost_steps=lost_steps)


# ----------------------------------------------------------------- heartbeats and blame
def observe_beats(seen: Mapping[str, tuple[bytes | None, float]],
                  raws: Mapping[str, bytes | None], now: float
                  ) -> dict[str, tuple[bytes | None, float]]:
    """Each member's heartbeat as read now (``raws``) and when it last changed: ``seen``
    updated for the beats that are new or changed since (at ``now``). A beat carries
    its writer's time, so one unchanged since an earlier look has not been written since;
    the writer's clock (maybe another host's) is never compared with this one."""
    out = dict(seen)
    for slot, raw in raws.items():
        if slot not in out or out[slot][0] != raw:
            out[slot] = (raw, now)
    return out


def silent_members(beats: Mapping[str, tuple[bytes | None, float]], eligible: Sequence[str],
                   now: float, quiet_s: float) -> list[str]:
    """The ``eligible`` members (live and started: their model built) whose heartbeat
    has not changed for ``quiet_s`` seconds of observation (a waiting worker beats every
    BEAT_INTERVAL_S); a member first observed at ``now`` is not silent yet."""
    return [s for s in eligible if now - beats[s][1] >= quiet_s]


def blame_quiet_s(fault_grace_s: float, step_seconds: float, beat_interval_s: float
                  ) -> float:
    """How long a peer must have been silent to be blamed for a reporter's failed
    collective: the grace, and at least two steady steps plus a beat interval (a healthy
    peer busy with its forward/backward when the collective raised enters its next
    collective within a step and beats there)."""
    return max(fault_grace_s, 2 * step_seconds + beat_interval_s)


def blame_due(*, reported_at: float, now: float, quiet_s: float, reporter_alive: bool,
              host_quiet: bool) -> bool:
    """True when the fault reported at ``reported_at`` is judged now: nobody is blamed
    while a host is quiet (``host_quiet``: the node check decides first, not the
    reporter), before ``quiet_s`` has passed, or once the reporter died (the death path
    acts)."""
    return not host_quiet and now - reported_at >= quiet_s and reporter_alive


@dataclass(frozen=True, slots=True)
class Blame:
    """Whom to fence after a reported collective fault: the stuck peers (cause
    ``hang``), or else the reporter itself (cause ``collective_error``)."""

    hung: tuple[str, ...] = ()
    reporter: str | None = None


def blame(reporter: str, silent: Sequence[str]) -> Blame:
    """No process died and a collective failed: it was maybe waiting for a stuck peer.
    The reporter keeps beating while it waits for the next generation, a stuck peer
    does not: fence the ``silent`` peers if there are any, else the reporter (its own
    collective failed; it cannot error again and again)."""
    stuck = tuple(s for s in silent if s != reporter)
    return Blame(hung=stuck) if stuck else Blame(reporter=reporter)


# ----------------------------------------------------------------- the step watchdog
def stalled_for(now: float, advanced_at: float | None, *, recovering: bool) -> float | None:
    """Seconds the committed step has not advanced, or None while the watchdog is not
    armed (before a generation's first step, and during a recovery or move)."""
    if advanced_at is None or recovering:
        return None
    return now - advanced_at


def stopped_look_due(stalled: float, deadline_s: float) -> bool:
    """True once the step has stalled for half the stopped deadline: from then on each
    member's /proc state is looked at every poll (before, what was noted is forgotten)."""
    return stalled >= deadline_s / 2


def note_stopped(since: Mapping[str, float], stopped: Mapping[str, bool], now: float
                 ) -> dict[str, float]:
    """Since when each member was found stopped on every look: ``since`` updated with
    this look (``stopped``: member -> stopped now); a member found running drops out."""
    out = dict(since)
    for slot, is_stopped in stopped.items():
        if is_stopped:
            out.setdefault(slot, now)
        else:
            out.pop(slot, None)
    return out


def stopped_to_fence(since: Mapping[str, float], *, members: int, now: float,
                     stalled: float, deadline_s: float) -> list[str]:
    """The members to fence as stopped (empty: none): found stopped on every look for
    half the deadline, once the step has stalled for all of it, as long as one member
    is not stopped (it holds the state)."""
    stopped = [s for s, t in since.items() if now - t >= deadline_s / 2]
    if stalled < deadline_s or not stopped or len(since) >= members:
        return []
    return stopped


def frozen_look_due(silent_s: float, beat_interval_s: float) -> bool:
    """True when a host on the coordinator's machine has been silent long enough (two
    heartbeats missed) for its agent's and processes' /proc states to be looked at."""
    return silent_s >= 2 * beat_interval_s


def host_frozen(*, silent_s: float, stopped_since: float, now: float, deadline_s: float
                ) -> bool:
    """True when a host silent for ``silent_s`` whose agent and every live process were
    found stopped on every look since ``stopped_since`` is frozen, not slow: silent for
    the whole stopped deadline and found stopped for half of it."""
    return silent_s >= deadline_s and now - stopped_since >= deadline_s / 2


def quiet_hosts(silence_s: Mapping[str, float], *, quiet_s: float) -> set[str]:
    """The hosts silent for ``quiet_s`` or more (``silence_s``: host -> seconds since its
    heartbeat last advanced): while one is quiet nobody is blamed for a stall or a failed
    collective -- the node check decides first (the host lost, or the coordinator cut
    off), so a partition never fences the ranks behind it one by one."""
    return {host for host, silent in silence_s.items() if silent >= quiet_s}


class HangPhase(StrEnum):
    """Where a stall stands against the hang deadline (see :func:`hang_phase`)."""

    EARLY = "early"  # under a quarter of the deadline: nothing to look at
    OBSERVE = "observe"  # from a quarter on: note whose heartbeat still changes
    EXPIRED = "expired"  # past the deadline: decide


def hang_phase(stalled: float, deadline_s: float) -> HangPhase:
    """The phase of a stall of ``stalled`` seconds against the hang deadline. Beats are
    noted from a quarter of it on, so that by the deadline a stuck member has been seen
    silent for three quarters of it (at least :func:`hang_quiet_s` once the deadline is
    the adaptive floor or more)."""
    if stalled < deadline_s / 4:
        return HangPhase.EARLY
    if stalled < deadline_s:
        return HangPhase.OBSERVE
    return HangPhase.EXPIRED


#: The least silence that marks a member as the stuck one: a peer waiting for it writes
#: its heartbeat every BEAT_INTERVAL_S, so any shorter silence says nothing (with this
#: margin for the supervisor's 20 ms store poll and a loaded machine's delays).
HANG_QUIET_MIN_S = 1.5 * BEAT_INTERVAL_S


def hang_quiet_s(deadline_s: float) -> float:
    """How long a member must have been silent to be the stuck one when the hang
    deadline expires: half the deadline, at least :data:`HANG_QUIET_MIN_S` (peers waiting
    for it beat every BEAT_INTERVAL_S) and at most 1 s (it has been silent about as long
    as the step has stalled)."""
    return min(max(deadline_s / 2, HANG_QUIET_MIN_S), 1.0)


def hang_verdict(silent: Sequence[str], members: int) -> tuple[str, ...]:
    """The members to fence as hung once the deadline expired: the silent ones, when
    some but not all are (empty: every member silent -- all stuck, or a long step on
    every rank -- or none: cannot tell which is stuck yet; see :func:`hang_undecided`)."""
    return tuple(silent) if silent and len(silent) < members else ()


#: A member is fenced as hung only while its host's agent has been heard from within
#: this (two node heartbeats): a host going silent is the node check's to judge (lost,
#: or this coordinator cut off), and its members' silence says nothing about them.
HANG_HOST_HEARD_S = 2 * NODE_BEAT_INTERVAL_S


def hang_hosts_heard(hosts: Iterable[str | None], silence_s: Mapping[str, float], *,
                     within_s: float = HANG_HOST_HEARD_S) -> bool:
    """True when every one of ``hosts`` (the hosts of the members to fence; None: the
    coordinator's own machine, one host) has beaten within ``within_s`` (``silence_s``:
    host -> seconds since its heartbeat last advanced; a host not in it has none)."""
    return all(silence_s.get(h, 0.0) < within_s for h in hosts if h is not None)


def hang_deadline_at_end(deadline_s: float, *, startup_s: float, ending: bool) -> float:
    """The hang deadline of this stall: the adaptive one (``deadline_s``, learnt from
    steps), or at least the conservative startup one once a member has ended its
    training loop (``ending``: its finished mark is written) -- the stall is then the
    job's end (a teardown, the last writes), not a step."""
    return max(deadline_s, startup_s) if ending else deadline_s


def hang_undecided(stalled: float, deadline_s: float) -> bool:
    """True while an expired stall whose verdict is empty is looked at again at the next
    poll rather than given up on (warned about, and the deadline re-armed): until
    :func:`hang_quiet_s` past the deadline, the silences may not have shown yet -- a
    stuck member first observed late, a waiting peer's first heartbeat still to come."""
    return stalled < deadline_s + hang_quiet_s(deadline_s)


# ----------------------------------------------------------------- the recovery plan
@dataclass(frozen=True, slots=True)
class SpareView:
    """A spare as the supervisor saw it when it planned (in its list's order)."""

    slot: str
    alive: bool
    ready: bool  # its model is built and it waits to be called in
    shard: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryView:
    """What a recovery is planned from: the failed generation's ``members``; the
    ``dead`` among them (in the order seen) and the ``survivors`` (alive); ``holders``,
    the survivors that hold the committed state; the ``spares`` (in the supervisor's
    order); the job's ``shards`` (HSDP) and each process's shard (``shard_of``); whether
    spares are configured and replenished (``replace_spares``); whether a host can be
    borrowed (``can_borrow``) and the pool was already asked (``borrowed``); how many more
    processes fit (``room``; None: no limit, one host); the transparent mode's report
    (None: not transparent); the highest step seen; the recovery's outcome and lost steps
    so far; the newest checkpoint (step, path), once looked up (``checkpoint_known``)."""

    members: tuple[str, ...]
    dead: tuple[str, ...]
    survivors: tuple[str, ...]
    holders: tuple[str, ...]
    spares: tuple[SpareView, ...]
    last_step: int
    shards: int = 1
    shard_of: Mapping[str, int] = field(default_factory=dict)
    replace_spares: bool = False
    can_borrow: bool = False
    room: int | None = None
    transparent: str | None = None
    outcome: Outcome | None = None
    lost_steps: int = 0
    borrowed: bool = False
    checkpoint_known: bool = False
    checkpoint: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class StartSpares:
    """Start ``count`` spares now (forked: ~0.1 s), then plan again with them: a death
    during a recovery finds the spares already used, and a replica still holds the
    state."""

    count: int


@dataclass(frozen=True, slots=True)
class Borrow:
    """Borrow hosts of lower-priority jobs for ``count`` processes, then plan again."""

    count: int


@dataclass(frozen=True, slots=True)
class NeedCheckpoint:
    """Look up the newest checkpoint, then plan again."""


@dataclass(frozen=True, slots=True)
class NewProcess:
    """A member the plan starts: a new process built for ``shard`` in place of
    ``replaces`` (a spare started for HSDP's lost shard, or a cold replacement in a
    rollback)."""

    shard: int
    replaces: str
    spare: bool  # started as a spare (HSDP) rather than as a cold replacement


@dataclass(frozen=True, slots=True)
class PlanRecovery:
    """The recovery's new generation: ``mode`` (live or rollback), its members in rank
    order (a :class:`NewProcess` to start in each such place, in ``starts`` order), the
    spares it calls in, the checkpoint of a rollback, and the recovery's outcome and lost
    steps from now on (``absorbed``: how many of them are steps a rollback's survivors
    cannot rerun -- the transparent mode's interrupted step -- which stay lost whatever
    step the failed generation turns out to have committed)."""

    mode: PlanMode  # live or rollback
    members: tuple[str | NewProcess, ...]
    starts: tuple[NewProcess, ...]
    called_in: tuple[str, ...]
    outcome: Outcome
    lost_steps: int
    checkpoint: tuple[int, str] | None = None
    gone_shards: tuple[int, ...] = ()
    absorbed: int = 0


@dataclass(frozen=True, slots=True)
class FailJob:
    """The job cannot recover: outcome ``failed`` for every open failure."""

    why: str


RecoveryStep = StartSpares | Borrow | NeedCheckpoint | PlanRecovery | FailJob


def too_many_recoveries(done: int, open_incidents: int, limit: int) -> bool:
    """True when the recoveries done plus the incidents now open exceed ``limit``."""
    return done + open_incidents > limit


def _live_outcome(view: RecoveryView) -> Outcome:
    """A live plan's outcome: live migration, unless a plan of the same recovery already
    rolled back (every incident of it then lost the rollback's steps)."""
    return Outcome.ROLLED_BACK if view.outcome == Outcome.ROLLED_BACK \
        else Outcome.LIVE_MIGRATED


def _candidates(view: RecoveryView) -> list[str]:
    """Spares to call in, best first: ready ones, then live ones still starting (a spare
    still importing torch is still better than a rollback: the new group simply forms
    when it arrives, and no step is lost)."""
    ready = [s.slot for s in view.spares if s.alive and s.ready]
    return ready + [s.slot for s in view.spares if s.alive and s.slot not in ready]


def plan_recovery(view: RecoveryView) -> RecoveryStep:
    """The next step of planning the recovery from ``view``'s deaths. The caller does
    what a :class:`StartSpares`, :class:`Borrow` or :class:`NeedCheckpoint` asks and
    calls again with the view updated (the new spares added, ``borrowed`` or the
    checkpoint set), until a :class:`PlanRecovery` or a :class:`FailJob` comes back.

    Plain data parallel: a live migration when a survivor holds the state and there is
    a spare for each dead member (one started at once, or borrowed, when needed);
    otherwise a rollback of survivors, spares and cold replacements to the newest
    checkpoint (``lost_steps`` = highest step - checkpoint step, one more in transparent
    mode where survivors cannot rerun their step), or failure without one. HSDP: see
    :func:`_plan_sharded`."""
    holders = list(view.holders)
    # Transparent mode: a rollback's survivors holding state cannot rerun their step.
    absorbed = 1 if view.transparent is not None and holders else 0
    if view.transparent is not None and view.transparent.startswith("rollback"):
        holders = []  # state not discoverable: rollback only
    if view.shards > 1:
        return _plan_sharded(view, holders)
    dead = list(view.dead)
    ready = _candidates(view)
    if holders and view.replace_spares and len(ready) < len(dead) and not view.borrowed:
        count = len(dead) - len(ready) if view.room is None else \
            min(len(dead) - len(ready), view.room)
        if count > 0:
            return StartSpares(count)
    if holders and len(ready) < len(dead) and view.can_borrow and not view.borrowed:
        return Borrow(len(dead) - len(ready))
    if holders and len(ready) >= len(dead):
        swap = dict(zip(dead, ready, strict=False))
        return PlanRecovery(mode=PlanMode.LIVE,
                            members=tuple(swap.get(m, m) for m in view.members), starts=(),
                            called_in=tuple(swap.values()), outcome=_live_outcome(view),
                            lost_steps=view.lost_steps)
    if not view.checkpoint_known:
        return NeedCheckpoint()
    if view.checkpoint is None:
        return FailJob("no live replica or spare, and no checkpoint to roll back to")
    ck_step = view.checkpoint[0]
    pool = [s.slot for s in view.spares if s.alive]
    room = view.room
    members: list[str | NewProcess] = []
    starts: list[NewProcess] = []
    called_in: list[str] = []
    for m in view.members:
        if m in view.survivors:
            members.append(m)
        elif pool:
            called_in.append(pool.pop(0))
            members.append(called_in[-1])
        elif room is None or room > 0:
            room = None if room is None else room - 1
            starts.append(NewProcess(shard=0, replaces=m, spare=False))
            members.append(starts[-1])  # cold: imports torch from scratch
        else:
            return FailJob(f"no place left to replace {m} (every node is lost or full)")
    return PlanRecovery(mode=PlanMode.ROLLBACK, members=tuple(members), starts=tuple(starts),
                        called_in=tuple(called_in), outcome=Outcome.ROLLED_BACK,
                        lost_steps=max(view.last_step - ck_step + absorbed, view.lost_steps),
                        checkpoint=view.checkpoint, absorbed=absorbed)


def _plan_sharded(view: RecoveryView, holders: list[str]) -> RecoveryStep:
    """HSDP: live migration when every lost shard is still held in another replica
    group -- each dead member is replaced by a spare built for its shard (started at once
    if none is ready) that receives the shard from a holder; otherwise roll everyone back
    to the newest whole sharded checkpoint, or fail without one."""
    lost = sorted({view.shard_of[d] for d in view.dead})
    held = {view.shard_of[h] for h in holders}
    gone = tuple(s for s in lost if s not in held)
    if gone and not view.checkpoint_known:
        return NeedCheckpoint()
    if gone and view.checkpoint is None:
        return FailJob(f"shard(s) {list(gone)} lost in every replica group, and no sharded "
                       "checkpoint to roll back to")
    ready = _candidates(view)
    shard_of = {**view.shard_of, **{s.slot: s.shard for s in view.spares}}
    replace: dict[str, str | NewProcess] = {}
    starts: list[NewProcess] = []
    for d in view.dead:
        match = [s for s in ready if shard_of[s] == shard_of[d] and s not in replace.values()]
        if match:
            replace[d] = match[0]
        else:
            starts.append(NewProcess(shard=shard_of[d], replaces=d, spare=True))
            replace[d] = starts[-1]
    members = tuple(replace.get(m, m) for m in view.members)
    called_in = tuple(s for s in replace.values() if isinstance(s, str))
    ck = view.checkpoint
    if gone and ck is not None:
        return PlanRecovery(mode=PlanMode.ROLLBACK, members=members, starts=tuple(starts),
                            called_in=called_in, outcome=Outcome.ROLLED_BACK,
                            lost_steps=max(view.last_step - ck[0], view.lost_steps),
                            checkpoint=ck, gone_shards=gone)
    return PlanRecovery(mode=PlanMode.LIVE, members=members, starts=tuple(starts),
                        called_in=called_in, outcome=_live_outcome(view),
                        lost_steps=view.lost_steps)


# ----------------------------------------------------------------- moves
@dataclass(frozen=True, slots=True)
class MoveWait:
    """The move stays queued (no ready spare, none of the leaving worker's shard).
    ``no_spare``: the job has no spare and will start none -- say so (status.json lists
    the move under ``moves_pending``)."""

    no_spare: bool = False


@dataclass(frozen=True, slots=True)
class MoveDrop:
    """The move is dropped: its worker is no longer a member (it died -- an unplanned
    failure, already recorded -- or was replaced meanwhile)."""


@dataclass(frozen=True, slots=True)
class MoveNow:
    """Move off the worker now: ``spare`` takes its rank in ``members``; ``donors`` are
    leaving workers that only send the state (a lone member)."""

    spare: str
    members: tuple[str, ...]
    donors: tuple[str, ...]


def plan_move(*, slot: str, members: Sequence[str], ready: Sequence[str],
              shard_of: Mapping[str, int], spares: int, spares_coming: bool
              ) -> MoveWait | MoveDrop | MoveNow:
    """What to do about the first queued move (pre-emptive or planned) off ``slot``,
    while no recovery is under way: it waits for a ``ready`` spare built for the leaving
    worker's shard (HSDP; ``shard_of``), and is dropped once ``slot`` is no longer a
    member. ``spares``: the job's spares now; ``spares_coming``: more will be started
    (configured and replenished)."""
    if not ready:
        return MoveWait(no_spare=not spares and not spares_coming)
    if slot not in members:
        return MoveDrop()
    match = [s for s in ready if shard_of.get(s) == shard_of.get(slot)]
    if not match:
        return MoveWait()
    spare = match[0]
    return MoveNow(spare=spare, members=tuple(spare if m == slot else m for m in members),
                   donors=(slot,) if len(members) == 1 else ())
