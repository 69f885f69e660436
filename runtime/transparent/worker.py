"""The transparent worker: an unmodified ``torch.distributed`` script under the runtime.

:func:`install` replaces, before the script runs, the constructors and calls through
which a data-parallel script states what its training state is, and keeps what they
built in one :class:`Transparent` per process:

* ``torch.distributed.init_process_group`` / ``new_group`` / ``get_rank`` / ... -- the
  script's process group is the runtime's elastic one (:class:`runtime.membership.Membership`,
  one per generation). A spare waits inside ``init_process_group`` until it is called in,
  so the rank the script reads is the rank it replaces;
* ``DistributedDataParallel`` -- :class:`ElasticDDP`, the module as it is (state-dict keys
  keep DDP's ``module.`` prefix); the gradients are averaged at the step boundary by the
  model-aware machinery (:class:`runtime.reduction.GradientReducer`), not in backward
  hooks;
* ``torch.optim.Optimizer`` -- its ``step()`` is the **step boundary**: the gradient
  reduction, the commit, checkpoints, moves and recoveries happen inside it. With several
  optimizers a training step is one ``step()`` of each, in any order, and the boundary is
  the last of them; an optimizer stepped twice before every other one stepped once (an
  optimizer stepped at its own rate, or one built and never stepped) is refused by name;
* ``LRScheduler`` -- state moved with the rest; a ``step()`` that follows an optimizer step
  the runtime absorbed (a rollback, or a state that came in newer) is skipped;
* ``DataLoader`` over a ``DistributedSampler`` -- the data position (iteration, batches
  fetched, sampler epoch), committed with each step, so that a replacement is placed at
  the next batch;
* the RNG states (torch CPU and CUDA, Python ``random``) of every rank at each step
  boundary, through the store (a replacement takes the states of the rank it replaces).

The state moved is exactly :class:`runtime.job.Job`'s: :class:`TransparentJob` *is* a
``Job`` (membership, state transfer, checkpoints, fault injection, records), driven from
the optimizer step instead of from ``Job.steps()``. docs/runtime.md "Transparent mode" says
what this discovers, what it cannot, and what then happens (rollback).
"""

from __future__ import annotations

import array
import atexit
import base64
import contextlib
import json
import logging
import os
import random
import sys
import time
import types
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from runtime import exitguard
from runtime import protocol as P
from runtime.errors import ConfigError, GenerationChanged, TransparentError
from runtime.job import Job, JobConfig
from runtime.membership import GenerationWatch

log = logging.getLogger("yoco.runtime.transparent")

__all__ = ["ElasticDDP", "Transparent", "TransparentJob", "current", "install"]

_RT: Transparent | None = None

#: How often a waiting spare asks whether the job has ended without it (the generations
#: it follows come through a blocking watch, at once).
SPARE_SHUTDOWN_CHECK_S = 0.1


def current() -> Transparent | None:
    """The process's transparent runtime (None before :func:`install`)."""
    return _RT


# ----------------------------------------------------------------- the replaced classes
class ElasticDDP(torch.nn.Module):
    """What ``DistributedDataParallel(module, ...)`` builds under the transparent runtime:
    ``module`` itself (``.module``, the ``module.`` state-dict prefix, ``no_sync()``), its
    gradients averaged at the optimizer step by the runtime rather than during backward.
    DDP's own arguments (bucket sizes, device ids, ...) do not change the numbers and are
    ignored."""

    def __init__(self, module: torch.nn.Module, *_args: Any, **_kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self.syncing = True  # False inside no_sync()
        rt = current()
        if rt is not None:
            rt.modules.append(self)
            for p in module.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda _p: rt.grad_ready(self))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module."""
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync``: the backward passes inside it are not averaged (the
        gradients accumulate locally until a backward pass outside it)."""
        before, self.syncing = self.syncing, False
        try:
            yield
        finally:
            self.syncing = before


class _Schedulers:
    """The script's LR schedulers and gradient scalers as one stateful object for
    :class:`Job` (the script steps and updates them itself)."""

    def __init__(self, schedulers: list[Any], scalers: list[Any]) -> None:
        self.schedulers = schedulers
        self.scalers = scalers

    def state_dict(self) -> dict[str, list[dict[str, Any]]]:
        """Each scheduler's and each scaler's state, in construction order."""
        return {"schedulers": [s.state_dict() for s in self.schedulers],
                "scalers": [s.state_dict() for s in self.scalers]}

    def load_state_dict(self, state: dict[str, list[dict[str, Any]]]) -> None:
        """Install what :meth:`state_dict` returned."""
        for name, have in (("schedulers", self.schedulers), ("scalers", self.scalers)):
            if len(state[name]) != len(have):
                raise TransparentError(f"the state holds {len(state[name])} {name}, this "
                                       f"script built {len(have)}")
        for s, sd in zip(self.schedulers, state["schedulers"], strict=True):
            s.load_state_dict(sd)
        for g, sd in zip(self.scalers, state["scalers"], strict=True):
            g.load_state_dict(sd)

    def step(self) -> None:
        """Never called by the transparent runtime (the script steps its schedulers)."""


