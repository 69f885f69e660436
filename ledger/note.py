"""C2SP signed notes (https://c2sp.org/signed-note) and checkpoints (https://c2sp.org/tlog-checkpoint).

Byte-compatible with Go's ``golang.org/x/mod/sumdb/note`` for Ed25519 keys::

    key ID            = SHA-256(name || 0x0A || 0x01 || 32-byte public key)[:4]   (big endian)
    verifier key text = <name>+<hex8 key ID>+<base64(0x01 || public key)>
    signer key text   = PRIVATE+KEY+<name>+<hex8 key ID>+<base64(0x01 || 32-byte seed)>
    note              = <text ending in \\n> \\n (— <name> <base64(key ID || signature)>\\n)+

A checkpoint is a signed note whose text is ``<origin>\\n<size>\\n<base64 root>\\n`` followed
by optional non-empty extension lines. The log's key name SHOULD be its origin (C2SP
tlog-checkpoint): :func:`sign_checkpoint` signs under the origin, with the operator's one
Ed25519 key (:meth:`Signer.named`), so Go's ``note.Open`` with the verifier key
``<origin>+<key ID>+<key>`` accepts it; :func:`open_checkpoint` accepts a pinned key's
signature under its own name (checkpoints signed before, under the operator's key name)
or under the checkpoint's origin — the same public key either way.

Parse keys once (``Verifier.from_text`` / ``Signer.from_text``) and reuse the objects; all
checking functions take parsed keys, so nothing is re-parsed in a loop.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.errors import KeyFileError, NoteError

__all__ = [
    "ALG_ED25519",
    "Checkpoint",
    "Signer",
    "Verifier",
    "checkpoint_verifiers",
    "ed25519_public_key",
    "format_checkpoint",
    "generate_signer",
    "key_id",
    "load_or_create_signer",
    "open_checkpoint",
    "open_note",
    "parse_checkpoint",
    "parse_public_key_text",
    "sign_checkpoint",
    "sign_note",
    "split_key_text",
    "unverified_text",
]

ALG_ED25519 = 0x01
"""Signature algorithm byte of Ed25519 keys in signed notes."""

_SIG_PREFIX = "\u2014 "  # em dash, space
_MAX_SIGNATURES = 100  # Go's limit on signature lines per note
_HASH_SIZE = 32
_PRIVATE_PREFIX = "PRIVATE+KEY+"


def _b64decode(text: str) -> bytes:
    """Strict standard base64 (RFC 4648 §4, padded); raises binascii.Error/ValueError."""
    if not text.isascii():
        raise ValueError("non-ASCII base64")
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("non-canonical base64")
    return raw


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def usable_key_name(name: str) -> bool:
    """True iff ``name`` can be a note key name (:func:`_check_name`).  A log's origin
    names its contract, and a contract id may hold a '+' (which separates a key text's
    fields): C2SP's key name = origin is a SHOULD, so such a log's checkpoints keep the
    operator's key name, on the signing and the verifying side alike."""
    try:
        _check_name(name)
    except NoteError:
        return False
    return True


def _check_name(name: object) -> str:
    """Key names: non-empty, no Unicode white space, no '+' (as Go's isValidName)."""
    if not isinstance(name, str) or not name:
        raise NoteError("key name must be a non-empty string")
    if "+" in name or any(ch.isspace() for ch in name):
        raise NoteError(f"key name {name!r} must not contain '+' or white space")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise NoteError(f"key name {name!r} is not valid UTF-8") from None
    return name


def key_id(name: str, public_key: bytes, alg: int = ALG_ED25519) -> int:
    """Return the 32-bit key ID of a key of algorithm byte ``alg`` (0x01: an Ed25519 note
    key; 0x04: a ``cosignature/v1`` witness key): first 4 bytes (big endian) of
    SHA-256(name || "\\n" || alg || public_key). Raises :class:`NoteError` for a bad
    name."""
    _check_name(name)
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key)
    return int.from_bytes(digest.digest()[:4], "big")


