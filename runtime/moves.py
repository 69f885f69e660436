"""The coordinator's queue of moves as a state machine: ``step(event, now) -> actions``.

A *move* is a pre-emptive (a telemetry warning) or planned (an operator's drain)
migration off a live worker; it waits for a ready spare of the worker's shard and is
served one at a time, never during a recovery. The decision about the first move in the
queue is :func:`runtime.coordinator.plan_move`'s (wait, drop, move now); what was the
supervisor's own state and sequencing -- the queue, one request per worker, the "no
spare" warning said once, first in first out -- is :class:`MoveQueue`, after torchft's
``quorum_compute`` and like :class:`runtime.watchdog.StallWatch` and
:class:`runtime.deaths.Deaths`: it is given :class:`Asked` and :class:`Poll` events with
``now`` from the caller's monotonic clock and returns what to do as data
(:class:`Duplicate`, :class:`NoSpare`, :class:`Dropped`, :class:`StartMove`). The
supervisor checks a request at the door (a member, a valid record), opens the move's
incident and publishes its plan; ``tests/runtime/test_moves.py`` drives the queue
in-process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from runtime.coordinator import MoveDrop, MoveWait, plan_move
from runtime.recovery import Move

__all__ = [
    "Action",
    "Asked",
    "Dropped",
    "Duplicate",
    "Event",
    "MoveQueue",
    "NoSpare",
    "Poll",
    "StartMove",
]


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Asked:
    """A move off ``move.slot`` was asked for (checked at the door by the caller);
    ``moving``: the workers already leaving (a move of theirs is under way)."""

    move: Move
    moving: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Poll:
    """Serve the first queued move if it can be: ``recovering``, a membership change is
    under way (every move waits for it); the rest is :func:`plan_move`'s input."""

    members: tuple[str, ...]
    ready: tuple[str, ...]
    shard_of: Mapping[str, int]
    spares: int
    spares_coming: bool
    recovering: bool


Event = Asked | Poll


# ----------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Duplicate:
    """Not queued: a move off the same worker is already queued or under way."""

    move: Move


@dataclass(frozen=True, slots=True)
class NoSpare:
    """The first move waits and the job has no spare and will start none (said once per
    worker: status.json lists the move under ``moves_pending`` meanwhile)."""

    move: Move


@dataclass(frozen=True, slots=True)
class Dropped:
    """The move left the queue unserved: its worker is no longer a member."""

    move: Move


@dataclass(frozen=True, slots=True)
class StartMove:
    """Move off ``move.slot`` now (it has left the queue): ``spare`` takes its rank in
    ``members``; ``donors``, leaving workers that only send the state."""

    move: Move
    spare: str
    members: tuple[str, ...]
    donors: tuple[str, ...]


Action = Duplicate | NoSpare | Dropped | StartMove


@dataclass
class MoveQueue:
    """The moves waiting for a spare, first in first out (see the module doc)."""

    pending: list[Move] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)

    def step(self, event: Event, now: float) -> list[Action]:
        """Take ``event`` at ``now`` (the caller's monotonic clock); return what to do.
        At most one move is started per poll."""
        if isinstance(event, Asked):
            mv = event.move
            if mv.slot in event.moving or any(p.slot == mv.slot for p in self.pending):
                return [Duplicate(move=mv)]
            self.pending.append(mv)
            return []
        if not self.pending or event.recovering:
            return []  # one membership change at a time: a move waits for the recovery
        mv = self.pending[0]
        decision = plan_move(slot=mv.slot, members=event.members, ready=event.ready,
                             shard_of=event.shard_of, spares=event.spares,
                             spares_coming=event.spares_coming)
        if isinstance(decision, MoveWait):
            if decision.no_spare and mv.slot not in self._warned:
                self._warned.add(mv.slot)
                return [NoSpare(move=mv)]
            return []
        self.pending.pop(0)
        if isinstance(decision, MoveDrop):
            return [Dropped(move=mv)]
        return [StartMove(move=mv, spare=decision.spare, members=decision.members,
                          donors=decision.donors)]

    def queued(self, slot: str) -> bool:
        """True while a move off ``slot`` waits in the queue."""
        return any(p.slot == slot for p in self.pending)

