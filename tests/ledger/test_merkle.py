"""RFC 9162 Merkle tree: conformance probes, reference cross-checks, node store, tampering, speed."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import merkle
from ledger.errors import MissingNodeError, ProofError, TreeSizeError
from ledger.merkle import (
    EMPTY_ROOT,
    CompactRange,
    appended_nodes,
    consistency_coords,
    consistency_proof,
    frontier_coords,
    inclusion_coords,
    inclusion_proof,
    leaf_hash,
    node_hash,
    range_coords,
    reference_consistency_proof,
    reference_inclusion_proof,
    reference_root,
    root_coords,
    root_from_nodes,
    verify_consistency,
    verify_inclusion,
)

# Vendored RFC 9162 probes (origin and licence: tests/data/rfc9162/README.md).
TESTDATA = Path(__file__).resolve().parents[1] / "data" / "rfc9162"
PROBES = sorted(TESTDATA.glob("**/*.json")) if TESTDATA.is_dir() else []
INCLUSION_PROBES = [p for p in PROBES if p.relative_to(TESTDATA).parts[0] == "inclusion"]
CONSISTENCY_PROBES = [p for p in PROBES if p.relative_to(TESTDATA).parts[0] == "consistency"]

# The 8 leaves of the RFC 6962 / certificate-transparency reference tree (the one the
# conformance probes' happy paths are built on) and its roots at sizes 1..8.
CT_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    bytes(range(0x60, 0x70)),
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def _leaves(n: int, seed: int = 0) -> list[bytes]:
    return [leaf_hash(f"{seed}:{i}".encode()) for i in range(n)]


LEAVES = _leaves(1100)


@cache
def _store(n: int) -> dict[tuple[int, int], bytes]:
    """All perfect nodes of the tree of the first n of LEAVES."""
    return {(lv, ix): h for lv, ix, h in appended_nodes(0, {}, LEAVES[:n])}


@cache
def _ref_root(n: int) -> bytes:
    return reference_root(LEAVES[:n])


def _b64(v: str | None) -> bytes:
    return base64.b64decode(v or "")


def _flip(proof: Sequence[bytes], i: int, bit: int = 0) -> list[bytes]:
    out = list(proof)
    b = bytearray(out[i])
    b[bit // 8] ^= 1 << (bit % 8)
    out[i] = bytes(b)
    return out


# --------------------------------------------------------------------------- conformance probes


def test_probe_directory_is_present_and_complete() -> None:
    assert TESTDATA.is_dir(), f"vendored test data missing: {TESTDATA}"
    assert (TESTDATA / "README.md").is_file()
    assert len(INCLUSION_PROBES) >= 90, INCLUSION_PROBES
    assert len(CONSISTENCY_PROBES) >= 90, CONSISTENCY_PROBES


def _probe_id(p: Path) -> str:
    return str(p.relative_to(TESTDATA))


@pytest.mark.parametrize("path", INCLUSION_PROBES, ids=_probe_id)
def test_inclusion_probe(path: Path) -> None:
    d: dict[str, Any] = json.loads(path.read_text())
    proof = [_b64(p) for p in d["proof"] or []]
    args = (d["leafIdx"], d["treeSize"], _b64(d["leafHash"]), proof, _b64(d["root"]))
    if d["wantErr"]:
        with pytest.raises(ProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", CONSISTENCY_PROBES, ids=_probe_id)
def test_consistency_probe(path: Path) -> None:
    d: dict[str, Any] = json.loads(path.read_text())
    proof = [_b64(p) for p in d["proof"] or []]
    args = (d["size1"], d["size2"], proof, _b64(d["root1"]), _b64(d["root2"]))
    if d["wantErr"]:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def test_ct_reference_tree_roots() -> None:
    hashes = [leaf_hash(x) for x in CT_LEAVES]
    assert EMPTY_ROOT.hex() == hashlib.sha256(b"").hexdigest()
    assert reference_root([]) == EMPTY_ROOT
    for n in range(1, 9):
        assert reference_root(hashes[:n]).hex() == CT_ROOTS[n - 1]
        assert CompactRange().extend(hashes[:n]) is not None
        c = CompactRange()
        c.extend(hashes[:n], collect=False)
        assert c.root().hex() == CT_ROOTS[n - 1]


def test_happy_path_probes_match_our_generated_proofs() -> None:
    """Proofs generated from our node store are byte-identical to the Go reference's."""
    hashes = [leaf_hash(x) for x in CT_LEAVES]
    store = {(lv, ix): h for lv, ix, h in appended_nodes(0, [], hashes)}
    checked = 0
    for path in PROBES:
        d = json.loads(path.read_text())
        if d["wantErr"] or "additional" in path.parts:
            continue
        want = [_b64(p) for p in d["proof"] or []]
        if "leafIdx" in d:
            n, i = d["treeSize"], d["leafIdx"]
            if n <= 8 and _b64(d["leafHash"]) == hashes[i]:
                nodes = {c: store[c] for c in inclusion_coords(i, n)}
                assert inclusion_proof(i, n, nodes) == want, path
                checked += 1
        else:
            m, n = d["size1"], d["size2"]
            if n <= 8 and _b64(d["root2"]) == bytes.fromhex(CT_ROOTS[n - 1]):
                assert consistency_proof(m, n, store) == want, path
                checked += 1
    assert checked >= 8


