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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from runtime import protocol as P
from runtime import records as R
from runtime.errors import ConfigError
from runtime.recovery import FailureClass, Incident, Outcome, Recovery

if TYPE_CHECKING:
    from runtime.nodepool import NodePool
    from runtime.supervisor import Supervisor

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
def lent_detail(*, host: str, borrower: str, borrower_priority: int, priority: int,
                width: int, narrower: int) -> str:
    """The ``detail`` of a lender's ``node_lent`` failure (class ``planned``)."""
    return (f"{host} lent to job {borrower} (priority {borrower_priority} > {priority}): "
            f"data-parallel width {width} -> {narrower} until it comes back")


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
@dataclass(kw_only=True, slots=True)
class Loan:
    """A host of this job lent to another: its failure, the GPUs lent, and once the
    host is back the processes that will widen the job again."""

    host: str
    borrower: str
    incident: Incident | None  # None: only spares were on it (the width did not change)
    gpus: int
    since: float  # when it was lent (the supervisor's time.monotonic())
    back: bool = False  # the host has come back
    replacements: list[str] = field(default_factory=list)
    grow_gen: int | None = None


class Loans:
    """A coordinator's side of the pool, as lender and as borrower (driven by the
    supervisor: :meth:`poll` in its loop, :meth:`borrow` in a recovery without spares,
    :meth:`close` at the end)."""

    def __init__(self, sup: Supervisor, *, pool: str, priority: int) -> None:
        self.sup = sup
        self.nodes: NodePool = sup.pool  # type: ignore[assignment]
        self.client = PoolClient(pool, timeout_s=POOL_TIMEOUT_S)
        self.priority = priority
        self.endpoint = f"{sup.cfg.host}:{sup.store.port}"
        self.loans: dict[str, Loan] = {}
        self.mine: list[str] = []
        self.borrowed: list[str] = []  # hosts claimed from other jobs, until they join
        #: The job's data-parallel width over time: {gen, width, from_step} (status.json).
        self.widths: list[dict[str, int]] = [{"gen": 0, "width": sup.cfg.workers,
                                               "from_step": 0}]
        self._pending_widths: dict[int, int] = {}
        self._last_poll = 0.0
        nnodes = sup.cfg.workers // max(self.nodes.nodes[0].nproc, 1)
        for node in self.nodes.nodes[1:]:  # the coordinator's own host is never lent
            self.client.register(HostRecord(
                name=node.name, job=sup.job_id, priority=priority, endpoint=self.endpoint,
                rank=node.rank, role="train" if node.rank < nnodes else "spare",
                nproc=node.nproc))
            self.mine.append(node.name)
        log.info("job %s (priority %d) shares hosts %s in the pool at %s", sup.job_id,
                 priority, ", ".join(self.mine) or "none", pool)

    # ------------------------------------------------------------- as borrower
    def borrow(self, need: int, inc: Incident) -> list[str]:
        """Claim hosts of lower-priority jobs for ``need`` processes and start them there
        (the borrower's spares, not ready yet); the incident's detail will name the
        hosts. Returns the new slots (fewer than ``need``, or none, if the pool has no
        host to lend)."""
        sup = self.sup
        slots: list[str] = []
        taken: list[str] = []
        while len(slots) < need:
            rank = len(self.nodes.nodes)
            spec = {"script": sup.cfg.script, "args": sup.cfg.args, "python": sup.cfg.python,
                    "job": sup.job_id}
            sup.store.set(P.node_job_key(rank), json.dumps(spec))
            try:
                rec = self.client.claim(job=sup.job_id, priority=self.priority,
                                        endpoint=self.endpoint, rank=rank)
            except (RuntimeError, dist.DistStoreError) as exc:
                log.warning("cannot borrow: the pool at %s does not answer (%s)",
                            self.client.endpoint, exc)
                rec = None
            if rec is None:
                break
            self.nodes.adopt(rec.name, rank=rank, nproc=rec.nproc)
            self.borrowed.append(rec.name)
            for _ in range(min(rec.nproc, need - len(slots))):
                slot = sup._spawn()
                sup.spares.append(slot)
                slots.append(slot)
            taken.append(f"{rec.name} borrowed from job {rec.job} (priority {rec.priority})")
            log.warning("no spare for %d process(es): %s", need, taken[-1])
        if taken:
            inc.note = f"; its ranks moved onto {', '.join(taken)}"
        return slots

    # ------------------------------------------------------------- as lender
    def poll(self) -> None:
        """Serve claims on this job's hosts, hosts coming back, and the widening after.
        A pool that does not answer is logged and left alone for a while: the job goes
        on (no new loan meanwhile; the width comes back with the host, which is told by
        its agent through the job's own store)."""
        now = time.monotonic()
        if now - self._last_poll < POLL_INTERVAL_S:
            return
        self._last_poll = now
        try:
            self._poll_pool()
        except (RuntimeError, dist.DistStoreError) as exc:
            log.warning("the pool at %s does not answer (%s): trying again in %.0f s",
                        self.client.endpoint, exc, POOL_RETRY_S)
            self._last_poll = now + POOL_RETRY_S
        for name in self.nodes.take_returned():
            self._returned(name)
        self._widen()
        self._note_widths()

    def _poll_pool(self) -> None:
        lost = {n.name for n in self.nodes.nodes if n.lost is not None}
        for name in self.mine:
            got = self.client.get(name)
            if got is None:
                continue
            if name in lost and not got[1].home_ended:
                # A lost host can lend nothing: off the pool (a claim on it is withdrawn).
                self.client.update(name, lambda r: dataclasses.replace(
                    r, home_ended=True, state="home", borrower=None)
                    if r.state != "lent" else None)
            elif got[1].state == "lending" and name not in self.loans:
                self._lend(got[1])
        for name in list(self.borrowed):
            node = next(n for n in self.nodes.nodes if n.name == name and n.borrowed)
            got = self.client.get(name)
            if node.joined or node.lost is not None:
                self.borrowed.remove(name)
            elif got is None or got[1].borrower is None \
                    or got[1].borrower.get("job") != self.sup.job_id:
                self.borrowed.remove(name)
                self.nodes.lose_unjoined(node, f"node {name}: its owner withdrew the loan")

    def _lend(self, rec: HostRecord) -> None:
        sup = self.sup
        if sup.recovery.active or sup.recovery.gen is not None or sup.moving:
            return  # one membership change at a time: the claim waits for the next poll
        assert rec.borrower is not None
        node = next((n for n in self.nodes.nodes if n.name == rec.name), None)
        on = [m for m in sup.members if self.nodes.node_of(m) == rec.name]
        stay = [m for m in sup.members if m not in on]
        if node is None or node.lost is not None or not stay:
            log.warning("cannot lend %s to job %s (%s): claim withdrawn", rec.name,
                        rec.borrower["job"], "no member would be left" if not stay
                        else "the host is lost")
            self.client.update(rec.name, lambda r: dataclasses.replace(
                r, state="home", borrower=None) if r.state == "lending" else None)
            return
        spares_on = [s for s in sup.spares if self.nodes.node_of(s) == rec.name]
        for s in spares_on:
            sup.spares.remove(s)
        sup.retired.update(on + spares_on)
        inc = None
        if on:
            width = len(sup.members)
            inc = sup._open_incident(
                FailureClass.PLANNED, CAUSE_LENT, on, sup.last_step,
                lent_detail(host=rec.name, borrower=str(rec.borrower["job"]),
                            borrower_priority=int(rec.borrower["priority"]),
                            priority=self.priority, width=width, narrower=len(stay)))
            gen = sup.gen + 1
            sup.recovery = Recovery(gen=gen)  # no incident: the shrink loses nothing
            self._pending_widths[gen] = len(stay)
            log.warning("generation %d: %s lent to job %s, members %s", gen, rec.name,
                        rec.borrower["job"], stay)
            sup._publish(P.Plan(gen=gen, mode=P.PlanMode.LIVE, members=stay))
            sup._advanced_at = None  # the step watchdog re-arms at the first step of gen
        for s in on + spares_on:
            self.nodes.kill(s)
        self.nodes.lend(rec.name, {"op": "lend", "slot": "", "pool": self.client.endpoint})
        self.loans[rec.name] = Loan(host=rec.name, borrower=rec.borrower["job"], incident=inc,
                                    gpus=len(on),
                                    since=inc.detected if inc else time.monotonic())

    def _returned(self, name: str) -> None:
        loan = self.loans.get(name)
        if loan is None:
            return
        log.warning("%s is back from job %s", name, loan.borrower)
        if loan.incident is None:
            del self.loans[name]  # only spares were lent: the supervisor replenishes them
            return
        loan.back = True

    def _widen(self) -> None:
        sup = self.sup
        for name, loan in list(self.loans.items()):
            if loan.back and not loan.replacements and self.nodes.has_room():
                # (Room: the exits of the processes lent away are reported first.)
                loan.replacements = [self.sup._spawn() for _ in range(loan.gpus)]
            if not loan.replacements:
                continue
            if loan.grow_gen is None:
                if sup.recovery.active or sup.recovery.gen is not None or sup.moving:
                    continue
                if any(not self.nodes.alive(s) for s in loan.replacements):
                    # One died before it was called in (no member: nothing was lost):
                    # start another in its place once there is room.
                    if self.nodes.has_room():
                        loan.replacements = [s if self.nodes.alive(s) else self.sup._spawn()
                                             for s in loan.replacements]
                    continue
                if not all(sup.store.check([P.waiting_key(s)]) for s in loan.replacements):
                    continue
                members = [*sup.members, *loan.replacements]
                gen = sup.gen + 1
                sup.recovery = Recovery(gen=gen)
                self._pending_widths[gen] = len(members)
                loan.grow_gen = gen
                log.warning("generation %d: %s back, width %d -> %d, members %s", gen, name,
                            len(sup.members), len(members), members)
                # A move plan: rank 0 sees it at its next step and the members switch at
                # that step's boundary (a lone member's collectives never wait, so it
                # would not notice a live plan until its end).
                sup._publish(P.Plan(gen=gen, mode=P.PlanMode.MOVE, members=members))
                sup._advanced_at = None  # (as for a recovery: re-armed when it steps)
            elif sup.gen >= loan.grow_gen and set(loan.replacements) <= set(sup.members) \
                    and sup.store.check([P.ready_key(sup.gen)]):
                # Measured by this supervisor alone, on its monotonic clock (as every
                # recovery_seconds): the first step at full width is seen now.
                self._close(loan, time.monotonic())
                del self.loans[name]

    def _close(self, loan: Loan, at: float) -> None:
        sup = self.sup
        if loan.incident is None:
            return
        sup._emit(loan_outcome(contract_id=sup.cfg.contract_id,
                               failure_event_id=loan.incident.event_id,
                               seconds=at - loan.since, step_seconds=sup.step_seconds,
                               gpus=loan.gpus))

    def _note_widths(self) -> None:
        for gen, width in list(self._pending_widths.items()):
            if self.sup.store.check([P.ready_key(gen)]):
                step = int(json.loads(self.sup.store.get(P.ready_key(gen)))["step"]) - 1
                self.widths.append({"gen": gen, "width": width, "from_step": step})
                del self._pending_widths[gen]
            elif self.sup.gen > gen:
                del self._pending_widths[gen]  # replaced before it ran a step

    def close(self) -> None:
        """The job ends: every loan still open gets its outcome (the lent host lost the
        job nothing but its GPUs for that time), and the pool learns that this job's
        hosts have no job to come back to."""
        self._note_widths()
        now = time.monotonic()
        for loan in self.loans.values():
            self._close(loan, now)
        self.loans.clear()
        for name in self.mine:
            with contextlib.suppress(Exception):
                self.client.update(name, lambda r: dataclasses.replace(r, home_ended=True)
                                   if r.job == self.sup.job_id else None)
