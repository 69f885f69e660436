"""A contract's whole log up to a signed checkpoint, as C2SP tlog-tiles static files.

``yoco ledger export-log CONTRACT --checkpoint N --out DIR`` and the portal's download
write the layout of :mod:`ledger.tiles`: ``checkpoint`` (the signed note of size N),
``tile/entries/…`` (the entries' canonical bytes, exactly what was hashed) and
``tile/<L>/…`` (hash tiles).  Static files a CDN could serve; a customer checks them with
``yoco-verify`` or any tlog-tiles client.  Before anything is handed out the tiles' root
is recomputed from the entries and must equal the signed root.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import checkpoints, merkle, tiles
from ledger.errors import LedgerError, UnknownContract, VerificationFailed
from ledger.models import Checkpoint, JournalEntry, LedgerLog
from ledger.witnessing import cosigned_note

__all__ = [
    "ExportInfo",
    "NoSuchCheckpoint",
    "export_files",
    "export_tar",
    "export_to_dir",
    "find_checkpoint",
]


class NoSuchCheckpoint(LedgerError):
    """The log has no signed checkpoint of the asked size (or none at all)."""


@dataclass(frozen=True, slots=True)
class ExportInfo:
    """What an export holds: the log, its signed size and root, how many files."""

    contract_id: str
    origin: str
    tree_size: int
    root_hash: bytes
    files: int


def find_checkpoint(session: Session, contract_id: str, tree_size: int | None) -> Checkpoint:
    """The signed checkpoint of ``contract_id`` of size ``tree_size`` (None: the latest).

    Raises :class:`UnknownContract` or :class:`NoSuchCheckpoint` (listing the sizes).
    """
    if session.get(LedgerLog, contract_id) is None:
        raise UnknownContract(f"unknown contract {contract_id!r}")
    if tree_size is None:
        cp = checkpoints.latest(session, contract_id)
    else:
        cp = checkpoints.at_size(session, contract_id, tree_size)
    if cp is None:
        sizes = checkpoints.signed_sizes(session, contract_id)
        listed = ", ".join(str(s) for s in sizes) or "none: run `yoco ledger checkpoint`"
        what = "signed checkpoint" + ("" if tree_size is None else f" of size {tree_size}")
        raise NoSuchCheckpoint(f"contract {contract_id!r} has no {what} (signed sizes: {listed})")
    return cp


def export_files(
    session: Session, contract_id: str, tree_size: int | None = None
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(path, content)`` of every file of the export, the checkpoint last.

    Reads the entries one bundle (256 entries) at a time.  Raises
    :class:`VerificationFailed` (before yielding any hash tile or the checkpoint) when the
    entries do not hash to the signed root.
    """
    cp = find_checkpoint(session, contract_id, tree_size)
    size = cp.tree_size
    leaves: list[bytes] = []
    bundle: list[bytes] = []
    rows = session.execute(
        select(JournalEntry.seq, JournalEntry.canonical)
        .where(JournalEntry.log_id == contract_id, JournalEntry.seq < size)
        .order_by(JournalEntry.seq)
        .execution_options(yield_per=4096)
    )
    for seq, canonical in rows:
        if seq != len(leaves):
            raise VerificationFailed(f"{contract_id}: entry {len(leaves)} is missing")
        data = bytes(canonical)
        leaves.append(merkle.leaf_hash(data))
        bundle.append(data)
        if len(bundle) == tiles.TILE_WIDTH or len(leaves) == size:
            tile = tiles.Tile(-1, (len(leaves) - 1) // tiles.TILE_WIDTH, len(bundle))
            yield tile.path, tiles.bundle_entries(bundle)
            bundle = []
    if len(leaves) != size:
        raise VerificationFailed(f"{contract_id}: the log has {len(leaves)} entries, not {size}")
    levels = tiles.compute_levels(leaves)
    root = tiles.tree_root(size, levels)
    if root != bytes(cp.root_hash):
        raise VerificationFailed(
            f"{contract_id}: the entries hash to {root.hex()}, checkpoint {size} signed "
            f"{bytes(cp.root_hash).hex()}"
        )
    for t in tiles.tiles_for_size(size):
        if t.level >= 0:
            yield t.path, tiles.tile_bytes(levels, t)
    yield "checkpoint", cosigned_note(session, cp).encode("utf-8")


def _info(cp: Checkpoint, files: int) -> ExportInfo:
    return ExportInfo(cp.log_id, cp.origin, cp.tree_size, bytes(cp.root_hash), files)


def export_to_dir(
    session: Session,
    contract_id: str,
    out: Path,
    tree_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportInfo:
    """Write the export into directory ``out`` (created if needed); the checkpoint last,
    each file written whole then renamed into place, so an interrupted export never
    leaves a checkpoint over missing tiles.  ``progress(done, total)`` is called after
    each file."""
    cp = find_checkpoint(session, contract_id, tree_size)
    out = Path(out)
    total = len(tiles.tiles_for_size(cp.tree_size)) + 1
    n = 0
    for rel, data in export_files(session, contract_id, cp.tree_size):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        n += 1
        if progress is not None:
            progress(n, total)
    return _info(cp, n)


def export_tar(
    session: Session, contract_id: str, tree_size: int | None = None
) -> tuple[ExportInfo, bytes]:
    """The export as a gzip-compressed tar archive (paths under ``<contract>-<size>/``)."""
    cp = find_checkpoint(session, contract_id, tree_size)
    top = f"{_safe(contract_id)}-log-{cp.tree_size}"
    buf = io.BytesIO()
    n = 0
    stamp = int(cp.signed_at.timestamp())
    # Same checkpoint, same bytes: gzip and tar times are the checkpoint's signing time.
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=stamp) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, data in export_files(session, contract_id, cp.tree_size):
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = stamp
            tar.addfile(info, io.BytesIO(data))
            n += 1
    return _info(cp, n), buf.getvalue()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
