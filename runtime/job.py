"""The worker side: a data-parallel replica that the supervisor can regroup at any time.

A training script hands its model, optimizer (and optionally scheduler and stateful
sampler) to :class:`Job` and iterates ``job.steps(total)``; the loop body does the
forward and backward pass only. After each body the runtime averages the gradients over
the current process group and applies the update, so it decides when an update is
*committed* and can always abandon a step in flight without applying it.

The pieces, along the lines torchft draws: :mod:`runtime.membership` (generations,
process groups, waiting without blocking), :mod:`runtime.reduction` (gradient buffers
and their reduction), :mod:`runtime.transfer` (commit vote and state transfer),
:mod:`runtime.checkpointing` and :class:`runtime.faults.FaultInjector`. :class:`Job`
sequences them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime import protocol as P
from runtime.checkpointing import Checkpointer, CommittedStep
from runtime.errors import CheckpointError, CollectiveError, ConfigError, GenerationChanged
from runtime.faults import FaultInjector, decode_faults
from runtime.hsdp import (
    ElasticGroup,
    LocalShardStep,
    ShardReducer,
    clip_sharded_grad_norm_,
    group_of,
    install_void_backward,
    load_local_model,
    optimizer_state_to_dtensors,
    reset_void_step,
    to_local_state,
)
from runtime.membership import Membership
from runtime.proc import set_parent_death_signal
from runtime.reduction import GradientReducer, stack_sparse, unstack_sparse
from runtime.sharded_checkpoint import read_sharded_checkpoint
from runtime.transfer import StateTransfer

__all__ = ["Job", "JobConfig", "local_device", "stack_sparse", "unstack_sparse"]

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
    # How long a member that has finished waits for its peers' finished marks before it
    # leaves (the end-of-job barrier; a dead peer ends the wait earlier, see
    # Membership.await_finished).
    finish_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError("checkpoint_every must be >= 0")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError("checkpoint_every needs checkpoint_dir")
        if not 0 < self.poll_interval_s <= 1:
            raise ConfigError("poll_interval_s must be in (0, 1]")
        if self.regroup_timeout_s <= 0 or self.collective_timeout_s <= 0 \
                or self.finish_timeout_s <= 0:
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
                 config: JobConfig | None = None, mesh: Any = None,
                 warmup: Callable[[], None] | None = None) -> None:
        cfg = config or JobConfig()
        every = int(os.environ.get(P.ENV_CKPT_EVERY, cfg.checkpoint_every))
        timeout = float(os.environ.get(P.ENV_COLLECTIVE_TIMEOUT, cfg.collective_timeout_s))
        ckpt_dir = os.environ.get(P.ENV_CKPT_DIR, cfg.checkpoint_dir)
        self.config = JobConfig(seed=cfg.seed, checkpoint_every=every,
                                checkpoint_dir=ckpt_dir if every else cfg.checkpoint_dir,
                                poll_interval_s=cfg.poll_interval_s,
                                regroup_timeout_s=cfg.regroup_timeout_s,
                                collective_timeout_s=timeout,
                                state_buffers_per_param=cfg.state_buffers_per_param,
                                finish_timeout_s=cfg.finish_timeout_s)
        self.model = model
        self.optimizer = optimizer
        self._warmup = warmup
        self.scheduler = scheduler
        self.sampler = sampler
        self.step = 0
        self.rank = 0
        self.world_size = 1
        self.slot = os.environ.get(P.ENV_SLOT, "local")
        params = [p for p in model.parameters()]
        self.device = params[0].device if params else torch.device("cpu")
        self._reducer = GradientReducer(model, self.device)
        # HSDP: the model is sharded with fully_shard over ``mesh`` (runtime.hsdp.shard_mesh)
        self._elastic: ElasticGroup | None = None
        self._shard_reducer: ShardReducer | None = None
        self._local_step: LocalShardStep | None = None
        self.shards = 1
        if mesh is not None:
            self._elastic = group_of(mesh)
            self._shard_reducer = ShardReducer(model, self.device)
            self._local_step = LocalShardStep(optimizer)
            self.shards = self._elastic.size()
            self._elastic.waiter = lambda w: w.wait()  # alone; a member waits its way
        self._m: Membership | None = None
        self._transfer: StateTransfer | None = None
        self._ckpt: Checkpointer | None = None
        self._faults: FaultInjector | None = None
        self._committed: CommittedStep | None = None
        addr = os.environ.get(P.ENV_STORE)
        if addr:
            set_parent_death_signal()
            host, _, port = addr.rpartition(":")
            self._m = Membership(slot=self.slot, store_addr=(host, int(port)),
                                 use_nccl=self.device.type == "cuda",
                                 poll_interval_s=self.config.poll_interval_s,
                                 regroup_timeout_s=self.config.regroup_timeout_s,
                                 collective_timeout_s=self.config.collective_timeout_s,
                                 current_step=lambda: self.step)
            self._transfer = StateTransfer(
                membership=self._m, model=model, optimizer=optimizer, device=self.device,
                state_dict=self.state_dict, load_state_dict=self.load_state_dict,
                buffers_per_param=self.config.state_buffers_per_param,
                load_optimizer=self._load_optimizer)
            self._faults = FaultInjector(
                decode_faults(os.environ.get(P.ENV_FAULTS)), store=self._m.store,
                slot=self.slot, signal_file=os.environ.get(P.ENV_SIGNAL_FILE),
                control_dir=os.environ.get(P.ENV_CONTROL_DIR))
            run_dir = os.environ.get(P.ENV_RUN_DIR)
            if run_dir:
                self._committed = CommittedStep(Path(run_dir) / P.COMMITTED_FILE)
            if self._elastic is not None:
                membership = self._m
                install_void_backward(model, self._elastic,
                                      on_void=lambda: membership.event("backward_cut"))
            faults = self._faults
            faults.install(model=model, optimizer=optimizer,
                           where=lambda: (self.step, self.rank))
            if self.config.checkpoint_every and self.config.checkpoint_dir:
                member = self._m

                def before_rename(step: int) -> None:
                    # A fenced writer (its generation abandoned while it wrote) must not
                    # put its checkpoint in place: it exits, its temporary file unnamed.
                    member.exit_if_fenced()
                    faults.during_checkpoint(step=step, rank=self.rank)

                self._ckpt = Checkpointer(
                    every=self.config.checkpoint_every,
                    directory=Path(self.config.checkpoint_dir), store=self._m.store,
                    before_rename=before_rename,
                    shard=(self._elastic.rank(), self.shards) if self._elastic is not None
                    and self.shards > 1 else None, model=model, optimizer=optimizer)
        self._was_member = False
        self._warmed = False
        self._move_seen = False
        self._sampler_snapshot: Any = None
        self._step_times: list[float] = []
        self._regroup_timing: dict[str, float] | None = None
        # The step's gradient reduction: done (by the body through reduce_gradients, or
        # after it), or abandoned because the membership changed while it was in flight.
        self._reduced = False
        self._abandoned: GenerationChanged | None = None
        # HSDP: this rank's move flag for the replica group's commit agreement, pending
        # until it rides on the clipping norm's allreduce or _finish_step runs it alone.
        self._agree: float | None = None

    # ----------------------------------------------------------------- public API
    @property
    def managed(self) -> bool:
        """True when launched by the supervisor (fault tolerant), False when standalone."""
        return self._m is not None

    @property
    def gen(self) -> int:
        """The membership generation this replica belongs to (-1: none yet)."""
        return self._m.gen if self._m is not None else -1

    @property
    def step_abandoned(self) -> bool:
        """True once the step in flight is known to be abandoned (the membership changed
        while it ran: with HSDP, a collective of FSDP2 found a peer gone). Everything the
        body still computes in this step is discarded, so a body with several
        micro-batches may stop early (``if job.step_abandoned: break``): the survivors'
        new group forms as soon as the slowest of them is out of its body. Reading it
        costs nothing (an attribute; no store or collective)."""
        if self._elastic is not None and self._elastic.abandoned is not None:
            return True
        return self._abandoned is not None

    def state_dict(self) -> dict[str, Any]:
        """Return the full training state: what a replacement needs to continue exactly
        (HSDP: this rank's shards of the model and optimizer state, as plain tensors)."""
        model, opt = self.model.state_dict(), self.optimizer.state_dict()
        if self._elastic is not None:
            model, opt = to_local_state(model), to_local_state(opt)
        return {
            "model": model,
            "optimizer": opt,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "step": self.step,
            "seed": self.config.seed,
        }

    def load_state_dict(self, state: dict[str, Any], *, model_in_place: bool = False) -> None:
        """Install ``state`` (from :meth:`state_dict`, a transfer or a checkpoint); an
        ``optimizer`` entry of None leaves the optimizer as it is."""
        if not model_in_place:
            if self._elastic is not None:
                load_local_model(self.model, state["model"])
            else:
                self.model.load_state_dict(state["model"])
        if state["optimizer"] is not None:
            self._load_optimizer(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        if self._elastic is not None:
            state = optimizer_state_to_dtensors(self.optimizer, state)
        self.optimizer.load_state_dict(state)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Average the gradients (:meth:`reduce_gradients`) and clip their global 2-norm
        to ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` does; return the norm
        before clipping (NaN when the step was abandoned: the body should go on or
        ``continue``, the step is discarded). With HSDP the norm is of the whole
        gradient, its shards' squares summed over the replica group through the
        runtime's shard group (so a peer's death cannot block or raise here)."""
        if not self.reduce_gradients():
            return torch.tensor(float("nan"))
        if self._elastic is not None:
            norm, flag = clip_sharded_grad_norm_(self.model, max_norm, self._elastic,
                                                 flag=self._agree)
            if self._elastic.abandoned is not None:
                return torch.tensor(float("nan"))
            if flag is not None:  # the replica group's commit agreement (see _agree)
                self._move_seen = self._move_seen or flag > 0
                self._agree = None
            return norm
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def reduce_gradients(self) -> bool:
        """Average the step's gradients over the group now, inside the loop body.

        Call it after the last backward pass of the step (all micro-batches) when the body
        needs the averaged gradient before the update: to clip it
        (``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` then computes the
        same norm on every rank, the norm a failure-free run computes), to log its norm,
        or to skip a step on a non-finite one. Without it the runtime reduces after the
        body. Returns True when the gradients are averaged; False when the membership
        changed while they were in flight: the step is abandoned (it runs again in the
        new group, from the same committed state) and whatever the body still does with
        these gradients is discarded. Calling it again in the same step does nothing.
        Standalone (world size 1) there is nothing to average: True.
        """
        if self._elastic is not None and self._elastic.abandoned is not None:
            self._abandoned = self._elastic.abandoned  # an FSDP collective saw the change
        if self._m is None or self._reduced or self._abandoned is not None:
            return self._abandoned is None
        try:
            self._reduce()
        except GenerationChanged as changed:
            self._abandoned = changed
            self._m.event("abandoned")
            return False
        return True

    def autocast(self, dtype: torch.dtype = torch.bfloat16) -> torch.autocast:
        """``torch.autocast`` for this replica's device (bf16 by default): the forward
        pass in reduced precision, parameters, gradients and optimizer state in their own
        dtype (fp32), so gradients are reduced and the update applied in full precision."""
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def steps(self, total: int) -> Iterator[int]:
        """Yield the index of each step to run until ``total`` steps are committed.

        The body must run the forward and backward pass of that step (gradients are
        zeroed before each yield), for as many micro-batches as it likes (gradient
        accumulation: backward passes add up; nothing is reduced between them). It may
        call :meth:`reduce_gradients` and then clip; the runtime applies
        ``optimizer.step()`` and ``scheduler.step()`` after it. The same index can be
        yielded again when the step was abandoned because the membership changed; the
        body must not keep side effects of an abandoned step. In a spare process this
        blocks until the spare is called in, and it exits the process if the job ends
        without needing it.
        """
        if total < 0:
            raise ConfigError("total must be >= 0")
        if self._m is None:
            yield from self._standalone(total)
            return
        m = self._m
        assert self._faults is not None
        self._join(0)
        while True:
            while self.step < total:
                t0 = time.perf_counter()
                self._begin_step()
                yield self.step
                try:
                    self._finish_step()
                except GenerationChanged as changed:
                    m.event("void")
                    if self._elastic is not None:
                        reset_void_step(self.model)  # wherever the void step stopped
                    if self.sampler is not None:
                        self.sampler.load_state_dict(self._sampler_snapshot)
                    self._join(changed.gen)
                    continue
                self._after_commit(time.perf_counter() - t0)
                if self._move_seen:
                    self._move_seen = False
                    self._join(self.gen + 1)
            if self._end_of_loop():
                continue
            break
        self._end_of_job()

    def _end_of_loop(self) -> bool:
        """The end-of-job protocol once every step is committed: this member's finished
        mark, then every member's awaited.  True iff a newer generation including this
        process was joined meanwhile (the caller goes on with it and ends again)."""
        m = self._m
        if m is None or self._faults is None:
            raise ConfigError("the end-of-job protocol needs a membership")
        self._complete_transfer()  # joined at the very end: nothing left to step
        if self.rank == 0 and self._regroup_timing is not None:
            # A generation that joined with every step already committed (a peer
            # died in the last step, after its gradient was in): it is complete, so
            # its recovery is too -- the supervisor records the outcome from this.
            self._mark_ready(self.step, self._mean_step_seconds())
        self._faults.at_loop_end(step=self.step, rank=self.rank)
        m.mark(P.finished_key(self.slot), str(self.step))
        # Nobody leaves while a peer may still be inside its last collective (see
        # Membership.await_finished): every member waits for every member's mark.
        missing = m.await_finished(m.plan(self.gen).members, self.config.finish_timeout_s)
        if missing and self._rejoin_at_the_end():
            return True
        if missing:
            log.warning("%s leaves without the finished mark of %s (after %.0f s at "
                        "most, or the membership changed)", self.slot,
                        ", ".join(missing), self.config.finish_timeout_s)
        return False

    def _end_of_job(self) -> None:
        """After the end-of-job protocol: the last checkpoint written out, then rank 0's
        done mark (the supervisor's sign that the job ended)."""
        if self._ckpt is not None:
            self._ckpt.wait()
        if self.rank == 0 and self._m is not None:
            self._m.mark(P.KEY_DONE, str(self.step))

    def _rejoin_at_the_end(self) -> bool:
        """After the loop: if a newer generation that includes this process was published
        while it waited for its peers' finished marks (a peer died before its mark, so
        the supervisor is recovering), withdraw the mark and join it -- this process holds
        the committed state the new members need (a spare, or a rollback), and the job is
        done only once that generation is. False: nothing newer to join."""
        assert self._m is not None
        m = self._m
        latest = m.latest_gen()
        if latest <= self.gen:
            return False
        plan = m.plan(latest)
        if self.slot not in plan.members + plan.donors:
            return False
        # A mark left standing would make the supervisor take this process's death in
        # the new generation for a member leaving after the end.
        m.store.delete_key(P.finished_key(self.slot))
        log.warning("%s: generation %d was published while finishing: joining it", self.slot,
                    latest)
        self._join(latest)
        return True

    # ----------------------------------------------------------------- standalone
    def _standalone(self, total: int) -> Iterator[int]:
        while self.step < total:
            self._begin_local()
            yield self.step
            self._optimizer_step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.step += 1

    def _begin_local(self) -> None:
        seed = _step_seed(self.config.seed, self.step, self.rank)
        torch.manual_seed(seed)
        random.seed(seed)
        if self._shard_reducer is not None:
            self._shard_reducer.zero(self.optimizer)
        else:
            self._reducer.zero(self.optimizer)
        self._reduced = False
        self._abandoned = None
        self._agree = None

    # ----------------------------------------------------------------- step
    def _begin_step(self) -> None:
        assert self._m is not None and self._faults is not None
        if not self._reducer.built and self._shard_reducer is None:
            self._reducer.build()
        self._begin_local()
        if self.sampler is not None:
            self._sampler_snapshot = self.sampler.state_dict()
        self._faults.at_step_start(step=self.step, rank=self.rank, gen=self.gen)
        self._m.event("step")
        if self.rank == 0 and not self._move_seen:
            # Only rank 0 polls for a pending move: it raises a flag inside the gradient
            # allreduce, so every rank learns of the move at the same committed step.
            latest = self._m.latest_gen()
            if latest == self.gen + 1 and self._m.plan(latest).mode == P.PlanMode.MOVE:
                self._move_seen = True

    def _reduce(self) -> None:
        """Launch the step's gradient reduction, wait for it and average."""
        assert self._m is not None and self._faults is not None
        m = self._m
        if self._shard_reducer is not None:
            self._reduce_sharded()
            return
        red = self._reducer.launch(m.pg, m.cpu_pg, move_flag=self._move_seen)
        if self._faults.in_collective(step=self.step, rank=self.rank):
            m.collective_failed(P.Phase.STEP, CollectiveError("injected collective error"))
        for w in red.works:
            m.wait(w, phase=P.Phase.STEP)
        if self._reducer.finish(red, self.world_size):
            self._move_seen = True
        self._reduced = True

    def _reduce_sharded(self) -> None:
        """HSDP: FSDP2 has averaged the gradient inside the replica group (reduce-scatter);
        average each shard over the replica groups. The replica group then has to agree
        that every shard made it (so that it commits the step on all its shards or on
        none) and a move flag raised by rank 0 has to reach every rank: a one-number
        allreduce in the shard group, which :meth:`clip_grad_norm_` folds into its norm's
        allreduce and :meth:`_finish_step` runs alone otherwise (:meth:`_agree_shards`)."""
        assert self._m is not None and self._faults is not None
        assert self._shard_reducer is not None and self._elastic is not None
        m = self._m
        if self._elastic.abandoned is not None:
            raise self._elastic.abandoned
        work, grads = self._shard_reducer.launch(m.sub["rep"], move_flag=self._move_seen)
        if self._faults.in_collective(step=self.step, rank=self.rank):
            m.collective_failed(P.Phase.STEP, CollectiveError("injected collective error"))
        m.wait(work, phase=P.Phase.STEP)
        move = self._shard_reducer.finish(grads, self.world_size // self.shards)
        self._agree = 1.0 if move else 0.0
        self._reduced = True

    def _agree_shards(self) -> None:
        """The replica group's commit agreement, when the body did not clip (see
        :meth:`_reduce_sharded`); raises GenerationChanged when a peer cannot agree."""
        if self._agree is None:
            return
        assert self._m is not None
        flag = torch.tensor([self._agree])  # control: on the gloo group, on CUDA too
        self._m.wait(self._m.sub_cpu["shard"].allreduce([flag]), phase=P.Phase.STEP)
        if float(flag[0]) > 0:
            self._move_seen = True
        self._agree = None

    def _finish_step(self) -> None:
        if self._m is not None:
            self._m.event("body_end")
        if self._elastic is not None and self._elastic.abandoned is not None:
            raise self._elastic.abandoned
        if self._abandoned is not None:
            raise self._abandoned  # the body's reduce_gradients saw the membership change
        if not self._reduced:
            self._reduce()
        self._agree_shards()
        self._complete_transfer()
        self._optimizer_step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1

    def _optimizer_step(self) -> None:
        # HSDP: on the local shards (runtime.hsdp.LocalShardStep: same numbers, without
        # DTensor's per-kernel dispatch).
        if self._local_step is not None:
            self._local_step.step()
        else:
            self.optimizer.step()

    def _after_commit(self, seconds: float) -> None:
        assert self._m is not None
        if self.rank == 0:
            # First, before the checkpoint's copy and the report: the generation's
            # committed step, for the lost steps should every member die right now.
            self._m.note_committed(self.step)
        self._m.event("commit")
        self._step_times.append(seconds)
        # Checkpoint writers: rank 0; with HSDP every rank of replica group 0, its shard.
        if self._ckpt is not None and self.rank < self.shards and self._ckpt.due(self.step):
            self._ckpt.submit(self.state_dict(), self.step, attempt=self.gen)
        if self.rank != 0:
            return
        # A rank of an abandoned generation (fenced while frozen or cut off, now back)
        # must not write the committed step or progress: it exits instead (the report's
        # fence check, on the reporting thread: Membership.report_commit).
        step, committed = self.step, self._committed
        window = self._step_times[-20:]

        def write_committed() -> None:
            if committed is not None:
                committed.write(step)

        self._m.report_commit(write_committed, P.KEY_PROGRESS, json.dumps(
            {"step": step, "step_seconds": sum(window) / len(window), "t": time.time(),
             "gen": self.gen, "slot": self.slot}))
        if self._regroup_timing is not None:
            self._mark_ready(self.step, seconds)

    def _mean_step_seconds(self) -> float:
        window = self._step_times[-20:]
        return sum(window) / len(window) if window else 0.0

    def _mark_ready(self, step: int, seconds: float) -> None:
        """Rank 0: this generation has completed its first step (or, joined at the end,
        has nothing left to step): the recovery that formed it is over."""
        assert self._m is not None and self._regroup_timing is not None
        timing = self._regroup_timing | {"first_step": time.time(), "step": step,
                                         "step_seconds": seconds}
        self._m.mark(P.ready_key(self.gen), json.dumps(timing))
        self._regroup_timing = None

    def _complete_transfer(self) -> None:
        assert self._transfer is not None
        t_done = self._transfer.complete()
        if t_done is not None:
            assert self._m is not None
            self._m.event("transfer_done", t_done)
        if t_done is not None and self._regroup_timing is not None:
            self._regroup_timing["transferred"] = t_done

    # ----------------------------------------------------------------- membership
    def _join(self, min_gen: int) -> None:
        """Become a member of the newest generation ≥ ``min_gen`` and hold its state."""
        assert self._m is not None and self._transfer is not None
        m = self._m
        m.event("join")
        if self._was_member and self.rank == 0:
            # Its generation's last progress, for the failure's record (supervisor:
            # _emit_deaths) -- before the next generation can overwrite the progress.
            m.mark(P.committed_key(m.gen), str(self.step))
        if not self._was_member:
            self._transfer.preallocate()
            m.mark(P.waiting_key(self.slot), str(time.time()))
        while True:
            gen = m.await_gen(min_gen)
            t_seen = time.time()
            plan = m.plan(gen)
            participants = plan.members + plan.donors
            if self.slot not in participants:
                if self._was_member:
                    self._leave()
                self._warm_up()  # a spare: once, before it is called in
                min_gen = gen + 1
                continue
            # A likely sender builds what it sends, a likely receiver lays out where it
            # lands, while the groups form (see StateTransfer.speculate).
            prepare = self._transfer.speculate(
                plan, previous=m.plan(gen - 1).members if gen > 0 else [],
                has_state=self._was_member or self.slot in plan.donors)
            try:
                m.form_groups(gen, participants.index(self.slot), len(participants),
                              subgroups=self._subgroups(plan), meanwhile=prepare)
                if self._elastic is not None:
                    self._elastic.set_backend(m.sub["shard"])
                    self._elastic.waiter = lambda w: m.wait(w, phase=P.Phase.STEP)
                    self._elastic.checker = m.check_generation
                    self._elastic.on_abandon = lambda: m.event("abandoned")
                t_pg = time.time()
                m.event("groups")
                moved = self._sync(plan)
                t_sync = time.time()
                m.event("synced")
            except GenerationChanged as changed:
                min_gen = changed.gen
                continue
            if self.slot in plan.donors:
                self._complete_transfer()
                self._leave()
            self._was_member = True
            self._transfer.release_buffers()  # whatever the transfer did not use
            self.rank = plan.members.index(self.slot)
            self.world_size = len(plan.members)
            if plan.donors:  # the training group excludes the donors
                try:
                    m.form_groups(gen, self.rank, self.world_size, prefix="train")
                except GenerationChanged as changed:
                    min_gen = changed.gen
                    continue
            self._regroup_timing = {"seen": t_seen, "pg": t_pg, "synced": t_sync,
                                    "bytes": moved, "mode_" + plan.mode: 1.0}
            # This generation's own gradient buffers (runtime.reduction): a collective of
            # an older one that completes late cannot touch them.
            if self._reducer.built:
                self._reducer.renew()
            if self._shard_reducer is not None:
                self._shard_reducer.renew()
            if plan.mode == P.PlanMode.START and self._ckpt is not None \
                    and self.rank < self.shards \
                    and self.step == 0:
                # So that a rollback target exists from step 0 on.
                self._ckpt.submit(self.state_dict(), self.step, attempt=self.gen)
            return

    def _warm_up(self) -> None:
        """A spare, before it is called in: run the script's ``warmup`` (one forward and
        backward pass on a made-up batch) once and discard every effect of it.

        Why: a fresh process's first forward/backward costs several times a steady one
        (FSDP2's lazy initialisation, the allocator's first touch of every activation
        and gradient buffer, first calls of the kernels); paid after a failure it sat on
        the recovery's critical path, and the rest of the job waited for it in the first
        step's collectives. What is restored (and what cannot change): collectives are
        skipped (HSDP: the shard group rehearses, each all-gather and reduce-scatter
        completes at once on uninitialised memory; plain data parallel reduces after the
        body, not in it), every gradient is dropped and FSDP2's iteration state reset,
        the buffers, the RNG states and the sampler's position are put back; parameters
        are only read by a forward/backward, and no optimizer or scheduler step runs.
        The parameters and the optimizer state then come from the transfer (or a
        checkpoint) anyway."""
        if self._warmup is None or self._warmed:
            return
        self._warmed = True
        t0 = time.perf_counter()
        rng = torch.get_rng_state()
        py_rng = random.getstate()
        buffers = [b.detach().clone() for b in self.model.buffers()]
        sampler = self.sampler.state_dict() if self.sampler is not None else None
        if self._elastic is not None:
            self._elastic.rehearsal = True
        try:
            self._warmup()
        finally:
            if self._elastic is not None:
                self._elastic.rehearsal = False
                reset_void_step(self.model)
            self.model.zero_grad(set_to_none=True)
            self.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for b, saved in zip(self.model.buffers(), buffers, strict=True):
                    b.copy_(saved)
            torch.set_rng_state(rng)
            random.setstate(py_rng)
            if self.sampler is not None:
                self.sampler.load_state_dict(sampler)
        log.info("%s warmed up in %.0f ms", self.slot, (time.perf_counter() - t0) * 1e3)
        if self._m is not None:
            self._m.event("warmed_up")

    def _subgroups(self, plan: P.Plan) -> tuple[tuple[str, str, int, int], ...]:
        """HSDP: this member's replicate group (same shard, one rank per replica group)
        and shard group (its replica group), named ``rep`` and ``shard`` in ``m.sub``."""
        assert self._m is not None
        if plan.shards != self.shards:
            self._m.collective_failed(P.Phase.REGROUP, ConfigError(
                f"the job runs {plan.shards} shard(s) per replica group, this script "
                f"{self.shards} (pass mesh=runtime.hsdp.shard_mesh() to Job)"))
        if plan.shards == 1 or self.slot not in plan.members:
            return ()
        assert self._elastic is not None
        replica, shard = divmod(plan.members.index(self.slot), plan.shards)
        if shard != self._elastic.rank():
            self._m.collective_failed(P.Phase.REGROUP, ConfigError(
                f"{self.slot} holds shard {self._elastic.rank()}, planned at shard {shard}"))
        replicas = len(plan.members) // plan.shards
        return (("rep", f"rep{shard}", replica, replicas),
                ("shard", f"shard{replica}", shard, plan.shards))

    def _sync(self, plan: P.Plan) -> int:
        """Bring every participant to the same state per ``plan.mode``; return bytes moved."""
        assert self._m is not None and self._transfer is not None
        # A transfer still in flight belongs to an abandoned generation: drop it.
        self._transfer.abandon()
        if plan.mode.from_checkpoint:
            assert plan.ckpt is not None
            try:
                if self._elastic is not None and self.shards > 1:
                    # HSDP: this member's shards of the DCP checkpoint
                    state = read_sharded_checkpoint(Path(plan.ckpt), self.model,
                                                    self.optimizer)
                else:
                    state = Checkpointer.load(plan.ckpt)
                self.load_state_dict(state)
                self._transfer.incomplete = False
            except CheckpointError as exc:
                self._m.collective_failed(P.Phase.ROLLBACK, exc)
            return 0
        has_state = self._was_member or self.slot in plan.donors
        if not has_state and plan.mode != P.PlanMode.START and self._faults is not None \
                and self.slot in plan.members:  # a spare called in (not the job's start)
            self._faults.before_receive(rank=plan.members.index(self.slot))
        return self._transfer.sync(plan, has_state=has_state, step=self.step)

    def _leave(self) -> None:
        assert self._m is not None
        self._m.mark(P.left_key(self.slot), "1")
        if self._ckpt is not None:
            self._ckpt.wait()
        sys.stdout.flush()
        os._exit(0)  # nothing of the user's script may run after this replica is retired


def local_device() -> torch.device:
    """Return the device the launcher assigned to this process (``cpu`` outside it)."""
    return torch.device(os.environ.get(P.ENV_DEVICE, "cpu"))
