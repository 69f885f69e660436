"""Self-contained, offline-checkable proof bundles (JSON), and their verification.

``yoco ledger prove EVENT_ID`` prints an *inclusion bundle*; ``yoco verify-proof`` checks it
(or a *consistency bundle*) with the log's verifier key only: no database, no trust in the
operator. The formats are documented, with manual verification steps, in ``docs/proofs.md``.

Inclusion bundle, ``format = "yoco-inclusion-proof/v1"``::

    {"format", "log", "event_id", "entry", "leaf_index", "tree_size", "leaf_hash",
     "proof", "checkpoint"}

Consistency bundle, ``format = "yoco-consistency-proof/v1"``::

    {"format", "log", "size1", "size2", "proof", "checkpoint1", "checkpoint2"}

Every hash and the entry bytes are standard, padded base64 (RFC 4648 §4). The checkpoints
are complete C2SP signed notes (``ledger.note``).

Hot path: pass a parsed :class:`~ledger.note.Verifier` when checking many bundles; key
text is parsed once per distinct key anyway (cached), and a checkpoint note's signature is
checked once per distinct (note, key) (cached), so checking many proofs against one signed
tree head costs one signature check plus ~log2(n) hashes each.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ledger import merkle, note
from ledger.errors import NoteError, ProofError

__all__ = [
    "CONSISTENCY_FORMAT",
    "INCLUSION_FORMAT",
    "VerifiedConsistency",
    "VerifiedInclusion",
    "build_consistency_bundle",
    "build_inclusion_bundle",
    "verify_bundle",
    "verify_consistency_bundle",
    "verify_inclusion_bundle",
]

INCLUSION_FORMAT = "yoco-inclusion-proof/v1"
"""The ``format`` value of an inclusion bundle."""

CONSISTENCY_FORMAT = "yoco-consistency-proof/v1"
"""The ``format`` value of a consistency bundle."""

_INCLUSION_FIELDS = frozenset(
    {
        "format",
        "log",
        "event_id",
        "entry",
        "leaf_index",
        "tree_size",
        "leaf_hash",
        "proof",
        "checkpoint",
    }
)
_CONSISTENCY_FIELDS = frozenset(
    {"format", "log", "size1", "size2", "proof", "checkpoint1", "checkpoint2"}
)


@dataclass(frozen=True)
class VerifiedInclusion:
    """What a verified inclusion bundle proves: entry ``event_id`` is leaf ``leaf_index``
    of log ``log``'s tree of ``tree_size`` leaves with root ``root``, signed by ``key``."""

    log: str
    event_id: str
    leaf_index: int
    tree_size: int
    root: bytes
    leaf_hash: bytes
    entry: bytes
    key: str

    def __str__(self) -> str:
        """One line for people: what was proven, against which signed tree head."""
        return (
            f"event {self.event_id} is entry #{self.leaf_index} of log {self.log}, included in "
            f"the tree of {self.tree_size} entries with root {self.root.hex()} signed by {self.key}"
        )


@dataclass(frozen=True)
class VerifiedConsistency:
    """What a verified consistency bundle proves: log ``log``'s tree (size2, root2) extends
    its tree (size1, root1), both signed by ``key``."""

    log: str
    size1: int
    root1: bytes
    size2: int
    root2: bytes
    key: str

    def __str__(self) -> str:
        """One line for people: the two signed tree heads and that one extends the other."""
        return (
            f"log {self.log} only grew: the tree of {self.size2} entries (root "
            f"{self.root2.hex()}) extends the tree of {self.size1} entries (root "
            f"{self.root1.hex()}), both signed by {self.key}"
        )


