"""HSDP under the runtime: FSDP2 (``fully_shard``) shards inside a replica group, the
runtime reduces across replica groups and makes that dimension fault tolerant.

Layout: ``yoco run --workers N --shards S`` runs R = N / S replica groups of S ranks.
Position ``p`` in the generation's member list is replica ``p // S``, shard ``p % S``; a
replacement takes the position (so the shard) of the rank it replaces, and receives that
shard's state (parameters, optimizer state, scheduler, sampler position, step) from the
rank holding the same shard in another replica group.

How FSDP2 keeps working while the groups change each generation (what we took from
torchft, and what we did not): torchft 0.2.0 runs FSDP2 over a plain intra-group mesh
and reduces across replica groups in an ``all_reduce_hook`` on its fault-tolerant group;
a replica group is its unit of failure (any rank lost: the whole group restarts and
heals). We keep that split -- FSDP2 on a 1-D ``("shard",)`` mesh, the cross-group
reduction in the runtime -- but the shard group is an :class:`ElasticGroup`: a process
group object whose rank and size stay (so FSDP2's sharding, computed once, stays valid)
while the backend under it (gloo on CPU; NCCL on CUDA, with gloo beside it for the
runtime's control messages) is replaced each generation. Its collectives are waited
for the runtime's way (never blocking inside ``wait()``, watching the generation), and a
collective that cannot complete (a peer died) never raises into the training loop: the
step is marked abandoned, later collectives of it are skipped, a backward pass in
progress ends at its next collective (:func:`install_void_backward`), the loop body runs
to its end on garbage and the runtime discards the step. So a survivor in the lost
rank's own replica group keeps its shard and its process. We do not depend on torchft: its
Manager/Lighthouse quorum would duplicate the supervisor's membership, and its process
group wrappers re-create a group per quorum in the same way we already do.

Facts this rests on (torch 2.13; each private internal used here is pinned by
tests/runtime/test_torch_contracts.py, which names it when a torch changes it): FSDP2
reads ``mesh_info.shard_process_group`` at each collective (not a copy), so swapping the
object's backend is enough; re-registering a backend on a c10d ``ProcessGroup`` does
*not* replace it (the first one of a backend type is kept), hence a Python group; a
DeviceMesh built with ``_init_backend=False`` needs no default process group.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from runtime import protocol as P
from runtime.errors import ConfigError, GenerationChanged


class StepVoid(Exception):
    """Raised inside autograd's backward pass by a collective of an abandoned step, so that
    the rest of the backward (kernels on garbage, discarded anyway) is not computed; the
    runtime's ``torch.autograd.backward`` catches it (:func:`install_void_backward`)."""


def _in_backward() -> bool:
    """True on a thread running an autograd backward pass (CPU: the caller's thread)."""
    return bool(torch._C._current_graph_task_id() != -1)


class _DoneWork(dist.Work):
    """A completed work (what a skipped collective of an abandoned step returns)."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Nothing to wait for."""
        return True

    def is_completed(self) -> bool:
        """Always complete."""
        return True


class _ElasticWork(dist.Work):
    """A collective of an :class:`ElasticGroup` in flight; ``wait()`` never raises and
    never blocks past a membership change (the step is abandoned instead)."""

    def __init__(self, group: ElasticGroup, work: Any, watch: bool) -> None:
        super().__init__()
        self._group = group
        self._work = work
        self._watch = watch
        self._done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait the runtime's way; on a membership change mark the step abandoned."""
        if not self._done:
            self._done = True
            self._group.wait(self._work, watch=self._watch)
        return True

    def is_completed(self) -> bool:
        """True once waited for (or the step is abandoned)."""
        return self._done or self._group.abandoned is not None


