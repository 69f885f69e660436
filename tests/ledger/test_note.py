"""C2SP signed notes and checkpoints: Go known-answer vectors, key handling, tampering."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest

from ledger import note
from ledger.errors import KeyFileError, NoteError
from ledger.note import (
    Checkpoint,
    Signer,
    Verifier,
    format_checkpoint,
    generate_signer,
    key_id,
    load_or_create_signer,
    open_checkpoint,
    open_note,
    parse_checkpoint,
    sign_checkpoint,
    sign_note,
)

# Known-answer vectors from golang.org/x/mod/sumdb/note (note_test.go).
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_B64 = (
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)
PETER_SIG = f"— PeterNeumann {PETER_B64}\n"
ENOCH_B64 = (
    "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ="
)
ENOCH_SIG = f"— EnochRoot {ENOCH_B64}\n"

ROOT = hashlib.sha256(b"root").digest()


def _byte_splice(s: str, at: int, insert: str) -> str:
    """Insert into the UTF-8 bytes of ``s`` at byte offset ``at`` (as Go's string slicing)."""
    b = s.encode()
    return (b[:at] + insert.encode() + b[at:]).decode()


@pytest.fixture(scope="module")
def peter() -> Verifier:
    return Verifier.from_text(PETER_VKEY)


@pytest.fixture(scope="module")
def enoch() -> Verifier:
    return Verifier.from_text(ENOCH_VKEY)


# --------------------------------------------------------------------------- keys


def test_go_keys_parse_and_round_trip(peter: Verifier) -> None:
    signer = Signer.from_text(PETER_SKEY)
    assert signer.name == peter.name == "PeterNeumann"
    assert signer.key_id == peter.key_id == 0xC74F20A3
    assert signer.verifier == peter
    assert signer.to_text() == PETER_SKEY
    assert signer.verifier_text() == PETER_VKEY == peter.to_text() == str(peter)
    assert key_id("PeterNeumann", peter.public_key) == 0xC74F20A3
    raw = hashlib.sha256(b"PeterNeumann\n\x01" + peter.public_key).digest()[:4]
    assert int.from_bytes(raw, "big") == peter.key_id
    assert Verifier.from_text(PETER_VKEY + "\n") == peter  # key files end with a newline


def test_go_sign_known_answer() -> None:
    signed = sign_note(TEXT, Signer.from_text(PETER_SKEY))
    assert signed == TEXT + "\n" + PETER_SIG


def _manglings(key: str) -> list[str]:
    b = key.encode()
    out = {
        b[i:j].decode(errors="replace")
        for i in range(len(b) + 1)
        for j in range(i + 1, len(b) + 1)
        if (i, j) != (0, len(b))
    }
    for i in range(len(b)):
        m = bytearray(b)
        m[i] = (m[i] + 1) % 256
        out.add(bytes(m).decode(errors="replace"))
    out.discard(key)
    return sorted(out)


def test_mangled_verifier_keys_are_rejected() -> None:
    for k in _manglings(PETER_VKEY):
        with pytest.raises(NoteError):
            Verifier.from_text(k)
    for k in [
        # from Go: wrong length key / unknown algorithm, each with an adjusted key hash
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ]:
        with pytest.raises(NoteError):
            Verifier.from_text(k)


def test_mangled_signer_keys_are_rejected() -> None:
    for k in _manglings(PETER_SKEY):
        with pytest.raises(NoteError):
            Signer.from_text(k)


def test_generate_signer() -> None:
    skey, vkey = generate_signer("example.com/log")
    signer, verifier = Signer.from_text(skey), Verifier.from_text(vkey)
    assert signer.verifier == verifier and verifier.name == "example.com/log"
    assert skey.startswith("PRIVATE+KEY+example.com/log+")
    assert verifier.verify(b"hi", signer.sign(b"hi"))
    assert not verifier.verify(b"ho", signer.sign(b"hi"))
    assert Signer.from_text(generate_signer("x")[0]).verifier != verifier


@pytest.mark.parametrize("name", ["", "a+b", "a b", "a\tb", "a\nb", "a\u00a0b"])
def test_bad_key_names(name: str) -> None:
    with pytest.raises(NoteError):
        Signer.generate(name)


def test_unicode_key_name_is_fine() -> None:
    signer = Signer.generate("ledger.example/журнал")
    assert Verifier.from_text(signer.verifier_text()) == signer.verifier


# --------------------------------------------------------------------------- notes


def test_go_open_vectors(peter: Verifier, enoch: Verifier) -> None:
    msg = TEXT + "\n" + PETER_SIG + ENOCH_SIG
    assert open_note(msg, peter) == TEXT  # one verified, one unknown: fine
    assert open_note(msg, [peter, enoch]) == TEXT
    assert open_note(msg.encode(), [enoch]) == TEXT
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_note(msg, [])
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_note(TEXT + "\n" + ENOCH_SIG, peter)
    # too many signatures
    with pytest.raises(NoteError):
        open_note(TEXT + "\n" + PETER_SIG * 101, peter)
    # invalid signature by a known key
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(TEXT + "\n" + _byte_splice(PETER_SIG, 60, "ABCD"), peter)
    # repeated verified and unverified signatures are tolerated
    enoch_abcd = _byte_splice(ENOCH_SIG, 60, "ABCD")
    dup = TEXT + "\n" + PETER_SIG + PETER_SIG + ENOCH_SIG + ENOCH_SIG + enoch_abcd
    assert open_note(dup, peter) == TEXT


@pytest.mark.parametrize(
    "msg",
    [
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        TEXT + "\n" + "— Bad Name " + PETER_B64,
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        TEXT + "\n" + PETER_SIG.replace("—", "-"),
        TEXT + "\n" + "— PeterNeumann\n",
        TEXT + "\n" + "— PeterNeumann AAAA\n",
        TEXT + "\n" + "— PeterNeumann !!!!\n",
    ],
)
def test_go_malformed_notes(msg: str, peter: Verifier) -> None:
    with pytest.raises(NoteError):
        open_note(msg, peter)


def test_invalid_utf8_note(peter: Verifier) -> None:
    with pytest.raises(NoteError):
        open_note(b"\xff" + (TEXT + "\n" + PETER_SIG).encode(), peter)


def test_tampered_text_fails(peter: Verifier) -> None:
    msg = TEXT + "\n" + PETER_SIG
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(msg.replace("cryptography", "cryptographY"), peter)


@pytest.mark.parametrize("text", ["abc", "", "a\n\nb\n", "\nabc\n", "a\x07\n"])
def test_sign_note_refuses_bad_text(text: str) -> None:
    with pytest.raises(NoteError):
        sign_note(text, Signer.from_text(PETER_SKEY))


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip() -> None:
    signer = Signer.generate("example.com/log")
    text = sign_checkpoint(signer, "example.com/log", 1234, ROOT)
    body = f"example.com/log\n1234\n{base64.b64encode(ROOT).decode()}\n"
    assert text.startswith(body + "\n— example.com/log ")
    cp = open_checkpoint(text, signer.verifier)
    assert cp == Checkpoint("example.com/log", 1234, ROOT)
    assert open_checkpoint(text, signer.verifier, origin="example.com/log") == cp
    with pytest.raises(NoteError, match="expected"):
        open_checkpoint(text, signer.verifier, origin="example.com/other")
    ext = sign_checkpoint(signer, "example.com/log", 0, ROOT, ["— a cosignature hint", "x"])
    assert open_checkpoint(ext, signer.verifier).extensions == ("— a cosignature hint", "x")


def test_checkpoint_tampering_fails() -> None:
    signer = Signer.generate("example.com/log")
    other = Signer.generate("example.com/log")
    text = sign_checkpoint(signer, "example.com/log", 1234, ROOT)
    root_b64 = base64.b64encode(ROOT).decode()
    forged_root = base64.b64encode(hashlib.sha256(b"x").digest()).decode()
    for bad in [
        text.replace("\n1234\n", "\n1235\n"),
        text.replace(root_b64, forged_root),
        text.replace("example.com/log\n", "example.com/lag\n", 1),
    ]:
        with pytest.raises(NoteError):
            open_checkpoint(bad, signer.verifier)
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_checkpoint(text, other.verifier)  # same name, other key: unknown key ID
    # a note signed by the right key but whose body is not a checkpoint
    with pytest.raises(NoteError):
        open_checkpoint(sign_note("hello\n", signer), signer.verifier)


@pytest.mark.parametrize(
    "body",
    [
        "o\n12\n",
        "o\n012\n{r}\n",
        "o\n-1\n{r}\n",
        "o\n+1\n{r}\n",
        "o\n1.0\n{r}\n",
        "o\n\u0661\n{r}\n",
        "\n12\n{r}\n",
        "o\n12\n{r}\n\nx\n",
        "o\n12\n{r}",
        "o\n12\n{short}\n",
        "o\n12\n{r}=\n",
        "o\n12\n{nopad}\n",
    ],
)
def test_parse_checkpoint_rejects(body: str) -> None:
    r = base64.b64encode(ROOT).decode()
    text = body.format(
        r=r,
        short=base64.b64encode(ROOT[:31]).decode(),
        nopad=r.rstrip("="),
    )
    with pytest.raises(NoteError):
        parse_checkpoint(text)


def test_parse_checkpoint_accepts_zero_and_extensions() -> None:
    r = base64.b64encode(ROOT).decode()
    assert parse_checkpoint(f"o\n0\n{r}\n") == Checkpoint("o", 0, ROOT)
    assert parse_checkpoint(f"o\n7\n{r}\na\nb c\n").extensions == ("a", "b c")


@pytest.mark.parametrize(
    "args",
    [("", 1, ROOT), ("a\nb", 1, ROOT), ("o", -1, ROOT), ("o", True, ROOT), ("o", 1, ROOT[:31])],
)
def test_format_checkpoint_rejects(args: tuple[str, int, bytes]) -> None:
    with pytest.raises(NoteError):
        format_checkpoint(*args)
    with pytest.raises(NoteError):
        format_checkpoint("o", 1, ROOT, [""])


# --------------------------------------------------------------------------- key file


def test_load_or_create_signer(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "deep" / "signer.key"
    signer = load_or_create_signer(path, "example.com/log")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().strip() == signer.to_text()
    again = load_or_create_signer(path, "example.com/log")
    assert again.verifier == signer.verifier
    assert [p.name for p in path.parent.iterdir()] == ["signer.key"]  # no temp files left
    with pytest.raises(KeyFileError, match="expected"):
        load_or_create_signer(path, "example.com/other")


def test_load_signer_refuses_unsafe_or_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "signer.key"
    load_or_create_signer(path, "log")
    if os.name == "posix":
        path.chmod(0o644)
        with pytest.raises(KeyFileError, match="chmod 600"):
            load_or_create_signer(path, "log")
        path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(KeyFileError, match="malformed"):
        load_or_create_signer(path, "log")
    # a Go-generated key file loads
    path.write_text(PETER_SKEY + "\n")
    assert load_or_create_signer(path, "PeterNeumann").verifier_text() == PETER_VKEY


def test_module_exports_are_real() -> None:
    for name in note.__all__:
        assert hasattr(note, name), name


# ------------------------------------------------- the key name is the checkpoint's origin


def _go_open(note_text: str, vkey: str) -> str:
    """What Go's ``note.Open`` does with one verifier, written from the spec without this
    package's code: parse ``<name>+<hex8>+<base64(0x01||key)>``, find a signature line of
    that name whose first four bytes are the key ID (SHA-256(name \\n 0x01 key)[:4]),
    check Ed25519 over the text; raise ValueError when there is none."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    name, hex8, b64 = vkey.split("+", 2)
    raw = base64.b64decode(b64)
    assert raw[0] == 1 and len(raw) == 33
    kid = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
    assert kid.hex() == hex8
    text, _, sigs = note_text.rpartition("\n\n")
    for line in sigs.splitlines():
        who, _, blob = line.removeprefix("\u2014 ").partition(" ")
        sig = base64.b64decode(blob)
        if who == name and sig[:4] == kid:
            Ed25519PublicKey.from_public_bytes(raw[1:]).verify(sig[4:], (text + "\n").encode())
            return text + "\n"
    raise ValueError("no signature by the verifier's name and key ID")


def test_a_checkpoint_is_signed_under_its_origin_as_go_reads_it() -> None:
    """The key name is the origin (C2SP SHOULD). The operator's one key signs
    every log's checkpoints under that log's origin; Go's note.Open accepts them with the
    verifier key ``<origin>+<key ID>+<key>`` and would not with the operator's name."""
    operator = Signer.generate("yoco.example/ledger")
    origin = "yoco.example/ledger/C-2026-001"
    text = sign_checkpoint(operator, origin, 7, ROOT)
    body = f"{origin}\n7\n{base64.b64encode(ROOT).decode()}\n"
    assert text.startswith(body + f"\n\u2014 {origin} ")
    per_log = operator.verifier.named(origin)
    assert per_log.public_key == operator.verifier.public_key
    assert per_log.key_id == key_id(origin, operator.verifier.public_key) != operator.key_id
    assert per_log.to_text() == operator.named(origin).verifier_text()
    # Go's reading, from the spec alone
    assert _go_open(text, per_log.to_text()) == body
    with pytest.raises(ValueError, match="no signature"):
        _go_open(text, operator.verifier_text())
    # Go's semantics in this package: the strict note API needs the per-log key ...
    assert open_note(text, per_log) == body
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_note(text, operator.verifier)
    # ... and checkpoints open with either: the pinned public key is the same
    assert open_checkpoint(text, operator.verifier, origin=origin).size == 7
    assert open_checkpoint(text, per_log).size == 7
    # another key under the same names is still refused
    stranger = Signer.generate("yoco.example/ledger")
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_checkpoint(text, stranger.verifier)
    with pytest.raises(NoteError, match="no signature by a known key"):
        open_checkpoint(text, stranger.verifier.named(origin))


def test_checkpoints_signed_under_the_operators_name_stay_verifiable() -> None:
    """A checkpoint signed before the change (under the operator's key name) opens with
    the operator's key, as every one signed since; Go reads it with that key."""
    operator = Signer.generate("yoco.example/ledger")
    origin = "yoco.example/ledger/C-OLD"
    old = sign_note(format_checkpoint(origin, 3, ROOT), operator)  # the old way
    assert "\n\u2014 yoco.example/ledger " in old
    new = sign_checkpoint(operator, origin, 4, ROOT)
    for text, size in ((old, 3), (new, 4)):
        assert open_checkpoint(text, operator.verifier, origin=origin).size == size
    assert _go_open(old, operator.verifier_text()).startswith(origin)
    # the verifiers a checkpoint may carry: the pinned name and the origin, once each
    keys = note.checkpoint_verifiers([operator.verifier, operator.verifier], origin)
    assert [(k.name, k.public_key) for k in keys] == [
        ("yoco.example/ledger", operator.verifier.public_key),
        (origin, operator.verifier.public_key)]
    # an origin that cannot be a key name (white space) adds nothing
    assert note.checkpoint_verifiers(operator.verifier, "bad origin") == (operator.verifier,)


def test_an_origin_that_cannot_be_a_key_name_keeps_the_operators_name() -> None:
    """A contract id may hold a '+' (it separates a key text's fields), so its log's
    origin cannot be a key name: that log's checkpoints are signed under the operator's
    key name, and opened the same way on the verifying side."""
    operator = Signer.generate("yoco.example/ledger")
    origin = "yoco.example/ledger/+C-1"
    assert not note.usable_key_name(origin)
    assert note.usable_key_name("yoco.example/ledger/C-1")
    assert operator.named(origin) is operator
    assert operator.verifier.named(origin) is operator.verifier
    text = sign_checkpoint(operator, origin, 7, ROOT)
    assert f"\n\u2014 {operator.name} " in text
    assert open_checkpoint(text, operator.verifier, origin=origin).size == 7
    assert _go_open(text, operator.verifier_text()).startswith(origin + "\n")
