"""Sharded (HSDP) checkpoints in the ``torch.distributed.checkpoint`` (DCP) format: the
rollback fallback when no replica group holds a shard any more.

Each rank of replica group 0 writes its shard of every K-th committed step, on its
background writer, with ``torch.distributed.checkpoint.save``: the model and optimizer
state as FSDP2 DTensors (each rank writes its local shards, with their global offsets),
plus one small entry of ours (``yoco.meta``: optimizer param groups, scheduler, data
position, step, seed). The per-step RNG needs no state: at the start of step ``s`` rank
``r`` reseeds from ``(seed, s, r)`` (:class:`runtime.Job`), so step and seed define it.

Why not ``dcp.save`` over the shard group: DCP's default save gathers every rank's plan
on a coordinator, scatters the global plan back and ends with a barrier, all with c10d
collectives on a *registered* process group. Ours are per-generation gloo groups outside
c10d's registry (there is no default group), and a writer runs on a background thread
that must never block a step or hang on a peer that died. So every rank saves without
collectives (DCP's ``use_collectives=False`` mode: its own data file ``__K_0.distcp`` and
its own metadata ``__K.metadata``), and the rank that finds every shard's metadata
written -- elected by an ``O_EXCL`` claim, no messages -- merges them into the one global
``.metadata`` (the chunks of every tensor, which must cover it exactly) and renames the
temporary folder into place. The result is an ordinary DCP checkpoint: ``dcp.load``
reads it with any sharding (a different shard count, or one process unsharded).

Atomic: the folder is written under a temporary name (``.dcp-step-N.gG.tmp``, one per
attempt: G is the generation) and renamed to ``dcp-step-N`` only after the global
metadata is written and fsync'd; :func:`latest_sharded_checkpoint` only sees renamed
folders. A writer killed half-way leaves a temporary folder without metadata that nothing
reads.
"""

from __future__ import annotations

import functools
import io
import math
import os
import pickle
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from runtime.errors import CheckpointError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

# DCP and DTensor are imported where they are used, not here: the supervisor and the
# resume path import this module for its folder helpers, and the two imports take about
# half a second of CPU per process (sympy, torch.fx) that only HSDP jobs need
# (docs/benchmarks-runtime.md, "Figures behind the code").

#: Name prefix of a whole (renamed) sharded checkpoint folder.
PREFIX = "dcp-step-"
#: The entry of ours in the checkpoint: everything that is not a tensor, as bytes.
META = "yoco.meta"
_MODEL = "model."
_OPTIM = "optimizer.state."
_METADATA = ".metadata"  # DCP's global metadata file name
_CLAIM = ".finalizing"
FORMAT = 1


def checkpoint_name(step: int) -> str:
    """Folder name of the sharded checkpoint of committed step ``step``."""
    return f"{PREFIX}{step:09d}"


