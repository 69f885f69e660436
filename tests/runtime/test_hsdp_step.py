"""HSDP's pieces that run inside one rank, in one process over a shard mesh of one (fast).

* The optimizer step on the local shards (runtime.hsdp.LocalShardStep): the same
  parameters and optimizer state, bit for bit, as the optimizer's own step on the
  DTensors, and the same kinds of state (DTensors stay DTensors), for the element-wise
  optimizers; anything else steps on the DTensors.
* A backward pass of an abandoned step cut short at its next collective
  (runtime.hsdp.install_void_backward), and a spare's warm-up pass (Job(warmup=...)):
  neither leaves a trace in what training computes next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
from torch.distributed.tensor import DTensor

from examples.gpt_train import GPT
from runtime import Job, ShardedSampler
from runtime.errors import GenerationChanged
from runtime.hsdp import (
    ElasticGroup,
    LocalShardStep,
    _ElasticMesh,
    install_void_backward,
    shard_mesh,
)

OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]]], torch.optim.Optimizer]] = {
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95)),
    "sgd-momentum": lambda groups: torch.optim.SGD(groups, lr=1e-2, momentum=0.9),
    "adagrad": lambda groups: torch.optim.Adagrad(groups, lr=1e-2),
    "adam-single-tensor": lambda groups: torch.optim.Adam(groups, lr=1e-3, foreach=False),
}


def _sharded_gpt(make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
                 mesh: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(vocab=30, seq=16, dim=32, layers=2, heads=2)
    mesh = mesh if mesh is not None else shard_mesh()
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2],
               "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    return model, make(groups)


def _train(model: nn.Module, step: Callable[[], None], opt: torch.optim.Optimizer) -> None:
    x = torch.randint(0, 30, (4, 16))
    for i in range(4):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(i)
        model(x).float().pow(2).mean().backward()
        step()


def _plain(t: Any) -> Any:
    return t.to_local() if isinstance(t, DTensor) else t


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_local_shard_step_is_the_dtensor_step_bit_for_bit(name: str) -> None:
    ref_model, ref_opt = _sharded_gpt(OPTIMIZERS[name])
    _train(ref_model, ref_opt.step, ref_opt)
    model, opt = _sharded_gpt(OPTIMIZERS[name])
    local = LocalShardStep(opt)
    assert local.enabled
    _train(model, local.step, opt)
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert isinstance(b, DTensor) and torch.equal(_plain(a), _plain(b))
    sa, sb = ref_opt.state_dict()["state"], opt.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for idx in sa:
        assert sa[idx].keys() == sb[idx].keys()
        for key in sa[idx]:
            assert type(sa[idx][key]) is type(sb[idx][key]), (idx, key)
            assert torch.equal(_plain(sa[idx][key]), _plain(sb[idx][key])), (idx, key)
    # Its state loads back into the optimizer and the local step goes on from it.
    opt.load_state_dict(opt.state_dict())
    _train(model, local.step, opt)
    assert all(p.grad is None or isinstance(p.grad, DTensor) for p in model.parameters())


def test_other_optimizers_step_on_the_dtensors() -> None:
    class Custom(torch.optim.AdamW):  # a subclass may look across elements: not trusted
        pass

    _, opt = _sharded_gpt(lambda groups: Custom(groups, lr=1e-3))
    assert not LocalShardStep(opt).enabled
    _, fused = _sharded_gpt(lambda groups: torch.optim.AdamW(groups, lr=1e-3, fused=True))
    assert not LocalShardStep(fused).enabled
    plain = torch.optim.AdamW(nn.Linear(2, 2).parameters())
    assert not LocalShardStep(plain).enabled  # no DTensor: nothing to do


# ---------------------------------------------------------------- void steps, warm-up
class _Done(dist.Work):
    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _TwinPeer:
    """The backend of a shard group of two whose other rank holds a copy of this rank's
    shard: deterministic, in one process, and FSDP2 really calls its collectives (a
    group of one has none)."""

    def _allgather_base(self, output: torch.Tensor, inp: torch.Tensor, opts: Any) -> _Done:
        output.view(2, -1).copy_(inp.reshape(1, -1).expand(2, -1))
        return _Done()

    def _reduce_scatter_base(self, output: torch.Tensor, inp: torch.Tensor,
                             opts: Any) -> _Done:
        torch.sum(inp.view(2, -1), dim=0, out=output.view(-1))
        return _Done()


def _mesh_of_two() -> tuple[Any, ElasticGroup]:
    group = ElasticGroup(0, 2)
    group.set_backend(_TwinPeer())
    group.waiter = lambda w: w.wait()
    mesh = _ElasticMesh("cpu", torch.arange(2), mesh_dim_names=("shard",),
                        _init_backend=False, _rank=0)
    mesh._elastic = group
    mesh._dim_group_names = [group.group_name]  # type: ignore[list-item]
    return mesh, group


def _adamw_gpt(mesh: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    return _sharded_gpt(OPTIMIZERS["adamw"], mesh)


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().pow(2).mean()


def _fsdp_idle(model: nn.Module) -> bool:
    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
    return all(g._training_state == TrainingState.IDLE and g.is_sharded
               for st in states for g in st._fsdp_param_groups)


def _same(a: nn.Module, oa: torch.optim.Optimizer, b: nn.Module,
          ob: torch.optim.Optimizer) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(_plain(p), _plain(q))
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for i in sa:
        for k in sa[i]:
            assert torch.equal(_plain(sa[i][k]), _plain(sb[i][k])), (i, k)


@pytest.mark.parametrize("how", ["collective", "generation"])
def test_a_backward_of_an_abandoned_step_ends_early(how: str) -> None:
    # The step becomes void while the backward pass is at the last block: a collective
    # found a peer gone (``collective``), or -- this rank's own collectives all fine --
    # a newer generation is published (``generation``: a death in the other replica
    # group). The pass ends at the next gradient hook or collective -- the first block's
    # gradient is never computed -- backward() returns normally, FSDP2 is back at rest,
    # and the step run again from the same state ends bit-identical to a run that never
    # had the void one.
    x = torch.randint(0, 30, (4, 16))
    ref, ref_opt = _adamw_gpt(_mesh_of_two()[0])
    for _ in range(2):
        ref_opt.zero_grad(set_to_none=True)
        _loss(ref, x).backward()
        ref_opt.step()
    mesh, group = _mesh_of_two()
    model, opt = _adamw_gpt(mesh)
    cut: list[int] = []
    install_void_backward(model, group, on_void=lambda: cut.append(1))
    opt.zero_grad(set_to_none=True)
    _loss(model, x).backward()
    opt.step()

    published: list[int] = []

    def checker() -> None:  # Membership.check_generation, a newer generation published
        if published:
            raise GenerationChanged(published[0])

    group.checker = checker

    def void(_: torch.Tensor) -> None:
        if how == "collective":
            group.abandoned = GenerationChanged(1)
        else:
            published.append(1)

    def abandon_here(_: nn.Module, __: Any, out: torch.Tensor) -> None:
        out.register_hook(void)

    reached: list[str] = []

    def note_fc(_: nn.Module, __: Any, out: torch.Tensor) -> None:
        out.register_hook(lambda g: reached.append("fc"))

    handles = [model.blocks[1].register_forward_hook(abandon_here),
               model.blocks[1].fc.register_forward_hook(note_fc)]
    opt.zero_grad(set_to_none=True)
    _loss(model, x).backward()  # returns: the pass was cut short, not failed
    for h in handles:
        h.remove()
    assert cut == [1]
    # It ended at the first leaf of that block (its output projection's gradient hook),
    # not at the block's collective: the MLP's first layer's gradient was never reached,
    # nor the first block.
    assert reached == []
    assert all(p.grad is None for p in model.blocks[0].parameters())
    assert _fsdp_idle(model)
    assert group.abandoned is not None
    group.abandoned = None  # the new generation: the step runs again
    published.clear()
    opt.zero_grad(set_to_none=True)
    _loss(model, x).backward()
    opt.step()
    _same(ref, ref_opt, model, opt)


def test_a_spares_warm_up_pass_leaves_no_trace() -> None:
    # Job(warmup=...): the spare's one forward/backward on a made-up batch runs with the
    # collectives rehearsed, then gradients, FSDP2's iteration state, buffers, RNG and the
    # sampler are as before it, and training from there is bit-identical to training
    # without it.
    x = torch.randint(0, 30, (4, 16))
    ref, ref_opt = _adamw_gpt(_mesh_of_two()[0])
    ref.register_buffer("seen", torch.zeros(3))
    mesh, group = _mesh_of_two()
    model, opt = _adamw_gpt(mesh)
    model.register_buffer("seen", torch.zeros(3))
    backend = group.backend
    group.set_backend(None)  # a spare has no group yet: every collective is rehearsed
    ran: list[int] = []

    def warmup() -> None:
        ran.append(1)
        model.seen.add_(1.0)  # a buffer the forward changes (running statistics)
        torch.rand(5)  # and the RNG
        sampler.next_batch(0, 1)
        _loss(model, torch.zeros(4, 16, dtype=torch.long)).backward()

    sampler = ShardedSampler(1000, 4, seed=0)
    job = Job(model=model, optimizer=opt, sampler=sampler, mesh=mesh, warmup=warmup)
    rng, pos = torch.get_rng_state(), sampler.state_dict()
    job._warm_up()
    job._warm_up()  # once only
    group.set_backend(backend)  # called in
    assert ran == [1]
    assert all(p.grad is None for p in model.parameters()) and _fsdp_idle(model)
    assert torch.equal(model.seen, torch.zeros(3)) and torch.equal(torch.get_rng_state(), rng)
    assert sampler.state_dict() == pos and not opt.state
    for step in job.steps(2):
        torch.manual_seed(step)
        _loss(model, x).backward()
    for step in range(2):
        ref_opt.zero_grad(set_to_none=True)
        torch.manual_seed(step)
        _loss(ref, x).backward()
        ref_opt.step()
    _same(ref, ref_opt, model, opt)
