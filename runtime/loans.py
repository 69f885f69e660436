"""Spare borrowing's decisions, pure: what a coordinator does about the shared pool.

Like :mod:`runtime.coordinator`, no I/O, no store, no clock of its own: each function takes
what was observed -- a frozen view of the job (:class:`JobView`), a loan as it stands
(:class:`Loan`), what the pool's record of a host says, which processes are alive or
ready -- and ``now``, an instant of the caller's monotonic clock, and returns a decision
as data. :class:`runtime.borrowing.Loans` is the I/O around them on the pool's side (the
pool store, the node pool) and the supervisor carries out what concerns the job (starts
processes, opens the lender's failure, publishes plans, writes outcomes); so each
decision is tested in-process with a fake clock (tests/runtime/test_loans_policy.py).

The policy itself (who may lend, taking, giving back, the records) is described in
:mod:`runtime.borrowing` and docs/runtime.md ("Borrowing a spare node").

The decisions here:

* **As lender** -- a claim on one of the job's hosts is served now, waits (one
  membership change at a time) or is withdrawn (the host is lost, or no member would be
  left) (:func:`decide_claim`); a lost host is taken off the pool
  (:func:`withdraw_lost_host`); a host that comes back (:func:`loan_returned`); the
  widening after it -- start its replacements, restart one that died, plan the wider
  generation, close the loan with its outcome (:func:`widen`); the job's width over
  time (:func:`widths_seen`); the loans still open when the job ends
  (:func:`close_loans`).
* **As borrower** -- how many processes a claimed host takes (:func:`borrow_count`), the
  failure's detail naming the hosts (:func:`borrowed_note`), and what becomes of a host
  claimed but not joined yet (:func:`borrowed_host`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum


def lent_detail(*, host: str, borrower: str, borrower_priority: int, priority: int,
                width: int, narrower: int) -> str:
    """The ``detail`` of a lender's ``node_lent`` failure (class ``planned``)."""
    return (f"{host} lent to job {borrower} (priority {borrower_priority} > {priority}): "
            f"data-parallel width {width} -> {narrower} until it comes back")


def poll_due(now: float, last_poll: float, interval_s: float) -> bool:
    """True when the pool is read again: ``interval_s`` after the last read
    (``last_poll``, set into the future after a pool that did not answer)."""
    return now - last_poll >= interval_s


@dataclass(frozen=True, slots=True)
class JobView:
    """The job as the supervisor saw it: its generation, its ``members`` (rank order) and
    ``spares``, and whether a membership change is under way (``busy``: a recovery
    active or planned, or a move) -- one change at a time."""

    gen: int
    members: tuple[str, ...]
    spares: tuple[str, ...]
    busy: bool


# ----------------------------------------------------------------- as lender
@dataclass(frozen=True, slots=True)
class ClaimWait:
    """Leave the claim for the next poll (a membership change is under way)."""


@dataclass(frozen=True, slots=True)
class ClaimWithdraw:
    """Give the claimed host back to the pool at home (``why``: for the log)."""

    host: str
    why: str


@dataclass(frozen=True, slots=True)
class Lend:
    """Lend ``host`` to ``borrower``: the members on it (``on``) leave, its spares
    (``spares_on``) are given up, both are killed, then the host's agent goes. When
    members leave, a live plan of generation ``gen`` keeps the ``stay`` members (the
    survivors hold the state: nothing is lost) and the lender opens one ``planned``
    failure with ``detail``; with only spares on it (``gen`` None) the width is
    unchanged and nothing is recorded."""

    host: str
    borrower: str
    on: tuple[str, ...]
    spares_on: tuple[str, ...]
    stay: tuple[str, ...]
    gen: int | None
    detail: str | None

    @property
    def gpus(self) -> int:
        """The GPUs lent away from training (the members on the host)."""
        return len(self.on)


ClaimDecision = ClaimWait | ClaimWithdraw | Lend


