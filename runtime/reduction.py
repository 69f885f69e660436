"""Gradient reduction: the flat gradient buffers, the sparse-gradient buckets and the
per-step average over the current group.

Gradients are views into one flat buffer per dtype, so the allreduce needs no copy. The
buffers belong to one generation: each new generation gets fresh ones (:meth:`renew`), so
an allreduce of an abandoned generation that completes late (a fenced peer came back)
writes into a buffer nobody reads any more, never into a later step's gradients. The
last element of the first buffer carries the control flag (a pending move) so that every
rank learns of it at the same committed step. Embedding tables with ``sparse=True`` keep
sparse gradients (the rows a step looked up): they are reduced as sparse tensors, one
reduction per bucket of tables with the same row shape and dtype.
"""

from __future__ import annotations

from typing import Any

import torch


class GradientReducer:
    """The gradient buffers of one replica's model and their reduction."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.flat: list[torch.Tensor] = []
        self.flat_params: list[list[torch.nn.Parameter]] = []
        # Params with sparse gradients, by (dtype, row shape): each bucket is reduced as one
        # sparse tensor, its tables' rows stacked.
        self.sparse_buckets: list[list[torch.nn.Parameter]] = []

    @property
    def built(self) -> bool:
        """True once :meth:`build` has run."""
        return bool(self.flat)

    def build(self) -> None:
        """Make every dense gradient a view into the flat buffers; bucket sparse tables."""
        sparse_ids = {id(m.weight) for m in self.model.modules()
                      if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)
                      and m.sparse and m.weight.requires_grad}
        buckets: dict[tuple[Any, ...], list[torch.nn.Parameter]] = {}
        for p in (p for p in self.model.parameters() if id(p) in sparse_ids):
            buckets.setdefault((p.dtype, tuple(p.shape[1:])), []).append(p)
        self.sparse_buckets = list(buckets.values())
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in self.model.parameters():
            if p.requires_grad and id(p) not in sparse_ids:
                by_dtype.setdefault(p.dtype, []).append(p)
        self.flat_params = []
        for i, (dtype, ps) in enumerate(by_dtype.items()):
            n = sum(p.numel() for p in ps) + (1 if i == 0 else 0)
            flat = torch.zeros(n, dtype=dtype, device=self.device)
            _point_grads(flat, ps)
            self.flat.append(flat)
            self.flat_params.append(ps)

    def renew(self) -> None:
        """Give this replica fresh (zeroed) flat buffers, every dense ``.grad`` a view into
        them: called when it joins a new generation. The old buffers are left to whatever
        collective of the abandoned generation still holds them (see the module
        docstring); nothing of this process reads them again."""
        for i, (flat, ps) in enumerate(zip(self.flat, self.flat_params, strict=True)):
            fresh = torch.zeros_like(flat)
            _point_grads(fresh, ps)
            self.flat[i] = fresh

    def zero(self, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients before a step's body."""
        if self.flat and self.grads_are_views():
            for fl in self.flat:
                fl.zero_()
        else:
            optimizer.zero_grad(set_to_none=False)
        for ps in self.sparse_buckets:
            for p in ps:
                p.grad = None  # a sparse gradient is built fresh by each backward

    def grads_are_views(self) -> bool:
        """True while every dense ``.grad`` is still its view into the flat buffer."""
        for flat, ps in zip(self.flat, self.flat_params, strict=True):
            off = 0
            for p in ps:
                if p.grad is None or p.grad.data_ptr() != flat[off:].data_ptr():
                    return False
                off += p.numel()
        return True

    def launch(self, pg: Any, cpu_pg: Any, *, move_flag: bool) -> Reduction:
        """Start the step's reductions (with the move flag raised or not)."""
        views = self.grads_are_views()
        if not views:  # the body replaced .grad (e.g. zero_grad(set_to_none=True))
            for flat, ps in zip(self.flat, self.flat_params, strict=True):
                off = 0
                for p in ps:
                    g = p.grad
                    if g is None:
                        flat[off:off + p.numel()].zero_()
                    else:
                        flat[off:off + p.numel()].copy_(g.reshape(-1))
                    off += p.numel()
        self.flat[0][-1] = 1.0 if move_flag else 0.0
        dense = [pg.allreduce([flat]) for flat in self.flat]
        # gloo reduces sparse tensors (an allgather of rows, then summed); NCCL does not,
        # so on CUDA they go through the CPU group. One reduction per bucket of tables,
        # not one per table: each costs three rounds of messages.
        sparse = [stack_sparse([p.grad for p in ps], [p.shape for p in ps], ps[0].dtype).cpu()
                  for ps in self.sparse_buckets]
        sparse_works = [cpu_pg.allreduce([g]) for g in sparse]
        return Reduction(works=dense + sparse_works, sparse_works=sparse_works, views=views)

    def finish(self, red: Reduction, world_size: int) -> bool:
        """Average the reduced gradients (the works are complete); return the move flag."""
        for flat in self.flat:
            flat.div_(world_size)
        for ps, w in zip(self.sparse_buckets, red.sparse_works, strict=True):
            total = w.get_future().value()[0].div_(world_size)  # the summed rows
            for p, g in zip(ps, unstack_sparse(total, [p.shape for p in ps]), strict=True):
                p.grad = g.to(p.device)
        move = float(self.flat[0][-1]) > 0
        if not red.views:
            for flat, ps in zip(self.flat, self.flat_params, strict=True):
                off = 0
                for p in ps:
                    p.grad = flat[off:off + p.numel()].view_as(p)
                    off += p.numel()
        return move


def _point_grads(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    off = 0
    for p in params:
        p.grad = flat[off:off + p.numel()].view_as(p)
        off += p.numel()


class Reduction:
    """The works of one step's reduction in flight."""

    __slots__ = ("sparse_works", "views", "works")

    def __init__(self, *, works: list[Any], sparse_works: list[Any], views: bool) -> None:
        self.works = works
        self.sparse_works = sparse_works
        self.views = views


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
