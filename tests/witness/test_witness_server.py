"""The witness (``yoco-verify witness serve``) as a real process over HTTP on 127.0.0.1:
the C2SP tlog-witness API and error codes, tlog-cosignature/v1 cosignatures, and its
state kept across a crash."""

from __future__ import annotations

import http.client
import signal
from pathlib import Path

import pytest

from ledger import merkle, note
from ledger.cosign import (
    SIZE_MEDIA_TYPE,
    Cosigner,
    CosignerKey,
    add_checkpoint_body,
    cosignatures,
    parse_add_checkpoint,
)
from ledger.errors import NoteError
from tests.witness.conftest import WitnessProcess, start_witness

PREFIX = "log.example/ledger"
LEAVES = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(64)]
FORKED = [*LEAVES[:10], *(merkle.leaf_hash(f"forged {i}".encode()) for i in range(10, 64))]


@pytest.fixture
def log_signer() -> note.Signer:
    return note.Signer.generate(PREFIX)


@pytest.fixture
def witness(witnesses: list[WitnessProcess], tmp_path: Path,
            log_signer: note.Signer) -> WitnessProcess:
    return start_witness(witnesses, tmp_path, "witness.acme.example/w1",
                         [f"{PREFIX}/*={log_signer.verifier_text()}"])


def checkpoint(signer: note.Signer, size: int, leaves: list[bytes] = LEAVES,
               origin: str = f"{PREFIX}/C-1") -> str:
    return note.sign_checkpoint(signer, origin, size, merkle.reference_root(leaves[:size]))


def post(w: WitnessProcess, body: bytes, path: str = "/add-checkpoint") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=60)
    try:
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def get(w: WitnessProcess, origin: str) -> tuple[int, str]:
    from urllib.parse import quote

    conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=60)
    try:
        conn.request("GET", "/checkpoint/" + quote(origin, safe=""))
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def add(w: WitnessProcess, signer: note.Signer, old: int, size: int,
        leaves: list[bytes] = LEAVES, **kw: str) -> tuple[int, str, str]:
    proof = merkle.reference_consistency_proof(old, leaves[:size]) if 0 < old < size else []
    return post(w, add_checkpoint_body(old, proof, checkpoint(signer, size, leaves, **kw)))


def test_cosigns_a_growing_log_with_consistency_proofs(
    witness: WitnessProcess, log_signer: note.Signer
) -> None:
    key = CosignerKey.from_text(witness.vkey)
    sizes = [1, 2, 5, 16, 17, 40]
    old = 0
    for size in sizes:
        status, _, body = add(witness, log_signer, old, size)
        assert status == 200, body
        cp = checkpoint(log_signer, size)
        stamps = cosignatures(cp + body, [key])
        assert list(stamps) == [witness.vkey] and stamps[witness.vkey] > 0
        old = size
    status, latest = get(witness, f"{PREFIX}/C-1")
    assert status == 200
    assert note.open_checkpoint(latest, note.Verifier.from_text(
        log_signer.verifier_text())).size == 40
    assert cosignatures(latest, [key])
    # The same head again (old size = its size, same root): cosigned again.
    assert add(witness, log_signer, 40, 40)[0] == 200


def test_refusals_name_the_spec_error_codes(
    witness: WitnessProcess, log_signer: note.Signer
) -> None:
    assert add(witness, log_signer, 0, 20)[0] == 200
    # A truncated log: a smaller checkpoint (old size above the checkpoint's) — 400.
    status, _, body = add(witness, log_signer, 20, 17)
    assert status == 400 and "old size 20" in body
    # A replayed old checkpoint with its own old size: not the witness's size — 409 + size.
    status, ctype, body = add(witness, log_signer, 0, 17)
    assert (status, ctype, body) == (409, SIZE_MEDIA_TYPE, "20\n")
    # A fork: same size, another root — 409.
    status, _, body = add(witness, log_signer, 20, 20, FORKED)
    assert status == 409 and "fork" in body
    # A fork that grows: the proof from the witness's head does not hold — 422.
    bad = merkle.reference_consistency_proof(20, FORKED[:30])
    status, _, body = post(witness, add_checkpoint_body(20, bad, checkpoint(
        log_signer, 30, FORKED)))
    assert status == 422 and "consistency proof" in body
    # Another origin: unknown log — 404.
    assert add(witness, log_signer, 0, 5, origin="other.example/log")[0] == 404
    # Signed by another key with the log's name — 403.
    impostor = note.Signer.generate(PREFIX)
    assert add(witness, impostor, 20, 30)[0] == 403
    # Malformed bodies — 400; an unknown endpoint — 404.
    assert post(witness, b"old 01\n\n" + checkpoint(log_signer, 5).encode())[0] == 400
    assert post(witness, b"no blank line")[0] == 400
    assert post(witness, b"x", path="/nope")[0] == 404
    # None of it moved the witness: it still holds 20, and extends it honestly.
    status, latest = get(witness, f"{PREFIX}/C-1")
    assert note.parse_checkpoint(note.unverified_text(latest)).size == 20
    assert add(witness, log_signer, 20, 30)[0] == 200