def decide_claim(job: JobView, *, host: str, borrower: str, borrower_priority: int,
                 priority: int, node_of: Mapping[str, str | None], host_usable: bool
                 ) -> ClaimDecision:
    """What to do about a claim by job ``borrower`` (priority ``borrower_priority``) on
    ``host``, one of this job's hosts (``priority``): wait while the job is ``busy``;
    withdraw it when the host is not ``host_usable`` (unknown or lost) or lending it
    would leave no member; otherwise lend it (``node_of``: each member's and spare's
    host)."""
    if job.busy:
        return ClaimWait()
    on = tuple(m for m in job.members if node_of.get(m) == host)
    stay = tuple(m for m in job.members if m not in on)
    if not host_usable or not stay:
        return ClaimWithdraw(host=host, why="no member would be left" if not stay
                             else "the host is lost")
    spares_on = tuple(s for s in job.spares if node_of.get(s) == host)
    if not on:
        return Lend(host=host, borrower=borrower, on=(), spares_on=spares_on, stay=stay,
                    gen=None, detail=None)
    return Lend(host=host, borrower=borrower, on=on, spares_on=spares_on, stay=stay,
                gen=job.gen + 1,
                detail=lent_detail(host=host, borrower=borrower,
                                   borrower_priority=borrower_priority, priority=priority,
                                   width=len(job.members), narrower=len(stay)))


def after_lend(job: JobView, lend: Lend) -> JobView:
    """The job once ``lend`` is carried out: its spares on the host gone and, when
    members left, the narrower generation planned (busy until it runs)."""
    spares = tuple(s for s in job.spares if s not in lend.spares_on)
    if lend.gen is None:
        return replace(job, spares=spares)
    return JobView(gen=lend.gen, members=lend.stay, spares=spares, busy=True)


def withdraw_lost_host(*, lost: bool, home_ended: bool) -> bool:
    """True when this job's host must be taken off the pool: it is lost (a lost host
    can lend nothing; a claim on it is withdrawn) and the pool does not know yet."""
    return lost and not home_ended


@dataclass(frozen=True, slots=True)
class Loan:
    """A host of this job lent to another: its failure (``failure_event_id``; None: only
    spares were on it, the width did not change), the GPUs lent, since when (the
    lender's monotonic clock), and once the host is back the processes that widen the
    job again and the generation that does."""

    host: str
    borrower: str
    failure_event_id: str | None
    gpus: int
    since: float
    back: bool = False
    replacements: tuple[str, ...] = ()
    grow_gen: int | None = None


def loan_returned(loan: Loan) -> Loan | None:
    """The loan once its host is back: None when only spares were lent (nothing to
    widen: spare replenishment refills them), else marked back."""
    if loan.failure_event_id is None:
        return None
    return replace(loan, back=True)


@dataclass(frozen=True, slots=True)
class LoanIdle:
    """Nothing to do for this loan now."""


@dataclass(frozen=True, slots=True)
class StartReplacements:
    """Start ``count`` processes (one per GPU lent) to widen the job on ``host``'s
    return."""

    host: str
    count: int


@dataclass(frozen=True, slots=True)
class RestartDead:
    """Replacements that died before they were called in (no member: nothing lost):
    start one in the place of each of ``dead``."""

    host: str
    dead: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grow:
    """Plan generation ``gen`` at the full width: ``members`` (the current ones, then
    the ready replacements), as a move plan (the members switch at a step boundary; the
    newcomers receive the state)."""

    host: str
    gen: int
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CloseLoan:
    """The loan is over: write its outcome (``live_migrated``, 0 lost steps, the time at
    reduced width ``seconds``, the GPUs lent) for failure ``failure_event_id``."""

    host: str
    failure_event_id: str
    seconds: float
    gpus: int


WidenStep = LoanIdle | StartReplacements | RestartDead | Grow | CloseLoan