def _tmp_name(step: int, attempt: int) -> str:
    return f".{checkpoint_name(step)}.g{attempt}.tmp"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_dtensor(t: object) -> bool:
    """True if ``t`` is a DTensor; without importing DTensor when nothing has (then no
    tensor can be one)."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def _like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as a DTensor sharded like ``param`` (no communication)."""
    from torch.distributed.tensor import DTensor

    assert isinstance(param, DTensor)
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def _encode(meta: dict[str, Any]) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(meta, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _decode(t: torch.Tensor) -> dict[str, Any]:
    meta = torch.load(io.BytesIO(bytes(t.tolist())), weights_only=True)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError("the checkpoint's yoco.meta entry is not of format "
                              f"{FORMAT}")
    return meta


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def sharded_snapshot(state: dict[str, Any], model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, shard: int) -> dict[str, Any]:
    """The flat DCP state dict of shard ``shard``, every tensor a private CPU copy (safe to
    write on a background thread while training goes on).

    ``state`` is :meth:`runtime.Job.state_dict` under HSDP (local shards as plain
    tensors). DTensor entries (``model.<fqn>``, ``optimizer.state.<i>.<name>``) are
    written by every shard; the replicated ones (plain tensors and ``yoco.meta``) by
    shard 0 only, so the merged metadata holds each chunk once."""
    live = model.state_dict()
    params = _params(optimizer)
    out: dict[str, Any] = {}
    for fqn, local in state["model"].items():
        copy = local.detach().to("cpu", copy=True)
        if _is_dtensor(live[fqn]):
            out[_MODEL + fqn] = _like(live[fqn], copy)
        elif shard == 0:
            out[_MODEL + fqn] = copy
    scalars: dict[int, dict[str, Any]] = {}
    # The order of the entries: a state loaded back iterates like the one saved.
    order = [(int(idx), list(entry)) for idx, entry in state["optimizer"]["state"].items()]
    for idx, entry in state["optimizer"]["state"].items():
        p = params[int(idx)]
        for name, value in entry.items():
            key = f"{_OPTIM}{int(idx)}.{name}"
            if not isinstance(value, torch.Tensor):
                scalars.setdefault(int(idx), {})[name] = value
                continue
            copy = value.detach().to("cpu", copy=True)
            if _is_dtensor(p) and copy.dim() > 0:
                out[key] = _like(p, copy)
            elif shard == 0:
                out[key] = copy
    if shard == 0:
        out[META] = _encode({
            "format": FORMAT, "step": int(state["step"]), "seed": state["seed"],
            "param_groups": state["optimizer"]["param_groups"], "scalars": scalars,
            "order": order,
            "scheduler": state["scheduler"], "sampler": state["sampler"]})
    return out


@functools.cache
def _shard_writer() -> type:
    """The class of DCP's file writer as rank ``shard`` without collectives (made on first
    use: it subclasses DCP's writer)."""
    import torch.distributed.checkpoint as dcp

    class _ShardWriter(dcp.FileSystemWriter):
        """DCP's file writer as rank ``shard`` without collectives (its own data file and
        metadata, ``__K_*``); ``torn()`` runs after the data is written, before the
        metadata (a fault injected there leaves a torn checkpoint)."""

        def __init__(self, path: Path, shard: int, torn: Callable[[], None] | None) -> None:
            super().__init__(path, sync_files=True, overwrite=True)
            self._shard = shard
            self._torn = torn

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any,
                                  **kwargs: Any) -> None:
            """Rank = this shard, no collectives (see the module docstring)."""
            super().set_up_storage_writer(is_coordinator, rank=self._shard,
                                          use_collectives=False)

        def finish(self, metadata: Metadata, results: Any) -> None:
            """Write this shard's metadata (after the fault hook)."""
            if self._torn is not None:
                self._torn()
            super().finish(metadata, results)

    return _ShardWriter


