"""yoco-verify reads the downloaded archive itself, in memory, and never extracts it.

Each hostile download is handed to the real command in a subprocess with an address-space
limit (RLIMIT_AS) and a timeout as a bound; the test asserts the clear refusal, never a
time.  No database: the logs are built here from the shared tile and note modules."""

from __future__ import annotations

import gzip
import io
import os
import resource
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest
from yoco_verify import VerifyError
from yoco_verify.logdir import MAX_BUNDLE, load_key, open_log

from ledger import merkle, note, tiles
from ledger.canonical import canonical_bytes

REPO = Path(__file__).resolve().parents[2]
ORIGIN = "yoco.example/ledger/C-1"
SIGNER = note.Signer.generate(ORIGIN)
KEY = SIGNER.verifier_text()
MEMORY = 1 << 30  # the verifier's address space in these runs: less than the bombs inflate to


def _files(n: int = 300) -> dict[str, bytes]:
    """A small, valid export (two bundles) of ``n`` entries."""
    entries = [canonical_bytes({"kind": "contract", "contract_id": "C-1", "event_id": "e0"})]
    entries += [canonical_bytes({"kind": "job_progress", "contract_id": "C-1",
                                 "event_id": f"e{i}", "step": i}) for i in range(1, n)]
    levels = tiles.compute_levels([merkle.leaf_hash(e) for e in entries])
    out: dict[str, bytes] = {}
    for t in tiles.tiles_for_size(n):
        out[t.path] = (tiles.bundle_entries(entries[t.first:t.first + t.width]) if t.level < 0
                       else tiles.tile_bytes(levels, t))
    out["checkpoint"] = note.sign_checkpoint(SIGNER, ORIGIN, n, tiles.tree_root(n, levels)
                                             ).encode()
    return out


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return path


def _export(path: Path, extra: list[tarfile.TarInfo | tuple[str, bytes]] = (),  # type: ignore[assignment]
            files: dict[str, bytes] | None = None) -> Path:
    return _tar(path, [*extra, *((f"C-1-log/{k}", v) for k, v in (files or _files()).items())])


