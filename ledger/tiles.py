"""C2SP tlog-tiles (https://c2sp.org/tlog-tiles): a log as static files, pure Python.

A log of ``size`` entries is published as

* ``checkpoint`` — the signed tree head (a C2SP checkpoint note);
* ``tile/entries/<N>[.p/<W>]`` — entry bundles: entries ``256·N .. 256·N+W-1``, each as
  a big-endian uint16 length followed by the entry's bytes;
* ``tile/<L>/<N>[.p/<W>]`` — hash tiles: the hashes of the tree's perfect nodes at height
  ``8·L`` (``L`` = 0: the RFC 9162 leaf hashes), numbers ``256·N .. 256·N+W-1``,
  concatenated (32 bytes each).

Tiles are 256 wide (height 8). A tile is full (no suffix) when it holds 256 hashes, else
it is the rightmost, *partial* tile of its level and its path ends in ``.p/<W>``,
``1 <= W <= 255``. ``<N>`` is written in groups of three decimal digits, every group but
the last prefixed with ``x``: 1234067 → ``x001/x234/067``, 5 → ``005``.  Level ``L``
exists while the tree has at least one perfect node of height ``8·L``
(``size >> 8L > 0``). The layout of C2SP logs such as Sunlight and Tessera; the tiles'
contents equal Go's ``golang.org/x/mod/sumdb/tlog`` tiles of height 8, whose older
sumdb paths differ only by an extra height element (``tile/8/<L>/<N>``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ledger.merkle import root_from_nodes

__all__ = [
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "Tile",
    "bundle_entries",
    "compute_levels",
    "encode_index",
    "parse_bundle",
    "split_tile",
    "tile_bytes",
    "tiles_for_size",
    "tree_root",
]

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
_HASH = 32
_MAX_ENTRY = 0xFFFF


def encode_index(n: int) -> str:
    """``n`` as tile path elements: ``1234067`` → ``x001/x234/067``, ``5`` → ``005``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"tile index must be a non-negative integer, got {n!r}")
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


@dataclass(frozen=True, slots=True)
class Tile:
    """One tile: ``level`` (``-1`` for an entry bundle), ``index`` and ``width`` (1..256)."""

    level: int
    index: int
    width: int

    @property
    def path(self) -> str:
        """The tile's path under the log's prefix, e.g. ``tile/0/x001/234.p/5``."""
        lv = "entries" if self.level < 0 else str(self.level)
        suffix = "" if self.width == TILE_WIDTH else f".p/{self.width}"
        return f"tile/{lv}/{encode_index(self.index)}{suffix}"

    @property
    def first(self) -> int:
        """The number of the first hash (or entry) the tile holds at its level."""
        return self.index * TILE_WIDTH


def tiles_for_size(size: int) -> list[Tile]:
    """Every tile of a tree of ``size`` leaves: the entry bundles, then hash tiles by level.

    For each level, the full tiles and (when the count is not a multiple of 256) one
    partial tile; a tree of 0 entries has none.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"tree size must be a non-negative integer, got {size!r}")
    out: list[Tile] = []
    levels = [-1]
    level = 0
    while size >> (TILE_HEIGHT * level):
        levels.append(level)
        level += 1
    for lv in levels:
        count = size >> (TILE_HEIGHT * max(lv, 0))
        full, rest = divmod(count, TILE_WIDTH)
        out.extend(Tile(lv, i, TILE_WIDTH) for i in range(full))
        if rest:
            out.append(Tile(lv, full, rest))
    return out


def bundle_entries(entries: Iterable[bytes]) -> bytes:
    """An entry bundle: each entry as a big-endian uint16 length and its bytes.

    Raises ValueError for an entry longer than 65,535 bytes (the format's limit).
    """
    parts: list[bytes] = []
    for e in entries:
        if len(e) > _MAX_ENTRY:
            raise ValueError(f"an entry of {len(e)} bytes does not fit a tlog-tiles bundle")
        parts.append(len(e).to_bytes(2, "big"))
        parts.append(bytes(e))
    return b"".join(parts)


def parse_bundle(data: bytes) -> list[bytes]:
    """The entries of an entry bundle; ValueError when a length runs past the end."""
    out: list[bytes] = []
    append = out.append
    pos, n = 0, len(data)
    while pos < n:
        if pos + 2 > n:
            raise ValueError(f"entry bundle ends inside a length prefix at byte {pos}")
        # The big-endian uint16 read from its two bytes (a slice and int.from_bytes per
        # entry cost twice as much, at a million entries).
        start = pos + 2
        end = start + (data[pos] << 8 | data[pos + 1])
        if end > n:
            raise ValueError(
                f"entry {len(out)} of the bundle claims {end - start} bytes, only {n - start} "
                "are left"
            )
        append(data[start:end])
        pos = end
    return out


def compute_levels(leaf_hashes: Sequence[bytes]) -> list[list[bytes]]:
    """Every perfect node of the tree over ``leaf_hashes``, by height.

    ``levels[h][i]`` is the MTH of leaves ``[i·2^h, (i+1)·2^h)``; ``levels[0]`` is the
    leaf hashes themselves.  About ``2·n`` hashes in all.
    """
    sha = hashlib.sha256
    levels = [list(leaf_hashes)]
    cur = levels[0]
    while len(cur) > 1:
        # Pairs by zip of the even and odd nodes (no index arithmetic per node); an odd
        # last node has no pair and makes no perfect node at the next height.
        nxt = [
            sha(b"\x01" + left + right).digest()
            for left, right in zip(cur[::2], cur[1::2], strict=False)
        ]
        levels.append(nxt)
        cur = nxt
    return levels


def tile_bytes(levels: Sequence[Sequence[bytes]], tile: Tile) -> bytes:
    """The content of hash tile ``tile`` (level >= 0) from :func:`compute_levels`."""
    if tile.level < 0:
        raise ValueError("entry bundles are not hash tiles")
    height = TILE_HEIGHT * tile.level
    row = levels[height] if height < len(levels) else []
    part = row[tile.first : tile.first + tile.width]
    if len(part) != tile.width:
        raise ValueError(f"{tile.path}: the tree has only {len(row)} nodes at height {height}")
    return b"".join(part)


def tree_root(size: int, levels: Sequence[Sequence[bytes]]) -> bytes:
    """The RFC 9162 root of the first ``size`` leaves, from :func:`compute_levels` output."""

    def get(level: int, index: int) -> bytes:
        return levels[level][index]

    return root_from_nodes(size, get)


def split_tile(data: bytes, tile: Tile) -> list[bytes]:
    """The hashes of hash tile ``tile`` from its bytes; ValueError when the length is wrong."""
    if len(data) != _HASH * tile.width:
        raise ValueError(
            f"{tile.path}: {len(data)} bytes, a tile of width {tile.width} has {_HASH * tile.width}"
        )
    return [data[i : i + _HASH] for i in range(0, len(data), _HASH)]