# --------------------------------------------------------------------------- helpers


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object, what: str) -> bytes:
    if not isinstance(value, str) or not value.isascii():
        raise ProofError(f"{what}: must be a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProofError(f"{what}: not valid base64") from None
    if _b64(raw) != value:
        raise ProofError(f"{what}: not canonical padded base64")
    return raw


def _hash(value: object, what: str) -> bytes:
    raw = _unb64(value, what)
    if len(raw) != merkle.HASH_SIZE:
        raise ProofError(f"{what}: a SHA-256 hash is {merkle.HASH_SIZE} bytes, got {len(raw)}")
    return raw


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProofError(f"{what}: must be a non-negative integer, got {value!r}")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ProofError(f"{what}: must be a non-empty string")
    return value


def _proof(value: object, what: str = "proof") -> list[bytes]:
    if not isinstance(value, list):
        raise ProofError(f"{what}: must be a list of base64 hashes")
    return [_hash(p, f"{what}[{i}]") for i, p in enumerate(value)]


def _fields(bundle: object, fmt: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(bundle, Mapping):
        raise ProofError("a proof bundle must be a JSON object")
    got = bundle.get("format")
    if got != fmt:
        raise ProofError(f"format: expected {fmt!r}, got {got!r}")
    missing = sorted(allowed - bundle.keys())
    if missing:
        raise ProofError(f"bundle is missing field(s): {', '.join(missing)}")
    unknown = sorted(str(k) for k in bundle.keys() - allowed)
    if unknown:
        raise ProofError(f"bundle has unknown field(s) for {fmt}: {', '.join(unknown)}")
    return bundle


@lru_cache(maxsize=64)
def _parse_verifier(text: str) -> note.Verifier:
    return note.Verifier.from_text(text)


def _verifier(key: str | note.Verifier) -> note.Verifier:
    if isinstance(key, note.Verifier):
        return key
    if not isinstance(key, str):
        raise NoteError("verifier key must be key text or a Verifier")
    return _parse_verifier(key.strip())


@lru_cache(maxsize=256)
def _open_cached(note_text: str, verifier: note.Verifier) -> note.Checkpoint:
    # Verifier equality/hash is (name, key_id, public_key): distinct keys never share an entry.
    return note.open_checkpoint(note_text, verifier)


def _open(note_text: object, verifier: note.Verifier, what: str) -> note.Checkpoint:
    if not isinstance(note_text, str):
        raise ProofError(f"{what}: must be the signed checkpoint note text")
    try:
        return _open_cached(note_text, verifier)
    except NoteError as exc:
        raise NoteError(f"{what}: {exc}") from None


def _event_id_of(entry: bytes) -> str:
    try:
        parsed = json.loads(entry)
    except (UnicodeDecodeError, ValueError):
        raise ProofError("entry: the entry bytes are not JSON") from None
    if not isinstance(parsed, dict) or "event_id" not in parsed:
        raise ProofError("entry: the entry is not a JSON object with an event_id")
    return str(parsed["event_id"])


def _same_event(a: str, b: str) -> bool:
    """Event ids are UUIDs: compare them as UUIDs (case, braces), else as exact strings."""
    if a == b:
        return True
    try:
        return uuid.UUID(a) == uuid.UUID(b)
    except ValueError:
        return False


def _unsigned_checkpoint(note_text: str, what: str) -> note.Checkpoint:
    try:
        return note.parse_checkpoint(note.unverified_text(note_text))
    except NoteError as exc:
        raise ProofError(f"{what}: {exc}") from None


# --------------------------------------------------------------------------- inclusion


def build_inclusion_bundle(
    *,
    log: str,
    event_id: str,
    entry: bytes,
    leaf_index: int,
    tree_size: int,
    proof: Sequence[bytes],
    checkpoint: str,
) -> dict[str, Any]:
    """Return an inclusion bundle (a JSON-ready dict) for one journal entry.

    ``entry`` is the entry's canonical bytes (the Merkle leaf is ``SHA-256(0x00||entry)``),
    ``proof`` its RFC 9162 inclusion proof in the tree of ``tree_size`` leaves, and
    ``checkpoint`` the signed checkpoint note of that tree. Self-checks everything except
    the signature (which needs the verifier key) and raises :class:`ProofError` rather
    than emit a bundle that cannot verify.
    """
    leaf = merkle.leaf_hash(entry)
    head = _unsigned_checkpoint(checkpoint, "checkpoint")
    if head.origin != log:
        raise ProofError(f"checkpoint is for log {head.origin!r}, not {log!r}")
    if head.size != tree_size:
        raise ProofError(f"checkpoint is for tree size {head.size}, not {tree_size}")
    if not _same_event(_event_id_of(entry), str(event_id)):
        raise ProofError(f"entry: its event_id is not {event_id}")
    merkle.verify_inclusion(leaf_index, tree_size, leaf, proof, head.root)
    return {
        "format": INCLUSION_FORMAT,
        "log": log,
        "event_id": str(event_id),
        "entry": _b64(entry),
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "leaf_hash": _b64(leaf),
        "proof": [_b64(p) for p in proof],
        "checkpoint": checkpoint,
    }


def verify_inclusion_bundle(
    bundle: Mapping[str, Any], verifier_key: str | note.Verifier
) -> VerifiedInclusion:
    """Check an inclusion bundle offline; return what it proves or raise naming the failure.

    Checks, in order: the format and fields; the checkpoint's signature by
    ``verifier_key`` (:class:`NoteError`); that the checkpoint's origin and size are the
    bundle's ``log`` and ``tree_size``; that ``leaf_hash`` is ``SHA-256(0x00 || entry)``;
    that the entry's ``event_id`` is the bundle's; and the RFC 9162 inclusion proof against
    the signed root (all :class:`ProofError`).
    """
    b = _fields(bundle, INCLUSION_FORMAT, _INCLUSION_FIELDS)
    log = _str(b["log"], "log")
    event_id = _str(b["event_id"], "event_id")
    leaf_index = _int(b["leaf_index"], "leaf_index")
    tree_size = _int(b["tree_size"], "tree_size")
    leaf = _hash(b["leaf_hash"], "leaf_hash")
    entry = _unb64(b["entry"], "entry")
    proof = _proof(b["proof"])
    verifier = _verifier(verifier_key)

    head = _open(b["checkpoint"], verifier, "checkpoint")
    if head.origin != log:
        raise ProofError(f"checkpoint: signed for log {head.origin!r}, the bundle says {log!r}")
    if head.size != tree_size:
        raise ProofError(
            f"checkpoint: signed for tree size {head.size}, the bundle says {tree_size}"
        )
    if merkle.leaf_hash(entry) != leaf:
        raise ProofError("leaf_hash: it is not SHA-256(0x00 || entry bytes)")
    if not _same_event(_event_id_of(entry), event_id):
        raise ProofError(f"entry: its event_id is not the bundle's event_id {event_id}")
    try:
        merkle.verify_inclusion(leaf_index, tree_size, leaf, proof, head.root)
    except ProofError as exc:
        raise ProofError(f"proof: inclusion of leaf {leaf_index} fails: {exc}") from None
    return VerifiedInclusion(
        log, event_id, leaf_index, tree_size, head.root, leaf, entry, verifier.to_text()
    )


# --------------------------------------------------------------------------- consistency


def build_consistency_bundle(
    *, log: str, size1: int, size2: int, proof: Sequence[bytes], checkpoint1: str, checkpoint2: str
) -> dict[str, Any]:
    """Return a consistency bundle (JSON-ready dict): ``checkpoint2`` extends ``checkpoint1``.

    ``proof`` is the RFC 9162 consistency proof from ``size1`` to ``size2``. Self-checks
    everything except the signatures and raises :class:`ProofError` rather than emit a
    bundle that cannot verify.
    """
    head1 = _unsigned_checkpoint(checkpoint1, "checkpoint1")
    head2 = _unsigned_checkpoint(checkpoint2, "checkpoint2")
    for what, head, size in (("checkpoint1", head1, size1), ("checkpoint2", head2, size2)):
        if head.origin != log:
            raise ProofError(f"{what} is for log {head.origin!r}, not {log!r}")
        if head.size != size:
            raise ProofError(f"{what} is for tree size {head.size}, not {size}")
    merkle.verify_consistency(size1, size2, proof, head1.root, head2.root)
    return {
        "format": CONSISTENCY_FORMAT,
        "log": log,
        "size1": size1,
        "size2": size2,
        "proof": [_b64(p) for p in proof],
        "checkpoint1": checkpoint1,
        "checkpoint2": checkpoint2,
    }


def verify_consistency_bundle(
    bundle: Mapping[str, Any], verifier_key: str | note.Verifier
) -> VerifiedConsistency:
    """Check a consistency bundle offline; return what it proves or raise naming the failure.

    Checks the format and fields; both checkpoints' signatures by ``verifier_key``
    (:class:`NoteError`); that both are for the bundle's ``log`` with sizes ``size1`` and
    ``size2``; and the RFC 9162 consistency proof between the signed roots
    (:class:`ProofError`).
    """
    b = _fields(bundle, CONSISTENCY_FORMAT, _CONSISTENCY_FIELDS)
    log = _str(b["log"], "log")
    size1 = _int(b["size1"], "size1")
    size2 = _int(b["size2"], "size2")
    proof = _proof(b["proof"])
    verifier = _verifier(verifier_key)
    head1 = _open(b["checkpoint1"], verifier, "checkpoint1")
    head2 = _open(b["checkpoint2"], verifier, "checkpoint2")
    for what, head, size in (("checkpoint1", head1, size1), ("checkpoint2", head2, size2)):
        if head.origin != log:
            raise ProofError(f"{what}: signed for log {head.origin!r}, the bundle says {log!r}")
        if head.size != size:
            raise ProofError(f"{what}: signed for tree size {head.size}, the bundle says {size}")
    try:
        merkle.verify_consistency(size1, size2, proof, head1.root, head2.root)
    except ProofError as exc:
        raise ProofError(f"proof: consistency from {size1} to {size2} fails: {exc}") from None
    return VerifiedConsistency(log, size1, head1.root, size2, head2.root, verifier.to_text())


def verify_bundle(
    bundle: Mapping[str, Any], verifier_key: str | note.Verifier
) -> VerifiedInclusion | VerifiedConsistency:
    """Check any supported bundle, dispatching on its ``format`` field.

    Raises :class:`ProofError` for an unknown format, otherwise whatever
    :func:`verify_inclusion_bundle` / :func:`verify_consistency_bundle` raise.
    """
    if not isinstance(bundle, Mapping):
        raise ProofError("a proof bundle must be a JSON object")
    fmt = bundle.get("format")
    if fmt == INCLUSION_FORMAT:
        return verify_inclusion_bundle(bundle, verifier_key)
    if fmt == CONSISTENCY_FORMAT:
        return verify_consistency_bundle(bundle, verifier_key)
    raise ProofError(
        f"format: unknown proof format {fmt!r} (expected {INCLUSION_FORMAT!r} or "
        f"{CONSISTENCY_FORMAT!r})"
    )
