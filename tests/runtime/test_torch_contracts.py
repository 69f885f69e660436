"""Contracts with torch's private internals that the runtime relies on, one test each.

The runtime's HSDP (runtime/hsdp.py), its collectives' waiting (runtime/membership.py),
its sparse reduction (runtime/reduction.py), its state transfer (runtime/transfer.py) and
the transparent mode's GradScaler hook (runtime/transparent/worker.py)
use parts of torch that are not public API and may change in any release of the range
pyproject.toml allows (``torch>=2.4,<=2.14.1``). Each test below pins one of them, as the
runtime uses it, and fails with a message naming the internal, the torch version and the
runtime code that depends on it -- instead of a wrong gradient or a hang in a training
job. CPU, gloo, one process (two ranks as two threads where a collective needs a peer);
scripts/gpu-check runs this file too, with the CUDA/NCCL ones (marker ``gpu``).

Where an internal is only written to (an attribute set to None), the test checks that the
attribute exists first: a renamed attribute would otherwise be created silently and the
reset it stands for would do nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from runtime import hsdp
from runtime import protocol as P
from runtime.hsdp import ElasticGroup, _DoneWork, _ElasticMesh, _in_backward, shard_mesh
from runtime.reduction import stack_sparse, unstack_sparse


@contextlib.contextmanager
def contract(internal: str, used_by: str) -> Iterator[None]:
    """Turn any failure inside into one that names ``internal``, the torch version and
    the runtime code that relies on it."""
    try:
        yield
    except Exception as exc:  # an AssertionError or whatever the changed internal raised
        pytest.fail(f"torch {torch.__version__}: the private internal {internal} changed "
                    f"({type(exc).__name__}: {exc}); {used_by} relies on it: adapt it, or "
                    f"exclude this torch version in pyproject.toml", pytrace=False)


class _Done(dist.Work):
    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _TwinPeer:
    """A shard group's backend of two ranks whose peer holds a copy of this rank's shard
    (as in tests/runtime/test_hsdp_step.py), counting the calls FSDP2 makes on it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _allgather_base(self, output: torch.Tensor, inp: torch.Tensor, opts: Any) -> _Done:
        self.calls.append("all_gather")
        output.view(2, -1).copy_(inp.reshape(1, -1).expand(2, -1))
        return _Done()

    def _reduce_scatter_base(self, output: torch.Tensor, inp: torch.Tensor,
                             opts: Any) -> _Done:
        self.calls.append("reduce_scatter")
        torch.sum(inp.view(2, -1), dim=0, out=output.view(-1))
        return _Done()


def _mesh_of_two(backend: Any) -> tuple[Any, ElasticGroup]:
    group = ElasticGroup(0, 2)
    group.set_backend(backend)
    group.waiter = lambda w: w.wait()
    mesh = _ElasticMesh("cpu", torch.arange(2), mesh_dim_names=("shard",),
                        _init_backend=False, _rank=0)
    mesh._elastic = group
    mesh._dim_group_names = [group.group_name]  # type: ignore[list-item]
    return mesh, group


def _sharded(mesh: Any) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _step(model: nn.Module) -> None:
    model(torch.ones(3, 8)).pow(2).mean().backward()


