"""Membership and generations, worker side: following the generations the supervisor
publishes, building each generation's process groups, and waiting on collectives without
ever blocking inside them.

Why the waiting is done the way it is (measured on gloo/CPU): a survivor waiting on
another survivor can block until the group timeout when a third peer dies, and
``abort()`` does not release it. So no op is ever waited on with ``wait()``: a callback
sets an event, and while it is not set the worker checks the generation the supervisor
publishes. On a new generation the old group is abandoned (kept referenced, never
destroyed, because destroying it could join a thread stuck in the dead op) and a new
group is built on a fresh store prefix.

Before this process builds a newer generation's groups, it *aborts* those of the older
ones (:meth:`Membership.abort_older`): a collective of an abandoned generation must never
complete later. It did: a host frozen (or cut off) long enough to be fenced, then thawed,
completed its pending gloo allreduce with the survivors' abandoned one, which wrote the
stale sum into the survivors' gradients of a later step. gloo has no abort of a pending
op (``ProcessGroupGloo.abort()``/``shutdown()`` leave it pending; measured, torch 2.13),
so the connections of the generation's groups are shut down (``shutdown(2)`` on every
connected socket the group build opened; never a listening one, which gloo's loop takes
as fatal): a pending op then fails at once, here and at the peer that comes back. NCCL
groups are ``abort()``-ed. Besides, each generation reduces into buffers of its own
(:meth:`runtime.reduction.GradientReducer.renew`), so even a completion racing the abort
lands in a dead buffer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from runtime import exitguard
from runtime import protocol as P
from runtime.errors import CollectiveError, GenerationChanged

log = logging.getLogger("yoco.runtime.membership")


class GenerationWatch:
    """Follows the generation counter the supervisor publishes without polling the
    store: a thread with a connection of its own blocks in a store wait for the next
    generation's plan key, which the supervisor writes just before ``gen``.

    Why: every worker and spare checks for a new generation every 2 ms while it waits for
    a collective or a transfer; as store round trips those checks took CPU from the
    transfers themselves on a small machine. Now a check is an attribute read.
    ``ok`` turns False if the connection fails; callers then poll the store again.
    """

    def __init__(self, host: str, port: int) -> None:
        self.latest = -1
        self.ok = True
        self._cond = threading.Condition()
        self._addr = (host, port)
        threading.Thread(target=self._run, name="yoco-gen", daemon=True).start()

    def _run(self) -> None:
        try:
            store = dist.TCPStore(self._addr[0], self._addr[1], is_master=False,
                                  timeout=timedelta(seconds=60))
            nxt = 0
            while True:
                try:
                    store.wait([P.plan_key(nxt)], timedelta(hours=1))
                except dist.DistStoreError:
                    continue  # the wait timed out: wait again
                latest = nxt
                if store.check([P.KEY_GEN]):
                    latest = max(latest, int(store.get(P.KEY_GEN)))
                with self._cond:
                    self.latest = latest
                    self._cond.notify_all()
                nxt = latest + 1
        except Exception as exc:  # the store is gone or broken: fall back to polling
            log.warning("generation watch stopped (%s); polling the store instead", exc)
            with self._cond:
                self.ok = False
                self._cond.notify_all()

    def wait_beyond(self, gen: int, timeout: float) -> None:
        """Block until a generation newer than ``gen`` is known, or ``timeout`` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self.latest > gen or not self.ok, timeout)


class _Reporter:
    """The thread that writes rank 0's report of each commit (:meth:`Membership.report_commit`):
    the fence check, then the local write, then the store's; one report at a time."""

    def __init__(self, m: Membership) -> None:
        self._m = m
        host, port = m.store_addr
        # Its own connection: a store client serves one request at a time, and the
        # training thread's requests (the RNG states, a fault report) must not queue
        # behind this thread's round trip.
        self._store = dist.TCPStore(host, port, is_master=False,
                                    timeout=timedelta(seconds=60))
        self._cond = threading.Condition()
        self._pending: tuple[Callable[[], None], str, str] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="yoco-report", daemon=True).start()

    def submit(self, local: Callable[[], None], key: str, value: str) -> None:
        """Queue one report (the caller has flushed the previous one)."""
        with self._cond:
            self._pending = (local, key, value)
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until no report is pending; raise the error writing the last one raised."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None)
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                item = self._pending
            if item is None:
                continue
            local, key, value = item
            try:
                self._m.exit_if_fenced(self._store)  # exits the process when fenced
                local()
                self._store.set(key, value)
            except BaseException as exc:  # raised again on the training thread
                error: BaseException | None = exc
            else:
                error = None
            with self._cond:
                self._error = error
                self._pending = None
                self._cond.notify_all()


