"""The queue of moves (runtime.moves) driven in-process: first in first out, one per
worker, never during a recovery, a spare of the leaving worker's shard, the "no spare"
warning said once, a move off a worker that is no longer a member dropped."""

from __future__ import annotations

from collections.abc import Mapping

from runtime.moves import Asked, Dropped, Duplicate, MoveQueue, NoSpare, Poll, StartMove
from runtime.recovery import FailureClass, Move


def _move(slot: str, cls: FailureClass = FailureClass.PREEMPTIVE) -> Move:
    return Move(slot=slot, failure_class=cls, cause="ecc_warning" if
                cls == FailureClass.PREEMPTIVE else "maintenance", detail="d", detected=1.0)


def _poll(*, members: tuple[str, ...] = ("w0", "w1"), ready: tuple[str, ...] = ("s0",),
          shard_of: Mapping[str, int] | None = None, spares: int = 1,
          spares_coming: bool = False, recovering: bool = False) -> Poll:
    return Poll(members=members, ready=ready, shard_of=shard_of or {}, spares=spares,
                spares_coming=spares_coming, recovering=recovering)


def test_moves_are_served_first_in_first_out_one_per_poll() -> None:
    q = MoveQueue()
    assert q.step(Asked(move=_move("w1")), 0.0) == []
    assert q.step(Asked(move=_move("w0", FailureClass.PLANNED)), 0.0) == []
    [start] = q.step(_poll(ready=("s0", "s1")), 1.0)
    assert isinstance(start, StartMove) and start.move.slot == "w1"
    assert (start.spare, start.members, start.donors) == ("s0", ("w0", "s0"), ())
    assert [m.slot for m in q.pending] == ["w0"]
    [second] = q.step(_poll(members=("w0", "s0"), ready=("s1",)), 2.0)
    assert isinstance(second, StartMove) and second.move.slot == "w0"
    assert second.members == ("s1", "s0") and q.pending == []


def test_a_second_request_for_the_same_worker_is_not_queued() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w0")), 0.0)
    [dup] = q.step(Asked(move=_move("w0", FailureClass.PLANNED)), 0.1)
    assert isinstance(dup, Duplicate) and dup.move.failure_class == FailureClass.PLANNED
    [leaving] = q.step(Asked(move=_move("w1"), moving=frozenset({"w1"})), 0.2)
    assert isinstance(leaving, Duplicate)
    assert [m.slot for m in q.pending] == ["w0"] and q.queued("w0") and not q.queued("w1")


def test_a_recovery_under_way_defers_every_move() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w0")), 0.0)
    assert q.step(_poll(recovering=True), 1.0) == []
    assert q.queued("w0")
    [start] = q.step(_poll(), 2.0)
    assert isinstance(start, StartMove)


def test_without_a_spare_the_move_waits_and_says_so_once() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w0")), 0.0)
    [warn] = q.step(_poll(ready=(), spares=0), 1.0)
    assert isinstance(warn, NoSpare) and warn.move.slot == "w0"
    assert q.step(_poll(ready=(), spares=0), 2.0) == []  # said once
    # Spares still starting (or to be started): it waits without the warning.
    q2 = MoveQueue()
    q2.step(Asked(move=_move("w0")), 0.0)
    assert q2.step(_poll(ready=(), spares=1), 1.0) == []
    assert q2.step(_poll(ready=(), spares=0, spares_coming=True), 1.0) == []
    assert q2.queued("w0")


def test_a_move_waits_for_a_spare_of_its_shard() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w1")), 0.0)
    shards = {"w0": 0, "w1": 1, "s0": 0, "s1": 1}
    assert q.step(_poll(ready=("s0",), shard_of=shards), 1.0) == []
    [start] = q.step(_poll(ready=("s0", "s1"), shard_of=shards), 2.0)
    assert isinstance(start, StartMove) and start.spare == "s1"


def test_a_move_off_a_worker_that_left_is_dropped_and_the_next_served() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w0")), 0.0)
    q.step(Asked(move=_move("w1")), 0.0)
    [dropped] = q.step(_poll(members=("s9", "w1")), 1.0)  # w0 died and was replaced
    assert isinstance(dropped, Dropped) and dropped.move.slot == "w0"
    [start] = q.step(_poll(members=("s9", "w1")), 2.0)
    assert isinstance(start, StartMove) and start.move.slot == "w1"


def test_a_lone_member_is_a_donor() -> None:
    q = MoveQueue()
    q.step(Asked(move=_move("w0")), 0.0)
    [start] = q.step(_poll(members=("w0",)), 1.0)
    assert isinstance(start, StartMove)
    assert (start.members, start.donors) == (("s0",), ("w0",))