# --------------------------------------------------------------------------- node store


def test_frontier_and_range_coords() -> None:
    assert frontier_coords(0) == []
    assert frontier_coords(1) == [(0, 0)]
    assert frontier_coords(13) == [(3, 0), (2, 2), (0, 12)]
    assert frontier_coords(16) == [(4, 0)]
    assert root_coords(6) == [(2, 0), (1, 2)]
    assert range_coords(8, 13) == [(2, 2), (0, 12)]
    assert range_coords(3, 9) == [(0, 3), (2, 1), (0, 8)]
    assert range_coords(5, 5) == []
    with pytest.raises(TreeSizeError):
        frontier_coords(-1)
    with pytest.raises(TreeSizeError):
        range_coords(4, 3)


@pytest.mark.parametrize("n", [*range(0, 131), 255, 256, 257, 511, 1000, 1024, 1025, 1100])
def test_store_and_root_match_reference(n: int) -> None:
    store = _store(n)
    # exactly the perfect subtrees, each equal to the reference MTH of its range
    expected = {(lv, ix) for lv in range(n.bit_length() + 1) for ix in range(n >> lv) if n >> lv}
    assert set(store) == expected
    for (lv, ix), h in store.items():
        if lv <= 3 or n <= 130:
            assert h == reference_root(LEAVES[ix << lv : (ix + 1) << lv])
    assert root_from_nodes(n, store) == _ref_root(n)
    assert root_from_nodes(n, lambda lv, ix: store[(lv, ix)]) == _ref_root(n)
    c = CompactRange()
    c.extend(LEAVES[:n], collect=False)
    assert c.size == n and c.root() == _ref_root(n)


def _apply_batches(n: int, cuts: list[int]) -> dict[tuple[int, int], bytes]:
    store: dict[tuple[int, int], bytes] = {}
    old = 0
    for cut in [*sorted(cuts), n]:
        frontier = {c: store[c] for c in frontier_coords(old)}
        new = appended_nodes(old, frontier, LEAVES[old:cut])
        for lv, ix, h in new:
            assert (lv, ix) not in store, "a node was produced twice"
            assert (ix + 1) << lv <= cut and (ix + 1) << lv > old
            store[(lv, ix)] = h
        old = cut
    return store


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 31, 64, 100, 129, 130, 257, 1100])
def test_appended_nodes_random_batches(n: int) -> None:
    rng = random.Random(n)
    for _ in range(5):
        cuts = rng.sample(range(n + 1), k=min(n + 1, rng.randint(0, 12)))
        assert _apply_batches(n, cuts) == _store(n)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=300),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=15),
)
def test_appended_nodes_property(n: int, cuts: list[int]) -> None:
    assert _apply_batches(n, [c for c in cuts if c <= n]) == _store(n)


