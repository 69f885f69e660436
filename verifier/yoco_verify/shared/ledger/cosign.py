# A copy of ledger/cosign.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Witness cosignatures (https://c2sp.org/tlog-cosignature, Ed25519 ``cosignature/v1``) and
the request body of a witness's ``add-checkpoint`` (https://c2sp.org/tlog-witness).

A cosignature is a signed-note signature line on a checkpoint::

    key ID        = SHA-256(<name> || "\\n" || 0x04 || 32-byte public key)[:4]
    signed message = "cosignature/v1\\n" "time <POSIX seconds>\\n" <checkpoint note body>
    signature line = — <name> base64(key ID || u64 big-endian timestamp || Ed25519 signature)

Keys are written like signed-note keys with the algorithm byte 0x04: the verifier key
``<name>+<hex8>+<base64(0x04 || public key)>`` and the private key
``PRIVATE+KEY+<name>+<hex8>+<base64(0x04 || seed)>``.

Pure (no database, no network): shared by the ledger, which submits checkpoints and checks
the cosignatures it gets back, and by the standalone verifier's witness server
(``yoco-verify witness serve``), which makes them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from yoco_verify.shared.ledger import note
from yoco_verify.shared.ledger.errors import NoteError

__all__ = [
    "ALG_COSIGNATURE_V1",
    "MAX_PROOF_LINES",
    "SIZE_MEDIA_TYPE",
    "AddCheckpoint",
    "Cosigner",
    "CosignerKey",
    "add_checkpoint_body",
    "cosignature_lines",
    "cosignatures",
    "parse_add_checkpoint",
    "signature_lines",
    "with_signatures",
]

ALG_COSIGNATURE_V1 = 0x04
"""Algorithm byte of Ed25519 ``cosignature/v1`` keys (tlog-cosignature)."""

SIZE_MEDIA_TYPE = "text/x.tlog.size"
"""The media type of a witness's 409 answer, whose body is its size (tlog-witness)."""

MAX_PROOF_LINES = 63
"""The most consistency proof lines an add-checkpoint request may hold (tlog-witness)."""

_SIG_PREFIX = "\u2014 "
_PRIVATE_PREFIX = "PRIVATE+KEY+"
_MAX_TIMESTAMP = 2**63 - 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError(f"{what} is not valid base64") from None
    if _b64(raw) != text:
        raise NoteError(f"{what} is not canonical base64")
    return raw


def _key_id(name: str, public_key: bytes) -> int:
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ALG_COSIGNATURE_V1]) + public_key)
    return int.from_bytes(digest.digest()[:4], "big")


def _split_key(text: str, what: str) -> tuple[str, int, bytes]:
    parts = text.split("+", 2)
    if len(parts) != 3:
        raise NoteError(f"{what} must look like <name>+<hex8 key ID>+<base64 key>")
    name, hex8, b64 = parts
    # The name rules of signed notes (no '+', no white space), checked once there.
    note.key_id(name, b"")
    if len(hex8) != 8 or any(c not in "0123456789abcdef" for c in hex8.lower()):
        raise NoteError(f"{what}: key ID {hex8!r} must be 8 hexadecimal digits")
    raw = _unb64(b64, f"{what} material")
    if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
        raise NoteError(f"{what} is not a cosignature/v1 key (0x04 followed by 32 bytes)")
    return name, int(hex8, 16), raw[1:]


def _message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


