"""Downloading the whole log (tlog-tiles tar.gz): tenant-scoped, and it verifies offline."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from yoco_verify.cli import run


def _unpack(data: bytes, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        assert all(not n.startswith("/") and ".." not in n for n in names)
        tar.extractall(into, filter="data")
    (top,) = {n.split("/")[0] for n in names}
    return into / top


def test_customer_downloads_own_log_and_it_verifies(client_for, seed, seeded, tmp_path,
                                                    capsys) -> None:
    ctx, _ = seeded
    alice = client_for("a")
    r = alice.get("/contracts/C-A/log.tar.gz")
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"] == "application/gzip"
    assert int(r.headers["x-yoco-tree-size"]) == seed.sizes["C-A"]
    # The procedure (docs/audit.md): the archive as downloaded, never unpacked ...
    archive = tmp_path / "C-A-log.tar.gz"
    archive.write_bytes(r.content)
    assert run([str(archive), "--public-key", ctx.signer.verifier_text(), "-q"]) == 0
    assert "every check passed" in capsys.readouterr().out
    # ... and the same files unpacked into a folder.
    log = _unpack(r.content, tmp_path / "a")
    assert (log / "checkpoint").is_file() and (log / "tile" / "entries").is_dir()
    assert run([str(log), "--public-key", ctx.signer.verifier_text(), "-q"]) == 0
    assert "every check passed" in capsys.readouterr().out
    # The page links it.
    assert 'href="/contracts/C-A/log.tar.gz"' in alice.get("/contracts/C-A/checkpoints").text
    # The API route serves the same bytes to the logged-in customer.
    assert alice.get("/api/v1/contracts/C-A/log.tar.gz").content == r.content


def test_another_customers_log_is_not_found(client_for, seed) -> None:
    alice, bob = client_for("a"), client_for("b")
    assert alice.get("/contracts/C-B/log.tar.gz").status_code == 404
    assert alice.get("/contracts/C-NOPE/log.tar.gz").status_code == 404
    assert bob.get("/contracts/C-A/log.tar.gz").status_code == 404
    assert bob.get("/contracts/C-B/log.tar.gz").status_code == 200
    anon = client_for()
    assert anon.get("/contracts/C-A/log.tar.gz", follow_redirects=False).status_code in (303, 401)


def test_api_token_scoped_to_its_customer(client_for, seed) -> None:
    c = client_for()
    h = {"Authorization": f"Bearer {seed.read_token_b}"}
    ok = c.get("/api/v1/contracts/C-B/log.tar.gz", headers=h)
    assert ok.status_code == 200 and ok.content[:2] == b"\x1f\x8b"
    assert c.get("/api/v1/contracts/C-A/log.tar.gz", headers=h).status_code == 404
    sizes = c.get("/api/v1/contracts/C-B/checkpoints", headers=h).json()
    oldest = min(x["tree_size"] for x in sizes)
    old = c.get(f"/api/v1/contracts/C-B/log.tar.gz?checkpoint={oldest}", headers=h)
    assert old.status_code == 200 and old.headers["x-yoco-tree-size"] == str(oldest)
    bad = c.get("/api/v1/contracts/C-B/log.tar.gz?checkpoint=2", headers=h)
    assert bad.status_code == 422 and "signed sizes" in bad.text
    # An ingest-only token cannot read logs.
    tok = {"Authorization": f"Bearer {seed.token}"}
    assert c.get("/api/v1/contracts/C-A/log.tar.gz", headers=tok).status_code == 403