def split_key_text(
    text: str, what: str, alg: int, kind: str, prefix: str = ""
) -> tuple[str, int, bytes]:
    """Parse the key text shape shared by note keys and witness keys,
    ``<name>+<hex8>+<base64(alg || 32 bytes)>`` (``text`` without its ``prefix``, e.g.
    ``PRIVATE+KEY+``): the name (checked), the key ID as written and the 32 bytes of key
    material. Raises :class:`NoteError` naming ``what`` (``verifier key``) and, for
    material of another algorithm, ``kind`` (``an Ed25519 key``). The caller checks the
    key ID against the key it derives."""
    parts = text.split("+", 2)
    if len(parts) != 3:
        raise NoteError(f"{what} must look like {prefix}<name>+<hex8 key ID>+<base64 key>")
    name, hex8, b64 = parts
    _check_name(name)
    if len(hex8) != 8 or any(c not in "0123456789abcdefABCDEF" for c in hex8):
        raise NoteError(f"{what}: key ID {hex8!r} must be 8 hexadecimal digits")
    try:
        raw = _b64decode(b64)
    except (binascii.Error, ValueError):
        raise NoteError(f"{what} material is not valid (canonical) base64") from None
    if len(raw) != 33 or raw[0] != alg:
        raise NoteError(f"{what} is not {kind} ({alg:#04x} followed by 32 bytes)")
    return name, int(hex8, 16), raw[1:]


def ed25519_public_key(name: str, public_key: bytes) -> Ed25519PublicKey:
    """The Ed25519 public key of 32 raw bytes for a key named ``name`` (the name checked
    by the rules of signed notes); raises :class:`NoteError`."""
    _check_name(name)
    if len(public_key) != 32:
        raise NoteError("Ed25519 public key must be 32 bytes")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes(public_key))
    except ValueError as exc:
        raise NoteError(f"invalid Ed25519 public key: {exc}") from None


def parse_public_key_text(
    text: object, what: str, alg: int, kind: str
) -> tuple[str, int, bytes, Ed25519PublicKey]:
    """Parse a public key text ``<name>+<hex8>+<base64(alg || 32-byte Ed25519 key)>``
    (:func:`split_key_text`; surrounding white space ignored) into its name, key ID, raw
    key and Ed25519 key, the key ID checked against the name and key (for ``alg``).
    Raises :class:`NoteError` naming ``what``."""
    if not isinstance(text, str):
        raise NoteError(f"{what} must be text")
    name, want_id, public = split_key_text(text.strip(), what, alg, kind)
    key = ed25519_public_key(name, public)
    if key_id(name, public, alg) != want_id:
        raise NoteError(f"{what} ID {want_id:08x} does not match the name and key")
    return name, want_id, public, key


