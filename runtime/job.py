"""The worker side: a data-parallel replica that the supervisor can regroup at any time.

A training script hands its model, optimizer (and optionally scheduler and stateful
sampler) to :class:`Job` and iterates ``job.steps(total)``; the loop body does the
forward and backward pass only. After each body the runtime averages the gradients over
the current process group and applies the update, so it decides when an update is
*committed* and can always abandon a step in flight without applying it.

Why the waiting is done the way it is (measured on gloo/CPU): a survivor waiting on
another survivor can block until the group timeout when a third peer dies, and
``abort()`` does not release it. So no op is ever waited on with ``wait()``: a callback
sets an event, and while it is not set the worker polls the ``gen`` key the supervisor
publishes. On a new generation the old group is abandoned (kept referenced, never
destroyed, because destroying it could join a thread stuck in the dead op) and a new
group is built on a fresh store prefix.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime.errors import (
    CheckpointError,
    CollectiveError,
    ConfigError,
    GenerationChanged,
)
from runtime.faults import FaultSpec, decode_faults
from runtime.proc import set_parent_death_signal
from runtime.state import (
    SMALL_TENSOR_BYTES,
    CheckpointWriter,
    clone_state,
    join_state,
    nbytes,
    pack,
    partition,
    read_checkpoint,
    refs,
    split_state,
    unpack,
)

log = logging.getLogger("yoco.runtime.job")


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """Knobs of a worker. The launcher's settings (checkpointing) come from the environment.

    ``seed`` defines the per-step RNG: at the start of step ``s`` rank ``r`` reseeds torch
    and ``random`` from ``(seed, s, r)``, so a replacement's RNG state is exactly the one
    the replica it replaces would have had.
    """

    seed: int = 0
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    poll_interval_s: float = 0.002
    regroup_timeout_s: float = 120.0
    collective_timeout_s: float = 600.0
    state_buffers_per_param: int | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError("checkpoint_every must be >= 0")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError("checkpoint_every needs checkpoint_dir")
        if not 0 < self.poll_interval_s <= 1:
            raise ConfigError("poll_interval_s must be in (0, 1]")
        if self.regroup_timeout_s <= 0 or self.collective_timeout_s <= 0:
            raise ConfigError("timeouts must be > 0")
        if self.state_buffers_per_param is not None and self.state_buffers_per_param < 0:
            raise ConfigError("state_buffers_per_param must be >= 0")


def _step_seed(seed: int, step: int, rank: int) -> int:
    return ((seed * 1_000_003 + step) * 10_007 + rank) % (2**63 - 1)


class Job:
    """One data-parallel replica under the migration runtime.

    Outside the launcher (no ``YOCO_STORE`` in the environment) it runs alone with
    world size 1, so the same script also runs with plain ``python``.
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, sampler: Any = None,
                 config: JobConfig | None = None) -> None:
        cfg = config or JobConfig()
        every = int(os.environ.get(P.ENV_CKPT_EVERY, cfg.checkpoint_every))
        ckpt_dir = os.environ.get(P.ENV_CKPT_DIR, cfg.checkpoint_dir)
        self.config = JobConfig(seed=cfg.seed, checkpoint_every=every,
                                checkpoint_dir=ckpt_dir if every else cfg.checkpoint_dir,
                                poll_interval_s=cfg.poll_interval_s,
                                regroup_timeout_s=cfg.regroup_timeout_s,
                                collective_timeout_s=cfg.collective_timeout_s,
                                state_buffers_per_param=cfg.state_buffers_per_param)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler
        self.step = 0
        self.rank = 0
        self.world_size = 1
        self.gen = -1
        self.slot = os.environ.get(P.ENV_SLOT, "local")
        params = [p for p in model.parameters()]
        self.device = params[0].device if params else torch.device("cpu")
        self._use_nccl = self.device.type == "cuda"
        self._store: dist.Store | None = None
        self._store_addr: tuple[str, int] | None = None
        addr = os.environ.get(P.ENV_STORE)
        if addr:
            set_parent_death_signal()
            host, _, port = addr.rpartition(":")
            self._store_addr = (host, int(port))
            self._store = dist.TCPStore(host, int(port), is_master=False,
                                        timeout=timedelta(seconds=60))
            self._watch: _GenWatch | None = _GenWatch(host, int(port))
        else:
            self._watch = None
        self._faults: list[FaultSpec] = decode_faults(os.environ.get(P.ENV_FAULTS))
        self._pg: Any = None  # gradient group (NCCL on CUDA, else gloo)
        self._cpu_pg: Any = None  # gloo group for control and CPU tensors
        self._graveyard: list[Any] = []  # abandoned groups: never destroyed on purpose
        # Pre-faulted receive buffers for the optimizer state, by (shape, dtype, device).
        self._spare_bufs: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        # The tail of a state transfer still in flight when the first step's body runs:
        # (works to wait for, what to do then). Completed before the optimizer step.
        self._inflight: _Inflight | None = None
        self._state_incomplete = False  # a receive began and its state is not all in
        self._was_member = False
        self._move_seen = False
        self._flat: list[torch.Tensor] = []
        # Params with sparse gradients, by (dtype, row shape): each bucket is reduced as one
        # sparse tensor, its tables' rows stacked.
        self._sparse_buckets: list[list[torch.nn.Parameter]] = []
        self._ctl = torch.zeros(1)
        self._sampler_snapshot: Any = None
        self._ckpt: CheckpointWriter | None = None
        if self.config.checkpoint_every and self.config.checkpoint_dir:
            self._ckpt = CheckpointWriter(Path(self.config.checkpoint_dir), self._published)
        self._step_times: list[float] = []
        self._regroup_timing: dict[str, float] | None = None
        self._signal_file = os.environ.get(P.ENV_SIGNAL_FILE)
        self._control_dir = os.environ.get(P.ENV_CONTROL_DIR)

    # ----------------------------------------------------------------- public API
    @property
    def managed(self) -> bool:
        """True when launched by the supervisor (fault tolerant), False when standalone."""
        return self._store is not None

    def state_dict(self) -> dict[str, Any]:
        """Return the full training state: what a replacement needs to continue exactly."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "step": self.step,
            "seed": self.config.seed,
        }

    def load_state_dict(self, state: dict[str, Any], *, model_in_place: bool = False) -> None:
        """Install ``state`` (from :meth:`state_dict`, a transfer or a checkpoint); an
        ``optimizer`` entry of None leaves the optimizer as it is."""
        if not model_in_place:
            self.model.load_state_dict(state["model"])
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])

    def steps(self, total: int) -> Iterator[int]:
        """Yield the index of each step to run until ``total`` steps are committed.

        The body must run the forward and backward pass of that step (gradients are
        zeroed before each yield). The same index can be yielded again when the step was
        abandoned because the membership changed; the body must not keep side effects of
        an abandoned step. In a spare process this blocks until the spare is called in,
        and it exits the process if the job ends without needing it.
        """
        if total < 0:
            raise ConfigError("total must be >= 0")
        if self._store is None:
            yield from self._standalone(total)
            return
        self._join(0)
        while self.step < total:
            t0 = time.perf_counter()
            self._begin_step()
            yield self.step
            try:
                self._finish_step()
            except GenerationChanged as changed:
                if self.sampler is not None:
                    self.sampler.load_state_dict(self._sampler_snapshot)
                self._join(changed.gen)
                continue
            self._after_commit(time.perf_counter() - t0)
            if self._move_seen:
                self._move_seen = False
                self._join(self.gen + 1)
        self._complete_transfer()  # joined at the very end: nothing left to step
        if self._ckpt is not None:
            self._ckpt.wait()
        self._store.set(P.finished_key(self.slot), str(self.step))
        if self.rank == 0:
            self._store.set(P.KEY_DONE, str(self.step))

    # ----------------------------------------------------------------- standalone
    def _standalone(self, total: int) -> Iterator[int]:
        while self.step < total:
            self._begin_local()
            yield self.step
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.step += 1

    def _begin_local(self) -> None:
        seed = _step_seed(self.config.seed, self.step, self.rank)
        torch.manual_seed(seed)
        random.seed(seed)
        if self._flat and self._grads_are_views():
            for fl in self._flat:
                fl.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=False)
        for ps in self._sparse_buckets:
            for p in ps:
                p.grad = None  # a sparse gradient is built fresh by each backward

    # ----------------------------------------------------------------- step
    def _begin_step(self) -> None:
        assert self._store is not None
        if not self._flat:
            self._build_flat()
        self._begin_local()
        if self.sampler is not None:
            self._sampler_snapshot = self.sampler.state_dict()
        for fault in self._faults:
            if fault.step != self.step:
                continue
            if fault.action == "killall" and self._killall_armed(fault):
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.rank == self.rank and fault.action in ("warn", "drain") and self._fire(fault):
                self._inject_request(fault)
        if self.rank == 0 and not self._move_seen:
            # Only rank 0 polls for a pending move: it raises a flag inside the gradient
            # allreduce, so every rank learns of the move at the same committed step.
            latest = self._latest_gen()
            if latest == self.gen + 1 and self._plan(latest).mode == "move":
                self._move_seen = True

    def _build_flat(self) -> None:
        # Gradients become views into one flat buffer per dtype, so the allreduce needs
        # no copy; the last element of the first buffer carries the control flag.
        # Embedding tables with sparse=True get sparse gradients (the rows a step looked
        # up): they are reduced as sparse tensors, not copied into the dense buffer.
        sparse_ids = {id(m.weight) for m in self.model.modules()
                      if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)
                      and m.sparse and m.weight.requires_grad}
        buckets: dict[tuple[Any, ...], list[torch.nn.Parameter]] = {}
        for p in (p for p in self.model.parameters() if id(p) in sparse_ids):
            buckets.setdefault((p.dtype, tuple(p.shape[1:])), []).append(p)
        self._sparse_buckets = list(buckets.values())
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in self.model.parameters():
            if p.requires_grad and id(p) not in sparse_ids:
                by_dtype.setdefault(p.dtype, []).append(p)
        self._flat_params: list[list[torch.nn.Parameter]] = []
        for i, (dtype, ps) in enumerate(by_dtype.items()):
            n = sum(p.numel() for p in ps) + (1 if i == 0 else 0)
            flat = torch.zeros(n, dtype=dtype, device=self.device)
            off = 0
            for p in ps:
                p.grad = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            self._flat.append(flat)
            self._flat_params.append(ps)

    def _grads_are_views(self) -> bool:
        for flat, ps in zip(self._flat, self._flat_params, strict=True):
            off = 0
            for p in ps:
                if p.grad is None or p.grad.data_ptr() != flat[off:].data_ptr():
                    return False
                off += p.numel()
        return True

    def _finish_step(self) -> None:
        views = self._grads_are_views()
        if not views:  # the body replaced .grad (e.g. zero_grad(set_to_none=True))
            for flat, ps in zip(self._flat, self._flat_params, strict=True):
                off = 0
                for p in ps:
                    g = p.grad
                    if g is None:
                        flat[off:off + p.numel()].zero_()
                    else:
                        flat[off:off + p.numel()].copy_(g.reshape(-1))
                    off += p.numel()
        self._flat[0][-1] = 1.0 if self._move_seen else 0.0
        works = [self._pg.allreduce([flat]) for flat in self._flat]
        # gloo reduces sparse tensors (an allgather of rows, then summed); NCCL does not,
        # so on CUDA they go through the CPU group. One reduction per bucket of tables,
        # not one per table: each costs three rounds of messages.
        sparse = [stack_sparse([p.grad for p in ps], [p.shape for p in ps], ps[0].dtype).cpu()
                  for ps in self._sparse_buckets]
        sparse_works = [self._cpu_pg.allreduce([g]) for g in sparse]
        works += sparse_works
        for fault in self._faults:
            if fault.step == self.step and fault.rank == self.rank:
                if fault.action == "kill" and self._fire(fault):
                    assert self._store is not None
                    self._store.set("killed_at", repr(time.time()))  # for the benchmark
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault.action == "raise" and self._fire(fault):
                    self._collective_failed("step", CollectiveError("injected collective error"))
        for w in works:
            self._wait(w, phase="step")
        for flat in self._flat:
            flat.div_(self.world_size)
        for ps, w in zip(self._sparse_buckets, sparse_works, strict=True):
            total = w.get_future().value()[0].div_(self.world_size)  # the summed rows
            for p, g in zip(ps, unstack_sparse(total, [p.shape for p in ps]), strict=True):
                p.grad = g.to(p.device)
        if float(self._flat[0][-1]) > 0:
            self._move_seen = True
        if not views:
            for flat, ps in zip(self._flat, self._flat_params, strict=True):
                off = 0
                for p in ps:
                    p.grad = flat[off:off + p.numel()].view_as(p)
                    off += p.numel()
        self._complete_transfer()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1

    def _after_commit(self, seconds: float) -> None:
        assert self._store is not None
        self._step_times.append(seconds)
        if self.rank != 0:
            return
        window = self._step_times[-20:]
        self._store.set(P.KEY_PROGRESS, json.dumps(
            {"step": self.step, "step_seconds": sum(window) / len(window), "t": time.time(),
             "gen": self.gen}))
        if self._regroup_timing is not None:
            timing = self._regroup_timing | {"first_step": time.time(), "step": self.step,
                                             "step_seconds": seconds}
            self._store.set(P.ready_key(self.gen), json.dumps(timing))
            self._regroup_timing = None
        if self._ckpt is not None and self.step % self.config.checkpoint_every == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        assert self._ckpt is not None
        self._ckpt.submit(clone_state(self.state_dict()), self.step)

    def _published(self, step: int, path: Path) -> None:
        assert self._store is not None
        self._store.set(P.KEY_CKPT, json.dumps({"step": step, "path": str(path)}))

    # ----------------------------------------------------------------- waiting
    def _wait(self, work: Any, *, phase: str) -> None:
        """Wait for ``work`` without ever blocking inside it; raise GenerationChanged
        as soon as a newer non-move generation is published."""
        done = threading.Event()
        error: list[BaseException] = []
        threaded = False
        try:
            work.get_future().add_done_callback(lambda _f: done.set())
        except RuntimeError:
            threaded = True
            # gloo send/recv have no future and report is_completed() only after wait():
            # block in wait() on a helper thread (it releases the GIL) and watch it.
            def blocker() -> None:
                try:
                    work.wait()
                except Exception as exc:  # surfaced below as a collective failure
                    error.append(exc)
                done.set()

            threading.Thread(target=blocker, name="yoco-wait", daemon=True).start()
        while not done.wait(self.config.poll_interval_s):
            self._check_generation()
        try:
            if error:
                raise error[0]
            if not threaded:  # a second wait() on a gloo p2p work can block forever
                work.wait()
        except Exception as exc:  # gloo raises RuntimeError subclasses; any is a fault
            self._collective_failed(phase, exc)

    def _latest_gen(self) -> int:
        """The newest generation the supervisor has published (-1: none yet)."""
        assert self._store is not None
        if self._watch is not None and self._watch.ok:
            return self._watch.latest  # no store round trip: polled every 2 ms
        return int(self._store.get(P.KEY_GEN)) if self._store.check([P.KEY_GEN]) else -1

    def _check_generation(self) -> None:
        latest = self._latest_gen()
        if latest <= self.gen:
            return
        if latest == self.gen + 1 and self._plan(latest).mode == "move":
            return  # a move waits for the step boundary; the flag is already raised
        raise GenerationChanged(latest)

    def _collective_failed(self, phase: str, exc: BaseException) -> None:
        """Report the failure to the supervisor and wait for the next generation."""
        assert self._store is not None
        self._store.set(P.fault_key(self.slot), json.dumps(
            {"gen": self.gen, "step": self.step, "phase": phase, "error": str(exc)[:500]}))
        self._store.add(P.KEY_FAULTS, 1)
        while True:
            latest = self._latest_gen()
            if latest > self.gen:
                raise GenerationChanged(latest)
            time.sleep(self.config.poll_interval_s * 5)

    def _killall_armed(self, fault: FaultSpec) -> bool:
        # The first rank to reach the step arms it for its generation; every rank of that
        # generation dies, and nobody after the recovery (a later generation) does.
        assert self._store is not None
        key = f"fired/killall/{fault.step}"
        armed = self._store.compare_set(key, "", str(self.gen))
        return bool(armed.decode() == str(self.gen))

    def _fire(self, fault: FaultSpec, *, per_rank: bool = False) -> bool:
        assert self._store is not None
        key = f"fired/{fault.action}/{fault.step}/{fault.rank}"
        if per_rank:
            key += f"/{self.rank}"
        return int(self._store.add(key, 1)) == 1

    def _inject_request(self, fault: FaultSpec) -> None:
        line = {"worker": self.slot, "t": time.time()}
        if fault.action == "warn" and self._signal_file:
            line |= {"cause": fault.signal, "detail": f"injected at step {self.step}"}
            with open(self._signal_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        elif fault.action == "drain" and self._control_dir:
            from runtime.control import file_drain_request

            file_drain_request(Path(self._control_dir), self.slot,
                               reason=f"injected at step {self.step}")

    # ----------------------------------------------------------------- membership
    def _plan(self, gen: int) -> P.Plan:
        assert self._store is not None
        return P.Plan.decode(self._store.get(P.plan_key(gen)))

    def _await_gen(self, min_gen: int) -> int:
        """Block until generation ``min_gen`` (or newer) exists; exit if shut down."""
        assert self._store is not None
        last_shutdown_check = 0.0
        while True:
            latest = self._latest_gen()
            if latest >= min_gen:
                return latest
            now = time.monotonic()
            if now - last_shutdown_check > 0.05:
                last_shutdown_check = now
                if self._store.check([P.KEY_SHUTDOWN]):
                    sys.exit(0)
            if self._watch is not None and self._watch.ok:
                self._watch.wait_beyond(min_gen - 1, 0.05)
            else:
                time.sleep(0.005)

    def _join(self, min_gen: int) -> None:
        """Become a member of the newest generation ≥ ``min_gen`` and hold its state."""
        assert self._store is not None
        if not self._was_member:
            self._preallocate_state_buffers()
            self._store.set(P.waiting_key(self.slot), str(time.time()))
        while True:
            gen = self._await_gen(min_gen)
            t_seen = time.time()
            plan = self._plan(gen)
            participants = plan.members + plan.donors
            if self.slot not in participants:
                if self._was_member:
                    self._leave()
                min_gen = gen + 1
                continue
            try:
                self._form_groups(gen, participants.index(self.slot), len(participants))
                t_pg = time.time()
                moved = self._sync(plan)
                t_sync = time.time()
            except GenerationChanged as changed:
                min_gen = changed.gen
                continue
            if self.slot in plan.donors:
                self._complete_transfer()
                self._leave()
            self._was_member = True
            self._spare_bufs.clear()  # whatever the transfer did not use
            self.rank = plan.members.index(self.slot)
            self.world_size = len(plan.members)
            if plan.donors:  # the training group excludes the donors
                try:
                    self._form_groups(gen, self.rank, self.world_size, prefix="train")
                except GenerationChanged as changed:
                    min_gen = changed.gen
                    continue
            self._regroup_timing = {"seen": t_seen, "pg": t_pg, "synced": t_sync,
                                    "bytes": moved, "mode_" + plan.mode: 1.0}
            if plan.mode == "start" and self._ckpt is not None and self.rank == 0 \
                    and self.step == 0:
                self._checkpoint()  # so that a rollback target exists from step 0 on
            return

    def _state_buffers_per_param(self) -> int:
        n = self.config.state_buffers_per_param
        if n is not None:
            return n
        # Optimizers whose state is K tensors shaped like each parameter (guessing wrong
        # only costs memory: unmatched state gets a buffer when it arrives).
        name = type(self.optimizer).__name__
        if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adadelta"):
            return 2
        if name in ("Adagrad", "RMSprop", "ASGD", "Rprop") or \
                self.optimizer.defaults.get("momentum"):
            return 1
        return 0

    def _preallocate_state_buffers(self) -> None:
        """While waiting (a spare, or a member before the start sync), allocate zeroed
        (so pre-faulted: receiving into fresh pages costs about as much as the copy)
        buffers for the optimizer state a transfer will bring, so a recovery does not
        pay for the allocation. Freed after the first sync if unused."""
        k = self._state_buffers_per_param()
        for p in self.model.parameters():
            key = (tuple(p.shape), p.dtype, p.device)
            self._spare_bufs.setdefault(key, []).extend(
                torch.zeros(p.shape, dtype=p.dtype, device=p.device) for _ in range(k))

    def _take_buffer(self, shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device | str) -> torch.Tensor:
        pool = self._spare_bufs.get((tuple(shape), dtype, torch.device(device)))
        if pool:
            return pool.pop()
        # zeros, not empty: pre-faulted pages halve the receive time.
        return torch.zeros(shape, dtype=dtype, device=device)

    def _leave(self) -> None:
        assert self._store is not None
        self._store.set(P.left_key(self.slot), "1")
        if self._ckpt is not None:
            self._ckpt.wait()
        sys.stdout.flush()
        os._exit(0)  # nothing of the user's script may run after this replica is retired

    def _form_groups(self, gen: int, rank: int, size: int, prefix: str = "pg") -> None:
        """Build this generation's group(s) on a fresh prefix, watching for a newer gen."""
        assert self._store is not None and self._store_addr is not None
        result: dict[str, Any] = {}
        timeout = timedelta(seconds=self.config.collective_timeout_s)
        host, port = self._store_addr

        def build() -> None:
            try:
                # A connection of its own: a TCPStore client runs one request at a time,
                # and the rendezvous blocks in a store wait until every peer has written
                # its address (up to the collective timeout). On the shared client a peer
                # that died before writing it froze this process's generation polling
                # behind that wait: the job hung after a kill-all with a spare called in.
                store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
                result["store"] = store
                base = dist.PrefixStore(f"g{gen}/{prefix}/", store)
                gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", base), rank, size,
                                             timeout)
                result["cpu"] = gloo
                if self._use_nccl:
                    opts = dist.ProcessGroupNCCL.Options()
                    opts._timeout = timeout
                    result["main"] = dist.ProcessGroupNCCL(
                        dist.PrefixStore("nccl/", base), rank, size, opts)
                else:
                    result["main"] = gloo
            except Exception as exc:  # reported below as a collective failure
                result["error"] = exc

        thread = threading.Thread(target=build, name="yoco-pg", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.config.regroup_timeout_s
        self.gen = gen  # so that _check_generation compares against the new generation
        while thread.is_alive():
            thread.join(self.config.poll_interval_s * 2)
            latest = self._latest_gen()
            if latest > gen:
                raise GenerationChanged(latest)
            if time.monotonic() > deadline:
                self._collective_failed("regroup", CollectiveError("process group timeout"))
        if "error" in result:
            self._collective_failed("regroup", result["error"])
        if self._pg is not None:
            self._graveyard.extend([self._pg, self._cpu_pg])
        self._graveyard.append(result["store"])  # the group's rendezvous connection
        self._pg, self._cpu_pg = result["main"], result["cpu"]

    def _sync(self, plan: P.Plan) -> int:
        """Bring every participant to the same state per ``plan.mode``; return bytes moved."""
        assert self._store is not None
        # A transfer still in flight belongs to an abandoned generation: drop it (a
        # receiver it left half-filled has _state_incomplete set and receives again).
        self._inflight = None
        if plan.mode in ("rollback", "resume"):
            assert plan.ckpt is not None
            try:
                state = read_checkpoint(Path(plan.ckpt))
                self.load_state_dict(state)
                self._state_incomplete = False
            except CheckpointError as exc:
                self._collective_failed("rollback", exc)
            return 0
        participants = plan.members + plan.donors
        me = participants.index(self.slot)
        # Who holds which committed step: survivors can be one step apart when a peer
        # died inside an allreduce some of them had already completed.
        holds = torch.zeros(len(participants), dtype=torch.float64)
        has_state = (self._was_member or self.slot in plan.donors) \
            and not self._state_incomplete
        holds[me] = float(self.step + 1) if has_state else 0.0
        if plan.mode == "start":
            holds[me] = 1.0 if me == 0 else 0.0
        self._wait(self._cpu_pg.allreduce([holds]), phase="sync")
        committed = int(holds.max().item()) - 1
        if committed < 0:
            self._collective_failed("sync", CollectiveError("no participant holds the state"))
        sources = [r for r in range(len(participants)) if int(holds[r]) - 1 == committed]
        # Donors only send: receivers are the members that lack the committed state.
        receivers = [r for r in range(len(plan.members)) if r not in sources]
        if not receivers:
            return 0
        # Prefer staying members as sources; a donor only sends if it is the only one.
        staying = [s for s in sources if s < len(plan.members)] or sources
        assign = {r: staying[i % len(staying)] for i, r in enumerate(receivers)}
        moved = 0
        if me in staying:
            mine = [r for r, s in assign.items() if s == me]
            if mine:
                moved = self._send_state(plan.gen, me, mine)
        elif me in assign:
            moved = self._recv_state(plan.gen, assign[me])
        return moved

    def _send_state(self, gen: int, me: int, dsts: list[int]) -> int:
        assert self._store is not None
        skel, tensors = split_state(self.state_dict())
        self._store.set(P.skeleton_key(gen, me), pickle.dumps(skel))  # type: ignore[arg-type]
        small, large = partition(tensors)
        packed = pack([tensors[i] for i in small])
        moved = 0
        pending: list[Any] = []
        for dst in dsts:
            works = [self._cpu_pg.send([packed], dst, 0)]
            for i in large:
                t = tensors[i].contiguous()
                pg = self._pg if t.device.type != "cpu" else self._cpu_pg
                works.append(pg.send([t], dst, 1 + i))
            pending.extend(works)
            moved += packed.numel() + sum(tensors[i].numel() * tensors[i].element_size()
                                          for i in large)
        # The sends finish while this replica runs its next forward/backward (which does
        # not touch the state); the optimizer step waits for them (_complete_transfer).
        self._inflight = _Inflight(pending, None)
        return moved

    def _recv_state(self, gen: int, src: int) -> int:
        assert self._store is not None
        key = P.skeleton_key(gen, src)
        while not self._store.check([key]):
            self._check_generation()
            time.sleep(self.config.poll_interval_s)
        skel = pickle.loads(self._store.get(key))  # noqa: S301 - our own skeleton, our store
        self._state_incomplete = True
        tensor_refs = refs(skel)
        own_model = self.model.state_dict()
        dest: list[torch.Tensor] = []
        live: set[int] = set()  # indices received straight into the live model tensors
        for ref in tensor_refs:
            mine = own_model.get(ref.path[1]) if ref.path[0] == "model" else None
            if mine is not None and tuple(mine.shape) == ref.shape and mine.dtype == ref.dtype:
                dest.append(mine)
                live.add(ref.index)
            else:
                dev = "cpu" if ref.on_cpu else self.device
                dest.append(self._take_buffer(ref.shape, ref.dtype, dev))
        small = [r for r in tensor_refs if nbytes(dest[r.index]) < SMALL_TENSOR_BYTES]
        small_set = {r.index for r in small}
        packed = torch.zeros(sum(nbytes(dest[r.index]) for r in small), dtype=torch.uint8)
        # The sender sends in index order: the packed buffer, the model, the optimizer.
        first = [self._cpu_pg.recv([packed], src, 0)]
        later: list[Any] = []
        for ref in tensor_refs:
            if ref.index not in small_set:
                t = dest[ref.index]
                pg = self._pg if t.device.type != "cpu" else self._cpu_pg
                (later if ref.path[0] == "optimizer" else first).append(
                    pg.recv([t], src, 1 + ref.index))
        for w in first:
            self._wait(w, phase="sync")
        for ref, t in zip(small, unpack(packed, small), strict=True):
            if ref.index in live:
                dest[ref.index].copy_(t)
            else:
                dest[ref.index] = t if ref.on_cpu else t.to(self.device)
        model_refs = [r for r in tensor_refs if r.path[0] == "model"]
        in_place = all(r.index in live for r in model_refs) and len(model_refs) == len(own_model)
        state = join_state(skel, dest)
        if not later:
            self.load_state_dict(state, model_in_place=in_place)
            self._state_incomplete = False
            return sum(nbytes(t) for t in dest)
        # Everything but the optimizer now, so that the first step's forward/backward
        # overlaps with the rest of the transfer; the optimizer state when it is in.
        self.load_state_dict(state | {"optimizer": None}, model_in_place=in_place)
        self._inflight = _Inflight(
            later, lambda: self.optimizer.load_state_dict(state["optimizer"]))
        return sum(nbytes(t) for t in dest)

    def _complete_transfer(self) -> None:
        """Wait for the tail of the last state transfer and install it (see _inflight)."""
        inflight = self._inflight
        if inflight is None:
            return
        while not inflight.done.wait(self.config.poll_interval_s):
            self._check_generation()
        if inflight.error:
            self._collective_failed("sync", inflight.error[0])
        if inflight.finish is not None:
            inflight.finish()
            self._state_incomplete = False
        self._inflight = None
        if self._regroup_timing is not None:
            self._regroup_timing["transferred"] = inflight.t_done


def stack_sparse(grads: list[torch.Tensor | None], shapes: list[torch.Size],
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return one sparse tensor holding the gradients of tables of the same row shape,
    table ``i``'s row ``r`` at row ``offset_i + r`` (offsets: the row counts before it).

    A missing gradient (a table this rank's batch did not touch) adds no rows: every rank
    still takes part in the same reduction. A dense gradient is taken as sparse rows.
    """
    idx: list[torch.Tensor] = []
    vals: list[torch.Tensor] = []
    off = 0
    for g, shape in zip(grads, shapes, strict=True):
        if g is not None:
            sp = g if g.is_sparse else g.to_sparse(1)
            idx.append(sp._indices()[0].to(sp.device) + off)
            vals.append(sp._values())
        off += shape[0]
    trailing = tuple(shapes[0][1:])
    if idx:
        indices, values = torch.cat(idx).unsqueeze(0), torch.cat(vals)
    else:
        indices = torch.zeros((1, 0), dtype=torch.long)
        values = torch.zeros((0, *trailing), dtype=dtype)
    return torch.sparse_coo_tensor(indices, values, (off, *trailing), check_invariants=False)


def unstack_sparse(total: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Split a tensor built by :func:`stack_sparse` back into one coalesced sparse
    gradient per table."""
    total = total.coalesce()
    rows, vals = total.indices()[0], total.values()
    out: list[torch.Tensor] = []
    off = 0
    for shape in shapes:
        lo = int(torch.searchsorted(rows, off))
        hi = int(torch.searchsorted(rows, off + shape[0]))
        out.append(torch.sparse_coo_tensor((rows[lo:hi] - off).unsqueeze(0), vals[lo:hi],
                                           tuple(shape), is_coalesced=True,
                                           check_invariants=False))
        off += shape[0]
    return out


class _GenWatch:
    """Follows the generation counter the supervisor publishes without polling the
    store: a thread with a connection of its own blocks in a store wait for the next
    generation's plan key, which the supervisor writes just before ``gen``.

    Why: every worker and spare checks for a new generation every 2 ms while it waits for
    a collective or a transfer; as store round trips those checks took CPU from the
    transfers themselves on a 2-core machine. Now a check is an attribute read.
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
                except Exception as exc:  # a timeout: wait again; anything else: give up
                    if "timeout" not in str(exc).lower():
                        raise
                    continue
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


class _Inflight:
    """The p2p ops of a state transfer still in flight, waited for on one helper thread
    (gloo p2p works have no future; each may be waited for only once), and what to do
    once they are all complete. ``t_done``: when the last one completed."""

    def __init__(self, works: list[Any], finish: Any) -> None:
        self.finish = finish
        self.done = threading.Event()
        self.error: list[BaseException] = []
        self.t_done = 0.0

        def run() -> None:
            try:
                for w in works:
                    w.wait()
            except Exception as exc:  # surfaced by _complete_transfer as a collective failure
                self.error.append(exc)
            self.t_done = time.time()
            self.done.set()

        threading.Thread(target=run, name="yoco-transfer", daemon=True).start()


def local_device() -> torch.device:
    """Return the device the launcher assigned to this process (``cpu`` outside it)."""
    return torch.device(os.environ.get(P.ENV_DEVICE, "cpu"))
