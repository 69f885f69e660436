"""The training state a replica owns, how it is split for transfer, and checkpoints.

A state dict is walked once into a picklable *skeleton* (every tensor replaced by a
:class:`TensorRef`) and a flat list of tensors. The skeleton travels through the store
(it is small); the tensors travel point-to-point. Tensors under 256 KiB are packed into
one byte buffer first, because a collective op has a fixed cost whatever its size
(docs/benchmarks-runtime.md, "Figures behind the code") and an Adam state has two tiny
``step`` tensors per parameter.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.errors import CheckpointError

SMALL_TENSOR_BYTES = 256 * 1024


@dataclass(slots=True, frozen=True)
class TensorRef:
    """Placeholder of tensor ``index`` in a skeleton."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool
    path: tuple[Any, ...]


def split_state(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Return ``(skeleton, tensors)``; ``join_state(skeleton, tensors)`` rebuilds ``state``."""
    tensors: list[torch.Tensor] = []

    def walk(obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            ref = TensorRef(len(tensors), tuple(obj.shape), obj.dtype,
                            obj.device.type == "cpu", path)
            tensors.append(obj.detach())
            return ref
        if isinstance(obj, dict):
            return {k: walk(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(walk(v, (*path, i)) for i, v in enumerate(obj))
        return obj

    return walk(state, ()), tensors


def join_state(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Rebuild a state from a skeleton and its tensors (inverse of :func:`split_state`)."""

    def walk(obj: Any) -> Any:
        if isinstance(obj, TensorRef):
            return tensors[obj.index]
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(walk(v) for v in obj)
        return obj

    return walk(skeleton)


def refs(skeleton: Any) -> list[TensorRef]:
    """Return the tensor placeholders of a skeleton in index order."""
    out: list[TensorRef] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, TensorRef):
            out.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                walk(v)

    walk(skeleton)
    return sorted(out, key=lambda r: r.index)


def nbytes(t: torch.Tensor) -> int:
    """Bytes of tensor ``t``'s elements."""
    return t.numel() * t.element_size()


def partition(tensors: list[torch.Tensor]) -> tuple[list[int], list[int]]:
    """Split tensor indices into (small ones to pack, large ones to send directly)."""
    small = [i for i, t in enumerate(tensors) if nbytes(t) < SMALL_TENSOR_BYTES]
    large = [i for i, t in enumerate(tensors) if nbytes(t) >= SMALL_TENSOR_BYTES]
    return small, large


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate the bytes of ``tensors`` (moved to CPU) into one uint8 tensor."""
    if not tensors:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.cat([t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                      for t in tensors])


def unpack(buf: torch.Tensor, like: list[TensorRef]) -> list[torch.Tensor]:
    """Cut a :func:`pack` buffer back into CPU tensors shaped like ``like``."""
    out: list[torch.Tensor] = []
    offset = 0
    for ref in like:
        size = torch.empty(0, dtype=ref.dtype).element_size()
        n = 1
        for d in ref.shape:
            n *= d
        chunk = buf[offset:offset + n * size].clone()
        out.append(chunk.view(ref.dtype).reshape(ref.shape))
        offset += n * size
    return out


def clone_state(state: Any) -> Any:
    """Deep-copy every tensor of ``state`` (a snapshot a background writer can save)."""
    skel, tensors = split_state(state)
    return join_state(skel, [t.detach().to("cpu", copy=True) for t in tensors])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(state: Any, directory: Path, step: int, keep: int = 2,
                     before_rename: Callable[[int], None] | None = None) -> Path:
    """Atomically write ``state`` as ``step-XXXXXXXXX.pt`` in ``directory`` and fsync it.

    The file appears under its final name only when complete (write to a temporary
    name, fsync, rename, fsync the directory), so a reader never sees a torn file.
    Keeps the ``keep`` newest checkpoints. ``before_rename(step)`` runs with the bytes
    written but not yet renamed (fault injection: a death half-way through the write).
    (HSDP checkpoints are :mod:`runtime.sharded_checkpoint`'s.)
    """
    directory.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:09d}.pt"
    final = directory / name
    tmp = directory / f".{name}.tmp{os.getpid()}"
    try:
        with tmp.open("wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename(step)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException as exc:
        # No partial file is left behind (a full disk: torch.save raises RuntimeError
        # from its stream writer, the fsync an OSError), whatever failed.
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, (OSError, RuntimeError)):
            raise CheckpointError(f"cannot write checkpoint {final}: {exc}") from exc
        raise
    for old in sorted(directory.glob("step-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return final


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """Return (step, path) of the newest complete checkpoint in ``directory``, or None."""
    if not directory.is_dir():
        return None
    files = sorted(directory.glob("step-*.pt"))
    if not files:
        return None
    return int(files[-1].stem.split("-")[1]), files[-1]


def read_checkpoint(path: Path) -> Any:
    """Load a checkpoint written by :func:`write_checkpoint`; CheckpointError if unreadable."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds on a bad file
        raise CheckpointError(f"cannot load checkpoint {path}: {exc}") from exc


class CheckpointWriter:
    """Writes snapshots on a background thread so that training does not wait for disk.

    ``write(snapshot, step)`` does the writing and returns the durable checkpoint's path,
    or None when this writer's part is written but the checkpoint is finished by another
    (a shard of an HSDP checkpoint); ``on_written(step, path)`` runs after a path."""

    def __init__(self, write: Callable[[Any, int], Path | None],
                 on_written: Callable[[int, Path], None],
                 on_error: Callable[[int, BaseException], None] | None = None) -> None:
        self._write = write
        self._on_written = on_written
        self._on_error = on_error
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # the latest failed write's error

    def submit(self, snapshot: Any, step: int) -> None:
        """Write ``snapshot`` (already a private copy) for ``step``; waits for the previous
        write first so that checkpoints are published in order."""
        self.wait()

        def run() -> None:
            try:
                path = self._write(snapshot, step)
                if path is not None:
                    self._on_written(step, path)
            except BaseException as exc:  # a failed write is no crash: reported
                self.error = exc
                if self._on_error is not None:
                    self._on_error(step, exc)

        self._thread = threading.Thread(target=run, name="yoco-ckpt", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the write in progress (if any) is finished."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
