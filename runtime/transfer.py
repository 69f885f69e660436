"""State transfer: the commit vote and the point-to-point copy of the full training state
from the replicas that hold the highest committed step to the members that lack it.

Small tensors are packed into one buffer; large ones travel one op each, straight from
the sender's live tensors into the receiver's live parameters or into optimizer-state
buffers a waiting process allocated (pre-faulted) before it was called in. The sender
sends the packed buffer, then the model, then the optimizer state; the receiver installs
everything but the optimizer state as soon as the model is in and runs its first step's
forward/backward while the optimizer state is still arriving (:class:`Inflight`).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from runtime import protocol as P
from runtime.errors import CollectiveError
from runtime.membership import Membership
from runtime.state import (
    SMALL_TENSOR_BYTES,
    join_state,
    nbytes,
    pack,
    partition,
    refs,
    split_state,
    unpack,
)

# Optimizers whose state is K tensors shaped like each parameter (guessing wrong only
# costs memory: unmatched state gets a buffer when it arrives).
_TWO_BUFFERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.Adamax, torch.optim.Adadelta)
_ONE_BUFFER: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adagrad, torch.optim.RMSprop, torch.optim.ASGD, torch.optim.Rprop)


def state_buffers_per_param(optimizer: torch.optim.Optimizer) -> int:
    """How many parameter-shaped state tensors ``optimizer`` keeps per parameter."""
    if isinstance(optimizer, _TWO_BUFFERS):
        return 2
    if isinstance(optimizer, _ONE_BUFFER) or optimizer.defaults.get("momentum"):
        return 1
    return 0


class Inflight:
    """The p2p ops of a state transfer still in flight, waited for on one helper thread
    (gloo p2p works have no future; each may be waited for only once), and what to do
    once they are all complete. ``t_done``: when the last one completed."""

    def __init__(self, works: list[Any], finish: Callable[[], None] | None) -> None:
        self.finish = finish
        self.done = threading.Event()
        self.error: list[BaseException] = []
        self.t_done = 0.0

        def run() -> None:
            try:
                for w in works:
                    w.wait()
            except Exception as exc:  # surfaced by complete() as a collective failure
                self.error.append(exc)
            self.t_done = time.time()
            self.done.set()

        threading.Thread(target=run, name="yoco-transfer", daemon=True).start()


def _assignment(plan: P.Plan, holds: list[int]) -> tuple[list[int], dict[int, int]]:
    """Who sends to whom, from each participant's vote (its committed step + 1, 0: none):
    the participants that hold the highest committed step which stay members (a donor
    only if it is the only holder), and each member lacking it -> the holder it receives
    from (HSDP: a holder of its own shard: member p holds shard p % shards). Raises
    :class:`CollectiveError` when no one holds the state or a shard of it."""
    committed = max(holds) - 1
    if committed < 0:
        raise CollectiveError("no participant holds the state")
    sources = [r for r, h in enumerate(holds) if h - 1 == committed]
    # Donors only send: receivers are the members that lack the committed state.
    receivers = [r for r in range(len(plan.members)) if r not in sources]
    # Prefer staying members as sources; a donor only sends if it is the only one.
    staying = [s for s in sources if s < len(plan.members)] or sources
    assign: dict[int, int] = {}
    for i, r in enumerate(receivers):
        same = [s for s in staying if s % plan.shards == r % plan.shards]
        if not same:
            raise CollectiveError(f"no participant holds shard {r % plan.shards} at step "
                                  f"{committed}")
        assign[r] = same[i % len(same)]
    return staying, assign


class _Prepared:
    """What a sender sends, built once (:meth:`StateTransfer.speculate`)."""

    def __init__(self, gen: int) -> None:
        self.gen = gen
        self.error: BaseException | None = None
        self.published = False  # its skeleton is in the store already
        self.skeleton = b""
        self.tensors: list[torch.Tensor] = []
        self.small: list[int] = []
        self.large: list[int] = []
        self.packed = torch.zeros(0, dtype=torch.uint8)

    def build(self, state_dict: Callable[[], dict[str, Any]]) -> None:
        """Split the state, pickle its skeleton, pack its small tensors."""
        try:
            skel, self.tensors = split_state(state_dict())
            self.skeleton = pickle.dumps(skel)
            self.small, self.large = partition(self.tensors)
            self.packed = pack([self.tensors[i] for i in self.small])
        except Exception as exc:  # built again, and raised, by the sync that needs it
            self.error = exc


class _Destination:
    """The receiving side of a transfer from participant ``src`` in generation ``gen``,
    laid out from the sender's skeleton (:meth:`StateTransfer._layout`)."""

    def __init__(self, gen: int, src: int, skel: Any) -> None:
        self.gen = gen
        self.src = src
        self.skel = skel
        self.refs = refs(skel)
        self.dest: list[torch.Tensor] = []
        self.live: set[int] = set()  # indices received straight into live model tensors
        self.small: list[Any] = []
        self.packed = torch.zeros(0, dtype=torch.uint8)
        self.in_place = False