def test_a_crashed_witness_keeps_its_state(
    witness: WitnessProcess, log_signer: note.Signer
) -> None:
    assert add(witness, log_signer, 0, 9)[0] == 200
    assert add(witness, log_signer, 9, 12)[0] == 200
    witness.kill(signal.SIGKILL)
    witness.start()  # same port, same state folder
    assert add(witness, log_signer, 0, 12)[:3] == (409, SIZE_MEDIA_TYPE, "12\n")
    assert add(witness, log_signer, 12, 9)[0] == 400  # still refuses to go back
    assert add(witness, log_signer, 12, 33)[0] == 200
    witness.kill(signal.SIGTERM)
    witness.start()
    assert add(witness, log_signer, 0, 33)[2] == "33\n"


def test_unknown_log_and_nothing_cosigned_yet_are_404(witness: WitnessProcess) -> None:
    assert get(witness, "other.example/log")[0] == 404
    assert get(witness, f"{PREFIX}/C-9")[0] == 404


def test_cosignature_keys_and_request_bodies_round_trip(tmp_path: Path) -> None:
    c = Cosigner.generate("w.example/w")
    assert Cosigner.from_text(c.to_text()).key.to_text() == c.key.to_text()
    key = CosignerKey.from_text(c.key.to_text())
    signer = note.Signer.generate("o.example")
    cp = note.sign_checkpoint(signer, "o.example", 3, merkle.reference_root(LEAVES[:3]))
    line = c.cosign(note.unverified_text(cp), 1_700_000_000)
    assert cosignatures(cp + line, [key]) == {key.to_text(): 1_700_000_000}
    # A cosignature is over the checkpoint body: moved to another checkpoint it is void.
    other = note.sign_checkpoint(signer, "o.example", 4, merkle.reference_root(LEAVES[:4]))
    assert cosignatures(other + line, [key]) == {}
    # A note-signature key (0x01) is not a cosigner key (0x04), and vice versa.
    with pytest.raises(NoteError, match="cosignature/v1"):
        CosignerKey.from_text(signer.verifier_text())
    with pytest.raises(NoteError):
        note.Verifier.from_text(key.to_text())
    proof = merkle.reference_consistency_proof(2, LEAVES[:3])
    req = parse_add_checkpoint(add_checkpoint_body(2, proof, cp))
    assert (req.old_size, list(req.proof), req.checkpoint) == (2, proof, cp)
    with pytest.raises(ValueError, match="line 2"):
        parse_add_checkpoint(b"old 2\nnot-base64!\n\n" + cp.encode())
    with pytest.raises(ValueError, match="old_size"):
        add_checkpoint_body(-1, [], cp)


def test_bad_options_are_refused_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             log_signer: note.Signer) -> None:
    from yoco_verify.cli import run

    key = tmp_path / "w.key"
    assert run(["witness", "keygen", "w.example/w", "--key", str(key)]) == 0
    assert CosignerKey.from_text(capsys.readouterr().out.strip()).name == "w.example/w"
    assert run(["witness", "keygen", "w.example/w", "--key", str(key)]) == 2  # no overwrite
    base = ["witness", "serve", "--state", str(tmp_path / "s"), "--key", str(key)]
    assert run([*base, "--log", "no-equals-sign"]) == 2
    assert "ORIGIN=VKEY" in capsys.readouterr().err
    assert run([*base, "--log", "o.example=not+a+key"]) == 2
    assert "bad verifier key" in capsys.readouterr().err
    assert run([*base, "--log", f"o.example={log_signer.verifier_text()}",
                "--listen", "nowhere"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert run(["witness", "serve", "--state", str(tmp_path / "s"), "--key",
                str(tmp_path / "missing.key"), "--log",
                f"o.example={log_signer.verifier_text()}"]) == 2
    assert "cannot read" in capsys.readouterr().err