class _Optimizers:
    """Two or more of the script's optimizers as the one optimizer :class:`Job` moves,
    checkpoints and zeroes (each steps through its own ``step()``, see
    :meth:`Transparent.on_step`)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        # (runtime.transfer reads it to pre-fault receive buffers; none are.)
        self.defaults: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's parameter groups, in construction order."""
        return [g for o in self.optimizers for g in o.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Each optimizer's state, in construction order."""
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Install what :meth:`state_dict` returned."""
        states = state["optimizers"]
        if len(states) != len(self.optimizers):
            raise TransparentError(f"the state holds {len(states)} optimizer(s), this "
                                   f"script built {len(self.optimizers)}")
        for o, sd in zip(self.optimizers, states, strict=True):
            o.load_state_dict(sd)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every optimizer's gradients."""
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def register_step_post_hook(self, hook: Callable[..., None]) -> None:
        """Run ``hook`` after each optimizer's own update (a fault at phase ``optimizer``
        fires after the first of the step)."""
        for o in self.optimizers:
            o.register_step_post_hook(hook)

    def step(self) -> None:
        """Never called: the script steps each optimizer itself."""
        raise TransparentError("the optimizers are stepped by the script")


class _Position:
    """The training loader's data position as a stateful 'sampler' for :class:`Job`:
    ``iters`` iterations started, ``fetched`` batches of the last one, the sampler's
    ``epoch`` -- as of the last committed step."""

    def __init__(self, rt: Transparent) -> None:
        self.rt = rt
        self.committed: dict[str, Any] = {"iters": 0, "fetched": 0, "epoch": None}

    def state_dict(self) -> dict[str, Any]:
        """The committed position."""
        return dict(self.committed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A process that has not started iterating is placed there at its next
        iteration (:meth:`Transparent._iterate`); one that is iterating already stays
        where its script is (its data is not rewound)."""
        if self.rt.loader_iters == 0:
            self.rt.resume = dict(state)
        else:
            self.committed = self.rt.position_now()


def _distributed_sampler(loader: DataLoader[Any]) -> DistributedSampler[Any] | None:
    s = loader.sampler
    if isinstance(s, DistributedSampler):
        return s
    inner = getattr(loader.batch_sampler, "sampler", None)
    return inner if isinstance(inner, DistributedSampler) else None


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["random"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


#: Values in the state of Python's ``random`` (``random.getstate()[1]``).
_MT_STATE_LEN = 625


def _encode_rng(boundary: int, states: dict[str, Any]) -> str:
    """JSON (no pickle: the store is not trusted to hand back code) of RNG states."""
    def b64(t: torch.Tensor) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    version, internal, gauss = states["random"]
    # Python's Mersenne Twister state (625 values below 2**32) as packed bytes: a JSON
    # list of its numbers took most of the encoding's time, and it is encoded each step.
    packed = base64.b64encode(array.array("I", internal).tobytes()).decode()
    return json.dumps({"boundary": boundary, "torch": b64(states["torch"]),
                       "random": [version, packed, gauss],
                       "cuda": [b64(t) for t in states.get("cuda", [])]
                       if "cuda" in states else None})


def _decode_rng(raw: bytes) -> tuple[int, dict[str, Any]]:
    """Inverse of :func:`_encode_rng`; ValueError on anything else."""
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)),
                                dtype=torch.uint8).clone()

    try:
        data = json.loads(raw)
        version, packed, gauss = data["random"]
        internal = array.array("I")
        internal.frombytes(base64.b64decode(packed, validate=True))
        if len(internal) != _MT_STATE_LEN:
            raise ValueError(f"a random state of {len(internal)} values, not {_MT_STATE_LEN}")
        states: dict[str, Any] = {
            "torch": tensor(data["torch"]),
            "random": (int(version), tuple(internal),
                       None if gauss is None else float(gauss))}
        if data["cuda"] is not None:
            states["cuda"] = [tensor(t) for t in data["cuda"]]
        return int(data["boundary"]), states
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed RNG state in the store: {exc}") from None


def _same_rng(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    if a is None or a.keys() != b.keys() or a["random"] != b["random"]:
        return False
    if not torch.equal(a["torch"], b["torch"]):
        return False
    return all(torch.equal(x, y) for x, y in zip(a.get("cuda", []), b.get("cuda", []),
                                                   strict=True))


# ----------------------------------------------------------------- the job
class TransparentJob(Job):
    """:class:`Job` with the script's optimizer step as the boundary: the update is the
    optimizer's own (unwrapped) ``step``; nothing is reseeded (the script's RNG is its
    own, moved between ranks as state)."""

    def __init__(self, *, raw_step: Callable[[], Any],
                 before_form: Callable[[P.Plan], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._raw_step = raw_step
        self._before_form = before_form

    def _optimizer_step(self) -> None:
        self._raw_step()

    def _subgroups(self, plan: P.Plan) -> tuple[tuple[str, str, int, int], ...]:
        # Called by Job._join with the plan it is about to form the groups of: the last
        # point before that rendezvous (what a member writes here, every other member can
        # read once the groups are formed).
        self._before_form(plan)
        return super()._subgroups(plan)


# ----------------------------------------------------------------- the runtime
class Transparent:
    """Everything the script built that the runtime needs, and the step boundary."""

    def __init__(self) -> None:
        self.managed = P.ENV_STORE in os.environ
        self.slot = os.environ.get(P.ENV_SLOT, "local")
        self.rank, self.world = 0, 1
        self.initialized = False
        self.modules: list[ElasticDDP] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.raw_steps: dict[int, Callable[..., Any]] = {}
        self.schedulers: list[Any] = []
        self.scalers: list[Any] = []  # the script's (enabled) torch.amp.GradScalers
        # Per scaler (by id): its update()s to undo (after absorbed training steps).
        self.skip_scaler: dict[int, int] = {}
        self.train_loader: DataLoader[Any] | None = None
        self.loader_iters = 0  # iterations of the training loader started
        self.loader_fetched = 0  # batches fetched in the current one
        self.resume: dict[str, Any] | None = None  # where a fresh process is to be placed
        self.held: dict[str, Any] | None = None  # state re-applied there
        self.calls = 0  # training steps (a step() of each optimizer) run by the script
        # Per optimizer (by id): its schedulers' steps to skip (after absorbed updates).
        self.skip_sched: dict[int, int] = {}
        self._stepped: list[torch.optim.Optimizer] = []  # this step's optimizers so far
        self._stepping: torch.optim.Optimizer | None = None  # whose update the job takes
        self.undiscoverable: str | None = None
        self.replay_to: int | None = None  # a rollback replacement: absorb calls up to
        self.job: TransparentJob | None = None
        self.position = _Position(self)
        self._rng_published: dict[str, Any] | None = None
        self._rng_pubs = 0
        self._t_commit = time.perf_counter()
        self._finished = False
        self._ckpt_pending = False  # the last commit's checkpoint is not decided yet
        self._reduced = False  # the gradients of the step in flight are averaged
        self._absorbing = False  # the step in flight will not be taken (on_backward_end)
        self._backward_queued = False
        self._rng_boundary = -1
        self._joined = False  # this process has joined the job (its script runs steps)
        self._void_calls: int | None = None  # the optimizer call of a step being voided

    # ------------------------------------------------------------- process group
    def init_process_group(self, *_args: Any, **_kwargs: Any) -> None:
        """The script's ``init_process_group``: under the launcher, wait until this
        process is a member of a generation (a spare: until it is called in) and take
        its rank there; standalone, rank 0 of 1."""
        if self.initialized:
            raise TransparentError("init_process_group called twice")
        self.initialized = True
        if not self.managed:
            return
        host, _, port = os.environ[P.ENV_STORE].rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
        store.set(P.waiting_key(self.slot), str(time.time()))
        # A spare may wait for hours: it follows the generations through a blocking watch
        # and reads a plan only when a new one is published (polling the store every 10 ms
        # took CPU from the training ranks on a small machine: docs/benchmarks-runtime.md).
        watch = GenerationWatch(host, int(port))
        seen, last_shutdown_check = -1, 0.0
        while True:
            now = time.monotonic()
            if now - last_shutdown_check >= SPARE_SHUTDOWN_CHECK_S:
                last_shutdown_check = now
                if store.check([P.KEY_SHUTDOWN]):
                    sys.exit(0)  # a spare the job ended without
            if watch.ok:
                gen = watch.latest
            else:  # the watch's connection failed: poll, as it would
                gen = int(store.get(P.KEY_GEN)) if store.check([P.KEY_GEN]) else -1
            if gen > seen:
                seen = gen
                plan = P.Plan.decode(store.get(P.plan_key(gen)))
                if self.slot in plan.members:
                    self.rank, self.world = plan.members.index(self.slot), len(plan.members)
                    if plan.shards != 1:
                        raise TransparentError("transparent mode runs plain data parallel "
                                               "(--shards 1)")
                    # What torchrun's workers find in their environment, for the script's
                    # code after this call (a spare learns its rank only here).
                    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(self.rank), \
                        str(self.world)
                    return
            if watch.ok:
                watch.wait_beyond(seen, SPARE_SHUTDOWN_CHECK_S)
            else:
                time.sleep(0.01)

    def get_rank(self, group: Any = None) -> int:
        """``torch.distributed.get_rank``."""
        return self.rank

    def get_world_size(self, group: Any = None) -> int:
        """``torch.distributed.get_world_size``."""
        return self.world

    def is_initialized(self) -> bool:
        """``torch.distributed.is_initialized``."""
        return self.initialized

    def new_group(self, ranks: Any = None, *_args: Any, **_kwargs: Any) -> Any:
        """``torch.distributed.new_group``: the world group (the only one replaced)."""
        if ranks is not None and sorted(ranks) != list(range(self.world)):
            raise TransparentError("new_group over a subset of the ranks is not supported "
                                   "in transparent mode")
        return None

    def barrier(self, *_args: Any, **_kwargs: Any) -> None:
        """``torch.distributed.barrier``: nothing (the step boundary synchronises)."""

    def destroy_process_group(self, *_args: Any, **_kwargs: Any) -> None:
        """``torch.distributed.destroy_process_group``: the runtime owns the groups."""

    def unsupported(self, name: str) -> Callable[..., Any]:
        """A ``torch.distributed`` call the transparent mode does not replace."""
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise TransparentError(f"torch.distributed.{name} is not supported in "
                                   "transparent mode (use model-aware mode: runtime.Job)")
        return refuse

    # ------------------------------------------------------------- discovery
    def add_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """Register an optimizer the script built; its ``step`` becomes the boundary (the
        last of the optimizers' in a step). One built once training has started cannot
        join the state a replacement receives: refused."""
        if self.job is not None:
            raise TransparentError(
                "an optimizer was built after training started (after the first batch of "
                "the training DataLoader): transparent mode discovers the optimizers "
                "before it, so this one's state could not move to a replacement")
        raw = opt.step
        self.raw_steps[id(opt)] = raw
        self.optimizers.append(opt)

        def step(this: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
            return self.on_step(this, closure)

        # A bound method, as LRScheduler expects (it rewraps ``step.__func__``).
        opt.step = types.MethodType(step, opt)  # type: ignore[method-assign]

    def add_scheduler(self, sched: Any) -> None:
        """Register an LR scheduler the script built."""
        self.schedulers.append(sched)

    def add_scaler(self, scaler: Any) -> None:
        """Register a ``torch.amp.GradScaler`` the script built (enabled: a disabled one
        has no state). Its state (scale, growth tracker) moves with the rest; one built
        once training has started could not: refused."""
        if not scaler.is_enabled():
            return
        if self.job is not None:
            raise TransparentError(
                "a GradScaler was built after training started (after the first batch of "
                "the training DataLoader): its state could not move to a replacement")
        self.scalers.append(scaler)

    def scaler_update_allowed(self, scaler: Any) -> bool:
        """False (once per absorbed training step) when ``scaler.update()`` must leave the
        scale and growth tracker as they are: the step it follows was not taken."""
        key = id(scaler)
        if self.skip_scaler.get(key, 0) > 0:
            self.skip_scaler[key] -= 1
            return False
        return True

    def _skip_scaler_updates(self) -> None:
        for g in self.scalers:
            self.skip_scaler[id(g)] = self.skip_scaler.get(id(g), 0) + 1

    def grad_ready(self, ddp: ElasticDDP) -> None:
        """A gradient of ``ddp``'s module was accumulated: at the first one of a backward
        pass (outside ``no_sync``), have :meth:`on_backward_end` run when it ends (DDP's
        own mechanism: a callback queued on the autograd engine)."""
        if self._backward_queued or not ddp.syncing:
            return
        self._backward_queued = True

        def ended() -> None:
            self._backward_queued = False
            self.on_backward_end()

        torch.autograd.Variable._execution_engine.queue_callback(ended)

    def scheduler_step_allowed(self, sched: Any) -> bool:
        """False (once per absorbed update of its optimizer) when the script's next
        ``sched.step()`` must not run: the update it follows was not taken."""
        key = id(getattr(sched, "optimizer", None))
        if self.skip_sched.get(key, 0) > 0:
            self.skip_sched[key] -= 1
            return False
        return True

    def _skip_scheduler_of(self, opt: torch.optim.Optimizer) -> None:
        self.skip_sched[id(opt)] = self.skip_sched.get(id(opt), 0) + 1

    def _ends_step(self, opt: torch.optim.Optimizer) -> bool:
        """Note ``opt.step()``; True when it is the last optimizer of the training step
        (every optimizer the script built has now stepped once since the last boundary)."""
        if any(o is opt for o in self._stepped):
            idx = next(i for i, o in enumerate(self.optimizers) if o is opt)
            missing = [i for i, o in enumerate(self.optimizers)
                       if not any(o is s for s in self._stepped)]
            raise TransparentError(
                f"optimizer {idx} (of {len(self.optimizers)}, in construction order) was "
                f"stepped twice before optimizer(s) {missing} stepped once: transparent "
                "mode needs every optimizer the script built stepped once per training "
                "step (the step boundary is the last of them)")
        self._stepped.append(opt)
        if len(self._stepped) < len(self.optimizers):
            return False
        self._stepped = []
        return True

    def position_now(self) -> dict[str, Any]:
        """The training loader's position now."""
        epoch = None
        if self.train_loader is not None:
            s = _distributed_sampler(self.train_loader)
            epoch = s.epoch if s is not None else None
        return {"iters": self.loader_iters, "fetched": self.loader_fetched, "epoch": epoch}

    def _build_job(self) -> TransparentJob:
        if len(self.modules) != 1:
            raise TransparentError(
                f"transparent mode needs one DistributedDataParallel module, found "
                f"{len(self.modules)}")
        if not self.optimizers:
            raise TransparentError("transparent mode needs an optimizer, found none")
        # One optimizer is moved as it is; several as one (_Optimizers), which Job handles
        # through the same calls (state_dict, load_state_dict, zero_grad, step hooks).
        opt = self.optimizers[0] if len(self.optimizers) == 1 else cast(
            torch.optim.Optimizer, _Optimizers(self.optimizers))

        def raw() -> Any:
            if self._stepping is None:
                return None  # the update is skipped (GradScaler: inf/NaN gradients)
            return self.raw_steps[id(self._stepping)]()

        job = TransparentJob(model=self.modules[0], optimizer=opt,
                             scheduler=_Schedulers(self.schedulers, self.scalers)
                             if self.schedulers or self.scalers
                             else None,
                             sampler=self.position, config=JobConfig(seed=0),
                             raw_step=raw, before_form=self._before_form)
        self.job = job
        return job

    # ------------------------------------------------------------- data
    def iterate(self, loader: DataLoader[Any], orig_iter: Callable[[Any], Any]) -> Iterator[Any]:
        """The training loader's iterator: joins the job at its first batch (a fresh
        process: the state comes in here), places a replacement at the job's position
        and counts the batches fetched."""
        if self.managed and self.job is None and self.undiscoverable is None:
            self._join_first(at_step=False)
        self.loader_iters += 1
        self.loader_fetched = 0
        r = self.resume
        if r is not None and self.loader_iters < r["iters"]:
            return  # an iteration the job had finished before this process came in
        if r is not None and self.loader_iters > r["iters"]:  # placed before any batch
            self.resume = None
            self._apply_held()
            r = None
        skip = 0
        if r is not None and self.loader_iters == r["iters"]:
            self.resume = None
            s = _distributed_sampler(loader)
            if s is not None and r["epoch"] is not None and s.epoch != r["epoch"]:
                raise TransparentError(
                    f"the replacement's loader is at epoch {s.epoch} where the job is at "
                    f"epoch {r['epoch']}: the script's loop is not placed by its loader")
            skip = int(r["fetched"])
            if not skip:
                self._apply_held()  # before iter(): it draws the loader's base seed
        it = orig_iter(loader)
        if skip:
            self._apply_held()
            from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

            if isinstance(it, _SingleProcessDataLoaderIter):
                for _ in range(skip):  # indices only: no batch is loaded
                    it._next_index()
                it._num_yielded += skip
            else:
                for _ in range(skip):
                    next(it)
            self.loader_fetched = skip
        for batch in it:
            self.loader_fetched += 1
            yield batch

    def _apply_held(self) -> None:
        """At the replacement's place in the data: the state the script's code between
        its start and here may have changed (per-epoch scheduler steps of the iterations
        it skipped), and the RNG states of the rank it replaces."""
        held, self.held = self.held, None
        if held is None:
            return
        if held["schedulers"] is not None:
            _Schedulers(self.schedulers, self.scalers).load_state_dict(held["schedulers"])
        groups = [g for o in self.optimizers for g in o.param_groups]
        for g, hyper in zip(groups, held["groups"], strict=True):
            g.update(hyper)
        if held["rng"] is not None:
            _set_rng_states(held["rng"])

    # ------------------------------------------------------------- membership
    def _join_first(self, *, at_step: bool) -> None:
        """Become a member (the first time): build the Job and join its generation."""
        job = self._build_job()
        assert job._m is not None
        m = job._m
        if at_step:
            self.undiscoverable = "no DataLoader with a DistributedSampler before the " \
                "first optimizer step (a custom iterator)"
        m.store.set(P.KEY_TRANSPARENT, "live" if self.undiscoverable is None
                    else f"rollback: {self.undiscoverable}")
        job._join(0)
        plan = m.plan(job.gen)
        if job.rank != self.rank or job.world_size != self.world:
            raise TransparentError(f"{self.slot} was rank {self.rank} of {self.world}, "
                                   f"the job placed it at {job.rank} of {job.world_size}")
        if plan.mode.from_checkpoint and m.store.check([P.transparent_at_key(plan.gen)]):
            # Survivors whose scripts are past the checkpoint (see _before_form).
            self.resume = json.loads(m.store.get(P.transparent_at_key(plan.gen)))["pos"]
        self.held = {
            "schedulers": _Schedulers(self.schedulers, self.scalers).state_dict()
            if self.schedulers or self.scalers
            else None,
            "groups": [{k: v for k, v in g.items() if k != "params"}
                       for o in self.optimizers for g in o.param_groups],
            "rng": self._rng_of(self.rank, job.step) if plan.mode in (
                P.PlanMode.LIVE, P.PlanMode.MOVE) else None,
        }
        if at_step or self.resume is None:
            self.held["rng"] = None
            self._apply_held()
        self._joined = True
        m.store.set(P.transparent_joined_key(self.slot), "1")
        self._begin()

    def _before_form(self, plan: P.Plan) -> None:
        """A member whose script has run steps, about to form a rollback generation: say
        where its script is (its data is not rewound), for a replacement to be placed
        there too."""
        if not self._joined or not plan.mode.from_checkpoint:
            return
        assert self.job is not None and self.job._m is not None
        calls = self._void_calls if self._void_calls is not None else self.calls
        self.job._m.store.set(P.transparent_at_key(plan.gen), json.dumps(
            {"calls": calls, "pos": self.position_now()}))

    def _rng_of(self, rank: int, step: int) -> dict[str, Any] | None:
        """Rank ``rank``'s RNG states at the boundary after ``step`` committed steps
        (None: never published that early -- the replacement's own, reached by the same
        deterministic start, are those)."""
        assert self.job is not None and self.job._m is not None
        store = self.job._m.store
        best: tuple[int, dict[str, Any]] | None = None
        for slot in (0, 1):
            key = P.transparent_rng_key(rank, slot)
            if store.check([key]):
                at, states = _decode_rng(store.get(key))
                if at <= step and (best is None or at > best[0]):
                    best = (at, states)
        return best[1] if best is not None else None

    def _publish_rng(self, boundary: int) -> None:
        """Before this rank's gradient can count (so before the step can commit): its RNG
        states now, which are those at the boundary after this step (the update draws no
        random numbers). Two alternating slots keep the previous boundary's too, for a
        step that is then abandoned. Written only when they changed."""
        states = _rng_states()
        if _same_rng(self._rng_published, states):
            return
        assert self.job is not None and self.job._m is not None
        # Not before the last commit's report has found this process unfenced: a rank of
        # an abandoned generation must not overwrite the live rank's published states.
        self.job._m.flush_report()
        if boundary != self._rng_boundary:  # a new boundary: the other slot
            self._rng_pubs += 1
            self._rng_boundary = boundary
        # (Several backward passes of one step publish the same boundary: the same slot,
        # so the two slots always hold the last two boundaries published.)
        self.job._m.store.set(P.transparent_rng_key(self.rank, self._rng_pubs % 2),
                              _encode_rng(boundary, states))
        self._rng_published = states

    def _begin(self) -> None:
        """The start of the next step (after a commit or a join)."""
        job = self.job
        assert job is not None and job._m is not None and job._faults is not None
        job._reduced = False
        job._abandoned = None
        job._agree = None
        job._faults.at_step_start(step=job.step, rank=job.rank, gen=job.gen)
        job._m.event("step")
        if job.rank == 0 and not job._move_seen:
            latest = job._m.latest_gen()
            if latest == job.gen + 1 and job._m.plan(latest).mode == P.PlanMode.MOVE:
                job._move_seen = True

    # ------------------------------------------------------------- the step boundary
    def on_backward_end(self) -> None:
        """The end of a backward pass through the DDP module (outside ``no_sync``): average
        the gradients over the group now, as DDP does, so that what the script does with
        them before ``optimizer.step()`` (clipping, logging a norm) sees the averaged
        gradient. A failure while they are in flight: the new group forms (a replacement
        receives the committed state) and this rank's own gradient, kept aside, is reduced
        again in it; after a rollback (or a newer state received) the step is absorbed."""
        if not self.managed or self._absorbing:
            return
        with torch.no_grad():  # (a transfer or rollback may load into the parameters)
            self._reduce_now()

    def _reduce_now(self) -> None:
        if self.job is None:
            if self.replay_to is None:
                self._first_step_without_loader()
            if self.replay_to is not None:
                return  # replaying: nothing is reduced
        job = self.job
        assert job is not None and job._m is not None
        m = job._m
        self._checkpoint_if_due()
        restore = self._gradients_in_buffers()
        if job._move_seen:  # a move (drain, warning) agreed at the last commit
            job._move_seen = False
            job._join(job.gen + 1)  # a drained rank sends its state and leaves here
            restore()
            self._begin()
        self._publish_rng(job.step + 1)
        committed = job.step
        while True:
            try:
                m.event("body_end")
                job._reduced = False
                job._abandoned = None
                job._reduce()
                job._complete_transfer()
                break
            except GenerationChanged as changed:
                m.event("void")
                self._void_calls = self.calls + 1  # this training step, to come
                try:
                    job._join(changed.gen)
                finally:
                    self._void_calls = None
                if job.rank != self.rank:
                    raise TransparentError(f"{self.slot} moved from rank {self.rank} "
                                           f"to {job.rank}") from None
                if job.step != committed or m.plan(job.gen).mode.from_checkpoint:
                    # The state came in newer (this rank was a step behind) or was
                    # rolled back: this step's update is not taken (nor the scheduler
                    # step after it); its gradients are zeroed, whatever the script
                    # still does with them.
                    for flat in job._reducer.flat:
                        flat.zero_()
                    self._absorbing = True
                    return
                restore()  # this rank's own gradient, into the new group
        self._reduced = True

    def on_step(self, opt: torch.optim.Optimizer, closure: Callable[[], Any] | None,
                *, update: bool = True) -> Any:
        """The script's ``optimizer.step()``: the update and the commit (the gradients were
        averaged at the end of the backward pass, :meth:`on_backward_end`). ``update``
        False: a ``GradScaler`` found inf/NaN gradients and skips ``opt``'s update (the same
        on every rank: the gradients are averaged); the step still counts, as an
        iteration of the script."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # A backward pass that raised never ran its end callback: queue afresh next time.
        self._backward_queued = False
        last = self._ends_step(opt)
        if not self.managed:
            self.calls += int(last)
            if update:
                self.raw_steps[id(opt)]()
            return loss
        if self.job is None and self.replay_to is None:
            self._first_step_without_loader()
        self.calls += int(last)
        if self.replay_to is not None:
            return self._replay(opt, last, loss)
        job = self.job
        assert job is not None and job._m is not None
        if not self._reduced and not self._absorbing:
            self.on_backward_end()  # no backward through the DDP module since the last step
        if self._absorbing:
            return self._absorb(opt, last, loss)
        job._complete_transfer()
        if not last:  # an optimizer before the last of the step: its update only
            if update:
                self.raw_steps[id(opt)]()
            return loss
        self._stepping = opt if update else None
        job._optimizer_step()
        job.step += 1
        self._reduced = False
        self.position.committed = self.position_now()
        now = time.perf_counter()
        # Checkpoints and moves wait for the next boundary (_checkpoint_if_due, the move in
        # on_backward_end): the script steps its scheduler after this returns, and the
        # state they carry must be the one a replacement continues from.
        ckpt, job._ckpt = job._ckpt, None
        try:
            job._after_commit(now - self._t_commit)
        finally:
            job._ckpt = ckpt
        self._t_commit = now
        self._ckpt_pending = True
        self._begin()
        return loss

    def _absorb(self, opt: torch.optim.Optimizer, last: bool, loss: Any) -> Any:
        """This optimizer's update is not taken (see :meth:`on_backward_end`); after the
        last optimizer of the step, the next step begins."""
        self._skip_scheduler_of(opt)
        if not last:
            return loss
        self._skip_scaler_updates()
        self._absorbing = False
        self.position.committed = self.position_now()
        self._begin()
        return loss

    def _checkpoint_if_due(self) -> None:
        """The checkpoint of the last committed step, if one is due (see :meth:`on_step`)."""
        job = self.job
        assert job is not None
        if not self._ckpt_pending:
            return
        self._ckpt_pending = False
        if job._ckpt is not None and job.rank == 0 and job._ckpt.due(job.step):
            job._ckpt.submit(job.state_dict(), job.step, attempt=job.gen)

    def _gradients_in_buffers(self) -> Callable[[], None]:
        """Make every gradient a view into the reducer's flat buffers (copying what the
        script's backward left), and return a function that puts the local, unreduced
        gradient back into them: an allreduce cut short by a failure may have overwritten
        them, and the retry in the new group needs it.

        A script's ``zero_grad()`` sets the gradients to None, so backward leaves new
        tensors each step; once copied and replaced by the views nothing else holds them,
        so they are kept as that local gradient instead of cloning the buffers (a copy of
        every gradient a step: docs/benchmarks-runtime.md §8). Gradients that already were
        the views (``zero_grad(set_to_none=False)``) are cloned, as before."""
        assert self.job is not None
        red = self.job._reducer
        first: dict[int, torch.Tensor | None] | None = None
        if not red.built:
            # build() points every gradient at its (zeroed) view: what backward left is
            # read before.
            first = {id(p): p.grad for p in self.job.model.parameters()}
            red.build()
        # (buffer, offset, size, local gradient): restored by position, into the buffers
        # current then -- a join renews them (GradientReducer.renew), and the abandoned
        # ones must never be written again.
        kept: list[tuple[int, int, int, torch.Tensor | None]] = []
        in_place = False
        for i, (flat, ps) in enumerate(zip(red.flat, red.flat_params, strict=True)):
            off = 0
            for p in ps:
                n = p.numel()
                view = flat[off:off + n]
                g = p.grad if first is None else first[id(p)]
                if g is None:
                    view.zero_()
                    kept.append((i, off, n, None))
                elif g.data_ptr() != view.data_ptr():
                    view.copy_(g.reshape(-1))
                    kept.append((i, off, n, g))
                else:
                    in_place = True
                p.grad = view.view_as(p)
                off += n
        if in_place:
            saved = [f.clone() for f in red.flat]

            def restore_flat() -> None:
                for flat, copy in zip(red.flat, saved, strict=True):
                    flat.copy_(copy)

            return restore_flat

        def restore_kept() -> None:
            for i, off, n, g in kept:
                dst = red.flat[i][off:off + n]
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g.reshape(-1))

        return restore_kept

    def _first_step_without_loader(self) -> None:
        """The first optimizer step of a process that has not joined at a training
        loader's first batch: the data position is not discoverable. Initial members join
        now (the job then recovers by rollback only); a replacement replays the script's
        steps up to where the job is (see :meth:`_replay`)."""
        assert P.ENV_STORE in os.environ
        host, _, port = os.environ[P.ENV_STORE].rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
        gen = int(store.get(P.KEY_GEN))
        plan = P.Plan.decode(store.get(P.plan_key(gen)))
        if plan.mode == P.PlanMode.START:
            self._join_first(at_step=True)
            return
        if not plan.mode.from_checkpoint:
            raise TransparentError(
                f"{self.slot} was called in by a {plan.mode} recovery, but this script's data "
                "position is not discoverable (no DataLoader with a DistributedSampler)")
        # Survivors (members whose scripts ran steps) write where they are before they
        # form the groups (_before_form), which they cannot do without this process: wait
        # for it, following newer generations (a survivor may die meanwhile).
        deadline = time.monotonic() + JobConfig().regroup_timeout_s
        while True:
            others = [s for s in plan.members if s != self.slot]
            if not any(store.check([P.transparent_joined_key(s)]) for s in others):
                self.replay_to = int(plan.ckpt_step or 0)  # nobody is past the checkpoint
                return
            if store.check([P.transparent_at_key(gen)]):
                at = json.loads(store.get(P.transparent_at_key(gen)))
                self.replay_to = int(at["calls"])
                return
            latest = int(store.get(P.KEY_GEN))
            if latest != gen:
                gen, plan = latest, P.Plan.decode(store.get(P.plan_key(latest)))
                if not plan.mode.from_checkpoint or self.slot not in plan.members:
                    raise TransparentError(f"{self.slot}: generation {gen} is a {plan.mode} "
                                           "plan, this script's state is not discoverable")
            if time.monotonic() > deadline:
                raise TransparentError(f"{self.slot}: the survivors never said where they "
                                       f"are (generation {gen})")
            time.sleep(0.01)

    def _replay(self, opt: torch.optim.Optimizer, last: bool, loss: Any) -> Any:
        """A replacement of a job whose data position is not discoverable: absorb the
        script's optimizer steps (no reduction, no update; the forward and backward passes
        do run: the script's own iterator advances only through them) until it is where
        the survivors are, then join (the rollback loads the checkpoint)."""
        assert self.replay_to is not None
        self._skip_scheduler_of(opt)
        if last:
            self._skip_scaler_updates()
        if not last or self.calls < self.replay_to:
            return loss
        self.replay_to = None
        self._join_first(at_step=True)
        self.position.committed = self.position_now()
        return loss

    # ------------------------------------------------------------- the end
    def finish(self) -> None:
        """After the script: the end-of-job protocol of :meth:`Job.steps` (every member's
        finished mark, a generation published meanwhile joined, rank 0's done mark)."""
        job = self.job
        if self._finished or job is None or job._m is None:
            return
        self._finished = True
        self._checkpoint_if_due()
        while job._end_of_loop():
            pass
        job._end_of_job()


# ----------------------------------------------------------------- installation
def install() -> Transparent:
    """Create the process's :class:`Transparent` and replace the constructors and calls
    it discovers the training state through (idempotent). Call before the script runs."""
    global _RT
    if _RT is not None:
        return _RT
    rt = Transparent()
    _RT = rt
    # torchrun sets LOCAL_RANK before the script starts (scripts pick their device with
    # it): the device the launcher gave this process (cuda:N -> N), 0 on CPU.
    device = os.environ.get(P.ENV_DEVICE, "cpu")
    os.environ.setdefault("LOCAL_RANK", device.split(":")[1] if ":" in device else "0")
    for name in ("init_process_group", "get_rank", "get_world_size", "is_initialized",
                 "new_group", "barrier", "destroy_process_group"):
        setattr(dist, name, getattr(rt, name))
    for name in ("all_reduce", "all_gather", "broadcast", "reduce", "all_to_all",
                 "reduce_scatter", "send", "recv", "all_gather_object",
                 "broadcast_object_list"):
        setattr(dist, name, rt.unsupported(name))
    torch.nn.parallel.DistributedDataParallel = ElasticDDP  # type: ignore[misc,assignment]
    torch.nn.parallel.distributed.DistributedDataParallel = (  # type: ignore[misc]
        ElasticDDP)  # type: ignore[assignment]

    opt_init = torch.optim.Optimizer.__init__

    def optimizer_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        opt_init(self, *args, **kwargs)
        rt.add_optimizer(self)

    torch.optim.Optimizer.__init__ = optimizer_init  # type: ignore[method-assign]

    from torch.optim.lr_scheduler import LRScheduler

    sched_init, sched_step = LRScheduler.__init__, LRScheduler.step

    def scheduler_init(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
        sched_init(self, *args, **kwargs)  # its first step() runs in there: never skipped
        rt.add_scheduler(self)

    def scheduler_step(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
        # Not an attribute of the scheduler: its state_dict() is its whole __dict__.
        if any(s is self for s in rt.schedulers) and not rt.scheduler_step_allowed(self):
            return
        sched_step(self, *args, **kwargs)

    LRScheduler.__init__ = scheduler_init  # type: ignore[method-assign]
    LRScheduler.step = scheduler_step  # type: ignore[method-assign]

    from torch.amp.grad_scaler import GradScaler

    scaler_init, scaler_update = GradScaler.__init__, GradScaler.update

    def grad_scaler_init(self: GradScaler, *args: Any, **kwargs: Any) -> None:
        scaler_init(self, *args, **kwargs)
        rt.add_scaler(self)

    def maybe_opt_step(self: GradScaler, optimizer: torch.optim.Optimizer,
                       optimizer_state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        # GradScaler's own rule (torch.amp.grad_scaler): no update where a gradient is
        # inf/NaN -- which, without this, would be no step boundary either.
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        if any(o is optimizer for o in rt.optimizers):
            rt.on_step(optimizer, None, update=False)
        return None

    def grad_scaler_update(self: GradScaler, new_scale: Any = None) -> None:
        if not any(g is self for g in rt.scalers) or rt.scaler_update_allowed(self):
            scaler_update(self, new_scale)
            return
        kept = self.state_dict()
        scaler_update(self, new_scale)  # (it also ends the step's per-optimizer records)
        self.load_state_dict(kept)

    GradScaler.__init__ = grad_scaler_init  # type: ignore[method-assign]
    GradScaler._maybe_opt_step = maybe_opt_step  # type: ignore[method-assign]
    GradScaler.update = grad_scaler_update  # type: ignore[method-assign]

    loader_iter = DataLoader.__iter__

    def iterate(self: DataLoader[Any]) -> Any:
        if _distributed_sampler(self) is None:
            return loader_iter(self)
        if rt.train_loader is None:
            rt.train_loader = self
        if rt.train_loader is not self:
            return loader_iter(self)
        return rt.iterate(self, loader_iter)

    DataLoader.__iter__ = iterate  # type: ignore[method-assign]
    return rt


def run_script(argv: list[str]) -> None:
    """Run ``argv[0]`` as ``__main__`` with ``argv`` as ``sys.argv`` under the transparent
    runtime, then the end-of-job protocol."""
    import runpy

    if not argv:
        raise ConfigError("usage: python -m runtime.transparent SCRIPT [ARGS...]")
    script = os.path.abspath(argv[0])
    if not os.path.isfile(script):
        raise ConfigError(f"script {argv[0]!r} does not exist")
    rt = install()
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    rt.finish()
    # The script is over and every step is committed. The runtime's groups of earlier
    # generations (a drain, a move) may still hold gloo threads that are joinable when the
    # interpreter tears torch down: "terminate called without an active exception", and a
    # job whose every step was committed ended "failed" (seen once in a clean-clone run).
    # So the script's own exit handlers run, then the process leaves without the teardown,
    # as runtime.exitguard does for a blocked wait.
    atexit._run_exitfuncs()
    exitguard.leave(0)
