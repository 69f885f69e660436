"""Spare borrowing's decisions (runtime/loans.py), in-process: no process, no store, no
pool, no sleep -- every instant comes from a fake monotonic clock. Lending a claimed host
(and when a claim waits or is withdrawn), the host coming back and the widening after it,
the loan's outcome, the job's width over time, and the borrower's side (how many
processes a host takes, the failure's detail, a claim its owner withdrew)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.loans import (
    Borrowed,
    ClaimWait,
    ClaimWithdraw,
    CloseLoan,
    Grow,
    JobView,
    Lend,
    Loan,
    LoanIdle,
    RestartDead,
    StartReplacements,
    after_grow,
    after_lend,
    borrow_count,
    borrowed_host,
    borrowed_note,
    close_loans,
    decide_claim,
    lent_detail,
    loan_returned,
    poll_due,
    widen,
    widths_seen,
    withdraw_lost_host,
)

T0 = 1000.0  # the fake monotonic clock's epoch

#: w0 on host0 (the coordinator's), w1 and w2 on host1, w3 on host2; spare w4 on host2.
NODE_OF = {"w0": "host0", "w1": "host1", "w2": "host1", "w3": "host2", "w4": "host2",
           "w5": "host3"}
JOB = JobView(gen=3, members=("w0", "w1", "w2", "w3"), spares=("w4",), busy=False)


def _claim(job: JobView = JOB, host: str = "host1", usable: bool = True
           ) -> ClaimWait | ClaimWithdraw | Lend:
    return decide_claim(job, host=host, borrower="hi", borrower_priority=5, priority=1,
                        node_of=NODE_OF, host_usable=usable)


# ----------------------------------------------------------------- as lender: a claim
def test_a_claim_on_a_training_host_shrinks_the_job_by_its_members() -> None:
    got = _claim()
    assert got == Lend(host="host1", borrower="hi", on=("w1", "w2"), spares_on=(),
                       stay=("w0", "w3"), gen=4,
                       detail=lent_detail(host="host1", borrower="hi", borrower_priority=5,
                                          priority=1, width=4, narrower=2))
    assert got.gpus == 2
    assert got.detail is not None and "width 4 -> 2" in got.detail
    # Carried out: the narrower generation is planned, and the job is busy until it runs.
    assert after_lend(JOB, got) == JobView(gen=4, members=("w0", "w3"), spares=("w4",),
                                           busy=True)


def test_a_claim_on_a_host_with_members_and_spares_gives_up_both() -> None:
    got = _claim(host="host2")
    assert isinstance(got, Lend)
    assert (got.on, got.spares_on, got.stay, got.gen) == (("w3",), ("w4",),
                                                          ("w0", "w1", "w2"), 4)
    assert after_lend(JOB, got).spares == ()


def test_a_claim_on_a_spare_host_changes_no_width_and_records_nothing() -> None:
    job = replace(JOB, spares=("w4", "w5"))
    got = _claim(job, host="host3")
    assert got == Lend(host="host3", borrower="hi", on=(), spares_on=("w5",),
                       stay=job.members, gen=None, detail=None)
    assert got.gpus == 0
    after = after_lend(job, got)
    assert (after.gen, after.members, after.spares, after.busy) == (3, job.members,
                                                                    ("w4",), False)


def test_a_claim_waits_while_a_membership_change_is_under_way() -> None:
    assert _claim(replace(JOB, busy=True)) == ClaimWait()
    # ... even one that would be withdrawn: the change is decided first.
    assert _claim(replace(JOB, busy=True), usable=False) == ClaimWait()


def test_a_claim_is_refused_when_no_member_would_be_left_or_the_host_is_lost() -> None:
    alone = JobView(gen=1, members=("w1", "w2"), spares=(), busy=False)
    assert _claim(alone) == ClaimWithdraw(host="host1", why="no member would be left")
    assert _claim(usable=False) == ClaimWithdraw(host="host1", why="the host is lost")


def test_a_lost_host_leaves_the_pool_once() -> None:
    assert withdraw_lost_host(lost=True, home_ended=False)
    assert not withdraw_lost_host(lost=True, home_ended=True)  # already off the pool
    assert not withdraw_lost_host(lost=False, home_ended=False)


def test_the_pool_is_read_every_interval_and_left_alone_after_a_failure() -> None:
    assert poll_due(T0, 0.0, 0.1)
    assert not poll_due(T0 + 0.05, T0, 0.1)
    assert poll_due(T0 + 0.1, T0, 0.1)
    # A pool that did not answer: the next read is set 5 s into the future.
    assert not poll_due(T0 + 4.9, T0 + 5.0, 0.1)
    assert poll_due(T0 + 5.1, T0 + 5.0, 0.1)


# ----------------------------------------------------------------- as lender: the return
LOAN = Loan(host="host1", borrower="hi", failure_event_id="ev-1", gpus=2, since=T0)
NARROW = JobView(gen=4, members=("w0", "w3"), spares=("w4",), busy=False)


def _widen(loan: Loan, job: JobView = NARROW, *, room: bool = True,
           alive: dict[str, bool] | None = None, waiting: dict[str, bool] | None = None,
           gen_ready: bool = False, now: float = T0 + 30.0
           ) -> LoanIdle | StartReplacements | RestartDead | Grow | CloseLoan:
    return widen(loan, job, room=room, alive=alive or {}, waiting=waiting or {},
                 gen_ready=gen_ready, now=now)


def test_while_the_host_is_away_nothing_happens() -> None:
    assert _widen(LOAN) == LoanIdle()


def test_a_host_back_gets_its_replacements_once_there_is_room() -> None:
    back = loan_returned(LOAN)
    assert back == replace(LOAN, back=True)
    assert back is not None
    assert _widen(back, room=False) == LoanIdle()  # the lent processes' exits come first
    assert _widen(back) == StartReplacements(host="host1", count=2)


def test_a_host_that_lent_only_spares_is_forgotten_on_its_return() -> None:
    spares_only = Loan(host="host3", borrower="hi", failure_event_id=None, gpus=0, since=T0)
    assert loan_returned(spares_only) is None


def test_the_job_widens_when_every_replacement_waits_and_nothing_else_changes() -> None:
    loan = replace(LOAN, back=True, replacements=("w6", "w7"))
    alive = {"w6": True, "w7": True}
    assert _widen(loan, alive=alive, waiting={"w6": True}) == LoanIdle()  # w7 not ready
    ready = {"w6": True, "w7": True}
    assert _widen(loan, replace(NARROW, busy=True), alive=alive, waiting=ready) == LoanIdle()
    grow = _widen(loan, alive=alive, waiting=ready)
    assert grow == Grow(host="host1", gen=5, members=("w0", "w3", "w6", "w7"))
    assert isinstance(grow, Grow)
    assert after_grow(NARROW, grow) == JobView(gen=5, members=("w0", "w3", "w6", "w7"),
                                               spares=("w4",), busy=True)


def test_a_replacement_that_died_before_it_was_called_in_is_restarted() -> None:
    loan = replace(LOAN, back=True, replacements=("w6", "w7"))
    alive = {"w6": True, "w7": False}
    assert _widen(loan, alive=alive, room=False) == LoanIdle()
    assert _widen(loan, alive=alive) == RestartDead(host="host1", dead=("w7",))


def test_the_loan_closes_at_the_first_step_at_full_width_measured_on_one_clock() -> None:
    loan = replace(LOAN, back=True, replacements=("w6", "w7"), grow_gen=5)
    wide = JobView(gen=5, members=("w0", "w3", "w6", "w7"), spares=("w4",), busy=True)
    assert _widen(loan, wide, gen_ready=False) == LoanIdle()  # not stepped yet
    assert _widen(loan, NARROW, gen_ready=True) == LoanIdle()  # the plan not published
    got = _widen(loan, wide, gen_ready=True, now=T0 + 42.5)
    assert got == CloseLoan(host="host1", failure_event_id="ev-1", seconds=42.5, gpus=2)
    # A recovery replaced the wider generation by another without a replacement: the
    # loan stays open (it is closed at the job's end).
    other = JobView(gen=6, members=("w0", "w3", "w6", "w8"), spares=(), busy=False)
    assert _widen(loan, other, gen_ready=True) == LoanIdle()


def test_at_the_end_every_open_loan_that_lent_members_gets_its_outcome() -> None:
    spares_only = Loan(host="host3", borrower="hi", failure_event_id=None, gpus=0, since=T0)
    assert close_loans([LOAN, spares_only], T0 + 7.0) == [
        CloseLoan(host="host1", failure_event_id="ev-1", seconds=7.0, gpus=2)]
    assert close_loans([], T0) == []


def test_the_width_over_time_counts_only_generations_that_ran() -> None:
    # Gen 4 (width 2) ran from step 20 (its ready step 21); gen 5 (width 4) was replaced
    # by gen 6 before it ran; gen 7 is pending (not ready yet).
    entries, left = widths_seen({4: 2, 5: 4, 7: 4}, {4: 21}, gen=6)
    assert entries == [{"gen": 4, "width": 2, "from_step": 20}]
    assert left == {7: 4}
    assert widths_seen({}, {}, gen=1) == ([], {})


# ----------------------------------------------------------------- as borrower
def test_a_borrowed_host_takes_what_it_has_room_for() -> None:
    assert borrow_count(need=3, got=0, nproc=2) == 2
    assert borrow_count(need=3, got=2, nproc=2) == 1
    assert borrow_count(need=1, got=1, nproc=4) == 0


def test_the_failure_names_the_borrowed_hosts() -> None:
    assert borrowed_note([]) == ""
    assert borrowed_note(["h2 borrowed from job lo (priority 0)", "h3 borrowed from job lo "
                          "(priority 0)"]) == ("; its ranks moved onto h2 borrowed from job "
                                               "lo (priority 0), h3 borrowed from job lo "
                                               "(priority 0)")


def test_a_claimed_host_is_watched_until_it_joins_and_lost_if_its_owner_takes_it_back(
        ) -> None:
    assert borrowed_host(joined=False, lost=False, borrower_job="hi", job="hi") \
        == Borrowed.WAITING
    assert borrowed_host(joined=True, lost=False, borrower_job="hi", job="hi") \
        == Borrowed.DONE
    assert borrowed_host(joined=False, lost=True, borrower_job=None, job="hi") \
        == Borrowed.DONE
    assert borrowed_host(joined=False, lost=False, borrower_job=None, job="hi") \
        == Borrowed.WITHDRAWN  # back at home
    assert borrowed_host(joined=False, lost=False, borrower_job="other", job="hi") \
        == Borrowed.WITHDRAWN  # claimed again by another job


def test_a_whole_loan_on_a_fake_clock() -> None:
    """Lend, run narrower, come back, widen, close: each decision fed the one before."""
    clock = T0
    lend = _claim()
    assert isinstance(lend, Lend) and lend.gen is not None
    job = replace(after_lend(JOB, lend), busy=False)  # the narrower generation ran
    loan = Loan(host=lend.host, borrower=lend.borrower, failure_event_id="ev-9",
                gpus=lend.gpus, since=clock)
    clock += 12.0
    assert _widen(loan, job, now=clock) == LoanIdle()  # away
    back = loan_returned(loan)
    assert back is not None
    start = _widen(back, job, now=clock)
    assert start == StartReplacements(host="host1", count=2)
    loan = replace(back, replacements=("w8", "w9"))
    clock += 0.5
    grow = _widen(loan, job, alive={"w8": True, "w9": True},
                  waiting={"w8": True, "w9": True}, now=clock)
    assert isinstance(grow, Grow) and grow.members == ("w0", "w3", "w8", "w9")
    job, loan = after_grow(job, grow), replace(loan, grow_gen=grow.gen)
    clock += 0.3
    done = _widen(loan, job, gen_ready=True, now=clock)
    assert isinstance(done, CloseLoan)
    assert (done.host, done.failure_event_id, done.gpus) == ("host1", "ev-9", 2)
    assert done.seconds == pytest.approx(12.8)  # the shrink to the first wide step
