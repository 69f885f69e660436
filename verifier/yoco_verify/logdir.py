"""Read a log exported in the C2SP tlog-tiles layout and check it against its checkpoint.

Every entry bundle and hash tile the signed tree size needs must be present; every leaf
hash is recomputed from the entry bytes, every hash tile from the level below, and the
root from the tiles must equal the signed root.  Nothing of the operator is trusted but
the pinned key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from yoco_verify import VerifyError
from yoco_verify.shared.ledger import merkle, note, tiles
from yoco_verify.shared.ledger.errors import NoteError

__all__ = ["VerifiedLog", "load_key", "open_log", "read_checkpoint"]


@dataclass(frozen=True, slots=True)
class VerifiedLog:
    """A log whose every entry was checked against the signed root."""

    path: Path
    origin: str
    size: int
    root: bytes
    note: str
    entries: list[bytes]
    levels: list[list[bytes]]

    def prefix_root(self, size: int) -> bytes:
        """The root of the log's first ``size`` entries (recomputed from the entries)."""
        return tiles.tree_root(size, self.levels)

    def consistency_proof(self, size1: int) -> list[bytes]:
        """The RFC 9162 consistency proof from ``size1`` to this log's size."""

        def get(level: int, index: int) -> bytes:
            return self.levels[level][index]

        return merkle.consistency_proof(size1, self.size, get)


def load_key(text_or_path: str) -> note.Verifier:
    """The pinned verifier key: the key text itself, or a file holding it."""
    text = text_or_path
    if "+" not in text_or_path or os.path.exists(text_or_path):
        try:
            text = Path(text_or_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise VerifyError(f"public key: cannot read {text_or_path}: {exc}") from None
    try:
        return note.Verifier.from_text(text.strip())
    except NoteError as exc:
        raise VerifyError(f"public key: {exc}") from None


def read_checkpoint(text: str, key: note.Verifier, what: str = "checkpoint") -> note.Checkpoint:
    """Open a signed checkpoint note with the pinned key; :class:`VerifyError` names why not."""
    try:
        return note.open_checkpoint(text, key)
    except NoteError as exc:
        raise VerifyError(f"{what}: {exc}") from None


def _read(root: Path, rel: str) -> bytes:
    try:
        return (root / rel).read_bytes()
    except FileNotFoundError:
        raise VerifyError(
            f"{rel}: missing (the log is truncated: the signed tree needs this file)"
        ) from None
    except OSError as exc:
        raise VerifyError(f"{rel}: cannot read: {exc}") from None


def open_log(
    path: Path,
    key: note.Verifier,
    progress: Callable[[str, int, int], None] | None = None,
) -> VerifiedLog:
    """Check the exported log at ``path`` against its signed checkpoint and pinned ``key``.

    Raises :class:`VerifyError` naming the first failed check: a checkpoint not signed by
    the key, a missing or short entry bundle or tile, an entry whose hash differs from its
    tile, a tile that differs from the level below, or a root that differs from the signed
    one.
    """
    path = Path(path)
    raw = _read(path, "checkpoint")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyError("checkpoint: not UTF-8") from None
    cp = read_checkpoint(text, key)
    all_tiles = tiles.tiles_for_size(cp.size)
    bundles = [t for t in all_tiles if t.level < 0]
    entries: list[bytes] = []
    for i, t in enumerate(bundles):
        try:
            got = tiles.parse_bundle(_read(path, t.path))
        except ValueError as exc:
            raise VerifyError(f"{t.path}: {exc}") from None
        if len(got) != t.width:
            raise VerifyError(
                f"{t.path}: holds {len(got)} entries, the signed tree needs {t.width} "
                "(the log is truncated or padded)"
            )
        entries.extend(got)
        if progress is not None:
            progress("read", i + 1, len(bundles))
    leaf = merkle.leaf_hash
    levels = tiles.compute_levels([leaf(e) for e in entries])
    if progress is not None:
        progress("hashed", len(entries), len(entries))
    for t in (t for t in all_tiles if t.level >= 0):
        data = _read(path, t.path)
        want = tiles.tile_bytes(levels, t)
        if data == want:
            continue
        try:
            have = tiles.split_tile(data, t)
        except ValueError as exc:
            raise VerifyError(str(exc)) from None
        for j, h in enumerate(have):
            if h != want[32 * j : 32 * j + 32]:
                n = t.first + j
                if t.level == 0:
                    raise VerifyError(
                        f"{t.path}: hash {j} is not the hash of entry {n} "
                        "(the entry or the tile was altered)"
                    )
                raise VerifyError(
                    f"{t.path}: hash {j} is not the root of tile/{t.level - 1} "
                    f"number {n} (a tile was altered)"
                )
    root = tiles.tree_root(cp.size, levels)
    if root != cp.root:
        raise VerifyError(
            f"checkpoint: the entries hash to root {root.hex()}, the signed root is {cp.root.hex()}"
        )
    return VerifiedLog(path, cp.origin, cp.size, cp.root, text, entries, levels)