def _merge(parts: list[Metadata], where: Path) -> Metadata:
    """One global metadata from the shards' own: each tensor's chunks, which must cover it
    exactly once; each entry written by one shard only."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    entries: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    planner: dict[str, Any] = {}
    for md in parts:
        for fqn, entry in md.state_dict_metadata.items():
            prev = entries.get(fqn)
            if prev is None:
                entries[fqn] = entry
            elif isinstance(prev, TensorStorageMetadata) \
                    and isinstance(entry, TensorStorageMetadata) and prev.size == entry.size \
                    and prev.properties.dtype == entry.properties.dtype:
                entries[fqn] = TensorStorageMetadata(properties=prev.properties,
                                                     size=prev.size,
                                                     chunks=[*prev.chunks, *entry.chunks])
            else:
                raise CheckpointError(f"{where}: {fqn} written by two shards differently")
        storage.update(md.storage_data or {})
        planner.update(md.planner_data or {})
    for fqn, entry in entries.items():
        if isinstance(entry, TensorStorageMetadata):
            covered = sum(math.prod(c.sizes) for c in entry.chunks)
            if covered != math.prod(entry.size):
                raise CheckpointError(f"{where}: the shards hold {covered} of the "
                                      f"{math.prod(entry.size)} elements of {fqn}")
    return Metadata(state_dict_metadata=entries, planner_data=planner,
                    storage_data=storage, storage_meta=parts[0].storage_meta,
                    version=parts[0].version)


def write_sharded_checkpoint(snapshot: dict[str, Any], directory: Path, step: int, *,
                             attempt: int, shard: int, shards: int,
                             torn: Callable[[], None] | None = None,
                             keep: int = 2) -> Path | None:
    """Write shard ``shard`` (of ``shards``) of the checkpoint of ``step`` (``snapshot``
    from :func:`sharded_snapshot`) into the attempt's temporary folder; the shard that
    finds every shard written finalizes it (global metadata, fsync, rename to
    :func:`checkpoint_name`), prunes all but the ``keep`` newest whole checkpoints and
    the temporary folders they supersede, and returns the final path; the others
    return None. CheckpointError when the write fails (the checkpoint stays partial)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / _tmp_name(step, attempt)
    try:
        tmp.mkdir(exist_ok=True)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single
            warnings.simplefilter("ignore")  # process": yes, this shard's part
            dcp.save(snapshot, storage_writer=_shard_writer()(tmp, shard, torn),
                     no_dist=True, use_collectives=False)
        _fsync_dir(tmp)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise CheckpointError(f"cannot write shard {shard} of checkpoint {tmp}: {exc}") \
            from exc
    if len(list(tmp.glob(f"__*{_METADATA}"))) < shards:
        return None  # a slower shard finalizes
    try:
        os.close(os.open(tmp / _CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return None  # another shard saw them all at the same time and finalizes
    except OSError as exc:
        raise CheckpointError(f"cannot finalize checkpoint {tmp}: {exc}") from exc
    return _finalize(tmp, directory, step, shards, keep)


def _finalize(tmp: Path, directory: Path, step: int, shards: int, keep: int) -> Path:
    import torch.distributed.checkpoint as dcp

    try:
        # DCP's own reader of a rank's metadata (``__K.metadata``)
        parts = [dcp.FileSystemReader(tmp).read_metadata(rank=k) for k in range(shards)]
        merged = _merge(parts, tmp)
        part = tmp / f"{_METADATA}.tmp"
        with part.open("wb") as fh:
            pickle.dump(merged, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, tmp / _METADATA)
        _fsync_dir(tmp)
        final = directory / checkpoint_name(step)
        old = None
        if final.exists():  # the same step again after a rollback: same training state
            old = directory / f".{final.name}.old{os.getpid()}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(directory)
    except CheckpointError:
        raise
    except Exception as exc:  # unreadable shard metadata, a failed write or rename
        raise CheckpointError(f"cannot finalize checkpoint {tmp}: {exc}") from exc
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(directory, keep, step)
    return final


def _step_of(path: Path) -> int | None:
    name = path.name.lstrip(".")
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX):len(PREFIX) + 9]
    return int(digits) if digits.isdigit() else None


