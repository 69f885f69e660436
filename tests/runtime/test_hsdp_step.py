"""HSDP's optimizer step on the local shards (runtime.hsdp.LocalShardStep), in one process
over a shard mesh of one (fast): the same parameters and optimizer state, bit for bit, as
the optimizer's own step on the DTensors, and the same kinds of state (DTensors stay
DTensors), for the element-wise optimizers; anything else steps on the DTensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from examples.gpt_train import GPT
from runtime.hsdp import LocalShardStep, shard_mesh

OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]]], torch.optim.Optimizer]] = {
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95)),
    "sgd-momentum": lambda groups: torch.optim.SGD(groups, lr=1e-2, momentum=0.9),
    "adagrad": lambda groups: torch.optim.Adagrad(groups, lr=1e-2),
    "adam-single-tensor": lambda groups: torch.optim.Adam(groups, lr=1e-3, foreach=False),
}


def _sharded_gpt(make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
                 ) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(vocab=30, seq=16, dim=32, layers=2, heads=2)
    mesh = shard_mesh()
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