@dataclass(frozen=True)
class CosignerKey:
    """A witness's public key (``cosignature/v1``): name, key ID, Ed25519 public key."""

    name: str
    key_id: int
    public_key: bytes
    _key: Ed25519PublicKey = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_public_key(cls, name: str, public_key: bytes) -> CosignerKey:
        """The key of a raw 32-byte Ed25519 public key under ``name``."""
        note.key_id(name, public_key)  # name rules
        if len(public_key) != 32:
            raise NoteError("Ed25519 public key must be 32 bytes")
        try:
            key = Ed25519PublicKey.from_public_bytes(bytes(public_key))
        except ValueError as exc:
            raise NoteError(f"invalid Ed25519 public key: {exc}") from None
        return cls(name, _key_id(name, public_key), bytes(public_key), key)

    @classmethod
    def from_text(cls, text: str) -> CosignerKey:
        """Parse ``<name>+<hex8>+<base64(0x04||pubkey)>``; raise :class:`NoteError` if
        malformed or the key ID does not match (surrounding white space ignored)."""
        if not isinstance(text, str):
            raise NoteError("witness key must be text")
        name, kid, public = _split_key(text.strip(), "witness key")
        key = cls.from_public_key(name, public)
        if key.key_id != kid:
            raise NoteError(f"witness key ID {kid:08x} does not match the name and key")
        return key

    def to_text(self) -> str:
        """The verifier key text ``<name>+<hex8>+<base64(0x04||pubkey)>``."""
        blob = _b64(bytes([ALG_COSIGNATURE_V1]) + self.public_key)
        return f"{self.name}+{self.key_id:08x}+{blob}"

    def verify(self, body: str, blob: bytes) -> int | None:
        """The timestamp of ``blob`` (key ID || timestamp || signature) if it is this key's
        valid cosignature of checkpoint ``body``; None otherwise."""
        if len(blob) != 4 + 8 + 64 or int.from_bytes(blob[:4], "big") != self.key_id:
            return None
        timestamp = int.from_bytes(blob[4:12], "big")
        if timestamp > _MAX_TIMESTAMP:
            return None
        try:
            self._key.verify(blob[12:], _message(body, timestamp))
        except InvalidSignature:
            return None
        return timestamp


@dataclass(frozen=True)
class Cosigner:
    """A witness's private key: makes timestamped ``cosignature/v1`` signature lines."""

    name: str
    key: CosignerKey
    _private: Ed25519PrivateKey = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> Cosigner:
        """The cosigner of a 32-byte Ed25519 seed under ``name``."""
        if len(seed) != 32:
            raise NoteError("Ed25519 seed must be 32 bytes")
        private = Ed25519PrivateKey.from_private_bytes(bytes(seed))
        public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(name, CosignerKey.from_public_key(name, public), private)

    @classmethod
    def generate(cls, name: str) -> Cosigner:
        """A new cosigner with a fresh random key."""
        return cls.from_seed(name, os.urandom(32))

    @classmethod
    def from_text(cls, text: str) -> Cosigner:
        """Parse ``PRIVATE+KEY+<name>+<hex8>+<base64(0x04||seed)>``; raise
        :class:`NoteError` if malformed or the key ID does not match."""
        if not isinstance(text, str) or not text.strip().startswith(_PRIVATE_PREFIX):
            raise NoteError("witness private key must start with PRIVATE+KEY+")
        name, kid, seed = _split_key(text.strip()[len(_PRIVATE_PREFIX) :], "witness private key")
        cosigner = cls.from_seed(name, seed)
        if cosigner.key.key_id != kid:
            raise NoteError(f"witness private key ID {kid:08x} does not match the name and key")
        return cosigner

    def to_text(self) -> str:
        """The private key text (keep it secret: mode 0600)."""
        seed = self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        blob = _b64(bytes([ALG_COSIGNATURE_V1]) + seed)
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key.key_id:08x}+{blob}"

    def cosign(self, body: str, timestamp: int) -> str:
        """The cosignature line (ending in a newline) of checkpoint note ``body`` at POSIX
        time ``timestamp``."""
        if isinstance(timestamp, bool) or not 0 <= timestamp <= _MAX_TIMESTAMP:
            raise ValueError(f"timestamp: must be within 0..2**63-1, got {timestamp!r}")
        sig = self._private.sign(_message(body, timestamp))
        blob = self.key.key_id.to_bytes(4, "big") + timestamp.to_bytes(8, "big") + sig
        return f"{_SIG_PREFIX}{self.name} {_b64(blob)}\n"


# --------------------------------------------------------------------------- notes


def signature_lines(signed_note: str) -> list[str]:
    """The signature lines of a signed note (each ending in a newline), in order."""
    body = note.unverified_text(signed_note)
    return signed_note[len(body) + 1 :].splitlines(keepends=True)


