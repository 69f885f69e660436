"""The pure detection decisions (runtime/detection.py), in-process with injected times:
the agents' coordinator deadline, the coordinator's partition verdict (blame the silent
hosts, or find itself cut off), the adaptive hang deadline and the node deadline."""

from __future__ import annotations

import pytest

from runtime.detection import (
    BEAT_GAP_FACTOR,
    BEAT_MEMORY_S,
    MIN_STEP_SAMPLES,
    NODE_FLOOR_S,
    QUIET_FRACTION,
    BeatGaps,
    PartitionVerdict,
    StepTimes,
    adaptive_deadline,
    coordinator_lost,
    node_deadline,
    partition_verdict,
    quantile,
)

T = 2.0  # node timeout


def test_the_coordinator_is_lost_only_past_the_deadline() -> None:
    assert not coordinator_lost(100.0, 104.9, 5.0)
    assert not coordinator_lost(100.0, 105.0, 5.0)
    assert coordinator_lost(100.0, 105.01, 5.0)
    with pytest.raises(ValueError, match="timeout_s"):
        coordinator_lost(0.0, 1.0, 0.0)


def test_nothing_is_decided_while_no_host_is_past_the_timeout() -> None:
    assert partition_verdict({0: 0.0, 1: 1.9, 2: 1.9, 3: 1.9}, self_rank=0,
                             timeout_s=T) == PartitionVerdict(lose=(), cut_off=False)


def test_one_silent_host_is_lost_whatever_the_job_size() -> None:
    for n in (2, 3, 4, 8):
        silence = {r: 0.05 for r in range(n)} | {1: T + 0.1}
        v = partition_verdict(silence, self_rank=0, timeout_s=T)
        assert (v.lose, v.cut_off) == ((1,), False), n


def test_the_majority_silent_together_means_the_coordinator_is_cut_off() -> None:
    # The coordinator's host partitioned from 3 others: it looks at them one after the
    # other, so one is past the timeout while the others are a beat or two behind.
    v = partition_verdict({0: 0.0, 1: T + 0.01, 2: T - 0.1, 3: T - 0.2}, self_rank=0,
                          timeout_s=T)
    assert v.cut_off and v.lose == () and v.quiet == (1, 2, 3)
    # Two of three others (the coordinator with one host: 2 of 4, not a strict majority).
    v = partition_verdict({0: 0.0, 1: T + 0.01, 2: T, 3: 0.1}, self_rank=0, timeout_s=T)
    assert v.cut_off and v.lose == ()


def test_a_minority_silent_together_is_lost() -> None:
    # Two hosts of five go silent together (a rack): the coordinator still reaches three.
    v = partition_verdict({0: 0.0, 1: T + 0.1, 2: T + 0.05, 3: 0.1, 4: 0.0}, self_rank=0,
                          timeout_s=T)
    assert (v.lose, v.cut_off) == ((1, 2), False)


def test_a_host_that_went_quiet_much_later_is_not_counted_together() -> None:
    # host1 is past the timeout; host2 has missed fewer beats than QUIET_FRACTION of it:
    # not silent *together*, so only host1 is lost (the coordinator reaches a majority).
    v = partition_verdict({0: 0.0, 1: T + 0.1, 2: QUIET_FRACTION * T - 0.01},
                          self_rank=0, timeout_s=T)
    assert (v.lose, v.cut_off) == ((1,), False)


def test_the_coordinators_own_silence_is_never_counted() -> None:
    v = partition_verdict({0: 99.0, 1: T + 1, 2: 0.0}, self_rank=0, timeout_s=T)
    assert (v.lose, v.cut_off) == ((1,), False)


def test_quantile_is_the_nearest_rank() -> None:
    assert quantile([], 0.99) == 0.0
    xs = [float(i) for i in range(1, 101)]
    assert quantile(xs, 0.99) == 99.0 and quantile(xs, 1.0) == 100.0
    assert quantile(xs, 0.5) == 50.0 and quantile([3.0], 0.99) == 3.0
    with pytest.raises(ValueError):
        quantile(xs, 1.5)


def test_the_adaptive_deadline_follows_the_tail_of_the_steps_above_its_floor() -> None:
    steady = [0.1] * 63 + [0.3]  # one slow step in the window: the tail is that step
    assert adaptive_deadline(steady, floor_s=0.5, factor=4.0, startup_s=3.0) == \
        pytest.approx(1.2)
    assert adaptive_deadline(steady, floor_s=0.5, factor=4.0, startup_s=3.0, q=0.5) == 0.5
    assert adaptive_deadline([0.1] * 64, floor_s=0.5, factor=4.0, startup_s=3.0) == 0.5
    assert adaptive_deadline([2.0] * 64, floor_s=0.5, factor=4.0, startup_s=3.0) == 8.0
    # Too few samples: the startup deadline.
    few = [0.1] * (MIN_STEP_SAMPLES - 1)
    assert adaptive_deadline(few, floor_s=0.5, factor=4.0, startup_s=3.0) == 3.0
    with pytest.raises(ValueError):
        adaptive_deadline(steady, floor_s=0.0, factor=4.0, startup_s=3.0)


