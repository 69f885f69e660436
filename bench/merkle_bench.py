"""Benchmark of the pure Merkle and proof code (no database): the figures the tests used to
assert on (a test asserts behaviour; the speed is measured here and quoted in
docs/benchmarks.md, "Merkle tree and proofs").

Usage::

    python bench/merkle_bench.py [--leaves 100000] [--append 10000] [--size 1000000]
        [--proofs 200] [--bundles 300] [--reps 5]

* tree recomputation: ``CompactRange`` over ``--leaves`` leaf hashes, root included (what
  verification does for a log, the tree part of it); ``appended_nodes`` for ``--append``
  leaves appended to an empty tree (what an ingest batch writes);
* inclusion proofs at ``--size`` entries: ``inclusion_proof`` of ``--proofs`` random
  entries over a virtual node store (deterministic hashes, no I/O);
* offline bundle checks: ``verify_inclusion_bundle`` of ``--bundles`` bundles of a
  ``--bundles``-entry log against one signed checkpoint, ``--reps`` times over.

Each timing is the best of ``--reps`` runs, then the median, on ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "verifier")]

ORIGIN = "bench.example/merkle"


def _timed(fn: Callable[[], object], reps: int) -> list[float]:
    """Wall seconds of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _line(name: str, times: list[float], per: int, unit: str) -> None:
    best, med = min(times), statistics.median(times)
    print(f"{name}: best {best * 1000:.1f} ms, median {med * 1000:.1f} ms "
          f"({per / best:,.0f} {unit}/s at best)")


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--leaves", type=int, default=100_000)
    parser.add_argument("--append", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=200)
    parser.add_argument("--bundles", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    import rfc8785

    from ledger import merkle
    from ledger.note import Signer, sign_checkpoint
    from ledger.proofs import build_inclusion_bundle, verify_inclusion_bundle

    leaves = [merkle.leaf_hash(f"3:{i}".encode()) for i in range(args.leaves)]

    def recompute() -> None:
        c = merkle.CompactRange()
        c.extend(leaves, collect=False)
        c.root()

    _line(f"tree recomputation, {args.leaves:,} leaves", _timed(recompute, args.reps),
          args.leaves, "leaves")
    appended = leaves[: args.append]
    _line(f"appended_nodes, {args.append:,} leaves onto an empty tree",
          _timed(lambda: merkle.appended_nodes(0, {}, appended), args.reps),
          args.append, "leaves")

    def virtual(level: int, index: int) -> bytes:
        return hashlib.sha256(f"{level}/{index}".encode()).digest()

    rng = random.Random(7)
    per_proof = []
    for _ in range(args.proofs):
        i = rng.randrange(args.size)
        t = time.perf_counter()
        merkle.inclusion_proof(i, args.size, virtual)
        per_proof.append(time.perf_counter() - t)
    per_proof.sort()
    p99 = per_proof[min(len(per_proof) - 1, int(0.99 * len(per_proof)))]
    print(f"inclusion proof at {args.size:,} entries ({args.proofs} random entries, virtual "
          f"store): p50 {statistics.median(per_proof) * 1000:.3f} ms, p99 {p99 * 1000:.3f} "
          f"ms, max {per_proof[-1] * 1000:.3f} ms")

    signer = Signer.generate(ORIGIN)
    n = args.bundles
    entries = [rfc8785.dumps({"kind": "failure", "event_id": str(uuid.UUID(int=i + 1, version=4)),
                              "seq": i}) for i in range(n)]
    log_leaves = [merkle.leaf_hash(e) for e in entries]
    nodes = {(lv, ix): h for lv, ix, h in merkle.appended_nodes(0, {}, log_leaves)}
    checkpoint = sign_checkpoint(signer, ORIGIN, n, merkle.root_from_nodes(n, nodes))
    bundles: list[dict[str, Any]] = []
    for i in range(n):
        coords = merkle.inclusion_coords(i, n)
        proof = merkle.inclusion_proof(i, n, {c: nodes[c] for c in coords})
        bundles.append(json.loads(json.dumps(build_inclusion_bundle(
            log=ORIGIN, event_id=json.loads(entries[i])["event_id"], entry=entries[i],
            leaf_index=i, tree_size=n, proof=proof, checkpoint=checkpoint))))
    key = signer.verifier_text()

    def check_all() -> None:
        for b in bundles:
            verify_inclusion_bundle(b, key)

    _line(f"inclusion bundle checks, {n} bundles against one checkpoint",
          _timed(check_all, args.reps), n, "bundles")


if __name__ == "__main__":
    main()
