"""Borrowing a spare node: a shared pool of hosts across jobs, and its simplest policy.

The pool is one ``TCPStore`` (``yoco pool``: :func:`serve_pool`) that the coordinators of
several multi-node jobs share (``yoco run --pool HOST:PORT --priority N``); every key is in
:mod:`runtime.protocol`. Each host has one record (:class:`HostRecord`), changed only by
``compare_set`` of the whole record (with a version that grows at every change), so two
jobs can never both take the same host: a host belongs to exactly one job at any time.

The policy (docs/runtime.md, "Borrowing a spare node"):

* **Who may lend**: a job of strictly lower priority. Its coordinator's host (node rank 0)
  is never in the pool, so a lender always keeps at least one host and continues,
  narrower (it never pauses at width 0). Among the candidates: the lowest priority
  first, a host with only spares on it before a training host, then by name.
* **Taking**: a coordinator that must replace lost ranks and has no spare of its own
  claims a host (``home`` -> ``lending``, naming itself), adds it to its node pool under
  a new node rank and plans the live migration onto it at once (the new group forms when
  the processes there arrive).
* **The lender** sees the claim at its next poll (0.1 s), drops the members on that host
  from a new generation (a live plan: the survivors hold the state; the step in flight is
  run again at the new width), kills them, and tells the host's agent to go. The agent
  ends every process of its job there, *then* marks the host ``lent`` and joins the
  borrower (:func:`runtime.loanagent.serve_loan`): the node is never in two jobs at once.
* **Giving back**: when the borrower's job ends (or its coordinator is lost), the agent
  ends the borrower's processes there, marks the host ``home`` again and rejoins its own
  job, whose coordinator starts new processes there and, once they are ready, plans a
  generation at the full width again (a move plan: the members switch at a step
  boundary, the newcomers receive the state from them).
* **Records**: the borrower's failure names the borrowed host in its detail. The lender
  writes one ``planned`` failure, cause :data:`CAUSE_LENT`, node = the lent host, dated at
  the shrink, and its ``outcome`` when the full width is back (``live_migrated``, 0 lost
  steps, ``recovery_seconds`` = the time at reduced width, ``gpus_affected`` = the GPUs
  lent); a lender that ends while its host is still away writes that outcome before its
  ``job_finished``. So no failure is left without an outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from runtime import protocol as P
from runtime import records as R
from runtime.errors import ConfigError
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
    borrow_count,
    borrowed_host,
    close_loans,
    decide_claim,
    lent_detail,
    loan_returned,
    poll_due,
    widen,
    widths_seen,
    withdraw_lost_host,
)
from runtime.recovery import Outcome

if TYPE_CHECKING:
    from runtime.nodepool import NodePool

__all__ = ["CAUSE_LENT", "BorrowedHost", "HostRecord", "LoanAction", "Loans", "PoolClient",
           "lent_detail", "loan_outcome", "parse_endpoint", "serve_pool"]

log = logging.getLogger("yoco.runtime.borrowing")

#: The cause of the lender's failure record (class ``planned``).
CAUSE_LENT = "node_lent"

STATES = ("home", "lending", "lent")
ROLES = ("train", "spare")

#: How often a coordinator reads the pool.
POLL_INTERVAL_S = 0.1
#: A coordinator's pool requests time out after this (they run in its loop: a pool that
#: does not answer must not stall the job's own failure handling for long) ...
POOL_TIMEOUT_S = 1.0
#: ... and after a failed one the pool is left alone this long (the job goes on).
POOL_RETRY_S = 5.0


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ConfigError when malformed."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"pool endpoint {endpoint!r} is not HOST:PORT")
    return host, int(port)


@dataclass(kw_only=True, slots=True)
class HostRecord:
    """One host of the pool: whose it is (``job``, its ``priority``, its coordinator's
    ``endpoint`` and the host's node ``rank`` there) and where it is now (``state``:
    ``home``, ``lending`` (claimed by ``borrower``, not yet free) or ``lent``).
    ``home_ended``: its own job has ended (an agent coming back then just exits)."""

    name: str
    job: str
    priority: int
    endpoint: str
    rank: int
    role: str
    nproc: int
    state: str = "home"
    borrower: dict[str, Any] | None = None  # {job, priority, endpoint, rank}
    home_ended: bool = False
    v: int = 0

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown host state {self.state!r}")
        if self.role not in ROLES:
            raise ValueError(f"unknown host role {self.role!r}")
        if (self.borrower is None) != (self.state == "home"):
            raise ValueError("a borrower is named exactly when the host is not at home")

    def encode(self) -> str:
        """The record as JSON (what the pool stores)."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def decode(raw: bytes | str) -> HostRecord:
        """Parse a record written by :meth:`encode`."""
        return HostRecord(**json.loads(raw))