def _gloo_pair() -> list[Any]:
    """Two gloo ranks of one group in this process (each constructor waits for the
    other, so they are built on two threads)."""
    store = dist.HashStore()
    pgs: list[Any] = [None, None]

    def make(rank: int) -> None:
        pgs[rank] = dist.ProcessGroupGloo(dist.PrefixStore("pair/", store), rank, 2,
                                          timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(pg is not None for pg in pgs), "the gloo pair did not form within 60 s"
    return pgs


# ------------------------------------------------------------------ autograd
def test_current_graph_task_id_tells_a_backward_pass() -> None:
    seen: list[int] = []
    with contract("torch._C._current_graph_task_id()",
                  "runtime.hsdp._in_backward (a void step's backward ends at a collective)"):
        outside = torch._C._current_graph_task_id()
        assert outside == -1, f"outside a backward pass it returned {outside}, not -1"
        x = torch.ones(3, requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: seen.append(torch._C._current_graph_task_id()))
        y.sum().backward()
        assert seen and seen[0] != -1, f"inside a backward pass it returned {seen}"
        assert not _in_backward()


# ------------------------------------------------------------------ the shard mesh
def test_a_device_mesh_subclass_needs_no_default_group(monkeypatch: pytest.MonkeyPatch) -> None:
    with contract("DeviceMesh(..., _init_backend=False, _rank=...) subclassed, with "
                  "_dim_group_names set and get_group() overridden",
                  "runtime.hsdp.shard_mesh (FSDP2 on the runtime's elastic shard group)"):
        assert not dist.is_initialized()
        monkeypatch.setattr(hsdp, "_GROUP", None)
        monkeypatch.setenv(P.ENV_SHARDS, "2")
        monkeypatch.setenv(P.ENV_SHARD_INDEX, "1")
        monkeypatch.delenv(P.ENV_DEVICE, raising=False)
        mesh = shard_mesh()
        group = hsdp.group_of(mesh)
        assert mesh.get_group() is group and mesh.get_group("shard") is group
        assert mesh.size() == 2 and mesh.ndim == 1
        assert mesh.mesh_dim_names == ("shard",)
        # alone: a gloo group of one on a private HashStore, also without a default group
        monkeypatch.setattr(hsdp, "_GROUP", None)
        monkeypatch.setenv(P.ENV_SHARDS, "1")
        monkeypatch.setenv(P.ENV_SHARD_INDEX, "0")
        alone = hsdp.group_of(shard_mesh())
        assert alone.backend is not None and alone.backend.size() == 1


def test_fsdp2_takes_the_group_from_the_mesh_and_reads_it_at_each_collective() -> None:
    first, second = _TwinPeer(), _TwinPeer()
    mesh, group = _mesh_of_two(first)
    with contract("FSDP2's mesh_info.shard_process_group (from DeviceMesh.get_group, read "
                  "at each collective) and dist.all_gather_single/reduce_scatter_single "
                  "calling group.all_gather_single/reduce_scatter_single(out, in, opts)",
                  "runtime.hsdp.ElasticGroup (a backend swapped under FSDP2 each "
                  "generation)"):
        model = _sharded(mesh)
        assert isinstance(model, FSDPModule)
        infos = {id(g.mesh_info.shard_process_group)
                 for m in model.modules() if isinstance(m, FSDPModule)
                 for g in m._get_fsdp_state()._fsdp_param_groups}
        assert infos == {id(group)}, "FSDP2 holds another object than the mesh's group"
        ranks = {g.mesh_info.shard_mesh_rank for m in model.modules()
                 if isinstance(m, FSDPModule) for g in m._get_fsdp_state()._fsdp_param_groups}
        assert ranks == {group.rank()}, ranks
        _step(model)
        assert "all_gather" in first.calls and "reduce_scatter" in first.calls, first.calls
        done = len(first.calls)
        group.set_backend(second)  # the next generation's backend
        _step(model)
        assert len(first.calls) == done, "FSDP2 kept using the replaced backend"
        assert "all_gather" in second.calls and "reduce_scatter" in second.calls


def test_gloo_has_the_base_collectives_the_elastic_group_calls() -> None:
    with contract("ProcessGroupGloo._allgather_base/_reduce_scatter_base(out, in, opts) and "
                  "ProcessGroupGloo(store, rank, size, timeout)",
                  "runtime.hsdp.ElasticGroup.all_gather_single/reduce_scatter_single"):
        pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=60))
        inp = torch.arange(4.0)
        out = torch.zeros(4)
        pg._allgather_base(out, inp, dist.distributed_c10d.AllgatherOptions()).wait()
        assert torch.equal(out, inp)
        opts = dist.distributed_c10d.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        out2 = torch.zeros(4)
        pg._reduce_scatter_base(out2, inp, opts).wait()
        assert torch.equal(out2, inp)


