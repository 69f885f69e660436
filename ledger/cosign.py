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
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger import note
from ledger.errors import NoteError, WitnessPolicyError

__all__ = [
    "ALG_COSIGNATURE_V1",
    "MAX_POLICY_WITNESSES",
    "MAX_PROOF_LINES",
    "SIZE_MEDIA_TYPE",
    "AddCheckpoint",
    "Cosigner",
    "CosignerKey",
    "PolicyCheck",
    "WitnessPolicy",
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

MAX_POLICY_WITNESSES = 16
"""The most witnesses a contract's witness policy may name (a bound on what a contract
import makes every report and verifier check)."""

_MAX_KEY_TEXT = 400
_POLICY_FIELDS = ("keys", "quorum")

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


#: What a witness key's material must be (the words of a refusal).
_KIND = "a cosignature/v1 key"


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
        key = note.ed25519_public_key(name, public_key)
        kid = note.key_id(name, public_key, ALG_COSIGNATURE_V1)
        return cls(name, kid, bytes(public_key), key)

    @classmethod
    def from_text(cls, text: str) -> CosignerKey:
        """Parse ``<name>+<hex8>+<base64(0x04||pubkey)>``; raise :class:`NoteError` if
        malformed or the key ID does not match (surrounding white space ignored)."""
        return cls(*note.parse_public_key_text(text, "witness key", ALG_COSIGNATURE_V1,
                                               _KIND))

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
        name, kid, seed = note.split_key_text(text.strip()[len(_PRIVATE_PREFIX) :],
                                              "witness private key", ALG_COSIGNATURE_V1,
                                              _KIND, _PRIVATE_PREFIX)
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


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    """What one checkpoint note shows against a :class:`WitnessPolicy`: the policy's
    witnesses (names, in the policy's order), those with a valid cosignature, the quorum."""

    quorum: int
    witnesses: tuple[str, ...]
    cosigned: tuple[str, ...]

    @property
    def met(self) -> bool:
        """Whether at least ``quorum`` of the policy's witnesses validly cosigned."""
        return len(self.cosigned) >= self.quorum

    @property
    def missing(self) -> tuple[str, ...]:
        """The policy's witnesses without a valid cosignature, in the policy's order."""
        return tuple(n for n in self.witnesses if n not in self.cosigned)

    def words(self) -> str:
        """One sentence: how many of the policy's witnesses cosigned, how many it needs,
        and (when not met) which are missing."""
        head = (f"cosigned by {len(self.cosigned)} of the {len(self.witnesses)} witnesses "
                f"the contract's policy names, which needs {self.quorum}")
        if self.met:
            return head
        return f"{head} (missing: {', '.join(self.missing)})"


def _policy_fail(field_: str, reason: str) -> WitnessPolicyError:
    return WitnessPolicyError(field_, reason)


@dataclass(frozen=True, slots=True)
class WitnessPolicy:
    """A contract's witness policy (``terms.witnesses``): the witnesses its customer trusts
    (``cosignature/v1`` keys: name and public key) and how many of them (``quorum``, k of
    n) must have cosigned a checkpoint before it counts for that contract.

    JSON form: ``{"keys": ["<name>+<hex8>+<base64>", ...], "quorum": k}``; ``quorum``
    defaults to every key. The one home of the rule: the contract's validation, billing's
    terms, the reports, the portal and the standalone verifier all use this class.
    """

    keys: tuple[CosignerKey, ...]
    quorum: int

    def __post_init__(self) -> None:
        if not self.keys or len(self.keys) > MAX_POLICY_WITNESSES:
            raise _policy_fail("keys", f"must name 1 to {MAX_POLICY_WITNESSES} witnesses, "
                               f"got {len(self.keys)}")
        names: set[str] = set()
        for i, key in enumerate(self.keys):
            if key.name in names:
                raise _policy_fail(f"keys[{i}]", f"witness {key.name} is listed twice")
            names.add(key.name)
        q = self.quorum
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= len(self.keys):
            raise _policy_fail("quorum", f"must be an integer from 1 to the {len(self.keys)} "
                               f"witness(es) listed, got {q!r}")

    @classmethod
    def from_json(cls, value: object, field_: str = "terms.witnesses") -> WitnessPolicy:
        """Parse the JSON form strictly; raise :class:`WitnessPolicyError` whose ``field``
        names the part at fault under ``field_`` (``terms.witnesses.keys[1]``)."""
        if not isinstance(value, dict):
            raise _policy_fail(field_, 'must be an object {"keys": [witness keys], '
                               '"quorum": k}')
        unknown = sorted(str(k) for k in value if k not in _POLICY_FIELDS)
        if unknown:
            raise _policy_fail(field_, f"unknown field(s) {unknown}; allowed: "
                               f"{list(_POLICY_FIELDS)}")
        raw = value.get("keys")
        if not isinstance(raw, list) or not raw:
            raise _policy_fail(f"{field_}.keys", "must be a non-empty array of witness keys "
                               "(<name>+<hex8>+<base64>, as `yoco-verify witness keygen` "
                               "prints them)")
        if len(raw) > MAX_POLICY_WITNESSES:
            raise _policy_fail(f"{field_}.keys", f"at most {MAX_POLICY_WITNESSES} witnesses, "
                               f"got {len(raw)}")
        keys: list[CosignerKey] = []
        for i, item in enumerate(raw):
            where = f"{field_}.keys[{i}]"
            if not isinstance(item, str) or len(item) > _MAX_KEY_TEXT:
                raise _policy_fail(where, "must be a witness key string "
                                   "(<name>+<hex8>+<base64>) of at most "
                                   f"{_MAX_KEY_TEXT} characters")
            try:
                key = CosignerKey.from_text(item)
            except NoteError as exc:
                raise _policy_fail(where, str(exc)) from None
            if item != key.to_text():
                raise _policy_fail(where, f"must be written exactly as {key.to_text()!r}")
            keys.append(key)
        quorum = value.get("quorum", len(keys))
        try:
            return cls(tuple(keys), quorum)
        except WitnessPolicyError as exc:
            raise _policy_fail(f"{field_}.{exc.field}", exc.reason) from None

    def to_json(self) -> dict[str, object]:
        """The JSON form, keys in the policy's order, ``quorum`` always written.
        Promises: ``WitnessPolicy.from_json(p.to_json()) == p``."""
        return {"keys": [k.to_text() for k in self.keys], "quorum": self.quorum}

    @property
    def names(self) -> tuple[str, ...]:
        """The witnesses' names, in the policy's order."""
        return tuple(k.name for k in self.keys)

    def describe(self) -> str:
        """``2 of 3 witnesses: a, b, c`` (the policy in words)."""
        return f"{self.quorum} of {len(self.keys)} witnesses: {', '.join(self.names)}"

    def check(self, signed_note: str) -> PolicyCheck:
        """Which of the policy's witnesses validly cosigned ``signed_note`` (a checkpoint
        with its signature lines). A line that does not verify over this very note (a
        forgery, a cosignature of another root or size) does not count; several lines by
        one key count once."""
        found = cosignatures(signed_note, self.keys)
        cosigned = tuple(k.name for k in self.keys if k.to_text() in found)
        return PolicyCheck(self.quorum, self.names, cosigned)
