"""Offline proof bundles: build, JSON round trip, verify, every kind of tampering (their
speed is measured by bench/merkle_bench.py)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import merkle, proofs
from ledger.errors import NoteError, ProofError
from ledger.note import Signer, sign_checkpoint
from ledger.proofs import (
    CONSISTENCY_FORMAT,
    INCLUSION_FORMAT,
    VerifiedConsistency,
    VerifiedInclusion,
    build_consistency_bundle,
    build_inclusion_bundle,
    verify_bundle,
    verify_consistency_bundle,
    verify_inclusion_bundle,
)

ORIGIN = "ledger.example.com/contract-42"


class Log:
    """A tiny in-memory log built exactly the way the database layer builds one."""

    def __init__(self, n: int, signer: Signer) -> None:
        self.signer = signer
        self.entries: list[bytes] = []
        self.event_ids: list[str] = []
        for i in range(n):
            event_id = str(uuid.UUID(int=i + 1, version=4))
            rec: dict[str, Any] = {
                "kind": "failure",
                "event_id": event_id,
                "seq": i,
                "cause": "gpu_lost",
            }
            self.entries.append(rfc8785.dumps(rec))
            self.event_ids.append(event_id)
        self.leaves = [merkle.leaf_hash(e) for e in self.entries]
        self.nodes = {(lv, ix): h for lv, ix, h in merkle.appended_nodes(0, {}, self.leaves)}

    def checkpoint(self, size: int) -> str:
        return sign_checkpoint(self.signer, ORIGIN, size, merkle.root_from_nodes(size, self.nodes))

    def inclusion(self, i: int, size: int) -> dict[str, Any]:
        coords = merkle.inclusion_coords(i, size)
        proof = merkle.inclusion_proof(i, size, {c: self.nodes[c] for c in coords})
        bundle = build_inclusion_bundle(
            log=ORIGIN,
            event_id=self.event_ids[i],
            entry=self.entries[i],
            leaf_index=i,
            tree_size=size,
            proof=proof,
            checkpoint=self.checkpoint(size),
        )
        return json.loads(json.dumps(bundle))  # what travels is JSON

    def consistency(self, size1: int, size2: int) -> dict[str, Any]:
        bundle = build_consistency_bundle(
            log=ORIGIN,
            size1=size1,
            size2=size2,
            proof=merkle.consistency_proof(size1, size2, self.nodes),
            checkpoint1=self.checkpoint(size1),
            checkpoint2=self.checkpoint(size2),
        )
        return json.loads(json.dumps(bundle))


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.generate(ORIGIN)


@pytest.fixture(scope="module")
def log(signer: Signer) -> Log:
    return Log(300, signer)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


# --------------------------------------------------------------------------- inclusion


def test_inclusion_bundles_verify(log: Log, signer: Signer) -> None:
    key = signer.verifier_text()
    for size in (1, 2, 7, 64, 300):
        for i in {0, size // 2, size - 1}:
            bundle = log.inclusion(i, size)
            assert bundle["format"] == INCLUSION_FORMAT
            v = verify_inclusion_bundle(bundle, key)
            assert isinstance(v, VerifiedInclusion)
            assert (v.log, v.event_id, v.leaf_index, v.tree_size) == (
                ORIGIN,
                log.event_ids[i],
                i,
                size,
            )
            assert v.root == merkle.reference_root(log.leaves[:size])
            assert v.entry == log.entries[i]
            assert verify_bundle(bundle, signer.verifier) == v
            assert log.event_ids[i] in str(v) and v.root.hex() in str(v)


def _mutations(bundle: dict[str, Any], other: dict[str, Any]) -> list[tuple[str, Any, type]]:
    """(field, new value, expected error) — each must make the bundle fail."""
    entry = base64.b64decode(bundle["entry"])
    forged_entry = entry.replace(b"gpu_lost", b"thermal!")
    proof = bundle["proof"]
    flipped = bytearray(base64.b64decode(proof[0]))
    flipped[0] ^= 1
    return [
        ("entry", _b64(forged_entry), ProofError),
        ("entry", "not base64!", ProofError),
        ("leaf_hash", _b64(merkle.leaf_hash(forged_entry)), ProofError),
        ("leaf_hash", other["leaf_hash"], ProofError),
        ("event_id", other["event_id"], ProofError),
        ("leaf_index", other["leaf_index"], ProofError),
        ("leaf_index", True, ProofError),
        ("leaf_index", -1, ProofError),
        ("leaf_index", "5", ProofError),
        ("tree_size", bundle["tree_size"] + 1, ProofError),
        ("proof", [_b64(bytes(flipped)), *proof[1:]], ProofError),
        ("proof", proof[:-1], ProofError),
        ("proof", [*proof, proof[0]], ProofError),
        ("proof", [p.rstrip("=") for p in proof], ProofError),
        ("proof", None, ProofError),
        ("log", "ledger.example.com/contract-43", ProofError),
        ("checkpoint", other["checkpoint"], ProofError),
        ("checkpoint", bundle["checkpoint"].replace("\n\n", "\nx\n\n"), NoteError),
        ("checkpoint", bundle["checkpoint"].split("\n\n")[0] + "\n", NoteError),
        ("format", "yoco-inclusion-proof/v2", ProofError),
    ]


def test_tampered_inclusion_bundles_fail(log: Log, signer: Signer) -> None:
    key = signer.verifier_text()
    bundle = log.inclusion(100, 257)
    other = log.inclusion(101, 300)
    for field, value, error in _mutations(bundle, other):
        bad = copy.deepcopy(bundle)
        bad[field] = value
        with pytest.raises(error) as info:
            verify_inclusion_bundle(bad, key)
        assert str(info.value), (field, value)
    for field in bundle:
        bad = copy.deepcopy(bundle)
        del bad[field]
        with pytest.raises(ProofError):
            verify_inclusion_bundle(bad, key)
    with pytest.raises(ProofError, match="unknown field"):
        verify_inclusion_bundle({**bundle, "extra": 1}, key)
    with pytest.raises(ProofError):
        verify_inclusion_bundle([], key)  # type: ignore[arg-type]


def test_checkpoint_by_another_key_fails(log: Log, signer: Signer) -> None:
    bundle = log.inclusion(5, 10)
    impostor = Signer.generate(ORIGIN)  # same name, different key
    with pytest.raises(NoteError, match="checkpoint"):
        verify_inclusion_bundle(bundle, impostor.verifier_text())
    # a whole log forged and signed by the impostor does not verify with the real key
    forged = Log(10, impostor).inclusion(5, 10)
    with pytest.raises(NoteError):
        verify_inclusion_bundle(forged, signer.verifier_text())
    with pytest.raises(NoteError):
        verify_inclusion_bundle(bundle, "not a key")


def test_entry_event_id_must_match(signer: Signer) -> None:
    entry = rfc8785.dumps({"event_id": "A1B2C3D4-0000-4000-8000-000000000001", "kind": "x"})
    leaf = merkle.leaf_hash(entry)
    cp = sign_checkpoint(signer, ORIGIN, 1, leaf)
    kwargs: dict[str, Any] = {
        "log": ORIGIN,
        "entry": entry,
        "leaf_index": 0,
        "tree_size": 1,
        "proof": [],
        "checkpoint": cp,
    }
    ok = build_inclusion_bundle(event_id="a1b2c3d4-0000-4000-8000-000000000001", **kwargs)
    verify_inclusion_bundle(ok, signer.verifier)  # UUIDs compare as UUIDs
    with pytest.raises(ProofError, match="event_id"):
        build_inclusion_bundle(event_id="a1b2c3d4-0000-4000-8000-000000000002", **kwargs)
    for bad_entry in (b"[1]", b"not json", b'{"kind": "x"}'):
        bad_cp = sign_checkpoint(signer, ORIGIN, 1, merkle.leaf_hash(bad_entry))
        with pytest.raises(ProofError, match="entry"):
            build_inclusion_bundle(
                log=ORIGIN,
                event_id="e",
                entry=bad_entry,
                leaf_index=0,
                tree_size=1,
                proof=[],
                checkpoint=bad_cp,
            )


def test_build_inclusion_refuses_inconsistent_input(log: Log) -> None:
    good: dict[str, Any] = {
        "log": ORIGIN,
        "event_id": log.event_ids[3],
        "entry": log.entries[3],
        "leaf_index": 3,
        "tree_size": 10,
        "proof": merkle.inclusion_proof(3, 10, log.nodes),
        "checkpoint": log.checkpoint(10),
    }
    build_inclusion_bundle(**good)
    changes: list[dict[str, Any]] = [
        {"log": "other"},
        {"tree_size": 11},
        {"leaf_index": 4},
        {"entry": log.entries[4]},
        {"checkpoint": log.checkpoint(11)},
        {"proof": merkle.inclusion_proof(3, 11, log.nodes)},
        {"checkpoint": "garbage"},
    ]
    for change in changes:
        with pytest.raises(ProofError):
            build_inclusion_bundle(**{**good, **change})


# --------------------------------------------------------------------------- consistency


def test_consistency_bundles_verify(log: Log, signer: Signer) -> None:
    for size1, size2 in [(1, 1), (1, 2), (3, 7), (64, 64), (64, 300), (299, 300)]:
        bundle = log.consistency(size1, size2)
        assert bundle["format"] == CONSISTENCY_FORMAT
        v = verify_consistency_bundle(bundle, signer.verifier_text())
        assert isinstance(v, VerifiedConsistency)
        assert (v.size1, v.size2) == (size1, size2)
        assert v.root2 == merkle.reference_root(log.leaves[:size2])
        assert verify_bundle(bundle, signer.verifier) == v
        assert "only grew" in str(v)


def test_tampered_consistency_bundles_fail(log: Log, signer: Signer) -> None:
    key = signer.verifier_text()
    bundle = log.consistency(100, 257)
    forked = Log(257, signer)  # a different history under the same key: a fork
    forked.entries[50] = b"{}"
    forked.leaves[50] = merkle.leaf_hash(b"{}")
    forked.nodes = {(lv, ix): h for lv, ix, h in merkle.appended_nodes(0, {}, forked.leaves)}
    flipped = bytearray(base64.b64decode(bundle["proof"][0]))
    flipped[5] ^= 0x10
    for field, value, error in [
        ("proof", [_b64(bytes(flipped)), *bundle["proof"][1:]], ProofError),
        ("proof", bundle["proof"][:-1], ProofError),
        ("proof", [], ProofError),
        ("size1", 101, ProofError),
        ("size2", 258, ProofError),
        ("checkpoint1", bundle["checkpoint2"], ProofError),
        ("checkpoint2", forked.checkpoint(257), ProofError),
        ("checkpoint1", forked.checkpoint(100), ProofError),
        ("checkpoint1", bundle["checkpoint1"].replace("\n100\n", "\n101\n"), NoteError),
        ("log", "x", ProofError),
        ("format", INCLUSION_FORMAT, ProofError),
    ]:
        bad = copy.deepcopy(bundle)
        bad[field] = value
        with pytest.raises(error):
            verify_consistency_bundle(bad, key)
    swapped = {
        **bundle,
        "size1": 257,
        "size2": 100,
        "checkpoint1": bundle["checkpoint2"],
        "checkpoint2": bundle["checkpoint1"],
    }
    with pytest.raises(ProofError):
        verify_consistency_bundle(swapped, key)
    with pytest.raises(NoteError):
        verify_consistency_bundle(bundle, Signer.generate(ORIGIN).verifier)
    with pytest.raises(ProofError):
        build_consistency_bundle(
            log=ORIGIN,
            size1=100,
            size2=257,
            proof=merkle.consistency_proof(100, 257, log.nodes),
            checkpoint1=log.checkpoint(100),
            checkpoint2=forked.checkpoint(257),
        )


def test_verify_bundle_unknown_format(signer: Signer) -> None:
    with pytest.raises(ProofError, match="unknown proof format"):
        verify_bundle({"format": "something/v1"}, signer.verifier_text())
    with pytest.raises(ProofError):
        verify_bundle("{}", signer.verifier_text())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- docs, speed


def _auditor_verify(bundle: dict[str, Any], key_text: str) -> None:
    """The manual steps of docs/proofs.md, with nothing but hashlib, base64 and Ed25519."""
    name, key_hex, key_b64 = key_text.split("+", 2)
    raw_key = base64.b64decode(key_b64)
    assert raw_key[0] == 1
    assert hashlib.sha256(name.encode() + b"\n" + raw_key).digest()[:4].hex() == key_hex
    text, sig_block = bundle["checkpoint"].rsplit("\n\n", 1)
    text += "\n"
    ok = False
    for line in sig_block.splitlines():
        sig_name, sig_b64 = line.removeprefix("\u2014 ").split(" ")
        blob = base64.b64decode(sig_b64)
        if sig_name == name and blob[:4].hex() == key_hex:
            Ed25519PublicKey.from_public_bytes(raw_key[1:]).verify(blob[4:], text.encode())
            ok = True
    assert ok
    origin, size, root_b64 = text.splitlines()[:3]
    assert origin == bundle["log"] and int(size) == bundle["tree_size"]
    entry = base64.b64decode(bundle["entry"])
    assert json.loads(entry)["event_id"] == bundle["event_id"]
    r = hashlib.sha256(b"\x00" + entry).digest()
    assert base64.b64encode(r).decode() == bundle["leaf_hash"]
    fn, sn = bundle["leaf_index"], bundle["tree_size"] - 1
    for p in map(base64.b64decode, bundle["proof"]):
        assert sn > 0
        if fn % 2 == 1 or fn == sn:
            r = hashlib.sha256(b"\x01" + p + r).digest()
            while fn % 2 == 0 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = hashlib.sha256(b"\x01" + r + p).digest()
        fn, sn = fn >> 1, sn >> 1
    assert sn == 0 and base64.b64encode(r).decode() == root_b64


def test_documented_manual_verification_works(log: Log, signer: Signer) -> None:
    for size, i in [(1, 0), (6, 5), (300, 0), (300, 123), (300, 299)]:
        _auditor_verify(log.inclusion(i, size), signer.verifier_text())


DOCS = Path(__file__).resolve().parents[2] / "docs" / "proofs.md"
DOC_KEY = "ledger.example.com/C-1001+a789bc35+AXYZMH9BmDEgJu9IO+GtHxLpmKZu6EfJxjJjKuae1RSe"


def test_docs_example_and_script_verify(tmp_path: Path) -> None:
    doc = DOCS.read_text(encoding="utf-8")
    example = re.search(r"<!-- example-inclusion-bundle -->\n```json\n(.*?)```", doc, re.S)
    script = re.search(r"```python\n(.*?)```", doc, re.S)
    assert example and script, "docs/proofs.md lost its example or its script"
    assert DOC_KEY in doc
    bundle = json.loads(example.group(1))
    v = verify_bundle(bundle, DOC_KEY)
    assert isinstance(v, VerifiedInclusion) and v.leaf_index == 4
    _auditor_verify(bundle, DOC_KEY)
    (tmp_path / "b.json").write_text(example.group(1))
    (tmp_path / "check.py").write_text(script.group(1))
    run = subprocess.run(
        [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "b.json"), DOC_KEY],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0 and run.stdout.startswith("OK:"), run
    tampered = {**bundle, "leaf_index": 5}
    (tmp_path / "b.json").write_text(json.dumps(tampered))
    run = subprocess.run(
        [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "b.json"), DOC_KEY],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0


def test_module_exports_are_real() -> None:
    for name in proofs.__all__:
        assert hasattr(proofs, name), name