def test_a_python_work_is_a_dist_work() -> None:
    with contract("subclassing torch.distributed.Work in Python (wait/is_completed)",
                  "runtime.hsdp._DoneWork/_ElasticWork (what FSDP2 waits on)"):
        work = _DoneWork()
        assert isinstance(work, dist.Work)
        assert work.wait() is True and work.is_completed() is True


# ------------------------------------------------------------------ FSDP2's state
def test_fsdp2_param_groups_hold_the_gradients_a_void_step_drops() -> None:
    mesh, _group = _mesh_of_two(_TwinPeer())
    with contract("FSDPModule._get_fsdp_state()._fsdp_param_groups[*].fsdp_params[*]"
                  ".unsharded_accumulated_grad / ._unsharded_param, and reset_iter_state()",
                  "runtime.hsdp.reset_void_step (after a backward cut short)"):
        model = _sharded(mesh)
        fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
        assert all(callable(getattr(m, "reset_iter_state", None)) for m in fsdp)
        _step(model)
        params = [fp for m in fsdp for g in m._get_fsdp_state()._fsdp_param_groups
                  for fp in g.fsdp_params]
        assert params, "no FSDPParam found"
        for fp in params:
            assert hasattr(fp, "unsharded_accumulated_grad"), \
                "FSDPParam has no unsharded_accumulated_grad (renamed?)"
            assert isinstance(fp._unsharded_param, nn.Parameter)  # made by the 1st gather
            fp._unsharded_param.grad = torch.ones_like(fp._unsharded_param)
        hsdp.reset_void_step(model)
        for fp in params:
            assert fp.unsharded_accumulated_grad is None
            assert fp._unsharded_param.grad is None


# ------------------------------------------------------------------ DTensor
def test_a_dtensor_local_tensor_is_its_live_shard() -> None:
    mesh, _group = _mesh_of_two(_TwinPeer())
    with contract("DTensor._local_tensor",
                  "runtime.hsdp (ShardReducer, clip_sharded_grad_norm_, LocalShardStep) "
                  "and runtime.transfer (a shard received into the live parameter)"):
        model = _sharded(mesh)
        _step(model)
        p = next(model.parameters())
        assert isinstance(p, DTensor) and isinstance(p.grad, DTensor)
        for t in (p, p.grad):
            local = t._local_tensor
            assert type(local) is torch.Tensor, type(local)  # plain, no autograd wrapper
            assert local.data_ptr() == t.to_local().data_ptr()
        with torch.no_grad():
            p._local_tensor.fill_(3.0)  # written in place, as a transfer receives a shard
        assert bool((p.to_local() == 3.0).all())
        assert model.state_dict()["0.weight"]._local_tensor.data_ptr() == \
            p._local_tensor.data_ptr()


# ------------------------------------------------------------------ foreach kernels
def test_the_foreach_kernels() -> None:
    with contract("torch._foreach_norm/_foreach_mul_/_foreach_copy_",
                  "runtime.hsdp.clip_sharded_grad_norm_ and ShardReducer.finish"):
        a, b = torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 2.0], [2.0, 4.0]])
        norms = torch._foreach_norm([a, b], 2.0)
        assert [float(n) for n in norms] == [5.0, 5.0]
        torch._foreach_mul_([a, b], torch.tensor(0.5))
        assert torch.equal(a, torch.tensor([1.5, 2.0]))
        assert torch.equal(b, torch.tensor([[0.5, 1.0], [1.0, 2.0]]))
        dst = [torch.zeros(2), torch.zeros(2, 2)]
        torch._foreach_copy_(dst, [a, b])
        assert torch.equal(dst[0], a) and torch.equal(dst[1], b)


def test_dynamo_names_a_compiled_module() -> None:
    with contract("torch._dynamo.eval_frame.OptimizedModule",
                  "runtime.hsdp.install_void_backward (no gradient hooks in a compiled "
                  "model) and runtime.zygote (imports torch._dynamo ahead)"):
        import torch._dynamo

        assert "torch._dynamo" in sys.modules
        compiled = torch.compile(nn.Linear(2, 2))  # lazy: compiles nothing until called
        assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)


