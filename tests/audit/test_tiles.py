"""C2SP tlog-tiles layout (ledger/tiles.py): paths, which tiles a size needs, bundles, roots."""

from __future__ import annotations

import hashlib

import pytest

from ledger import merkle, tiles


def test_index_encoding_follows_the_spec() -> None:
    # c2sp.org/tlog-tiles: groups of three digits, all but the last prefixed with x.
    assert tiles.encode_index(0) == "000"
    assert tiles.encode_index(5) == "005"
    assert tiles.encode_index(999) == "999"
    assert tiles.encode_index(1000) == "x001/000"
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.Tile(0, 1234067, 8).path == "tile/0/x001/x234/067.p/8"
    assert tiles.Tile(-1, 3, 256).path == "tile/entries/003"
    assert tiles.Tile(2, 0, 1).path == "tile/2/000.p/1"
    with pytest.raises(ValueError):
        tiles.encode_index(-1)


def test_tiles_for_size() -> None:
    assert tiles.tiles_for_size(0) == []
    paths = [t.path for t in tiles.tiles_for_size(70000)]
    # 70000 = 273·256 + 112 leaves; 273 = 256 + 17 level-1 hashes; 1 level-2 hash.
    assert paths.count("tile/entries/273.p/112") == 1
    assert "tile/0/272" in paths and "tile/0/273.p/112" in paths
    assert paths[-3:] == ["tile/1/000", "tile/1/001.p/17", "tile/2/000.p/1"]
    assert [t.path for t in tiles.tiles_for_size(256)] == ["tile/entries/000", "tile/0/000",
                                                           "tile/1/000.p/1"]


def test_bundle_round_trip_and_refusals() -> None:
    entries = [b"", b"a", b"x" * 300, "é".encode()]
    data = tiles.bundle_entries(entries)
    assert data[:2] == b"\x00\x00" and data[2:5] == b"\x00\x01a"
    assert tiles.parse_bundle(data) == entries
    with pytest.raises(ValueError, match="claims"):
        tiles.parse_bundle(data[:-1])
    with pytest.raises(ValueError, match="does not fit"):
        tiles.bundle_entries([b"x" * 70000])


@pytest.mark.parametrize("n", [1, 2, 3, 255, 256, 257, 511, 700, 65537])
def test_tiles_and_root_agree_with_the_reference_tree(n: int) -> None:
    leaves = [merkle.leaf_hash(str(i).encode()) for i in range(n)]
    levels = tiles.compute_levels(leaves)
    if n <= 700:
        assert tiles.tree_root(n, levels) == merkle.reference_root(leaves)
    for size in {1, n // 2 or 1, n}:
        assert tiles.tree_root(size, levels) == merkle.root_from_nodes(
            size, lambda lv, ix: levels[lv][ix]
        )
    for t in tiles.tiles_for_size(n):
        if t.level < 0:
            continue
        got = tiles.split_tile(tiles.tile_bytes(levels, t), t)
        assert len(got) == t.width
        if t.level == 1:  # a level-1 hash is the root of a full level-0 tile
            first = leaves[256 * t.first : 256 * t.first + 256]
            assert got[0] == merkle.reference_root(first)
    assert hashlib.sha256(b"\x00" + b"0").digest() == leaves[0]