class PoolClient:
    """A connection to the shared pool store (see the module docstring)."""

    def __init__(self, endpoint: str, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        host, port = parse_endpoint(endpoint)
        try:
            self.store = dist.TCPStore(host, port, is_master=False,
                                       timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistStoreError) as exc:
            raise ConfigError(f"cannot reach the pool at {endpoint}: {exc} (is `yoco pool` "
                              "running there?)") from exc

    def names(self) -> list[str]:
        """Every host name registered, in registration order."""
        n = int(self.store.add(P.KEY_POOL_HOSTS, 0))
        return [self.store.get(P.pool_host_name_key(i)).decode() for i in range(n)]

    def get(self, name: str) -> tuple[str, HostRecord] | None:
        """Host ``name``'s record and its raw text (for a compare-and-set), or None."""
        key = P.pool_host_key(name)
        if not self.store.check([key]):
            return None
        raw = self.store.get(key).decode()
        return raw, HostRecord.decode(raw)

    def _cas(self, raw: str, new: HostRecord) -> bool:
        return self.store.compare_set(P.pool_host_key(new.name), raw,
                                      new.encode()).decode() == new.encode()

    def update(self, name: str, change: Callable[[HostRecord], HostRecord | None]
               ) -> HostRecord | None:
        """Apply ``change`` to host ``name``'s record atomically (retried while another
        writer got in first); ``change`` returns None to leave it. Returns the new
        record, or None when nothing was changed."""
        for _ in range(100):
            got = self.get(name)
            if got is None:
                return None
            raw, rec = got
            new = change(dataclasses.replace(rec))
            if new is None:
                return None
            new.v = rec.v + 1
            if self._cas(raw, new):
                return new
        raise RuntimeError(f"pool record of {name} keeps changing")  # invariant

    def register(self, rec: HostRecord) -> None:
        """Add ``rec``'s host to the pool for its job (or, on ``--resume``, refresh the
        record it already has). A host registered by another job is refused."""
        key = P.pool_host_key(rec.name)
        if self.store.compare_set(key, "", rec.encode()).decode() == rec.encode():
            i = int(self.store.add(P.KEY_POOL_HOSTS, 1)) - 1
            self.store.set(P.pool_host_name_key(i), rec.name)
            return

        def refresh(old: HostRecord) -> HostRecord | None:
            if old.job != rec.job:
                raise ConfigError(f"host {rec.name} is already in the pool for job "
                                  f"{old.job}: host names must be unique in a pool")
            return dataclasses.replace(old, priority=rec.priority, endpoint=rec.endpoint,
                                       rank=rec.rank, role=rec.role, nproc=rec.nproc,
                                       home_ended=False)

        self.update(rec.name, refresh)

    def claim(self, *, job: str, priority: int, endpoint: str, rank: int) -> HostRecord | None:
        """Claim a host for ``job`` (the policy of the module docstring): the claimed
        record (state ``lending``), or None when no job of lower priority has one."""
        recs = [got[1] for n in self.names() if (got := self.get(n)) is not None]
        cands = sorted((r for r in recs if r.state == "home" and not r.home_ended
                        and r.job != job and r.priority < priority),
                       key=lambda r: (r.priority, r.role != "spare", r.name))
        me = {"job": job, "priority": priority, "endpoint": endpoint, "rank": rank}
        for cand in cands:
            def take(r: HostRecord, c: HostRecord = cand) -> HostRecord | None:
                if r.state != "home" or r.home_ended or r.job != c.job:
                    return None  # taken or gone meanwhile
                return dataclasses.replace(r, state="lending", borrower=dict(me))
            claimed = self.update(cand.name, take)
            if claimed is not None:
                return claimed
        return None


def serve_pool(port: int, *, stop: Callable[[], bool] = lambda: False) -> None:
    """Host the shared pool store on ``port`` until ``stop()`` (or forever)."""
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    store.add(P.KEY_POOL_HOSTS, 0)
    log.info("pool store serving on port %d", store.port)
    while not stop():
        time.sleep(0.2)


# ----------------------------------------------------------------- records
def loan_outcome(*, contract_id: str, failure_event_id: str, seconds: float,
                 step_seconds: float, gpus: int, occurred_at: str | None = None
                 ) -> dict[str, Any]:
    """The validated outcome of a loan: ``live_migrated`` (the lender's state stayed live
    on the members that kept training), 0 lost steps, ``recovery_seconds`` = the time at
    reduced width, ``gpus_affected`` = the GPUs lent (the others kept training)."""
    return R.outcome(contract_id=contract_id, failure_event_id=failure_event_id,
                     outcome=Outcome.LIVE_MIGRATED.value, lost_steps=0,
                     recovery_seconds=max(seconds, 0.0), step_seconds=max(step_seconds, 1e-6),
                     gpus_affected=max(gpus, 1), occurred_at=occurred_at)




# ----------------------------------------------------------------- coordinator side
@dataclass(frozen=True, slots=True)
class BorrowedHost:
    """A host claimed from another job for the borrower's recovery: start ``count``
    processes there (the borrower's spares; the node is already in its node pool)."""

    host: str
    job: str
    priority: int
    count: int

    def describe(self) -> str:
        """How the failure's detail names it."""
        return f"{self.host} borrowed from job {self.job} (priority {self.priority})"


#: What the supervisor carries out for :meth:`Loans.poll` (see runtime.loans).
LoanAction = Lend | StartReplacements | RestartDead | Grow | CloseLoan


class Loans:
    """A coordinator's side of the pool, as lender and as borrower: the I/O around the
    pure decisions of :mod:`runtime.loans` on the pool's side (the pool store, the node
    pool, the job's store for readiness). It never touches the supervisor: the
    supervisor drives it -- :meth:`poll` in its loop, :meth:`borrow` in a recovery
    without spares, :meth:`close` at the end -- and carries out the decisions that
    concern the job (starting processes, the lender's failure, plans, outcomes), then
    tells it what came of them (:meth:`lent`, :meth:`started`, :meth:`restarted`)."""

    def __init__(self, *, store: Any, nodes: NodePool, job_id: str, endpoint: str,
                 workers: int, spec: dict[str, Any], pool: str, priority: int) -> None:
        self.store = store
        self.nodes = nodes
        self.job_id = job_id
        self.client = PoolClient(pool, timeout_s=POOL_TIMEOUT_S)
        self.priority = priority
        self.endpoint = endpoint
        self.spec = spec  # what a borrowed host's agent runs: {script, args, python, job}
        self.loans: dict[str, Loan] = {}
        self.mine: list[str] = []
        self.borrowed: list[str] = []  # hosts claimed from other jobs, until they join
        #: The job's data-parallel width over time: {gen, width, from_step} (status.json).
        self.widths: list[dict[str, int]] = [{"gen": 0, "width": workers, "from_step": 0}]
        self._pending_widths: dict[int, int] = {}
        self._last_poll = 0.0
        nnodes = workers // max(self.nodes.nodes[0].nproc, 1)
        for node in self.nodes.nodes[1:]:  # the coordinator's own host is never lent
            self.client.register(HostRecord(
                name=node.name, job=job_id, priority=priority, endpoint=endpoint,
                rank=node.rank, role="train" if node.rank < nnodes else "spare",
                nproc=node.nproc))
            self.mine.append(node.name)
        log.info("job %s (priority %d) shares hosts %s in the pool at %s", job_id,
                 priority, ", ".join(self.mine) or "none", pool)

    # ------------------------------------------------------------- as borrower
    def borrow(self, need: int) -> list[BorrowedHost]:
        """Claim hosts of lower-priority jobs for ``need`` processes and add them to the
        node pool; the caller starts the processes there (its spares, not ready yet) and
        names the hosts in the failure's detail (:func:`runtime.loans.borrowed_note`).
        Fewer than ``need`` places, or none, when the pool has no host to lend."""
        got: list[BorrowedHost] = []
        placed = 0
        while placed < need:
            rank = len(self.nodes.nodes)
            self.store.set(P.node_job_key(rank), json.dumps(self.spec))
            try:
                rec = self.client.claim(job=self.job_id, priority=self.priority,
                                        endpoint=self.endpoint, rank=rank)
            except (RuntimeError, dist.DistStoreError) as exc:
                log.warning("cannot borrow: the pool at %s does not answer (%s)",
                            self.client.endpoint, exc)
                rec = None
            if rec is None:
                break
            self.nodes.adopt(rec.name, rank=rank, nproc=rec.nproc)
            self.borrowed.append(rec.name)
            count = borrow_count(need, placed, rec.nproc)
            placed += count
            got.append(BorrowedHost(host=rec.name, job=rec.job, priority=rec.priority,
                                    count=count))
            log.warning("no spare for %d process(es): %s", need, got[-1].describe())
        return got

    # ------------------------------------------------------------- as lender
    def poll(self, view: Callable[[], JobView], now: float) -> Iterator[LoanAction]:
        """Serve claims on this job's hosts, hosts coming back, and the widening after:
        yields each decision that concerns the job, for the caller to carry out before
        it asks for the next one (``view``: the job as it is then). A pool that does not
        answer is logged and left alone for a while: the job goes on (no new loan
        meanwhile; the width comes back with the host, which is told by its agent
        through the job's own store)."""
        if not poll_due(now, self._last_poll, POLL_INTERVAL_S):
            return
        self._last_poll = now
        try:
            yield from self._poll_pool(view)
        except (RuntimeError, dist.DistStoreError) as exc:
            log.warning("the pool at %s does not answer (%s): trying again in %.0f s",
                        self.client.endpoint, exc, POOL_RETRY_S)
            self._last_poll = now + POOL_RETRY_S
        for name in self.nodes.take_returned():
            self._returned(name)
        yield from self._widen(view)
        self._note_widths(view().gen)

    def _poll_pool(self, view: Callable[[], JobView]) -> Iterator[LoanAction]:
        lost = {n.name for n in self.nodes.nodes if n.lost is not None}
        for name in self.mine:
            got = self.client.get(name)
            if got is None:
                continue
            rec = got[1]
            if withdraw_lost_host(lost=name in lost, home_ended=rec.home_ended):
                # A lost host can lend nothing: off the pool (a claim on it is withdrawn).
                self.client.update(name, lambda r: dataclasses.replace(
                    r, home_ended=True, state="home", borrower=None)
                    if r.state != "lent" else None)
            elif rec.state == "lending" and name not in self.loans \
                    and rec.borrower is not None:
                yield from self._claim(view(), rec, rec.borrower)
        for name in list(self.borrowed):
            node = next(n for n in self.nodes.nodes if n.name == name and n.borrowed)
            got = self.client.get(name)
            borrower = got[1].borrower if got is not None else None
            fate = borrowed_host(joined=node.joined, lost=node.lost is not None,
                                 borrower_job=borrower.get("job") if borrower else None,
                                 job=self.job_id)
            if fate != Borrowed.WAITING:
                self.borrowed.remove(name)
            if fate == Borrowed.WITHDRAWN:
                self.nodes.lose_unjoined(node, f"node {name}: its owner withdrew the loan")

    def _claim(self, job: JobView, rec: HostRecord, borrower: dict[str, Any]
               ) -> Iterator[LoanAction]:
        node = next((n for n in self.nodes.nodes if n.name == rec.name), None)
        decision = decide_claim(
            job, host=rec.name, borrower=str(borrower["job"]),
            borrower_priority=int(borrower["priority"]), priority=self.priority,
            node_of={s: self.nodes.node_of(s) for s in (*job.members, *job.spares)},
            host_usable=node is not None and node.lost is None)
        if isinstance(decision, ClaimWait):
            return  # one membership change at a time: the claim waits for the next poll
        if isinstance(decision, ClaimWithdraw):
            log.warning("cannot lend %s to job %s (%s): claim withdrawn", rec.name,
                        borrower["job"], decision.why)
            self.client.update(rec.name, lambda r: dataclasses.replace(
                r, state="home", borrower=None) if r.state == "lending" else None)
            return
        if decision.gen is not None:
            self._pending_widths[decision.gen] = len(decision.stay)
            log.warning("generation %d: %s lent to job %s, members %s", decision.gen,
                        rec.name, borrower["job"], list(decision.stay))
        yield decision  # the caller shrinks the job, then calls lent()

    def lent(self, lend: Lend, *, failure_event_id: str | None, since: float) -> None:
        """``lend`` was carried out by the job (its failure ``failure_event_id`` opened
        at ``since``, and the narrower plan published, when members left): kill the
        processes lent away and send the host's agent to the borrower."""
        for s in (*lend.on, *lend.spares_on):
            self.nodes.kill(s)
        self.nodes.lend(lend.host, {"op": "lend", "slot": "", "pool": self.client.endpoint})
        self.loans[lend.host] = Loan(host=lend.host, borrower=lend.borrower,
                                     failure_event_id=failure_event_id, gpus=lend.gpus,
                                     since=since)

    def _returned(self, name: str) -> None:
        loan = self.loans.get(name)
        if loan is None:
            return
        log.warning("%s is back from job %s", name, loan.borrower)
        back = loan_returned(loan)
        if back is None:
            del self.loans[name]  # only spares were lent: the supervisor replenishes them
        else:
            self.loans[name] = back

    def _widen(self, view: Callable[[], JobView]) -> Iterator[LoanAction]:
        for name in list(self.loans):
            loan = self.loans[name]
            job = view()
            # The store is read only where the decision can turn on it.
            growing = loan.grow_gen is not None and job.gen >= loan.grow_gen
            asks = bool(loan.replacements) and loan.grow_gen is None and not job.busy
            step = widen(loan, job, room=self.nodes.has_room(),
                         alive={s: self.nodes.alive(s) for s in loan.replacements},
                         waiting={s: bool(self.store.check([P.waiting_key(s)]))
                                  for s in loan.replacements} if asks else {},
                         gen_ready=growing and bool(self.store.check([P.ready_key(job.gen)])),
                         now=time.monotonic())
            if isinstance(step, LoanIdle):
                continue
            if isinstance(step, Grow):
                self._pending_widths[step.gen] = len(step.members)
                self.loans[name] = dataclasses.replace(loan, grow_gen=step.gen)
                log.warning("generation %d: %s back, width %d -> %d, members %s", step.gen,
                            name, len(job.members), len(step.members), list(step.members))
            elif isinstance(step, CloseLoan):
                del self.loans[name]
            yield step

    def started(self, host: str, slots: Sequence[str]) -> None:
        """The replacements of ``host``'s loan (a :class:`StartReplacements`) started."""
        self.loans[host] = dataclasses.replace(self.loans[host], replacements=tuple(slots))

    def restarted(self, host: str, new: Mapping[str, str]) -> None:
        """Replacements of ``host``'s loan started in the place of dead ones (``new``:
        dead slot -> its replacement; a :class:`RestartDead`)."""
        loan = self.loans[host]
        self.loans[host] = dataclasses.replace(
            loan, replacements=tuple(new.get(s, s) for s in loan.replacements))

    def _note_widths(self, gen: int) -> None:
        ready = {g: int(json.loads(self.store.get(P.ready_key(g)))["step"])
                 for g in self._pending_widths if self.store.check([P.ready_key(g)])}
        entries, self._pending_widths = widths_seen(self._pending_widths, ready, gen)
        self.widths.extend(entries)

    def close(self, gen: int, now: float) -> list[CloseLoan]:
        """The job ends (at generation ``gen``): returns the outcome of every loan still
        open, for the caller to write, and tells the pool that this job's hosts have no
        job to come back to."""
        self._note_widths(gen)
        outcomes = close_loans(self.loans.values(), now)
        self.loans.clear()
        for name in self.mine:
            with contextlib.suppress(Exception):
                self.client.update(name, lambda r: dataclasses.replace(r, home_ended=True)
                                   if r.job == self.job_id else None)
        return outcomes
