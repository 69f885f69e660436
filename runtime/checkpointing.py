"""Checkpointing, worker side: rank 0 snapshots the state every K committed steps (and
at step 0, so that a rollback target exists from the start), writes it on a background
thread, and publishes each durable checkpoint to the supervisor under ``ckpt``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from runtime import protocol as P
from runtime.state import CheckpointWriter, clone_state, read_checkpoint


class Checkpointer:
    """Periodic, asynchronous, atomically written checkpoints of one replica."""

    def __init__(self, *, every: int, directory: Path, store: dist.Store) -> None:
        self.every = every
        self._store = store
        self._writer = CheckpointWriter(directory, self._published)

    def due(self, step: int) -> bool:
        """True when committed step ``step`` is to be checkpointed."""
        return step % self.every == 0

    def submit(self, state: dict[str, Any], step: int) -> None:
        """Snapshot ``state`` now and write it in the background."""
        self._writer.submit(clone_state(state), step)

    def wait(self) -> None:
        """Block until the write in progress (if any) is finished."""
        self._writer.wait()

    def _published(self, step: int, path: Path) -> None:
        self._store.set(P.KEY_CKPT, json.dumps({"step": step, "path": str(path)}))

    @staticmethod
    def load(path: str) -> Any:
        """Read a checkpoint (CheckpointError if unreadable)."""
        return read_checkpoint(Path(path))