class Timeline:
    """A worker's recovery timeline for the benchmarks (``YOCO_TIMELINE``): one JSON line
    per event (wall clock, event name, generation, step), appended to ``DIR/SLOT.jsonl``.
    Disabled (every call a no-op) when the variable is unset, as in production."""

    def __init__(self, slot: str) -> None:
        directory = os.environ.get(P.ENV_TIMELINE)
        self.path = os.path.join(directory, f"{slot}.jsonl") if directory else None

    def __call__(self, ev: str, gen: int, step: int, t: float | None = None) -> None:
        """Record event ``ev`` (at ``t``, default now)."""
        if self.path is None:
            return
        line = json.dumps({"t": time.time() if t is None else t, "ev": ev, "gen": gen,
                           "step": step})
        with open(self.path, "a") as fh:
            fh.write(line + "\n")


def open_sockets() -> dict[int, str]:
    """This process's open sockets: file descriptor -> ``socket:[INODE]`` (Linux /proc)."""
    out: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if link.startswith("socket:"):
                    out[int(name)] = link
    return out


def shut_down(sockets: dict[int, str]) -> int:
    """Shut down (both directions) each connected socket of ``sockets`` still open under
    the same descriptor (the inode is compared: a closed and reused descriptor is left
    alone); listening sockets are skipped. Return how many were shut down. The
    descriptors stay open: whoever owns them sees their peers gone, nothing more."""
    done = 0
    for fd, link in sockets.items():
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != link:
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass  # not connected (any more)
        finally:
            sock.close()
    return done


class _PendingWork:
    """A collective whose completion callback has not run yet (see Membership.wait)."""

    __slots__ = ()