class StateTransfer:
    """Sends and receives one replica's full state (see the module docstring)."""

    def __init__(self, *, membership: Membership, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, device: torch.device,
                 state_dict: Callable[[], dict[str, Any]],
                 load_state_dict: Callable[..., None],
                 buffers_per_param: int | None,
                 load_optimizer: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.m = membership
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._buffers_per_param = buffers_per_param
        self._load_optimizer = load_optimizer or optimizer.load_state_dict
        # Pre-faulted receive buffers for the optimizer state, by (shape, dtype, device).
        self._spare_bufs: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        # The tail of a state transfer still in flight when the first step's body runs.
        # Completed before the optimizer step.
        self.inflight: Inflight | None = None
        self.incomplete = False  # a receive began and its state is not all in
        self._spec: _Prepared | None = None  # built ahead by speculate()
        self._rspec: _Destination | None = None  # laid out ahead by speculate()

    # ----------------------------------------------------------------- buffers
    def preallocate(self) -> None:
        """While waiting (a spare, or a member before the start sync), allocate zeroed
        (so pre-faulted: receiving into fresh pages costs about as much as the copy)
        buffers for the optimizer state a transfer will bring, so a recovery does not
        pay for the allocation. Freed after the first sync if unused."""
        k = self._buffers_per_param
        if k is None:
            k = state_buffers_per_param(self.optimizer)
        for p in self.model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p  # HSDP: this rank's shard
            key = (tuple(local.shape), local.dtype, local.device)
            self._spare_bufs.setdefault(key, []).extend(
                torch.zeros(local.shape, dtype=local.dtype, device=local.device)
                for _ in range(k))

    def release_buffers(self) -> None:
        """Free whatever pre-allocated buffer the transfer did not use."""
        self._spare_bufs.clear()

    def _take_buffer(self, shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device | str) -> torch.Tensor:
        pool = self._spare_bufs.get((tuple(shape), dtype, torch.device(device)))
        if pool:
            return pool.pop()
        # zeros, not empty: pre-faulted pages halve the receive time.
        return torch.zeros(shape, dtype=dtype, device=device)

    # ----------------------------------------------------------------- sync
    def sync(self, plan: P.Plan, *, has_state: bool, step: int) -> int:
        """Run the commit vote among ``plan``'s participants and copy the highest
        committed state to every member that lacks it; return the bytes moved."""
        participants = plan.members + plan.donors
        me = participants.index(self.m.slot)
        # Who holds which committed step: survivors can be one step apart when a peer
        # died inside an allreduce some of them had already completed.
        holds = torch.zeros(len(participants), dtype=torch.float64)
        holds[me] = float(step + 1) if has_state and not self.incomplete else 0.0
        if plan.mode == P.PlanMode.START:
            holds[me] = 1.0 if me < plan.shards else 0.0  # replica group 0 (HSDP: each shard)
        self.m.wait(self.m.cpu_pg.allreduce([holds]), phase=P.Phase.SYNC)
        self.m.event("vote")
        try:
            staying, assign = _assignment(plan, [int(h) for h in holds.tolist()])
        except CollectiveError as exc:
            self.m.collective_failed(P.Phase.SYNC, exc)
        if me in staying:
            mine = [r for r, s in assign.items() if s == me]
            return self._send(plan.gen, me, mine) if mine else 0
        if me in assign:
            return self._recv(plan.gen, assign[me])
        return 0

    def speculate(self, plan: P.Plan, *, previous: list[str],
                  has_state: bool) -> Callable[[], None] | None:
        """If this process will most likely send in ``plan``'s generation (the commit
        vote as it comes out when every member of the ``previous`` generation holds the
        same step, and this one is then a source for a newcomer), return a function that
        builds what it sends -- the state's skeleton, pickled, its tensors and the packed
        small ones -- for :meth:`sync` to use; the caller runs it while the groups form
        (:meth:`Membership.form_groups`'s ``meanwhile``). None: nothing to build.

        Why: built after the vote it sat on the recovery's critical path and took
        several times its own work there (the other members start their first step's
        compute right after the vote and take the CPU; docs/benchmarks-runtime.md,
        "Figures behind the code"), while during the regroup
        this process only waits on the rendezvous (its group threads wait in C++). The
        state cannot change in between: nothing trains or loads between the plan and the
        send (a receiver never sends in the same sync); a prediction that does not come
        true is dropped unused."""
        self._spec = None
        self._rspec = None
        if plan.mode != P.PlanMode.LIVE:
            return None
        participants = plan.members + plan.donors
        me = participants.index(self.m.slot)

        def no_skeleton() -> None:
            # Said at once: every participant guesses alike (from the previous plan), but
            # a member of a generation that never formed holds no state although the
            # guess counts it as a source; a newcomer told nothing waited for its
            # skeleton until the regroup timed out (two minutes; two workers killed in
            # one step, the second seen after the first recovery was planned).
            self.m.store.set(P.no_skeleton_key(plan.gen, me), "1")

        guess = [1 if s in previous else 0 for s in participants]
        try:
            staying, assign = _assignment(plan, guess)
        except CollectiveError:
            no_skeleton()
            return None
        if me in assign and not has_state:
            no_skeleton()
            return lambda: self._lay_out_ahead(plan.gen, assign[me])
        if not has_state or self.incomplete or me not in staying \
                or me not in assign.values():
            no_skeleton()
            return None
        spec = _Prepared(plan.gen)

        def build() -> None:
            spec.build(self._state_dict)
            if spec.error is None:
                spec.published = True
                # Published now: a receiver lays out its buffers while the groups form.
                # The key is the one the send would set, to the same bytes (the state
                # cannot change before it); if the vote does not make this process a
                # source, no receiver is told to read it.
                self.m.store.set(P.skeleton_key(plan.gen, me),
                                 spec.skeleton)  # type: ignore[arg-type]
            else:
                no_skeleton()
            self._spec = spec

        return build

    def _lay_out_ahead(self, gen: int, src: int) -> None:
        """A likely receiver, while its groups form: wait (a bounded time, watching the
        generation) for the likely sender's skeleton and lay out where each tensor will
        land (:meth:`_layout`), so that after the vote it only posts the receives."""
        key, none = P.skeleton_key(gen, src), P.no_skeleton_key(gen, src)
        since = time.monotonic()
        while not self.m.store.check([key]):
            if self.m.store.check([none]) or self.m.latest_gen() > gen \
                    or time.monotonic() - since > self.m.regroup_timeout_s:
                return  # laid out after the vote instead
            self.m.beat(since)
            time.sleep(self.m.poll_interval_s)
        skel = pickle.loads(self.m.store.get(key))  # noqa: S301 - our own skeleton, our store
        self._rspec = self._layout(gen, src, skel)

    def _prepared(self, gen: int) -> _Prepared:
        spec = self._spec
        self._spec = None
        if spec is None or spec.gen != gen or spec.error is not None:
            spec = _Prepared(gen)
            spec.build(self._state_dict)
            if spec.error is not None:
                raise spec.error
        return spec

    def _send(self, gen: int, me: int, dsts: list[int]) -> int:
        prep = self._prepared(gen)
        if not prep.published:
            self.m.store.set(P.skeleton_key(gen, me), prep.skeleton)  # type: ignore[arg-type]
        tensors, large, packed = prep.tensors, prep.large, prep.packed
        moved = 0
        pending: list[Any] = []
        for dst in dsts:
            works = [self.m.cpu_pg.send([packed], dst, 0)]
            for i in large:
                t = tensors[i].contiguous()
                pg = self.m.pg if t.device.type != "cpu" else self.m.cpu_pg
                works.append(pg.send([t], dst, 1 + i))
            pending.extend(works)
            moved += packed.numel() + sum(tensors[i].numel() * tensors[i].element_size()
                                          for i in large)
        # The sends finish while this replica runs its next forward/backward (which does
        # not touch the state); the optimizer step waits for them (complete()).
        self.inflight = Inflight(pending, None)
        self.m.event("sends_posted")
        return moved

    def _skeleton(self, gen: int, src: int) -> Any:
        """Wait for participant ``src``'s skeleton of generation ``gen`` and load it."""
        key = P.skeleton_key(gen, src)
        since = time.monotonic()
        while not self.m.store.check([key]):
            self.m.check_generation()
            self.m.beat(since)
            time.sleep(self.m.poll_interval_s)
        return pickle.loads(self.m.store.get(key))  # noqa: S301 - our own skeleton, our store

    def _layout(self, gen: int, src: int, skel: Any) -> _Destination:
        """Where each tensor of ``skel`` will be received: this rank's live model tensors
        where they match, else buffers pre-faulted for the optimizer state."""
        d = _Destination(gen, src, skel)
        own_model = self.model.state_dict()
        for ref in d.refs:
            mine = own_model.get(ref.path[1]) if ref.path[0] == "model" else None
            if isinstance(mine, DTensor):
                # HSDP: shards travel as plain tensors, straight into this rank's live
                # shard (before, into a spare buffer and copied: the copy, and the buffer
                # taken from those pre-faulted for the optimizer state).
                mine = mine._local_tensor
            if mine is not None and tuple(mine.shape) == ref.shape and mine.dtype == ref.dtype \
                    and mine.is_contiguous():
                d.dest.append(mine)
                d.live.add(ref.index)
            else:
                dev = "cpu" if ref.on_cpu else self.device
                d.dest.append(self._take_buffer(ref.shape, ref.dtype, dev))
        d.small = [r for r in d.refs if nbytes(d.dest[r.index]) < SMALL_TENSOR_BYTES]
        d.packed = torch.zeros(sum(nbytes(d.dest[r.index]) for r in d.small),
                               dtype=torch.uint8)
        model_refs = [r for r in d.refs if r.path[0] == "model"]
        d.in_place = all(r.index in d.live for r in model_refs) \
            and len(model_refs) == len(own_model)
        return d

    def _recv(self, gen: int, src: int) -> int:
        d = self._rspec
        self._rspec = None
        if d is None or (d.gen, d.src) != (gen, src):
            d = self._layout(gen, src, self._skeleton(gen, src))
        self.m.event("skeleton")
        self.incomplete = True
        dest = d.dest
        small_set = {r.index for r in d.small}
        # The sender sends in index order: the packed buffer, the model, the optimizer.
        first = [self.m.cpu_pg.recv([d.packed], src, 0)]
        later: list[Any] = []
        for ref in d.refs:
            if ref.index not in small_set:
                t = dest[ref.index]
                pg = self.m.pg if t.device.type != "cpu" else self.m.cpu_pg
                (later if ref.path[0] == "optimizer" else first).append(
                    pg.recv([t], src, 1 + ref.index))
        self.m.event("recvs_posted")
        for w in first:
            self.m.wait(w, phase=P.Phase.SYNC)
        self.m.event("model_in")
        for ref, t in zip(d.small, unpack(d.packed, d.small), strict=True):
            if ref.index in d.live:
                dest[ref.index].copy_(t)
            else:
                dest[ref.index] = t if ref.on_cpu else t.to(self.device)
        state = join_state(d.skel, dest)
        if not later:
            self._load_state_dict(state, model_in_place=d.in_place)
            self.incomplete = False
            return sum(nbytes(t) for t in dest)
        # Everything but the optimizer now, so that the first step's forward/backward
        # overlaps with the rest of the transfer; the optimizer state when it is in.
        self._load_state_dict(state | {"optimizer": None}, model_in_place=d.in_place)
        self.inflight = Inflight(
            later, lambda: self._load_optimizer(state["optimizer"]))
        return sum(nbytes(t) for t in dest)

    def abandon(self) -> None:
        """Drop a transfer still in flight: it belongs to an abandoned generation (a
        receiver it left half-filled has ``incomplete`` set and receives again)."""
        self.inflight = None

    def complete(self) -> float | None:
        """Wait for the tail of the last state transfer and install it; return when its
        last op completed (None: nothing was in flight)."""
        inflight = self.inflight
        if inflight is None:
            return None
        self.m.wait_event(inflight.done)
        if inflight.error:
            self.m.collective_failed(P.Phase.SYNC, inflight.error[0])
        if inflight.finish is not None:
            inflight.finish()
            self.incomplete = False
        self.inflight = None
        return inflight.t_done