class ElasticGroup:
    """The shard group of one replica group, as FSDP2 sees it: a fixed rank and size,
    and a gloo backend that the runtime replaces each generation (see the module
    docstring). Only the collectives FSDP2 uses are provided."""

    def __init__(self, rank: int, size: int) -> None:
        if not 0 <= rank < size:
            raise ConfigError(f"shard index {rank} outside 0..{size - 1}")
        self._rank = rank
        self._size = size
        self.backend: Any = None
        self.group_name = f"yoco-shard-{rank}-of-{size}-{os.getpid()}"
        # Set by the Job: waits for a work watching the generation (raises
        # GenerationChanged when a newer one is published), and checks the generation
        # (raises it too) without waiting.
        self.waiter: Callable[[Any], None] | None = None
        self.checker: Callable[[], None] | None = None
        self.abandoned: GenerationChanged | None = None
        # Called when a collective finds the step abandoned (the benchmark timeline).
        self.on_abandon: Callable[[], None] | None = None
        # Set by a managed Job (install_void_backward): a collective of an abandoned step
        # called inside a backward pass raises StepVoid instead of being skipped.
        self.abort_backward = False
        # A spare's warm-up pass (Job._warm_up): every collective completes at once,
        # without a backend, on whatever its output buffer holds.
        self.rehearsal = False
        self._lock = threading.Lock()

    # ProcessGroup's interface, as much as FSDP2 uses of it.
    def rank(self) -> int:
        """This process's shard index (stable across generations)."""
        return self._rank

    def size(self) -> int:
        """Shards per replica group."""
        return self._size

    def set_backend(self, backend: Any) -> None:
        """Use ``backend`` (the new generation's gloo group) from now on."""
        self.backend = backend
        self.abandoned = None

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any) -> dist.Work:
        """FSDP2's all-gather of parameter shards."""
        return self._run(lambda b: b._allgather_base(output, inp, opts), watch=True)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor,
                              opts: Any) -> dist.Work:
        """FSDP2's reduce-scatter of gradients."""
        return self._run(lambda b: b._reduce_scatter_base(output, inp, opts), watch=True)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """Sum ``tensors`` over the group (the runtime's gradient-norm reduction)."""
        if opts is None:
            return self._run(lambda b: b.allreduce(tensors))
        return self._run(lambda b: b.allreduce(tensors, opts))

    def _run(self, launch: Callable[[Any], Any], *, watch: bool = False) -> dist.Work:
        if self.rehearsal:
            return _DoneWork()
        if self.abandoned is not None:
            self._void_backward()
            return _DoneWork()  # the step is void: skip the collective
        if self._size == 1 and self.backend is None:
            raise ConfigError("a shard group of one used before the runtime set it up")
        try:
            work = launch(self.backend)
        except Exception as exc:  # a dead peer's socket: the supervisor sees the death
            return self._failed(exc)
        return _ElasticWork(self, work, watch)

    def wait(self, work: Any, *, watch: bool = False) -> None:
        """Wait for ``work``; a membership change abandons the step (never raises but
        :class:`StepVoid`). ``watch``: FSDP2's own collectives (all-gather,
        reduce-scatter), which cannot commit anything: a newer generation seen after
        one completed abandons the step too, so that a peer's death in another replica
        group voids the step at the next collective (an attribute read) instead of at
        the cross-group reduction, after computing the rest of it. (Not for the
        allreduces that carry the commit agreement: every rank of the replica group
        must decide the same on those.)"""
        if self.abandoned is not None:
            return
        assert self.waiter is not None, "ElasticGroup used outside a Job"
        try:
            self.waiter(work)
            if watch and self.checker is not None:
                self.checker()
        except GenerationChanged as changed:
            self.abandoned = changed
            if self.on_abandon is not None:
                self.on_abandon()
            self._void_backward()

    def _void_backward(self) -> None:
        """In a backward pass of an abandoned step: end it (see :class:`StepVoid`)."""
        if self.abort_backward and _in_backward():
            raise StepVoid

    def check_backward(self) -> None:
        """Between two kernels of a backward pass (a gradient hook): if the step is void
        -- abandoned already, or a newer generation published -- end the pass now."""
        if self.abandoned is None and self.checker is not None:
            try:
                self.checker()
            except GenerationChanged as changed:
                self.abandoned = changed
                if self.on_abandon is not None:
                    self.on_abandon()
        if self.abandoned is not None:
            self._void_backward()

    def _failed(self, exc: Exception) -> dist.Work:
        # Wait for the supervisor's next generation, as a failed collective does.
        assert self.waiter is not None, "ElasticGroup used outside a Job"

        class _Raising:
            def wait(self) -> None:
                raise exc

            def get_future(self) -> Any:
                raise RuntimeError("no future")  # -> waited on a helper thread

        self.wait(_Raising())
        return _DoneWork()