class Membership:
    """This process's view of the job's membership: the store, the generation it is a
    member of, and that generation's process groups.

    ``pg`` reduces gradients (NCCL on CUDA, else gloo); ``cpu_pg`` is the gloo group for
    control and CPU tensors (the same object on CPU).
    """

    def __init__(self, *, slot: str, store_addr: tuple[str, int], use_nccl: bool,
                 poll_interval_s: float, regroup_timeout_s: float,
                 collective_timeout_s: float, current_step: Callable[[], int]) -> None:
        host, port = store_addr
        exitguard.install()
        self.slot = slot
        self._current_step = current_step  # for fault reports
        self.store_addr = store_addr
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        self.watch = GenerationWatch(host, port)
        self.use_nccl = use_nccl
        self.poll_interval_s = poll_interval_s
        self.regroup_timeout_s = regroup_timeout_s
        self.collective_timeout_s = collective_timeout_s
        self.gen = -1
        self._move_gen = -1  # a published generation known to be a pending move
        self._last_beat = 0.0
        self.pg: Any = None
        self.cpu_pg: Any = None
        # This generation's subgroups (form_groups): ``sub`` for the tensors of the device
        # (NCCL on CUDA, else gloo), ``sub_cpu`` gloo for control (the same objects on CPU).
        self.sub: dict[str, Any] = {}
        self.sub_cpu: dict[str, Any] = {}
        self._timeline = Timeline(slot)
        self._graveyard: list[Any] = []  # abandoned groups: never destroyed on purpose
        # What each generation's group builds opened (sockets) and made (groups): aborted
        # before a newer generation's groups are built (abort_older).
        self._gen_sockets: dict[int, dict[int, str]] = {}
        self._gen_groups: dict[int, list[Any]] = {}
        self._reporter: _Reporter | None = None  # rank 0's, from its first commit

    def event(self, ev: str, t: float | None = None) -> None:
        """Stamp ``ev`` (at ``t``, default now) on this worker's benchmark timeline (see
        :class:`Timeline`)."""
        self._timeline(ev, self.gen, self._current_step(), t)

    # ----------------------------------------------------------------- heartbeat
    def beat(self, waiting_since: float) -> None:
        """Write the heartbeat if this process has waited longer than the beat interval
        (and has not beaten within it): see :func:`runtime.protocol.beat_key`."""
        now = time.monotonic()
        if now - waiting_since < P.BEAT_INTERVAL_S or now - self._last_beat < P.BEAT_INTERVAL_S:
            return
        self._last_beat = now
        self.store.set(P.beat_key(self.slot), f"{self.gen} {self._current_step()} {time.time()}")

    # ----------------------------------------------------------------- generations
    def latest_gen(self) -> int:
        """The newest generation the supervisor has published (-1: none yet)."""
        if self.watch.ok:
            return self.watch.latest  # no store round trip: polled every 2 ms
        return int(self.store.get(P.KEY_GEN)) if self.store.check([P.KEY_GEN]) else -1

    def plan(self, gen: int) -> P.Plan:
        """Generation ``gen``'s plan."""
        return P.Plan.decode(self.store.get(P.plan_key(gen)))

    def check_generation(self) -> None:
        """Raise :class:`GenerationChanged` if a newer generation than ours that is not a
        pending move (a move waits for the step boundary) has been published."""
        latest = self.latest_gen()
        if latest <= self.gen or latest == self._move_gen:
            return
        if latest == self.gen + 1 and self.plan(latest).mode == P.PlanMode.MOVE:
            # A move waits for the step boundary; the flag is already raised. Noted, so
            # that the checks on every collective do not read the plan again.
            self._move_gen = latest
            return
        raise GenerationChanged(latest)

    def await_gen(self, min_gen: int) -> int:
        """Block until generation ``min_gen`` (or newer) exists; exit if shut down."""
        last_shutdown_check = 0.0
        while True:
            latest = self.latest_gen()
            if latest >= min_gen:
                return latest
            now = time.monotonic()
            if now - last_shutdown_check > 0.05:
                last_shutdown_check = now
                if self.store.check([P.KEY_SHUTDOWN]):
                    sys.exit(0)
            if self.watch.ok:
                self.watch.wait_beyond(min_gen - 1, 0.05)
            else:
                time.sleep(0.005)

    # ----------------------------------------------------------------- groups
    def form_groups(self, gen: int, rank: int, size: int, prefix: str = "pg",
                    subgroups: tuple[tuple[str, str, int, int], ...] = (),
                    meanwhile: Callable[[], None] | None = None) -> None:
        """Build this generation's group(s) on a fresh prefix, watching for a newer gen.

        ``subgroups``: further groups ``(key, name, rank, size)`` among some of the
        members (HSDP: this rank's replicate and shard groups), each on the prefix
        ``g{gen}/{name}/``: a gloo group there, in ``sub_cpu[key]``, and ``sub[key]`` for
        the device's tensors -- on CUDA an NCCL group on ``g{gen}/{name}/nccl/`` (FSDP2's
        collectives and the gradient reduction), else the gloo group itself.
        ``meanwhile`` runs on this thread while the groups rendezvous (on their own
        threads, waiting in C++)."""
        self.abort_older(gen)
        before = open_sockets()
        try:
            self._form_groups(gen, rank, size, prefix, subgroups, meanwhile)
        finally:
            # Whatever the build opened belongs to this generation (a build left running
            # by a GenerationChanged opens its sockets later: they count in the next
            # generation's, and are shut down with them).
            opened = {fd: link for fd, link in open_sockets().items()
                      if before.get(fd) != link}
            self._gen_sockets.setdefault(gen, {}).update(opened)

    def abort_older(self, gen: int) -> None:
        """Abort the groups of every generation older than ``gen`` (see the module
        docstring): their pending collectives fail now instead of completing later, with
        a fenced peer that comes back. Called before ``gen``'s groups are built, so
        before ``gen`` runs anything."""
        for old in [g for g in self._gen_sockets if g < gen]:
            n = shut_down(self._gen_sockets.pop(old))
            log.info("%s: generation %d's groups aborted (%d connection(s) shut down)",
                     self.slot, old, n)
        for old in [g for g in self._gen_groups if g < gen]:
            for pg in self._gen_groups.pop(old):
                if self.use_nccl and isinstance(pg, dist.ProcessGroupNCCL):
                    with contextlib.suppress(Exception):  # already broken: nothing to do
                        pg.abort()

    def _form_groups(self, gen: int, rank: int, size: int, prefix: str,
                     subgroups: tuple[tuple[str, str, int, int], ...],
                     meanwhile: Callable[[], None] | None) -> None:
        result: dict[str, Any] = {}
        stores: list[Any] = []
        timeout = timedelta(seconds=self.collective_timeout_s)
        host, port = self.store_addr

        def world(store: Any) -> Any:
            base = dist.PrefixStore(P.group_prefix(gen, prefix), store)
            gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", base), rank, size, timeout)
            if self.use_nccl:
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                result["main"] = dist.ProcessGroupNCCL(
                    dist.PrefixStore("nccl/", base), rank, size, opts)
            else:
                result["main"] = gloo
            return gloo

        def sub(key: str, name: str, sub_rank: int, sub_size: int) -> Callable[[Any], Any]:
            def make(store: Any) -> Any:
                base = dist.PrefixStore(P.group_prefix(gen, name), store)
                gloo = dist.ProcessGroupGloo(base, sub_rank, sub_size, timeout)
                if self.use_nccl:
                    opts = dist.ProcessGroupNCCL.Options()
                    opts._timeout = timeout
                    result["cpu/" + key] = gloo
                    return dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", base), sub_rank,
                                                 sub_size, opts)
                return gloo
            return make

        def build(key: str, make: Callable[[Any], Any]) -> None:
            try:
                # A connection of its own: a TCPStore client runs one request at a time,
                # and the rendezvous blocks in a store wait until every peer has written
                # its address (up to the collective timeout). On the shared client a peer
                # that died before writing it froze this process's generation polling
                # behind that wait: the job hung after a kill-all with a spare called in.
                store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
                stores.append(store)
                result[key] = make(store)
            except Exception as exc:  # reported below as a collective failure
                result.setdefault("error", exc)

        # Every group on a thread of its own, so that they rendezvous at the same time:
        # built one after another, HSDP's three groups (world, replicate, shard) took
        # three rendezvous round trips of the slowest member each.
        jobs: list[tuple[str, Callable[[Any], Any]]] = [("cpu", world)]
        jobs += [("sub/" + key, sub(key, name, r, n)) for key, name, r, n in subgroups]
        threads = [threading.Thread(target=build, args=job, name="yoco-pg", daemon=True)
                   for job in jobs]
        for thread in threads:
            thread.start()
        if meanwhile is not None:
            meanwhile()
        deadline = time.monotonic() + self.regroup_timeout_s
        self.gen = gen  # so that check_generation compares against the new generation
        since = time.monotonic()
        while any(t.is_alive() for t in threads) and "error" not in result:
            next(t for t in threads if t.is_alive()).join(self.poll_interval_s * 2)
            self.beat(since)
            latest = self.latest_gen()
            if latest > gen:
                raise GenerationChanged(latest)
            if time.monotonic() > deadline:
                self.collective_failed(P.Phase.REGROUP,
                                       CollectiveError("process group timeout"))
        if "error" in result:
            self.collective_failed(P.Phase.REGROUP, result["error"])
        if self.pg is not None:
            self._graveyard.extend([self.pg, self.cpu_pg])
        self._graveyard.extend(stores)  # the groups' rendezvous connections
        self.pg, self.cpu_pg = result["main"], result["cpu"]
        self._gen_groups.setdefault(gen, []).extend(
            v for k, v in result.items() if k != "error")
        if subgroups:
            self._graveyard.extend([*self.sub.values(), *self.sub_cpu.values()])
            self.sub = {k[4:]: v for k, v in result.items() if k.startswith("sub/")}
            self.sub_cpu = {k: result.get("cpu/" + k, v) for k, v in self.sub.items()}

    # ----------------------------------------------------------------- waiting
    def wait(self, work: Any, *, phase: P.Phase) -> None:
        """Wait for ``work`` without ever blocking inside it; raise GenerationChanged
        as soon as a newer non-move generation is published."""
        # Fast path: a collective that has already completed (FSDP2 prefetches its
        # all-gathers, so most are done when waited for) needs no callback, no event and
        # no generation check: wait() returns at once (or raises its error). HSDP issues
        # tens of collectives a step, and the slow path's machinery (a callback, an event,
        # the checks) cost each of them noticeably on a busy machine (docs/benchmarks-
        # runtime.md, "Figures behind the code"). (gloo p2p works report is_completed()
        # only after wait().)
        try:
            finished = bool(work.is_completed())
        except Exception:  # a work type without it: take the slow path
            finished = False
        if finished:
            try:
                work.wait()
            except Exception as exc:  # gloo raises RuntimeError subclasses; any is a fault
                self.collective_failed(phase, exc)
            return
        done = threading.Event()
        error: list[BaseException] = []
        threaded = False
        # Until its callback has run, a collective is pending in a thread of the process
        # group; if this generation is abandoned it may complete (with an error) only
        # when a peer exits, maybe while this interpreter finalizes: the exit guard
        # (runtime.exitguard) counts it until then.
        token = _PendingWork()

        def completed(_f: Any) -> None:
            done.set()
            exitguard.untrack(token)

        try:
            exitguard.track(token)
            work.get_future().add_done_callback(completed)
        except RuntimeError:
            exitguard.untrack(token)
            threaded = True
            # gloo send/recv have no future and report is_completed() only after wait():
            # block in wait() on a helper thread (it releases the GIL) and watch it.
            # A wait of an abandoned generation can stay blocked for good: the exit guard
            # (runtime.exitguard) keeps such a thread from aborting the process at exit.
            def blocker() -> None:
                try:
                    work.wait()
                except Exception as exc:  # surfaced below as a collective failure
                    error.append(exc)
                finally:
                    exitguard.untrack(threading.current_thread())
                done.set()

            helper = threading.Thread(target=blocker, name="yoco-wait", daemon=True)
            exitguard.track(helper)
            helper.start()
        since = time.monotonic()
        while not done.wait(self.poll_interval_s):
            self.check_generation()
            self.beat(since)
        try:
            if error:
                raise error[0]
            if not threaded:  # a second wait() on a gloo p2p work can block forever
                work.wait()
        except Exception as exc:  # gloo raises RuntimeError subclasses; any is a fault
            self.collective_failed(phase, exc)

    def wait_event(self, event: threading.Event) -> None:
        """Wait for ``event``, raising GenerationChanged if the membership changes."""
        since = time.monotonic()
        while not event.wait(self.poll_interval_s):
            self.check_generation()
            self.beat(since)

    def collective_failed(self, phase: P.Phase, exc: BaseException) -> None:
        """Report the failure to the supervisor and wait for the next generation."""
        self.exit_if_fenced()  # a fenced process's report would be about a dead generation
        report = P.FaultReport(gen=self.gen, step=self._current_step(), phase=phase,
                               error=str(exc)[:500])
        self.store.set(P.fault_key(self.slot), report.encode())
        self.store.add(P.KEY_FAULTS, 1)
        since = time.monotonic()
        while True:
            latest = self.latest_gen()
            if latest > self.gen:
                raise GenerationChanged(latest)
            self.beat(since)  # alive, waiting: not the rank to fence
            time.sleep(self.poll_interval_s * 5)

    def await_finished(self, members: list[str], timeout_s: float) -> list[str]:
        """Wait until every one of ``members`` has marked its training loop finished
        (:func:`runtime.protocol.finished_key`); return those that have not.

        The end-of-job barrier, through the store and not through gloo: a member that
        exits tears down its sockets, and a peer still inside its last step's collective
        then fails with gloo's "Connection closed by peer" (the job was called failed
        although every step had been committed). Once every member has marked finished,
        none has a collective in flight and leaving is safe. The wait is bounded: it ends
        when a peer is gone (the supervisor saw it die after the last commit:
        :func:`runtime.protocol.gone_key`), when a newer (non-move) generation is
        published, when the job is shut down, or after ``timeout_s``. It beats
        while it waits, so the hang watchdog blames a stuck peer, not this one.
        """
        pending = [s for s in members if s != self.slot]
        since = time.monotonic()
        while True:
            if pending and self.store.check([P.finished_key(s) for s in pending]):
                return []
            # One store request while everyone is finishing; the per-slot look (which
            # ones are still missing, or gone: died after the end) only when not.
            pending = [s for s in pending if not self.store.check([P.finished_key(s)])
                       and not self.store.check([P.gone_key(s)])]
            if not pending or time.monotonic() - since > timeout_s \
                    or self.store.check([P.KEY_SHUTDOWN]):
                return pending
            try:
                self.check_generation()
            except GenerationChanged:
                return pending
            self.beat(since)
            time.sleep(0.02)

    def mark(self, key: str, value: str, *, checked: bool = False) -> None:
        """Set ``key`` in the supervisor's store -- unless this process is fenced: then
        it exits (:meth:`exit_if_fenced`; ``checked``: the caller just checked). After the
        step's report (:meth:`report_commit`), if one is pending: the store sees this
        process's writes in the order it made them."""
        self.flush_report()
        if not checked:
            self.exit_if_fenced()
        self.store.set(key, value)

    def note_committed(self, step: int) -> None:
        """Rank 0, right after each update: ``g{gen}/committed`` = ``step`` (see
        :func:`runtime.protocol.committed_key`), on this thread, before the step's report.

        Why here and unchecked: the report (:meth:`report_commit`) reaches the store a
        little later, on its own thread; were every member killed in between, the
        rollback's lost steps would miss this step, which the update has taken. A store
        ``set`` is one message with no reply (no round trip: a few microseconds), and this
        key is the process's own generation's: a fenced process writing it (frozen in
        those microseconds, thawed later) writes the step it truly committed into a key
        no later generation uses, never into a live one's."""
        self.store.set(P.committed_key(self.gen), str(step))

    def report_commit(self, local: Callable[[], None], key: str, value: str) -> None:
        """What rank 0 writes after each commit -- ``local()`` (the committed-step file),
        then ``key`` = ``value`` in the store (the progress) -- once this process is
        known not to be fenced, as :meth:`mark` does, but on a reporting thread with a
        store connection of its own: the training thread does not wait for the fence
        check's round trip, which a store on a busy machine answers late
        (docs/benchmarks-runtime.md, "Figures behind the code").

        At most one report is pending: this first waits for the previous one, so the
        progress the store holds is never more than the step being reported behind, as
        before. A fenced process exits from the reporting thread before writing anything;
        a report that failed (the store gone) raises here, or in :meth:`flush_report`,
        as the write itself would have."""
        self.flush_report()
        if self._reporter is None:
            self._reporter = _Reporter(self)
        self._reporter.submit(local, key, value)

    def flush_report(self) -> None:
        """Wait until the pending report (:meth:`report_commit`) is written; raise what
        writing it raised."""
        if self._reporter is not None:
            self._reporter.flush()

    def fenced(self, store: Any = None) -> dict[str, Any] | None:
        """The coordinator's fence of this process ({gen, cause, detail}), or None (read
        through ``store``, default this process's connection).

        One store round trip. Fencing is published before any generation that excludes
        this process, so a process that was frozen or cut off when it was fenced finds it
        as soon as it runs (or reaches the store) again; a store that does not answer
        raises here, so nothing is written meanwhile."""
        store = self.store if store is None else store
        key = P.fenced_key(self.slot)
        if not store.check([key]):
            return None
        return dict(json.loads(store.get(key)))

    def exit_if_fenced(self, store: Any = None) -> None:
        """Exit :data:`runtime.protocol.EXIT_FENCED`, writing nothing, if the coordinator
        has fenced this process (a rank of an abandoned generation must never write into
        the live one's store keys, checkpoints or records)."""
        fence = self.fenced(store)
        if fence is None:
            return
        msg = (f"{self.slot} was fenced by the coordinator ({fence.get('cause')}: "
               f"{fence.get('detail')}); it is no longer part of the job: exiting "
               f"{P.EXIT_FENCED} without writing anything")
        log.error("%s", msg)
        print(f"yoco: {msg}", file=sys.stderr, flush=True)
        os._exit(P.EXIT_FENCED)