def test_step_times_come_from_commits_seen_on_one_clock() -> None:
    st = StepTimes(window=16, warmup=0)
    now = 50.0
    for step in range(1, 11):
        now += 0.2
        st.observe(step, now)
    st.observe(10, now + 5.0)  # the same step seen again: no sample
    assert len(st.samples) == 9 and all(s == pytest.approx(0.2) for s in st.samples)
    st.observe(13, now + 0.9)  # three steps seen at once: three samples of their mean
    assert list(st.samples)[-3:] == pytest.approx([0.3, 0.3, 0.3])
    st.restart()  # a new generation: the recovery's gap is not a step
    st.observe(14, now + 60.0)
    assert max(st.samples) == pytest.approx(0.3)
    # Fewer samples than MIN_STEP_SAMPLES: still the startup deadline.
    assert st.deadline(floor_s=0.1, factor=4.0, startup_s=3.0) == 3.0
    assert adaptive_deadline([*st.samples] * 3, floor_s=0.1, factor=4.0, startup_s=3.0) \
        == pytest.approx(1.2)


def test_the_node_deadline_is_a_few_steady_steps_within_its_floor_and_the_timeout() -> None:
    # Steps of 0.1 s: the step deadline is the hang floor (0.4 s): the node floor rules.
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.0,
                         step_deadline_s=0.4) == NODE_FLOOR_S
    # Steps of 0.45 s: the step deadline (2 x 0.45) rules: a slow job stays patient.
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.1,
                         step_deadline_s=0.9) == 0.9
    # Heartbeats once seen 0.3 s apart: 3 x that.
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.3,
                         step_deadline_s=0.4) == pytest.approx(BEAT_GAP_FACTOR * 0.3)
    # Before the steps are known (the startup deadline, 3 s) or with a long gap: never
    # past the node timeout.
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.0,
                         step_deadline_s=3.0) == T
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=5.0,
                         step_deadline_s=0.4) == T
    # A floor above the timeout: the timeout.
    assert node_deadline(timeout_s=T, floor_s=3.0, longest_gap_s=0.0,
                         step_deadline_s=0.0) == T
    # The job still commits steps (stalled for less than the short deadline): its hosts
    # are there, whatever their heartbeats say: the node timeout.
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.0,
                         step_deadline_s=0.4, stalled_s=0.3) == T
    assert node_deadline(timeout_s=T, floor_s=NODE_FLOOR_S, longest_gap_s=0.0,
                         step_deadline_s=0.4, stalled_s=0.51) == NODE_FLOOR_S
    for bad in ({"timeout_s": 0.0}, {"floor_s": 0.0}, {"longest_gap_s": -1.0},
                {"step_deadline_s": -0.1}, {"stalled_s": -1.0}):
        args = {"timeout_s": T, "floor_s": 0.5, "longest_gap_s": 0.0,
                "step_deadline_s": 0.4} | bad
        with pytest.raises(ValueError):
            node_deadline(**args)


def test_beat_gaps_keep_the_long_gaps_for_their_memory() -> None:
    gaps = BeatGaps(floor_s=0.5, memory_s=10.0)
    for k in range(100):  # the steady beats: too short to matter, not kept
        gaps.observe(0.1, 100.0 + k * 0.1)
    assert gaps.longest(110.0) == 0.0
    gaps.observe(0.5 / BEAT_GAP_FACTOR, 110.0)  # not longer than floor / factor: not kept
    assert gaps.longest(110.0) == 0.0
    gaps.observe(0.4, 111.0)
    gaps.observe(0.25, 112.0)
    assert gaps.longest(112.0) == 0.4
    assert gaps.longest(121.0) == 0.4      # 10 s after the 0.4 s gap: still kept
    assert gaps.longest(121.5) == 0.25     # then forgotten; the later one stays
    assert gaps.longest(122.5) == 0.0
    assert BeatGaps().longest(0.0) == 0.0 and BEAT_MEMORY_S > 0
    with pytest.raises(ValueError):
        BeatGaps(floor_s=0.0)


def test_a_coordinator_cut_off_waits_for_the_node_timeout_before_it_stops() -> None:
    # The adaptive deadline (0.5 s) loses a lone silent host; a silent majority stops the
    # job only past the node timeout: until then nobody is lost and nothing decided.
    lone = partition_verdict({0: 0.0, 1: 0.6, 2: 0.05}, self_rank=0, timeout_s=0.5,
                             cut_off_s=T)
    assert (lone.lose, lone.cut_off) == ((1,), False)
    early = partition_verdict({0: 0.0, 1: 0.6, 2: 0.55}, self_rank=0, timeout_s=0.5,
                              cut_off_s=T)
    assert (early.lose, early.cut_off, early.quiet) == ((), False, (1, 2))
    late = partition_verdict({0: 0.0, 1: T + 0.01, 2: T - 0.05}, self_rank=0,
                             timeout_s=0.5, cut_off_s=T)
    assert (late.lose, late.cut_off) == ((), True)
    # One of them beats again before the timeout: the other is a lone silent host, lost.
    healed = partition_verdict({0: 0.0, 1: 1.2, 2: 0.05}, self_rank=0, timeout_s=0.5,
                               cut_off_s=T)
    assert (healed.lose, healed.cut_off) == ((1,), False)
    with pytest.raises(ValueError, match="cut_off_s"):
        partition_verdict({0: 0.0}, self_rank=0, timeout_s=1.0, cut_off_s=0.5)