def test_appended_nodes_sequence_frontier_and_errors() -> None:
    store = _store(13)
    seq = [store[c] for c in frontier_coords(13)]
    assert appended_nodes(13, seq, LEAVES[13:20]) == appended_nodes(13, store, LEAVES[13:20])
    with pytest.raises(TreeSizeError):
        appended_nodes(13, seq[:-1], LEAVES[13:20])
    with pytest.raises(MissingNodeError):
        appended_nodes(13, {(3, 0): store[(3, 0)]}, LEAVES[13:20])
    with pytest.raises(TreeSizeError):
        appended_nodes(13, seq, [b"short"])
    assert appended_nodes(13, seq, []) == []


def test_compact_range_resumes_from_frontier() -> None:
    c = CompactRange()
    c.extend(LEAVES[:77])
    d = CompactRange(77, c.frontier())
    d.extend(LEAVES[77:300])
    assert d.root() == _ref_root(300)


# --------------------------------------------------------------------------- proofs


@pytest.mark.parametrize("n", range(1, 131))
def test_inclusion_proofs_match_reference(n: int) -> None:
    store = _store(n)
    root = _ref_root(n)
    for i in range(n):
        coords = inclusion_coords(i, n)
        assert all(((ix + 1) << lv) <= n for lv, ix in coords), "reads a node not yet final"
        proof = inclusion_proof(i, n, {c: store[c] for c in coords})
        assert proof == reference_inclusion_proof(i, LEAVES[:n])
        verify_inclusion(i, n, LEAVES[i], proof, root)