def widen(loan: Loan, job: JobView, *, room: bool, alive: Mapping[str, bool],
          waiting: Mapping[str, bool], gen_ready: bool, now: float) -> WidenStep:
    """The next step of widening the job after ``loan``'s host came back. ``room``: a
    process fits (the exits of the processes lent away are reported first); ``alive``
    and ``waiting``: each replacement runs, and waits to be called in (its model
    built); ``gen_ready``: the job's current generation has run its first step.

    Back with no replacement yet: start them (when there is room). Then, while no other
    membership change is under way: restart any replacement that died (when there is
    room), and once all wait, plan the wider generation. Once that generation runs with
    every replacement a member: close the loan, measured on this one clock from the
    shrink to now."""
    if loan.back and not loan.replacements:
        return StartReplacements(host=loan.host, count=loan.gpus) if room else LoanIdle()
    if not loan.replacements:
        return LoanIdle()
    if loan.grow_gen is None:
        if job.busy:
            return LoanIdle()
        dead = tuple(s for s in loan.replacements if not alive.get(s, False))
        if dead:
            return RestartDead(host=loan.host, dead=dead) if room else LoanIdle()
        if not all(waiting.get(s, False) for s in loan.replacements):
            return LoanIdle()
        return Grow(host=loan.host, gen=job.gen + 1,
                    members=(*job.members, *loan.replacements))
    if job.gen >= loan.grow_gen and set(loan.replacements) <= set(job.members) \
            and gen_ready and loan.failure_event_id is not None:
        return CloseLoan(host=loan.host, failure_event_id=loan.failure_event_id,
                         seconds=now - loan.since, gpus=loan.gpus)
    return LoanIdle()


def after_grow(job: JobView, grow: Grow) -> JobView:
    """The job once ``grow`` is published (busy until its generation runs)."""
    return replace(job, gen=grow.gen, members=grow.members, busy=True)


def widths_seen(pending: Mapping[int, int], ready_steps: Mapping[int, int], gen: int
                ) -> tuple[list[dict[str, int]], dict[int, int]]:
    """The job's width over time: of the ``pending`` generations (gen -> width), those
    that ran (``ready_steps``: gen -> the step of its first completed step) become
    entries ``{gen, width, from_step}``; those replaced by a newer generation (``gen``,
    the current one) before running a step are dropped. Returns (entries, still
    pending)."""
    entries: list[dict[str, int]] = []
    left: dict[int, int] = {}
    for g, width in pending.items():
        if g in ready_steps:
            entries.append({"gen": g, "width": width, "from_step": ready_steps[g] - 1})
        elif gen <= g:
            left[g] = width
    return entries, left


def close_loans(loans: Iterable[Loan], now: float) -> list[CloseLoan]:
    """The job ends: each loan still open that lent members gets its outcome (the host
    lost the job nothing but its GPUs for that time)."""
    return [CloseLoan(host=ln.host, failure_event_id=ln.failure_event_id,
                      seconds=now - ln.since, gpus=ln.gpus)
            for ln in loans if ln.failure_event_id is not None]


# ----------------------------------------------------------------- as borrower
def borrow_count(need: int, got: int, nproc: int) -> int:
    """How many of the ``need`` processes a claimed host of ``nproc`` places takes,
    ``got`` being placed already."""
    return max(min(nproc, need - got), 0)


def borrowed_note(taken: Sequence[str]) -> str:
    """The tail of the failure's detail naming the hosts borrowed for it ("" for
    none)."""
    return f"; its ranks moved onto {', '.join(taken)}" if taken else ""


class Borrowed(StrEnum):
    """What becomes of a host claimed from another job (see :func:`borrowed_host`)."""

    WAITING = "waiting"  # claimed, not joined yet: keep watching it
    DONE = "done"  # joined (or lost): nothing more to watch
    WITHDRAWN = "withdrawn"  # its owner took it back before it joined: lose it


def borrowed_host(*, joined: bool, lost: bool, borrower_job: str | None, job: str
                  ) -> Borrowed:
    """A host this ``job`` claimed: done once it joined or was lost; withdrawn when the
    pool no longer names this job its borrower (``borrower_job``; None: the record is
    gone or at home); else still waiting."""
    if joined or lost:
        return Borrowed.DONE
    if borrower_job != job:
        return Borrowed.WITHDRAWN
    return Borrowed.WAITING