class _ElasticMesh(DeviceMesh):
    """A 1-D DeviceMesh whose group is an :class:`ElasticGroup` (DeviceMesh would look
    a group up in c10d's registry by name, where only C++ process groups live)."""

    _elastic: ElasticGroup

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """The shard group (the only dimension)."""
        return self._elastic


_GROUP: ElasticGroup | None = None


def shard_mesh() -> DeviceMesh:
    """The 1-D ``("shard",)`` DeviceMesh of this process's replica group, for
    ``fully_shard(module, mesh=shard_mesh())``; pass it to :class:`runtime.Job` as
    ``mesh``. Under ``yoco run --shards S`` it spans S ranks; alone it spans this one.
    On the CUDA device the launcher assigned (``YOCO_DEVICE=cuda:N``) it is a CUDA mesh
    and that device becomes the current one (FSDP2 allocates on the current device);
    the runtime then gives the group NCCL backends (written, not yet run: see
    docs/runtime.md)."""
    global _GROUP
    shards = int(os.environ.get(P.ENV_SHARDS, "1"))
    index = int(os.environ.get(P.ENV_SHARD_INDEX, "0"))
    device = torch.device(os.environ.get(P.ENV_DEVICE, "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if _GROUP is None:
        _GROUP = ElasticGroup(index, shards)
        if shards == 1:  # alone: a gloo group of one on a private store
            _GROUP.set_backend(dist.ProcessGroupGloo(dist.HashStore(), 0, 1,
                                                     timedelta(seconds=60)))
    mesh = _ElasticMesh(device.type, torch.arange(shards), mesh_dim_names=("shard",),
                        _init_backend=False, _rank=index)
    mesh._elastic = _GROUP
    mesh._dim_group_names = [_GROUP.group_name]  # type: ignore[list-item]
    return mesh


def group_of(mesh: DeviceMesh) -> ElasticGroup:
    """The :class:`ElasticGroup` behind a mesh made by :func:`shard_mesh`."""
    if not isinstance(mesh, _ElasticMesh):
        raise ConfigError("the mesh was not made by runtime.hsdp.shard_mesh()")
    return mesh._elastic


# ------------------------------------------------------------------- void steps
def fsdp_roots(model: torch.nn.Module) -> list[FSDPModule]:
    """The outermost ``fully_shard`` modules of ``model`` (its FSDP2 roots)."""
    roots: list[FSDPModule] = []
    inside: set[int] = set()
    for mod in model.modules():  # pre-order: an outer module comes before its children
        if id(mod) in inside or not isinstance(mod, FSDPModule):
            continue
        roots.append(mod)
        inside.update(id(m) for m in mod.modules())
    return roots


def reset_void_step(model: torch.nn.Module) -> None:
    """Bring FSDP2's per-iteration state back to the start of a step after an abandoned
    one, whatever point it stopped at: ``reset_iter_state()`` on every root (FSDP2's own
    recovery after a mid-forward/backward exception: in-flight collectives dropped,
    every parameter group resharded, iteration trackers cleared), and the unsharded
    gradients a cut-short backward leaves on blocks whose post-backward did not run
    dropped too (reset_iter_state keeps them, and the next backward would add to them)."""
    for root in fsdp_roots(model):
        root.reset_iter_state()
        assert isinstance(root, torch.nn.Module)
        for mod in root.modules():
            if not isinstance(mod, FSDPModule):
                continue
            for group in mod._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    fp.unsharded_accumulated_grad = None
                    if hasattr(fp, "_unsharded_param"):
                        fp._unsharded_param.grad = None


def _watch_leaves(model: torch.nn.Module, group: ElasticGroup) -> None:
    """A gradient hook on the output of every leaf module with parameters: in a backward
    pass, :meth:`ElasticGroup.check_backward` (see :func:`install_void_backward`)."""

    def check(_grad: torch.Tensor) -> None:
        group.check_backward()

    def hook(_mod: torch.nn.Module, _inp: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
            out.register_hook(check)

    for mod in model.modules():
        if next(mod.children(), None) is None and \
                next(mod.parameters(recurse=False), None) is not None:
            mod.register_forward_hook(hook)


_BACKWARD_MODELS: list[torch.nn.Module] = []
_ORIGINAL_BACKWARD: Callable[..., Any] | None = None
_ON_VOID: list[Callable[[], None]] = []


def install_void_backward(model: torch.nn.Module, group: ElasticGroup,
                          on_void: Callable[[], None] | None = None) -> None:
    """From now on, a backward pass of an abandoned step ends at its next collective.

    Why: when a peer dies, the survivors' step is void, but FSDP2's hooks run inside
    autograd and nothing there can stop the backward pass short of an exception: it ran
    to its end on garbage (a sizeable share of a step's compute, on the recovery's
    critical path and taking CPU from it; docs/benchmarks-runtime.md, "Figures behind the
    code"). So ``group`` raises
    :class:`StepVoid` from a collective of an abandoned step inside a backward pass, and
    ``torch.autograd.backward`` (what ``Tensor.backward`` calls) is wrapped, once per
    process, to catch it, reset FSDP2's iteration state (:func:`reset_void_step`) and
    return as if the pass had completed: the loop body goes on (on garbage, discarded
    as before) without seeing it. Outside an abandoned step the wrapper costs one
    Python call per ``backward()``. ``on_void`` runs after each pass cut short.

    FSDP2's collectives come once per block and pass, so a rank whose own collectives
    all succeed (the dead rank's twin in the other replica group) learnt of the death
    only at its next one, a whole block's backward later. So each leaf module with
    parameters also gets a gradient hook on its output (registered by a forward hook; its
    cost per pass is in the same figures) that checks the generation (an attribute read)
    and ends the pass there. Not for a ``torch.compile``d model (hooks
    inside a compiled graph are its business): there the collectives alone check."""
    global _ORIGINAL_BACKWARD
    group.abort_backward = True
    if model not in _BACKWARD_MODELS:
        _BACKWARD_MODELS.append(model)
        dynamo = sys.modules.get("torch._dynamo")  # not imported: nothing is compiled
        if dynamo is None or not any(isinstance(m, dynamo.eval_frame.OptimizedModule)
                                     for m in model.modules()):
            _watch_leaves(model, group)
    if on_void is not None:
        _ON_VOID.append(on_void)
    if _ORIGINAL_BACKWARD is not None:
        return
    original = torch.autograd.backward
    _ORIGINAL_BACKWARD = original

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> None:
        try:
            original(*args, **kwargs)
        except StepVoid:
            for m in _BACKWARD_MODELS:
                reset_void_step(m)
            for hook in _ON_VOID:
                hook()

    torch.autograd.backward = backward


# ------------------------------------------------------------------- state
def to_local_state(state: Any) -> Any:
    """``state`` with every DTensor replaced by this rank's local shard (what is
    transferred: a shard moves between ranks holding the same shard index)."""
    if isinstance(state, DTensor):
        return state.to_local()
    if isinstance(state, dict):
        return {k: to_local_state(v) for k, v in state.items()}
    if isinstance(state, list):
        return [to_local_state(v) for v in state]
    return state


def load_local_model(model: torch.nn.Module, local: dict[str, Any]) -> None:
    """Copy local shards (from :func:`to_local_state`) into ``model``'s live shards."""
    live = model.state_dict()
    with torch.no_grad():
        for key, value in local.items():
            dst = live[key]
            dst = dst.to_local() if isinstance(dst, DTensor) else dst
            if dst.shape != value.shape:
                raise ConfigError(f"shard of {key} has shape {tuple(value.shape)}, this "
                                  f"rank's is {tuple(dst.shape)} (another shard index?)")
            dst.copy_(value)


def optimizer_state_to_dtensors(optimizer: torch.optim.Optimizer,
                                state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict of local shards with each parameter-shaped tensor wrapped
    back as a DTensor like its parameter (so ``load_state_dict`` matches the params)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    out: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for idx, entry in state["state"].items():
        p = params[int(idx)]
        new = {}
        for k, v in entry.items():
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() > 0 \
                    and not isinstance(v, DTensor):
                v = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                       shape=p.shape, stride=p.stride())
            new[k] = v
        out["state"][idx] = new
    return out


class ShardReducer:
    """The cross-replica-group gradient average of HSDP: FSDP2 has reduce-scattered
    (averaged) each gradient inside the replica group; this averages the local shards
    over the ranks holding the same shard (the replicate group), one flat buffer."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.flat: torch.Tensor | None = None

    def zero(self, optimizer: torch.optim.Optimizer) -> None:
        """FSDP2 makes new gradients each step: drop the old ones."""
        optimizer.zero_grad(set_to_none=True)

    def renew(self) -> None:
        """A new generation reduces into a buffer of its own: an abandoned generation's
        allreduce that completes late writes into the old one, which nothing reads any
        more (see :mod:`runtime.reduction`)."""
        self.flat = None

    def _locals(self) -> list[torch.Tensor]:
        out = []
        for p in self.model.parameters():
            g = p.grad
            if g is not None:
                # DTensor's local shard without the autograd wrapper to_local() applies
                out.append(g._local_tensor if isinstance(g, DTensor) else g)
        return out

    def launch(self, pg: Any, *, move_flag: bool) -> tuple[Any, list[torch.Tensor]]:
        """Pack the local gradient shards and start their sum over ``pg``."""
        grads = self._locals()
        n = sum(g.numel() for g in grads) + 1
        if self.flat is None or self.flat.numel() != n:
            self.flat = torch.zeros(n, dtype=torch.float32, device=self.device)
        flat = self.flat
        # One copy kernel for all shards: a copy per tensor cost several times the bytes'
        # own copy in Python overhead (docs/benchmarks-runtime.md, "Figures behind the
        # code").
        with torch.no_grad():
            if all(g.dtype == flat.dtype for g in grads):
                torch.cat([g.reshape(-1) for g in grads], out=flat[:-1])
            else:  # bf16 parameters: cast shard by shard
                off = 0
                for g in grads:
                    flat[off:off + g.numel()].copy_(g.reshape(-1))
                    off += g.numel()
        flat[-1] = 1.0 if move_flag else 0.0
        return pg.allreduce([flat]), grads

    def finish(self, grads: list[torch.Tensor], replicas: int) -> bool:
        """Average and copy back; return the move flag."""
        assert self.flat is not None
        flat = self.flat
        move = float(flat[-1]) > 0
        flat.div_(replicas)
        views = []
        off = 0
        for g in grads:
            views.append(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        with torch.no_grad():
            if all(g.dtype == flat.dtype for g in grads):
                torch._foreach_copy_(grads, views)
            else:
                for g, v in zip(grads, views, strict=True):
                    g.copy_(v)
        return move


def clip_sharded_grad_norm_(model: torch.nn.Module, max_norm: float, group: ElasticGroup,
                            *, flag: float | None = None) -> tuple[torch.Tensor, float | None]:
    """``clip_grad_norm_`` (2-norm) over gradients sharded in ``group``: the squares of the
    local shards summed over the group, so every rank gets the norm of the whole
    gradient; collectives waited the runtime's way. Returns the norm before clipping and,
    when ``flag`` is given, its sum over the group: the runtime's commit agreement rides
    on the norm's allreduce instead of a collective of its own."""
    grads = [g._local_tensor if isinstance(g, DTensor) else g
             for g in (p.grad for p in model.parameters()) if g is not None]
    # On the gradients' device: on CUDA the group is NCCL's (the flag rides along).
    local = torch.zeros(1 if flag is None else 2, dtype=torch.float32,
                        device=grads[0].device if grads else None)
    if grads:
        norms = torch._foreach_norm(grads, 2.0)
        local[0] = torch.stack([n.float() for n in norms]).pow(2).sum()
    if flag is not None:
        local[1] = flag
    group.allreduce([local]).wait()
    total = local[0].sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if grads:
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    return total, None if flag is None else float(local[1])


# Optimizers whose update of an element depends on that element's parameter, gradient and
# state only (and on scalars): stepping them on the local shards is the same arithmetic
# as stepping the DTensors. Exact types: a subclass may do anything.
_ELEMENTWISE: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad,
    torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam)


class LocalShardStep:
    """``optimizer.step()`` applied to the local shards of an FSDP2 model's DTensor
    parameters, for the element-wise optimizers (Adam, AdamW, SGD, Adagrad, RMSprop,
    Adamax, NAdam, RAdam; any other steps on the DTensors as usual).

    Why: on DTensors every foreach kernel of the optimizer goes through DTensor's
    sharding propagation; for the GPT example (53 parameters) that was half of AdamW's
    step (docs/benchmarks-runtime.md, "Figures behind the code"), for arithmetic that is
    purely local (FSDP2's
    parameters are ``Shard(0)``, an element-wise update never looks across shards). The
    step swaps in each parameter's local tensor (its gradient the local gradient, its
    state the states' local tensors), runs the optimizer's own ``step``, and swaps back;
    state created by a first step is wrapped as DTensors like its parameter, so
    ``state_dict()`` and checkpoints see what they saw before. The kernels and their
    inputs are the same, so the numbers are the same bit for bit."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.enabled = type(optimizer) in _ELEMENTWISE and not optimizer.defaults.get(
            "fused") and any(isinstance(p, DTensor) for g in optimizer.param_groups
                             for p in g["params"])

    def step(self) -> None:
        """Step the optimizer (on the local shards when enabled)."""
        opt = self.optimizer
        if not self.enabled:
            opt.step()
            return
        saved_params = [g["params"] for g in opt.param_groups]
        saved_state = opt.state
        pairs: list[tuple[Any, torch.Tensor]] = []
        local_state: dict[Any, Any] = {}
        for group in opt.param_groups:
            params = []
            for p in group["params"]:
                if not isinstance(p, DTensor):
                    params.append(p)
                    if p in saved_state:
                        local_state[p] = saved_state[p]
                    continue
                lp = p._local_tensor
                g = p.grad
                lp.grad = g._local_tensor if isinstance(g, DTensor) else g
                pairs.append((p, lp))
                params.append(lp)
                if p in saved_state:
                    local_state[lp] = {k: v._local_tensor if isinstance(v, DTensor) else v
                                       for k, v in saved_state[p].items()}
            group["params"] = params
        opt.state = collections.defaultdict(dict, local_state)
        try:
            opt.step()
        finally:
            new_state = opt.state
            for group, params in zip(opt.param_groups, saved_params, strict=True):
                group["params"] = params
            opt.state = saved_state
            for p, lp in pairs:
                lp.grad = None
                entry = new_state.get(lp)
                if not entry:
                    continue
                # Entries updated in place keep their DTensor; new (or replaced) ones are
                # wrapped like the parameter.
                old = saved_state.get(p, {})
                merged = {}
                for k, v in entry.items():
                    o = old.get(k)
                    same = o is not None and (o._local_tensor if isinstance(o, DTensor)
                                              else o) is v
                    merged[k] = o if same else self._wrap(p, v)
                saved_state[p] = merged
            for p, entry in new_state.items():  # plain parameters' new state
                if not isinstance(p, torch.Tensor) or p in saved_state:
                    continue
                if any(p is q for params in saved_params for q in params):
                    saved_state[p] = entry

    @staticmethod
    def _wrap(p: DTensor, v: Any) -> Any:
        if isinstance(v, torch.Tensor) and not isinstance(v, DTensor) \
                and v.shape == p._local_tensor.shape and v.dim() > 0:
            return DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                      shape=p.shape, stride=p.stride())
        return v