@dataclass(frozen=True)
class Verifier:
    """A parsed note verifier (public) key: name, 32-bit key ID and Ed25519 public key."""

    name: str
    key_id: int
    public_key: bytes
    _key: Ed25519PublicKey = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_public_key(cls, name: str, public_key: bytes) -> Verifier:
        """Return the verifier for a raw 32-byte Ed25519 public key under ``name``."""
        key = ed25519_public_key(name, public_key)
        return cls(name, key_id(name, public_key), bytes(public_key), key)

    @classmethod
    def from_text(cls, text: str) -> Verifier:
        """Parse ``<name>+<hex8>+<base64(0x01||pubkey)>``; raise :class:`NoteError` if malformed.

        Surrounding white space (e.g. a trailing newline from a key file) is ignored; the
        key ID must match the name and key.
        """
        return cls(*parse_public_key_text(text, "verifier key", ALG_ED25519, "an Ed25519 key"))

    def to_text(self) -> str:
        """Return the verifier key text ``<name>+<hex8>+<base64(0x01||pubkey)>``."""
        blob = _b64(bytes([ALG_ED25519]) + self.public_key)
        return f"{self.name}+{self.key_id:08x}+{blob}"

    def __str__(self) -> str:
        """The verifier key text."""
        return self.to_text()

    def named(self, name: str) -> Verifier:
        """The same public key under another key name (a log's origin): what Go's
        ``note.Open`` needs to accept a signature line of that name.  A name that cannot
        be a key name (see :func:`usable_key_name`) keeps this key's own name."""
        if name == self.name or not usable_key_name(name):
            return self
        return Verifier(name, key_id(name, self.public_key), self.public_key, self._key)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Return True iff ``signature`` is this key's Ed25519 signature of ``message``."""
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """A parsed note signer (private) key: name, key ID and Ed25519 private key."""

    name: str
    key_id: int
    _key: Ed25519PrivateKey = field(repr=False, compare=False, hash=False)
    verifier: Verifier = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> Signer:
        """Return the signer for a 32-byte Ed25519 seed (private key) under ``name``."""
        _check_name(name)
        if len(seed) != 32:
            raise NoteError("Ed25519 seed must be 32 bytes")
        key = Ed25519PrivateKey.from_private_bytes(bytes(seed))
        public = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        verifier = Verifier.from_public_key(name, public)
        return cls(name, verifier.key_id, key, verifier)

    @classmethod
    def generate(cls, name: str) -> Signer:
        """Return a new signer with a fresh random Ed25519 key."""
        return cls.from_seed(name, os.urandom(32))

    @classmethod
    def from_text(cls, text: str) -> Signer:
        """Parse ``PRIVATE+KEY+<name>+<hex8>+<base64(0x01||seed)>``; raise :class:`NoteError`.

        Surrounding white space is ignored; the key ID must match the name and key.
        """
        if not isinstance(text, str):
            raise NoteError("signer key must be text")
        text = text.strip()
        if not text.startswith(_PRIVATE_PREFIX):
            raise NoteError("signer key must start with PRIVATE+KEY+")
        name, want_id, seed = split_key_text(text[len(_PRIVATE_PREFIX) :], "signer key",
                                             ALG_ED25519, "an Ed25519 key", _PRIVATE_PREFIX)
        signer = cls.from_seed(name, seed)
        if signer.key_id != want_id:
            raise NoteError(f"signer key ID {want_id:08x} does not match the name and key")
        return signer

    def to_text(self) -> str:
        """Return the private key text ``PRIVATE+KEY+<name>+<hex8>+<base64(0x01||seed)>``."""
        seed = self._key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_id:08x}+{_b64(bytes([1]) + seed)}"

    def verifier_text(self) -> str:
        """Return the verifier (public) key text of this signer, ``<name>+<hex8>+<base64>``."""
        return self.verifier.to_text()

    def named(self, name: str) -> Signer:
        """This signer's Ed25519 key under another key name (a log's origin): the same
        private key, a different key ID.  A name that cannot be a key name (see
        :func:`usable_key_name`) keeps this key's own name."""
        if name == self.name or not usable_key_name(name):
            return self
        seed = self._key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return Signer.from_seed(name, seed)

    def sign(self, message: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of ``message``."""
        return self._key.sign(message)


def generate_signer(name: str) -> tuple[str, str]:
    """Return ``(signer_key_text, verifier_key_text)`` for a fresh Ed25519 key named ``name``."""
    signer = Signer.generate(name)
    return signer.to_text(), signer.verifier.to_text()


# --------------------------------------------------------------------------- notes


def _check_note_chars(text: str) -> None:
    for ch in text:
        if ch < " " and ch != "\n":
            raise NoteError(f"note contains control character {ch!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NoteError("note is not valid UTF-8") from None


def sign_note(text: str, signer: Signer) -> str:
    """Return the signed note: ``text``, a blank line, and ``signer``'s signature line.

    ``text`` must be non-empty, end with a newline, hold no blank line and no control
    character other than newline (raises :class:`NoteError` otherwise).
    """
    if not isinstance(text, str) or not text.endswith("\n"):
        raise NoteError("note text must end with a newline")
    if "\n\n" in text or text.startswith("\n"):
        raise NoteError("note text must not contain a blank line")
    _check_note_chars(text)
    sig = signer.sign(text.encode("utf-8"))
    blob = _b64(signer.key_id.to_bytes(4, "big") + sig)
    return f"{text}\n{_SIG_PREFIX}{signer.name} {blob}\n"


def _split_note(note: str) -> tuple[str, str]:
    _check_note_chars(note)
    split = note.rfind("\n\n")
    if split < 0:
        raise NoteError("note has no signature block (blank line followed by signatures)")
    text, sigs = note[: split + 1], note[split + 2 :]
    if not sigs or not sigs.endswith("\n"):
        raise NoteError("note's signature block must be non-empty and end with a newline")
    return text, sigs


def unverified_text(note: str) -> str:
    """Return a signed note's text WITHOUT checking any signature (for diagnostics/self-checks).

    Raises :class:`NoteError` when the note is malformed. Never trust the result: use
    :func:`open_note` for anything that matters.
    """
    if not isinstance(note, str):
        raise NoteError("note must be text")
    return _split_note(note)[0]


def open_note(note: str | bytes, verifiers: Verifier | Iterable[Verifier]) -> str:
    """Verify a signed note and return its text (ending with a newline).

    Follows Go's ``note.Open``: signature lines by unknown keys (name and key ID) are
    ignored, any signature by a known key must verify, and at least one must be present.
    Raises :class:`NoteError` on a malformed note, an invalid signature, or no signature
    by any of ``verifiers``.
    """
    if isinstance(note, bytes | bytearray):
        try:
            note = bytes(note).decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("note is not valid UTF-8") from None
    if not isinstance(note, str):
        raise NoteError("note must be text")
    known: dict[tuple[str, int], Verifier] = {}
    for v in [verifiers] if isinstance(verifiers, Verifier) else verifiers:
        known[(v.name, v.key_id)] = v
    text, sigs = _split_note(note)
    message = text.encode("utf-8")
    lines = sigs[:-1].split("\n")
    if len(lines) > _MAX_SIGNATURES:
        raise NoteError(f"note has more than {_MAX_SIGNATURES} signatures")
    verified = 0
    seen: set[tuple[str, int]] = set()
    for line in lines:
        if not line.startswith(_SIG_PREFIX):
            raise NoteError(f"malformed signature line {line!r}: must start with '— '")
        name, sep, b64 = line[len(_SIG_PREFIX) :].partition(" ")
        _check_name(name)
        try:
            blob = base64.b64decode(b64, validate=True) if sep and b64 else b""
        except (binascii.Error, ValueError):
            raise NoteError(f"malformed signature line {line!r}") from None
        if len(blob) < 5:
            raise NoteError(f"malformed signature line {line!r}")
        kid = int.from_bytes(blob[:4], "big")
        verifier = known.get((name, kid))
        if verifier is None or (name, kid) in seen:
            continue  # unknown key, or a repeated signature by one key (as Go's note.Open)
        seen.add((name, kid))
        if not verifier.verify(message, blob[4:]):
            raise NoteError(f"invalid signature by {name}+{kid:08x}")
        verified += 1
    if not verified:
        names = ", ".join(f"{n}+{k:08x}" for n, k in known) or "none given"
        raise NoteError(f"note has no signature by a known key (known: {names})")
    return text


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """A log's tree head: origin, tree size, root hash and optional extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


def format_checkpoint(origin: str, size: int, root: bytes, extensions: Sequence[str] = ()) -> str:
    """Return the checkpoint note text ``<origin>\\n<size>\\n<base64 root>\\n[ext\\n...]``.

    Raises :class:`NoteError` on an empty origin or one with a newline/control character,
    a negative size, a root that is not 32 bytes, or an empty or multi-line extension.
    """
    if not isinstance(origin, str) or not origin or "\n" in origin:
        raise NoteError("checkpoint origin must be a non-empty single line")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise NoteError(f"checkpoint size must be a non-negative integer, got {size!r}")
    if not isinstance(root, bytes | bytearray) or len(root) != _HASH_SIZE:
        raise NoteError(f"checkpoint root must be {_HASH_SIZE} bytes")
    for ext in extensions:
        if not isinstance(ext, str) or not ext or "\n" in ext:
            raise NoteError("checkpoint extension lines must be non-empty single lines")
    text = "".join(f"{line}\n" for line in (origin, str(size), _b64(bytes(root)), *extensions))
    _check_note_chars(text)
    return text


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse checkpoint note text (unsigned body) strictly; raise :class:`NoteError` if bad.

    Requires at least three non-empty lines, a decimal size without sign or leading zeros,
    and a canonical standard-base64 32-byte root.
    """
    if not text.endswith("\n"):
        raise NoteError("checkpoint text must end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise NoteError("checkpoint must have at least three non-empty lines")
    origin, size_text, root_text, *extensions = lines
    if not (size_text.isascii() and size_text.isdigit()) or (
        len(size_text) > 1 and size_text[0] == "0"
    ):
        raise NoteError(f"checkpoint size {size_text!r} is not a canonical decimal number")
    try:
        root = _b64decode(root_text)
    except (binascii.Error, ValueError):
        raise NoteError("checkpoint root hash is not valid base64") from None
    if len(root) != _HASH_SIZE:
        raise NoteError(f"checkpoint root hash is {len(root)} bytes, want {_HASH_SIZE}")
    return Checkpoint(origin, int(size_text), root, tuple(extensions))


def sign_checkpoint(
    signer: Signer, origin: str, size: int, root: bytes, extensions: Sequence[str] = ()
) -> str:
    """Return the full signed checkpoint note text for tree ``(size, root)`` of log
    ``origin``, signed by ``signer``'s key under the key name ``origin`` (C2SP: the key
    name SHOULD be the origin), whatever name ``signer`` carries."""
    text = format_checkpoint(origin, size, root, extensions)
    return sign_note(text, signer.named(origin))


def checkpoint_verifiers(
    verifier: Verifier | Iterable[Verifier], origin: str
) -> tuple[Verifier, ...]:
    """The keys a checkpoint of ``origin`` may be signed with, given the pinned keys:
    each one under its own name (checkpoints signed before the key name was the origin)
    and under ``origin`` (every checkpoint since).  The public keys are the pinned ones:
    trusting them trusts nothing more."""
    pinned = [verifier] if isinstance(verifier, Verifier) else list(verifier)
    out: dict[tuple[str, int], Verifier] = {}
    for v in pinned:
        out.setdefault((v.name, v.key_id), v)
        with contextlib.suppress(NoteError):  # an origin that is no key name: own name only
            o = v.named(origin)
            out.setdefault((o.name, o.key_id), o)
    return tuple(out.values())


def open_checkpoint(
    note: str | bytes,
    verifier: Verifier | Iterable[Verifier],
    origin: str | None = None,
) -> Checkpoint:
    """Verify a signed checkpoint with ``verifier`` and return its parsed contents.

    A signature by a pinned key counts under the key's own name or under the
    checkpoint's origin (:func:`checkpoint_verifiers`).  When ``origin`` is given the
    checkpoint's origin must equal it. Raises :class:`NoteError` on a bad signature,
    unknown key, malformed note or checkpoint body, or origin mismatch.
    """
    if isinstance(note, bytes | bytearray):
        try:
            note = bytes(note).decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("note is not valid UTF-8") from None
    if not isinstance(note, str):
        raise NoteError("note must be text")
    claimed = unverified_text(note).split("\n", 1)[0]  # the origin line, checked below
    checkpoint = parse_checkpoint(open_note(note, checkpoint_verifiers(verifier, claimed)))
    if origin is not None and checkpoint.origin != origin:
        raise NoteError(f"checkpoint is for log {checkpoint.origin!r}, expected {origin!r}")
    return checkpoint


# --------------------------------------------------------------------------- key file


def _read_signer(path: Path, name: str) -> Signer:
    try:
        info = path.stat()
        if os.name == "posix" and stat.S_IMODE(info.st_mode) & 0o077:
            raise KeyFileError(
                f"signer key file {path} is readable by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeyFileError(f"cannot read signer key file {path}: {exc}") from exc
    try:
        signer = Signer.from_text(text)
    except NoteError as exc:
        raise KeyFileError(f"signer key file {path} is malformed: {exc}") from None
    if signer.name != name:
        raise KeyFileError(
            f"signer key file {path} holds a key named {signer.name!r}, expected {name!r}"
        )
    return signer


def load_or_create_signer(path: Path, name: str) -> Signer:
    """Return the signer stored at ``path``, creating it (new key named ``name``) if absent.

    A new file is written with mode 0600 (parents created with mode 0700), fsync'd and
    published atomically, so concurrent callers all end up with the same key. Raises
    :class:`KeyFileError` when the file exists but is malformed, names another key, or is
    readable by group/others.
    """
    path = Path(path)
    _check_name(name)
    if path.exists():
        return _read_signer(path, name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    signer = Signer.generate(name)
    fd, tmp_name = tempfile.mkstemp(prefix=".signer-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(signer.to_text() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp_name, path)
        except FileExistsError:
            return _read_signer(path, name)
        except OSError as exc:
            raise KeyFileError(f"cannot create signer key file {path}: {exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return signer