# ------------------------------------------------------------------ gloo's works
def test_sparse_rows_and_the_gloo_works_the_runtime_waits_on() -> None:
    with contract("sparse COO _indices()/_values(); gloo allreduce's get_future().value() "
                  "(the summed sparse rows); gloo send/recv works without a future",
                  "runtime.reduction (sparse gradients) and runtime.membership.wait"):
        grad = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 3.0]])
        sp = grad.to_sparse(1)
        assert sp._indices()[0].tolist() == [0, 2]
        assert torch.equal(sp._values(), torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        stacked = stack_sparse([grad, None], [torch.Size((3, 2)), torch.Size((1, 2))])
        pgs = _gloo_pair()
        works = [pg.allreduce([stacked.clone()]) for pg in pgs]
        for w in works:
            w.wait()
            assert w.is_completed()
        total = works[0].get_future().value()[0]
        back = unstack_sparse(total, [torch.Size((3, 2)), torch.Size((1, 2))])
        assert torch.equal(back[0].to_dense(), 2 * grad), back[0]
        sent = pgs[0].send([torch.ones(2)], 1, 7)
        into = torch.zeros(2)
        got = pgs[1].recv([into], 0, 7)
        for w in (sent, got):
            with pytest.raises(RuntimeError):
                w.get_future()
        sent.wait()
        got.wait()
        assert torch.equal(into, torch.ones(2))


# ------------------------------------------------------------------ CUDA (gpu-check)
@pytest.mark.gpu
def test_nccl_options_take_a_timeout() -> None:
    if not dist.is_nccl_available():
        pytest.fail(f"torch {torch.__version__} was built without NCCL")
    with contract("ProcessGroupNCCL.Options()._timeout",
                  "runtime.membership (each generation's NCCL groups)"):
        opts = dist.ProcessGroupNCCL.Options()
        assert hasattr(opts, "_timeout")
        opts._timeout = timedelta(seconds=7)
        assert opts._timeout == timedelta(seconds=7)


@pytest.mark.gpu
def test_current_graph_task_id_on_the_cuda_backward_thread() -> None:
    if not torch.cuda.is_available():
        pytest.fail("gpu test without a CUDA device")
    seen: list[int] = []
    with contract("torch._C._current_graph_task_id() on autograd's CUDA device thread",
                  "runtime.hsdp._in_backward under NCCL"):
        x = torch.ones(3, device="cuda", requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: seen.append(torch._C._current_graph_task_id()))
        y.sum().backward()
        assert seen and seen[0] != -1, seen


def test_this_file_is_run_by_gpu_check() -> None:
    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu-check").read_text()
    assert "tests/runtime/test_torch_contracts.py" in script


# ------------------------------------------------------------------ the grad scaler


def test_grad_scaler_steps_through_maybe_opt_step_with_found_inf_per_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The transparent mode replaces GradScaler._maybe_opt_step to count a skipped update
    # as a step: GradScaler.step must still call it, with the optimizer and its per-
    # optimizer state holding the inf/NaN findings per device.
    from torch.amp import GradScaler

    calls: list[tuple[Any, Any]] = []
    original = GradScaler._maybe_opt_step

    def recording(self: Any, optimizer: Any, optimizer_state: Any, *a: Any, **k: Any) -> Any:
        calls.append((optimizer, optimizer_state))
        return original(self, optimizer, optimizer_state, *a, **k)

    with contract("torch.amp.GradScaler._maybe_opt_step(optimizer, optimizer_state)",
                  "runtime.transparent.worker (a GradScaler's skipped update is a step)"):
        monkeypatch.setattr(GradScaler, "_maybe_opt_step", recording)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GradScaler("cpu")
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        scaler.step(opt)
        assert len(calls) == 1 and calls[0][0] is opt, f"called {len(calls)} time(s)"
        found = calls[0][1]["found_inf_per_device"]
        assert found and all(isinstance(v, torch.Tensor) for v in found.values()), found