def with_signatures(signed_note: str, lines: Iterable[str]) -> str:
    """``signed_note`` with the signature ``lines`` it does not hold yet appended."""
    have = set(signature_lines(signed_note))
    extra = [ln if ln.endswith("\n") else ln + "\n" for ln in lines]
    return signed_note + "".join(ln for ln in dict.fromkeys(extra) if ln not in have)


def cosignature_lines(lines: str) -> list[str]:
    """Split a witness's add-checkpoint answer into signature lines; raise
    :class:`NoteError` when a line is not a signature line."""
    if not lines.endswith("\n"):
        raise NoteError("cosignature answer must end with a newline")
    out = lines.splitlines(keepends=True)
    for ln in out:
        if not ln.startswith(_SIG_PREFIX) or " " not in ln[len(_SIG_PREFIX) :].strip():
            raise NoteError(f"malformed cosignature line {ln.rstrip()!r}")
    return out


def cosignatures(signed_note: str, keys: Sequence[CosignerKey]) -> dict[str, int]:
    """Which of ``keys`` validly cosigned the note: ``{key text: timestamp}``.

    Lines by other keys are ignored (as signed-note verification does); a line by a known
    key that does not verify is ignored too, so it does not count toward a policy.
    """
    body = note.unverified_text(signed_note)
    known = {(k.name, k.key_id): k for k in keys}
    out: dict[str, int] = {}
    for line in signature_lines(signed_note):
        if not line.startswith(_SIG_PREFIX):
            continue
        name, _, b64 = line[len(_SIG_PREFIX) :].rstrip("\n").partition(" ")
        try:
            blob = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            continue
        key = known.get((name, int.from_bytes(blob[:4], "big"))) if len(blob) >= 4 else None
        if key is None:
            continue
        ts = key.verify(body, blob)
        if ts is not None:
            out[key.to_text()] = ts
    return out


# --------------------------------------------------------------------------- add-checkpoint


@dataclass(frozen=True, slots=True)
class AddCheckpoint:
    """A parsed add-checkpoint request: the old size, the proof, the signed checkpoint."""

    old_size: int
    proof: tuple[bytes, ...]
    checkpoint: str


def add_checkpoint_body(old_size: int, proof: Sequence[bytes], signed_checkpoint: str) -> bytes:
    """The request body of ``POST <prefix>/add-checkpoint``: ``old <size>``, one base64
    proof hash a line, a blank line, then the signed checkpoint note."""
    if isinstance(old_size, bool) or not isinstance(old_size, int) or old_size < 0:
        raise ValueError(f"old_size: must be a non-negative integer, got {old_size!r}")
    if len(proof) > MAX_PROOF_LINES:
        raise ValueError(f"proof: at most {MAX_PROOF_LINES} hashes, got {len(proof)}")
    lines = [f"old {old_size}\n", *(f"{_b64(h)}\n" for h in proof), "\n", signed_checkpoint]
    return "".join(lines).encode("utf-8")


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """Parse an add-checkpoint request body strictly; raise ``ValueError`` naming the line."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("body: not valid UTF-8") from None
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise ValueError("body: no blank line between the old size and proof and the checkpoint")
    lines = head.split("\n")
    first = lines[0]
    size_text = first[4:] if first.startswith("old ") else ""
    if not (size_text.isascii() and size_text.isdigit()) or (
        len(size_text) > 1 and size_text[0] == "0"
    ):
        raise ValueError(f"line 1: want 'old <size>' (decimal, no leading zeros), got {first!r}")
    proof_lines = lines[1:]
    if len(proof_lines) > MAX_PROOF_LINES:
        raise ValueError(f"body: more than {MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for i, line in enumerate(proof_lines, start=2):
        try:
            h = _unb64(line, f"line {i}")
        except NoteError as exc:
            raise ValueError(str(exc)) from None
        if len(h) != 32:
            raise ValueError(f"line {i}: a proof hash must be 32 bytes, got {len(h)}")
        proof.append(h)
    if not checkpoint:
        raise ValueError("body: no checkpoint after the blank line")
    return AddCheckpoint(int(size_text), tuple(proof), checkpoint)
