"""Read a log exported in the C2SP tlog-tiles layout and check it against its checkpoint.

Every entry bundle and hash tile the signed tree size needs must be present; every leaf
hash is recomputed from the entry bytes, every hash tile from the level below, and the
root from the tiles must equal the signed root.  Nothing of the operator is trusted but
the pinned key.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from yoco_verify import VerifyError
from yoco_verify.shared.ledger import merkle, note, tiles
from yoco_verify.shared.ledger.errors import NoteError

__all__ = ["VerifiedLog", "load_key", "open_log", "read_checkpoint"]


@dataclass(frozen=True, slots=True)
class VerifiedLog:
    """A log whose every entry was checked against the signed root."""

    path: Path
    origin: str
    size: int
    root: bytes
    note: str
    entries: list[bytes]
    levels: list[list[bytes]]

    def prefix_root(self, size: int) -> bytes:
        """The root of the log's first ``size`` entries (recomputed from the entries)."""
        return tiles.tree_root(size, self.levels)

    def consistency_proof(self, size1: int) -> list[bytes]:
        """The RFC 9162 consistency proof from ``size1`` to this log's size."""

        def get(level: int, index: int) -> bytes:
            return self.levels[level][index]

        return merkle.consistency_proof(size1, self.size, get)


def load_key(text_or_path: str) -> note.Verifier:
    """The pinned verifier key: the key text itself, or a file holding it."""
    text = text_or_path
    if "+" not in text_or_path or os.path.exists(text_or_path):
        try:
            text = Path(text_or_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise VerifyError(f"public key: cannot read {text_or_path}: {exc}") from None
    try:
        return note.Verifier.from_text(text.strip())
    except NoteError as exc:
        raise VerifyError(f"public key: {exc}") from None


def read_checkpoint(text: str, key: note.Verifier, what: str = "checkpoint") -> note.Checkpoint:
    """Open a signed checkpoint note with the pinned key; :class:`VerifyError` names why not."""
    try:
        return note.open_checkpoint(text, key)
    except NoteError as exc:
        raise VerifyError(f"{what}: {exc}") from None


#: What an export may hold, and how large each file can be.  A hash tile is at most 256
#: hashes; an entry bundle at most 256 entries of at most 65,535 bytes, each after its
#: two-byte length; a checkpoint note is a few lines and signatures.
MAX_TILE = tiles.TILE_WIDTH * 32
MAX_BUNDLE = tiles.TILE_WIDTH * (2 + 0xFFFF)
MAX_CHECKPOINT = 64 * 1024
#: Caps on a whole export (``--max-bytes`` raises the first): everything is read into
#: memory, so a download may not decompress to more than this, nor hold more members.
MAX_TOTAL = 1 << 30
MAX_MEMBERS = 1 << 20
#: The smallest an entry can take in a bundle: its length and ``{}``.  A signed tree
#: size needs at least this many bytes per entry of the data supplied.
MIN_ENTRY = 4

_TILE_PATH = re.compile(r"tile/(?:entries|[0-9]{1,2})/(?:x[0-9]{3}/)*[0-9]{3}(?:\.p/[0-9]{1,3})?")


def _limit(rel: str) -> int:
    """The largest a file of the export named ``rel`` can be; VerifyError for a name an
    export never holds."""
    if rel == "checkpoint":
        return MAX_CHECKPOINT
    if _TILE_PATH.fullmatch(rel):
        return MAX_BUNDLE if rel.startswith("tile/entries/") else MAX_TILE
    raise VerifyError(f"{rel}: not a file of a tlog-tiles export (refused)")


class _Files:
    """The export's files, by their path under the log's prefix."""

    def __init__(self, where: Path, max_total: int) -> None:
        self.where = where
        self.max_total = max_total
        self.total = 0

    def count(self, rel: str, n: int) -> None:
        self.total += n
        if self.total > self.max_total:
            raise VerifyError(
                f"{rel}: the export holds more than {self.max_total} bytes (the cap; "
                "--max-bytes raises it)"
            )

    def read(self, rel: str) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def supplied(self) -> int | None:
        """Bytes of entry bundles supplied, when known before reading them (an archive)."""
        return None


class _Folder(_Files):
    """An unpacked export: each file opened without following a link or blocking, and
    read only when it is a regular file of the size its name allows."""

    def read(self, rel: str) -> bytes:
        limit = _limit(rel)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        dflags = flags | getattr(os, "O_DIRECTORY", 0)
        fds: list[int] = []
        try:
            try:
                # The folder you named may itself be a link; nothing inside it may.
                fd = os.open(self.where, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                fds.append(fd)
                *dirs, name = rel.split("/")
                for part in dirs:
                    fd = os.open(part, dflags, dir_fd=fd)
                    fds.append(fd)
                fd = os.open(name, flags, dir_fd=fd)
                fds.append(fd)
            except FileNotFoundError:
                raise VerifyError(
                    f"{rel}: missing (the log is truncated: the signed tree needs this file)"
                ) from None
            except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: not a folder
                raise VerifyError(
                    f"{rel}: cannot be opened as a plain file ({exc.strerror}; refused)"
                ) from None
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise VerifyError(f"{rel}: not a regular file (a device, FIFO or socket; refused)")
            if st.st_size > limit:
                raise VerifyError(
                    f"{rel}: {st.st_size} bytes, a file of this name holds at most {limit}"
                )
            self.count(rel, st.st_size)
            data = os.read(fd, limit + 1) if st.st_size else b""
            while len(data) < st.st_size:
                more = os.read(fd, limit + 1 - len(data))
                if not more:
                    break
                data += more
            if len(data) > limit:
                raise VerifyError(f"{rel}: more than {limit} bytes (refused)")
            return data
        finally:
            for fd in reversed(fds):
                os.close(fd)


class _Capped(io.RawIOBase):
    """A decompressed stream that refuses to yield more than ``cap`` bytes."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        self.raw = raw
        self.left = cap

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b)
        n = self.raw.readinto(view[: max(0, min(len(view), self.left + 1))])  # type: ignore[attr-defined]
        self.left -= n
        if self.left < 0:
            raise VerifyError("the archive decompresses to more than the cap (refused)")
        return n


#: The largest extended header (pax, GNU long name) a member may carry: tar reads one
#: whole into memory before the member it describes, so it is checked here first.
MAX_EXTENDED_HEADER = 1 << 20
_EXTENDED = {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}


class _TarInfo(tarfile.TarInfo):
    """A member header that refuses an oversized extended header before tar reads it."""

    def _proc_member(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER:
            raise VerifyError(
                f"{self.name!r}: an extended header of {self.size} bytes (at most "
                f"{MAX_EXTENDED_HEADER}; refused)"
            )
        return super()._proc_member(tarfile)  # type: ignore[misc]


class _Archive(_Files):
    """A downloaded ``.tar.gz`` (or ``.tar``) export read member by member into memory,
    never extracted: only regular files and folders with the names an export holds,
    each no larger than its name allows, at most :data:`MAX_MEMBERS` of them."""

    def __init__(self, where: Path, max_total: int) -> None:
        super().__init__(where, max_total)
        self.files: dict[str, bytes] = {}
        self.bundle_bytes = 0
        try:  # never blocks on a FIFO; fstat before reading a byte
            fd = os.open(where, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise VerifyError(f"{where}: cannot read: {exc}") from None
        fh = os.fdopen(fd, "rb")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise VerifyError(f"{where}: not a regular file (refused)")
            head = fh.read(2)
            fh.seek(0)
            raw: Any = gzip.GzipFile(fileobj=fh, mode="rb") if head == b"\x1f\x8b" else fh
            # Headers and padding count too: cap the stream a little above the content.
            stream = io.BufferedReader(_Capped(raw, max_total + (64 << 20)))
            try:
                self._load(stream)
            except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
                raise VerifyError(f"{where.name}: not a readable tar archive: {exc}") from None
        finally:
            fh.close()

    def _load(self, stream: BinaryIO) -> None:
        top: str | None = None
        n = 0
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=_TarInfo) as tar:
            for m in tar:
                n += 1
                if n > MAX_MEMBERS:
                    raise VerifyError(f"{self.where.name}: more than {MAX_MEMBERS} members")
                name = m.name
                if name.startswith("/") or "\\" in name:
                    raise VerifyError(f"{name!r}: an absolute path (refused)")
                parts = [p for p in name.split("/") if p not in ("", ".")]
                if ".." in parts:
                    raise VerifyError(f"{name!r}: a path into a parent folder (refused)")
                if parts and parts[0] not in ("tile", "checkpoint"):
                    if top is None:
                        top = parts[0]
                    if parts[0] != top:
                        raise VerifyError(
                            f"{name!r}: outside the export's folder {top!r} (refused)"
                        )
                    parts = parts[1:]
                rel = "/".join(parts)
                if m.isdir():
                    if rel and rel != "tile" and not rel.startswith("tile/"):
                        raise VerifyError(f"{name!r}: a folder an export never holds (refused)")
                    continue
                if not m.isreg():
                    what = "a link" if m.issym() or m.islnk() else "not a regular file"
                    raise VerifyError(f"{name!r}: {what} (refused: an export holds files only)")
                limit = _limit(rel)
                if m.size > limit:
                    raise VerifyError(
                        f"{rel}: {m.size} bytes, a file of this name holds at most {limit} "
                        "(refused)"
                    )
                if rel in self.files:
                    raise VerifyError(f"{rel}: twice in the archive (refused)")
                self.count(rel, m.size)
                f = tar.extractfile(m)
                data = f.read(limit + 1) if f is not None else b""
                if len(data) != m.size:
                    raise VerifyError(f"{rel}: the archive ends inside it")
                self.files[rel] = data
                if rel.startswith("tile/entries/"):
                    self.bundle_bytes += len(data)

    def read(self, rel: str) -> bytes:
        try:
            return self.files[rel]
        except KeyError:
            raise VerifyError(
                f"{rel}: missing (the log is truncated: the signed tree needs this file)"
            ) from None

    def supplied(self) -> int | None:
        return self.bundle_bytes


def _plain_file(path: Path, limit: int) -> bytes:
    """A regular file of at most ``limit`` bytes, opened without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VerifyError(f"{path}: not a regular file (refused)")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise VerifyError(f"{path}: more than {limit} bytes (refused)")
    return data


def since_text(path: Path) -> str:
    """The text of an older signed checkpoint: a checkpoint file, or the ``checkpoint``
    of an older export (its archive or folder), read as :func:`open_log` reads one."""
    path = Path(path)
    if path.is_dir():
        raw = _Folder(path, MAX_TOTAL).read("checkpoint")
    else:
        raw = _plain_file(path, MAX_TOTAL)
        if raw.startswith(b"\x1f\x8b") or (len(raw) > 262 and raw[257:262] == b"ustar"):
            raw = _Archive(path, MAX_TOTAL).read("checkpoint")
        elif len(raw) > MAX_CHECKPOINT:
            raise VerifyError(f"--since: {path} is neither a checkpoint nor an export")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyError(f"--since: {path}: not UTF-8") from None


def open_log(
    path: Path,
    key: note.Verifier,
    progress: Callable[[str, int, int], None] | None = None,
    max_bytes: int = MAX_TOTAL,
) -> VerifiedLog:
    """Check the exported log at ``path`` (the downloaded ``.tar.gz``, or a folder)
    against its signed checkpoint and pinned ``key``.

    The archive is read in memory and never extracted; a folder's files are opened
    without following links.  Raises :class:`VerifyError` naming the first failed check:
    a member that is not a regular file of an export's name and size (a link, a FIFO, a
    device, a ``../`` or absolute path, a bundle larger than 256 entries can be), more
    than ``max_bytes`` in all, a checkpoint not signed by the key, a signed size larger
    than the data supplied could hold, a missing or short entry bundle or tile, an entry
    whose hash differs from its tile, a tile that differs from the level below, or a root
    that differs from the signed one.
    """
    path = Path(path)
    files: _Files
    if path.is_dir():
        files = _Folder(path, max_bytes)
    elif path.exists():
        files = _Archive(path, max_bytes)
    else:
        raise VerifyError(f"checkpoint: missing ({path} is neither an archive nor a folder)")
    raw = files.read("checkpoint")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyError("checkpoint: not UTF-8") from None
    cp = read_checkpoint(text, key)
    supplied = files.supplied()
    room = max_bytes if supplied is None else supplied
    if cp.size * MIN_ENTRY > room:
        what = "the cap" if supplied is None else "the entry bundles supplied"
        raise VerifyError(
            f"checkpoint: a signed tree of {cp.size} entries needs at least "
            f"{cp.size * MIN_ENTRY} bytes of entries, {what} hold {room} (refused)"
        )
    all_tiles = tiles.tiles_for_size(cp.size)
    bundles = [t for t in all_tiles if t.level < 0]
    entries: list[bytes] = []
    for i, t in enumerate(bundles):
        try:
            got = tiles.parse_bundle(files.read(t.path))
        except ValueError as exc:
            raise VerifyError(f"{t.path}: {exc}") from None
        if len(got) != t.width:
            raise VerifyError(
                f"{t.path}: holds {len(got)} entries, the signed tree needs {t.width} "
                "(the log is truncated or padded)"
            )
        entries.extend(got)
        if progress is not None:
            progress("read", i + 1, len(bundles))
    levels = tiles.compute_levels(merkle.leaf_hashes(entries))
    if progress is not None:
        progress("hashed", len(entries), len(entries))
    for t in (t for t in all_tiles if t.level >= 0):
        data = files.read(t.path)
        want = tiles.tile_bytes(levels, t)
        if data == want:
            continue
        try:
            have = tiles.split_tile(data, t)
        except ValueError as exc:
            raise VerifyError(str(exc)) from None
        for j, h in enumerate(have):
            if h != want[32 * j : 32 * j + 32]:
                n = t.first + j
                if t.level == 0:
                    raise VerifyError(
                        f"{t.path}: hash {j} is not the hash of entry {n} "
                        "(the entry or the tile was altered)"
                    )
                raise VerifyError(
                    f"{t.path}: hash {j} is not the root of tile/{t.level - 1} "
                    f"number {n} (a tile was altered)"
                )
    root = tiles.tree_root(cp.size, levels)
    if root != cp.root:
        raise VerifyError(
            f"checkpoint: the entries hash to root {root.hex()}, the signed root is {cp.root.hex()}"
        )
    return VerifiedLog(path, cp.origin, cp.size, cp.root, text, entries, levels)