def _prune(directory: Path, keep: int, step: int) -> None:
    whole = sorted(p for p in directory.glob(f"{PREFIX}*") if _step_of(p) is not None)
    for old in whole[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    # Temporary folders superseded by a whole checkpoint: another attempt at this step,
    # or a step older than every kept checkpoint (writes that died; a write still in
    # flight is of a newer step, or of an abandoned generation whose work is void).
    oldest = _step_of(whole[-keep]) if len(whole) >= keep else None
    for tmp in directory.glob(f".{PREFIX}*.tmp"):
        s = _step_of(tmp)
        if s is not None and (s == step or (oldest is not None and s < oldest)):
            shutil.rmtree(tmp, ignore_errors=True)


def discard_partial_checkpoints(directory: Path) -> list[Path]:
    """Remove every temporary (never finalized) checkpoint folder in ``directory``; call
    only when no writer can be running (a supervisor resuming: its workers are gone).
    Returns what was removed."""
    gone = []
    if directory.is_dir():
        for tmp in directory.glob(f".{PREFIX}*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
            gone.append(tmp)
    return gone


def latest_sharded_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """Return (step, folder) of the newest whole sharded checkpoint in ``directory`` (a
    renamed folder: its global metadata was written before the rename), or None."""
    if not directory.is_dir():
        return None
    whole = [(s, p) for p in directory.glob(f"{PREFIX}*")
             if (s := _step_of(p)) is not None and (p / _METADATA).is_file()]
    return max(whole) if whole else None


def read_sharded_checkpoint(path: Path, model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load this rank's shards of the checkpoint in ``path`` for ``model`` (sharded with
    FSDP2, or not: DCP reshards) and ``optimizer``; return them as a
    :meth:`runtime.Job.state_dict` (local tensors), for ``Job.load_state_dict``.
    CheckpointError if the folder is not a whole checkpoint or does not fit the model
    (a missing or extra parameter, another shape)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from torch.distributed.tensor import DTensor

    reader = dcp.FileSystemReader(path)
    try:
        md = reader.read_metadata()
    except Exception as exc:
        raise CheckpointError(f"cannot load checkpoint {path}: no readable global metadata "
                              f"({type(exc).__name__}: {exc})") from exc
    live = model.state_dict()
    params = _params(optimizer)
    target: dict[str, Any] = {}
    missing = [f for f in live if _MODEL + f not in md.state_dict_metadata]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no {', '.join(missing[:5])}")
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            raise CheckpointError(f"checkpoint {path}: unexpected entry {fqn}")
        dtype, size = entry.properties.dtype, torch.Size(entry.size)
        if fqn == META:
            target[fqn] = torch.empty(size, dtype=dtype)
        elif fqn.startswith(_MODEL):
            like = live.get(fqn[len(_MODEL):])
            if like is None:
                raise CheckpointError(f"checkpoint {path} has {fqn}, the model has not")
            if like.shape != size:
                raise CheckpointError(f"checkpoint {path}: {fqn} has shape {tuple(size)}, "
                                      f"the model's is {tuple(like.shape)}")
            target[fqn] = _like(like, torch.empty_like(like.to_local())) \
                if isinstance(like, DTensor) else torch.empty_like(like)
        elif fqn.startswith(_OPTIM):
            idx_s, _, _name = fqn[len(_OPTIM):].partition(".")
            if not idx_s.isdigit() or int(idx_s) >= len(params):
                raise CheckpointError(f"checkpoint {path} has {fqn}, the optimizer has "
                                      f"{len(params)} parameters")
            p = params[int(idx_s)]
            if len(size) > 0 and size != p.shape:  # a per-element state, as the param
                raise CheckpointError(f"checkpoint {path}: {fqn} has shape {tuple(size)}, "
                                      f"its parameter's is {tuple(p.shape)}")
            if isinstance(p, DTensor) and len(size) > 0:
                target[fqn] = _like(p, torch.empty(p.to_local().shape, dtype=dtype))
            else:
                target[fqn] = torch.empty(size, dtype=dtype)
        else:
            raise CheckpointError(f"checkpoint {path}: unexpected entry {fqn}")
    if META not in target:
        raise CheckpointError(f"checkpoint {path} has no {META} entry")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(target, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise CheckpointError(f"cannot load checkpoint {path}: {type(exc).__name__}: "
                              f"{exc}") from exc
    meta = _decode(target[META])

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    state: dict[int, dict[str, Any]] = {}
    try:
        for idx, names in meta["order"]:
            scalars = meta["scalars"].get(idx, {})
            state[idx] = {n: scalars[n] if n in scalars else local(target[f"{_OPTIM}{idx}.{n}"])
                          for n in names}
    except KeyError as exc:
        raise CheckpointError(f"checkpoint {path} lacks optimizer entry {exc}") from exc
    return {
        "model": {fqn: local(target[_MODEL + fqn]) for fqn in live},
        "optimizer": {"state": state,
                      "param_groups": meta["param_groups"]},
        "scheduler": meta["scheduler"],
        "sampler": meta["sampler"],
        "step": meta["step"],
        "seed": meta["seed"],
    }