def _special(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _verify(path: Path, *args: str) -> str:
    """The real command on ``path``, bounded in memory and time; its refusal line."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    env = {**os.environ, "PYTHONPATH": f"{REPO / 'verifier'}"}
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from yoco_verify.cli import run; "
         "sys.exit(run(sys.argv[1:]))", str(path), "-k", KEY, *args],
        capture_output=True, text=True, timeout=300, env=env, preexec_fn=limit, cwd=path.parent)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


def test_the_archive_as_downloaded_is_read_without_unpacking(tmp_path: Path) -> None:
    good = _export(tmp_path / "good.tar.gz")
    log = open_log(good, load_key(KEY))
    assert log.size == 300 and log.origin == ORIGIN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.tar.gz"]  # nothing written


@pytest.mark.parametrize(("member", "says"), [
    (("C-1-log/../../escaped", b"x"), "'C-1-log/../../escaped': a path into a parent folder"),
    (("/tmp/absolute", b"x"), "'/tmp/absolute': an absolute path"),
    (_special("C-1-log/tile/0/000", tarfile.SYMTYPE, "/etc/passwd"), "a link (refused"),
    (_special("C-1-log/tile", tarfile.SYMTYPE, "/tmp"), "a link (refused"),
    (_special("C-1-log/tile/0/001", tarfile.LNKTYPE, "C-1-log/checkpoint"), "a link (refused"),
    (_special("C-1-log/tile/0/002", tarfile.FIFOTYPE), "not a regular file (refused"),
    (_special("C-1-log/tile/0/003", tarfile.CHRTYPE), "not a regular file (refused"),
    (("C-1-log/tile/0/000.p/5/../../../../x", b"x"), "a path into a parent folder"),
    (("C-1-log/notes.txt", b"hello"), "notes.txt: not a file of a tlog-tiles export"),
    (("C-1-log/tile/0/004", b"\0" * (256 * 32 + 1)), "a file of this name holds at most 8192"),
    (("other/checkpoint", b"x"), "outside the export's folder"),
])
def test_hostile_members_are_refused(tmp_path: Path, member, says: str) -> None:
    out = _verify(_export(tmp_path / "hostile.tar.gz", [member]))
    assert "FAILED: " in out and says in out, out
    assert not (tmp_path.parent / "escaped").exists()


def test_a_duplicate_member_is_refused(tmp_path: Path) -> None:
    files = _files()
    out = _verify(_export(tmp_path / "twice.tar.gz", [("C-1-log/checkpoint", b"x")], files))
    assert "FAILED: checkpoint: twice in the archive (refused)" in out, out


def test_a_small_archive_of_a_1_gib_zero_bundle_is_refused(tmp_path: Path) -> None:
    # Concatenated gzip members are one gzip stream: a 512-byte tar header claiming a
    # 1 GiB bundle, then 1 GiB of zeros, in about a megabyte.
    info = tarfile.TarInfo("C-1-log/tile/entries/000")
    info.size = 1 << 30
    chunk = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    path = tmp_path / "bomb.tar.gz"
    with path.open("wb") as fh:
        fh.write(gzip.compress(info.tobuf(tarfile.PAX_FORMAT)))
        for _ in range(1024):
            fh.write(chunk)
    assert path.stat().st_size < 2 << 20
    out = _verify(path)
    assert (f"FAILED: tile/entries/000: {1 << 30} bytes, a file of this name holds at most "
            f"{MAX_BUNDLE} (refused)") in out, out


def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # A pax header of 1.5 GiB (tar reads one whole before the member it describes).
    body = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = tmp_path / "pax.tar.gz"
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 3 << 29
    with path.open("wb") as fh:
        fh.write(body.compress(info.tobuf(tarfile.USTAR_FORMAT)))
        zeros = b"\0" * (1 << 20)
        for _ in range(3 << 9):
            fh.write(body.compress(zeros))
        fh.write(body.flush())
    out = _verify(path)
    assert f"an extended header of {3 << 29} bytes (at most 1048576; refused)" in out, out


def test_an_export_larger_than_the_cap_is_refused(tmp_path: Path) -> None:
    out = _verify(_export(tmp_path / "big.tar.gz"), "--max-bytes", "10000")
    assert "the export holds more than 10000 bytes (the cap; --max-bytes raises it)" in out, out


def test_a_signed_checkpoint_of_2_to_the_50_is_refused_quickly(tmp_path: Path) -> None:
    files = _files()
    files["checkpoint"] = note.sign_checkpoint(SIGNER, ORIGIN, 1 << 50, b"\1" * 32).encode()
    out = _verify(_export(tmp_path / "huge.tar.gz", files=files))
    assert f"checkpoint: a signed tree of {1 << 50} entries needs at least" in out, out
    assert "the entry bundles supplied hold" in out
    folder = tmp_path / "huge"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    out = _verify(folder)
    assert f"checkpoint: a signed tree of {1 << 50} entries needs at least" in out, out


def _folder(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "log"
    for rel, data in _files().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder, next(rel for rel in _files() if rel.startswith("tile/0/"))


def test_folder_tile_symlinked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    folder, rel = _folder(tmp_path)
    (folder / rel).unlink()
    (folder / rel).symlink_to("/dev/zero")
    out = _verify(folder)
    assert f"FAILED: {rel}: cannot be opened as a plain file" in out, out


def test_folder_with_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path)
    real = tmp_path / "elsewhere"
    (folder / "tile" / "entries").rename(real)
    (folder / "tile" / "entries").symlink_to(real)
    out = _verify(folder)
    assert "FAILED: tile/entries/000: cannot be opened as a plain file" in out, out


def test_folder_fifo_tile_and_fifo_archive_are_refused(tmp_path: Path) -> None:
    folder, rel = _folder(tmp_path)
    (folder / rel).unlink()
    os.mkfifo(folder / rel)
    out = _verify(folder)
    assert f"FAILED: {rel}: not a regular file" in out, out
    fifo = tmp_path / "download.tar.gz"
    os.mkfifo(fifo)
    out = _verify(fifo)
    assert "not a regular file (refused)" in out, out


def test_open_log_names_a_missing_file_in_an_archive(tmp_path: Path) -> None:
    files = _files()
    gone = next(rel for rel in files if rel.startswith("tile/entries/"))
    del files[gone]
    with pytest.raises(VerifyError, match=f"{gone}: missing"):
        open_log(_export(tmp_path / "short.tar.gz", files=files), load_key(KEY))
