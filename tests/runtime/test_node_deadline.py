"""The coordinator's node deadline on a real store, in-process: a host on another machine
(nothing of it in this machine's ``/proc``) is lost after the adaptive deadline
(runtime.detection.node_deadline) -- the node floor while the job's steps are short, its
heartbeats steady and the job stalled, longer once a heartbeat was seen late -- and only
after the node timeout while the job still commits steps. Each beat is followed by the coordinator's look in this one thread, so a
loaded machine delays both alike and cannot fake a silence; only lower bounds are
asserted (a late look can only find a longer silence)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runtime import protocol as P
from runtime.detection import BEAT_GAP_FACTOR
from runtime.nodepool import NodeFailure, NodePool

TIMEOUT = 6.0     # --node-timeout: far above what this test waits for
FLOOR = 1.0       # --node-floor
STEP_DEADLINE = 0.3  # the job's hang deadline of ordinary steps (short steps)


@pytest.fixture
def store(remote_pair_store: Any) -> Any:
    """Node 0 here, node 1 on another machine (tests/runtime/conftest.py)."""
    return remote_pair_store


def _beat_and_look(store: Any, pool: NodePool, ranks: tuple[int, ...], seconds: float
                   ) -> list[NodeFailure]:
    """Beat ``ranks`` and look, every 60 ms, for ``seconds`` or until a node is lost."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for rank in ranks:
            store.add(P.node_beat_key(rank), 1)
        time.sleep(0.06)  # past the coordinator's 50 ms between looks at the beats
        lost = pool.take_node_failures()
        if lost:
            return lost
    return []


def _silent_for(failure: NodeFailure) -> tuple[float, float]:
    """(seconds silent, deadline) as the failure's detail states them."""
    silent = float(failure.detail.split("silent for ")[1].split(" s")[0])
    deadline = float(failure.detail.split("lost after ")[1].split(" s")[0])
    return silent, deadline


def test_a_silent_remote_host_is_lost_at_the_floor_not_the_node_timeout(store: Any) -> None:
    pool = NodePool(store, nodes=2, node_timeout_s=TIMEOUT, register_timeout_s=10,
                    node_floor_s=FLOOR, step_deadline=lambda: STEP_DEADLINE)
    assert not pool.nodes[1].reachable
    assert _beat_and_look(store, pool, (0, 1), 2.0) == []
    # Steady beats: nothing kept that raises the deadline above the floor.
    assert pool.node_deadline(time.monotonic()) == FLOOR
    [failure] = _beat_and_look(store, pool, (0,), 30.0)
    assert (failure.node, failure.cause) == ("host1", "hang")
    silent, deadline = _silent_for(failure)
    assert deadline == FLOOR and silent >= deadline, failure.detail
    assert silent < TIMEOUT  # lost at the adaptive deadline, long before the timeout


def test_a_heartbeat_seen_late_lengthens_the_deadline(store: Any) -> None:
    pool = NodePool(store, nodes=2, node_timeout_s=TIMEOUT, register_timeout_s=10,
                    node_floor_s=FLOOR, step_deadline=lambda: STEP_DEADLINE)
    assert _beat_and_look(store, pool, (0, 1), 1.0) == []
    # host1 misses beats for 0.7 s (under the 1 s floor: not lost), then beats again: a
    # gap of at least the looks that saw nothing (0.7 s less one look, 60 ms).
    assert _beat_and_look(store, pool, (0,), 0.7) == []
    assert _beat_and_look(store, pool, (0, 1), 0.3) == []
    gap = pool.beat_gaps.longest(time.monotonic())
    assert gap >= 0.5
    assert pool.node_deadline(time.monotonic()) == pytest.approx(
        min(TIMEOUT, BEAT_GAP_FACTOR * gap))
    [failure] = _beat_and_look(store, pool, (0,), 30.0)
    silent, deadline = _silent_for(failure)
    assert deadline >= BEAT_GAP_FACTOR * 0.5 and silent >= deadline, failure.detail


def test_a_coordinator_stuck_itself_does_not_count_its_delay_as_the_hosts(store: Any
                                                                         ) -> None:
    # This coordinator does not look for 0.8 s (busy) while every host beats: the late look
    # finds every heartbeat advanced, loses nobody and takes no gap of 0.8 s for a host's
    # (from the look before the stall to the one before the late look: nothing).
    pool = NodePool(store, nodes=2, node_timeout_s=TIMEOUT, register_timeout_s=10,
                    node_floor_s=FLOOR, step_deadline=lambda: STEP_DEADLINE)
    assert _beat_and_look(store, pool, (0, 1), 0.5) == []
    until = time.monotonic() + 0.8
    while time.monotonic() < until:
        for rank in (0, 1):
            store.add(P.node_beat_key(rank), 1)
        time.sleep(0.06)
    assert pool.take_node_failures() == []
    assert pool.beat_gaps.longest(time.monotonic()) == 0.0


def test_a_job_that_still_steps_keeps_a_silent_host_until_the_node_timeout(store: Any
                                                                         ) -> None:
    # The job commits steps (stalled 0 s): the host's silence is not corroborated (every
    # step needs every training host; a silent spare costs nothing): the node timeout.
    timeout = 2.5
    pool = NodePool(store, nodes=2, node_timeout_s=timeout, register_timeout_s=10,
                    node_floor_s=FLOOR, step_deadline=lambda: STEP_DEADLINE,
                    stalled=lambda: 0.0)
    assert _beat_and_look(store, pool, (0, 1), 0.5) == []
    [failure] = _beat_and_look(store, pool, (0,), 30.0)
    silent, deadline = _silent_for(failure)
    assert deadline == timeout and silent >= timeout, failure.detail
