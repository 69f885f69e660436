"""Checkpointing, worker side: rank 0 snapshots the state every K committed steps (and
at step 0, so that a rollback target exists from the start), writes it on a background
thread, and publishes each durable checkpoint to the supervisor under ``ckpt``. With HSDP
every rank of replica group 0 writes its shard of a DCP checkpoint
(:mod:`runtime.sharded_checkpoint`); the supervisor finds whole ones in the folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime.errors import ConfigError
from runtime.sharded_checkpoint import sharded_snapshot, write_sharded_checkpoint
from runtime.state import CheckpointWriter, clone_state, read_checkpoint, write_checkpoint

log = logging.getLogger("yoco.runtime.checkpointing")


class Checkpointer:
    """Periodic, asynchronous, atomically written checkpoints of one replica."""

    def __init__(self, *, every: int, directory: Path, store: dist.Store,
                 before_rename: Callable[[int], None] | None = None,
                 shard: tuple[int, int] | None = None,
                 model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.every = every
        self._store = store
        self._directory = directory
        self._before_rename = before_rename
        # HSDP: shard k of S (its model and optimizer give the DTensor layout); the
        # supervisor finds whole checkpoints in the directory, not through the store.
        self._shard = shard
        self._model = model
        self._optimizer = optimizer
        if shard is not None and (model is None or optimizer is None):
            raise ConfigError("a sharded checkpointer needs the model and the optimizer")
        write = self._write_shard if shard is not None else self._write_whole
        self._writer = CheckpointWriter(write, self._published, self._failed)

    def due(self, step: int) -> bool:
        """True when committed step ``step`` is to be checkpointed."""
        return step % self.every == 0

    def submit(self, state: dict[str, Any], step: int, attempt: int = 0) -> None:
        """Snapshot ``state`` now and write it in the background. ``attempt`` (the
        generation) tells apart two writes of the same step's shards (after a rollback)."""
        if self._shard is None:
            self._writer.submit(clone_state(state), step)
            return
        assert self._model is not None and self._optimizer is not None
        snapshot = sharded_snapshot(state, self._model, self._optimizer, self._shard[0])
        self._writer.submit((snapshot, attempt), step)

    def _write_whole(self, snapshot: Any, step: int) -> Path:
        return write_checkpoint(snapshot, self._directory, step,
                                before_rename=self._before_rename)

    def _write_shard(self, item: tuple[dict[str, Any], int], step: int) -> Path | None:
        assert self._shard is not None
        snapshot, attempt = item
        hook = self._before_rename
        return write_sharded_checkpoint(
            snapshot, self._directory, step, attempt=attempt, shard=self._shard[0],
            shards=self._shard[1], torn=None if hook is None else lambda: hook(step))

    def wait(self) -> None:
        """Block until the write in progress (if any) is finished."""
        self._writer.wait()

    def _failed(self, step: int, exc: BaseException) -> None:
        # The worker's log, and the supervisor (which logs it where the operator sees it
        # and shows it in status.json); the previous checkpoint stays the rollback target.
        log.error("CHECKPOINT WRITE FAILED at step %d: %s: %s; the newest checkpoint is "
                  "still the previous one", step, type(exc).__name__, exc)
        try:
            self._store.set(P.KEY_CKPT_ERROR, json.dumps(
                {"step": step, "error": f"{type(exc).__name__}: {exc}"[:500]}))
            self._store.add(P.KEY_CKPT_ERRORS, 1)
        except (RuntimeError, dist.DistStoreError) as err:  # the supervisor is gone
            log.error("cannot report the failed checkpoint write: %s", err)

    def _published(self, step: int, path: Path) -> None:
        if self._shard is not None:
            return
        self._store.set(P.KEY_CKPT, json.dumps({"step": step, "path": str(path)}))

    @staticmethod
    def load(path: str) -> Any:
        """Read a checkpoint (CheckpointError if unreadable)."""
        return read_checkpoint(Path(path))


_COMMITTED_FMT = "{step:020d} {t:020.6f}\n"


class CommittedStep:
    """The last committed step and when it was committed, in ``RUN_DIR/committed``.

    Rank 0 rewrites it after every commit, in place with one ``pwrite`` of a fixed-width
    line (no fsync: ~10 us per step). It survives any process death, the supervisor's
    included -- the page cache outlives the process -- so a resumed supervisor knows the
    true committed step and when progress stopped (for the lost steps and the recovery
    time it records). Only a crash of the machine itself can lose the latest write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def write(self, step: int) -> None:
        """Note that ``step`` steps are committed, now."""
        os.pwrite(self._fd, _COMMITTED_FMT.format(step=step, t=time.time()).encode(), 0)


def read_committed(path: Path) -> tuple[int, float] | None:
    """Return (step, epoch seconds) from a :class:`CommittedStep` file, or None."""
    try:
        step, t = path.read_text().split()
        return int(step), float(t)
    except (OSError, ValueError):
        return None