@pytest.mark.parametrize("n", [255, 256, 257, 1000, 1025, 1100])
def test_inclusion_proofs_larger_trees(n: int) -> None:
    store = _store(n)
    root = _ref_root(n)
    for i in [0, 1, n // 3, n // 2, n - 2, n - 1]:
        proof = inclusion_proof(i, n, store)
        assert proof == reference_inclusion_proof(i, LEAVES[:n])
        verify_inclusion(i, n, LEAVES[i], proof, root)


@pytest.mark.parametrize("n", range(1, 131))
def test_consistency_proofs_match_reference(n: int) -> None:
    store = _store(n)
    for m in range(1, n + 1):
        coords = consistency_coords(m, n)
        assert all(((ix + 1) << lv) <= n for lv, ix in coords)
        proof = consistency_proof(m, n, {c: store[c] for c in coords})
        assert proof == reference_consistency_proof(m, LEAVES[:n])
        verify_consistency(m, n, proof, _ref_root(m), _ref_root(n))


@pytest.mark.parametrize("m,n", [(1, 1100), (255, 257), (256, 1025), (513, 1000), (1024, 1100)])
def test_consistency_proofs_larger_trees(m: int, n: int) -> None:
    proof = consistency_proof(m, n, _store(n))
    assert proof == reference_consistency_proof(m, LEAVES[:n])
    verify_consistency(m, n, proof, _ref_root(m), _ref_root(n))


def test_tampered_inclusion_proofs_fail() -> None:
    for n in [1, 2, 5, 8, 13, 64, 100, 257]:
        store, root = _store(n), _ref_root(n)
        for i in {0, n // 2, n - 1}:
            proof = inclusion_proof(i, n, store)
            for k in range(len(proof)):
                for bit in (0, 255):
                    with pytest.raises(ProofError):
                        verify_inclusion(i, n, LEAVES[i], _flip(proof, k, bit), root)
            bad_cases: list[tuple[int, int, bytes, list[bytes], bytes]] = [
                (i, n, LEAVES[i], [*proof, proof[0] if proof else root], root),  # extended
                (i, n, LEAVES[i], proof, _flip([root], 0)[0]),  # wrong root
                (i, n, LEAVES[(i + 1) % 1100], proof, root),  # wrong leaf
                (i, 2 * n + 1, LEAVES[i], proof, root),  # wrong size (other shape)
                (i, n, LEAVES[i][:31], proof, root),  # short leaf hash
                (n, n, LEAVES[i], proof, root),  # index beyond size
                (-1, n, LEAVES[i], proof, root),
            ]
            if proof:
                bad_cases.append((i, n, LEAVES[i], proof[:-1], root))  # truncated
                bad_cases.append((i, n, LEAVES[i], [proof[0][:31], *proof[1:]], root))
            if n > 1:
                bad_cases.append((i ^ 1 if i ^ 1 < n else i - 1, n, LEAVES[i], proof, root))
            for case in bad_cases:
                with pytest.raises(ProofError):
                    verify_inclusion(*case)


def test_tampered_consistency_proofs_fail() -> None:
    for m, n in [(1, 2), (3, 7), (4, 8), (6, 8), (7, 130), (64, 100), (100, 257)]:
        proof = consistency_proof(m, n, _store(n))
        r1, r2 = _ref_root(m), _ref_root(n)
        verify_consistency(m, n, proof, r1, r2)
        for k in range(len(proof)):
            with pytest.raises(ProofError):
                verify_consistency(m, n, _flip(proof, k, 7), r1, r2)
        for case in [
            (m, n, proof[:-1], r1, r2),
            (m, n, [*proof, r1], r1, r2),
            (m, n, proof, r2, r1),
            (m, n, proof, _ref_root(m + 1), r2),
            (m, n, proof, r1, _ref_root(n - 1)),
            (m + 1, n, proof, r1, r2),
            (m, 2 * n + 1, proof, r1, r2),
            (n, m, proof, r1, r2),
            (0, n, proof, EMPTY_ROOT, r2),
            (m, n, [], r1, r2),
        ]:
            with pytest.raises(ProofError):
                verify_consistency(*case)


def test_equal_sizes_and_bad_arguments() -> None:
    verify_consistency(5, 5, [], _ref_root(5), _ref_root(5))
    assert consistency_proof(5, 5, _store(5)) == []
    with pytest.raises(ProofError):
        verify_consistency(5, 5, [], _ref_root(5), _ref_root(4))
    with pytest.raises(ProofError):
        verify_consistency(0, 0, [], EMPTY_ROOT, EMPTY_ROOT)
    with pytest.raises(TreeSizeError):
        consistency_proof(0, 5, _store(5))
    with pytest.raises(TreeSizeError):
        consistency_proof(6, 5, _store(5))
    with pytest.raises(TreeSizeError):
        inclusion_proof(5, 5, _store(5))
    with pytest.raises(TreeSizeError):
        inclusion_coords(True, 5)
    with pytest.raises(ProofError):
        verify_inclusion(True, 5, LEAVES[1], [], _ref_root(5))
    with pytest.raises(MissingNodeError):
        inclusion_proof(3, 5, {})
    assert root_from_nodes(0, {}) == EMPTY_ROOT
    assert node_hash(b"a", b"b") == hashlib.sha256(b"\x01ab").digest()
    assert leaf_hash(b"a") == hashlib.sha256(b"\x00a").digest()


# --------------------------------------------------------------------------- large trees


class _CountingStore:
    """A virtual 'store' for huge trees: deterministic node hashes, counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, level: int, index: int) -> bytes:
        self.reads += 1
        return hashlib.sha256(f"{level}/{index}".encode()).digest()


def test_proofs_at_a_million_entries_read_log_n_nodes() -> None:
    # Their speed is measured by bench/merkle_bench.py (docs/benchmarks.md), not here.
    size = 1_000_000
    rng = random.Random(7)
    for _ in range(200):
        i = rng.randrange(size)
        store = _CountingStore()
        coords = inclusion_coords(i, size)
        proof = inclusion_proof(i, size, store)
        assert store.reads == len(coords) <= 2 * size.bit_length()
        assert len(proof) <= size.bit_length()
        m = rng.randrange(1, size)
        store = _CountingStore()
        consistency_proof(m, size, store)
        assert store.reads <= 3 * size.bit_length()


def test_module_exports_are_real() -> None:
    for name in merkle.__all__:
        assert hasattr(merkle, name), name
