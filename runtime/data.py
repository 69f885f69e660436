"""A stateful, deterministic, sharded sampler: the "data position" the runtime moves."""

from __future__ import annotations

from typing import Any

import torch

from runtime.errors import ConfigError


class ShardedSampler:
    """Yields per-rank batch indices in a deterministic, seed-defined order.

    The global order of epoch ``e`` is ``randperm(dataset_len)`` seeded with ``seed + e``;
    each step consumes one global batch of ``batch_size * world_size`` indices and rank
    ``r`` takes the ``r``-th slice. The state is two integers, so a replacement that loads
    it continues exactly where the replica it copies from stands.
    """

    def __init__(self, dataset_len: int, batch_size: int, *, seed: int = 0,
                 shuffle: bool = True) -> None:
        if dataset_len < 1 or batch_size < 1:
            raise ConfigError("dataset_len and batch_size must be >= 1")
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0  # indices of the current epoch already consumed (all ranks)
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1

    def _order(self) -> torch.Tensor:
        if self._perm is None or self._perm_epoch != self.epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed + self.epoch)
                self._perm = torch.randperm(self.dataset_len, generator=gen)
            else:
                self._perm = torch.arange(self.dataset_len)
            self._perm_epoch = self.epoch
        return self._perm

    def next_batch(self, rank: int, world_size: int) -> torch.Tensor:
        """Return this rank's indices for the next step and advance the position.

        Every rank must call it once per step with the same ``world_size``; an epoch
        ends when fewer than one global batch is left (the remainder is dropped).
        """
        global_batch = self.batch_size * world_size
        if global_batch > self.dataset_len:
            raise ConfigError("batch_size * world_size exceeds the dataset")
        if self.position + global_batch > self.dataset_len:
            self.epoch += 1
            self.position = 0
        order = self._order()
        start = self.position + rank * self.batch_size
        idx = order[start:start + self.batch_size]
        self.position += global_batch
        return idx

    def state_dict(self) -> dict[str, Any]:
        """Return the data position (epoch, position) and the order's parameters."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "dataset_len": self.dataset_len, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (as returned by :meth:`state_dict`)."""
        if state["dataset_len"] != self.dataset_len or state["batch_size"] != self.batch_size:
            raise ConfigError("sampler state is for another dataset or batch size")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state["seed"])
