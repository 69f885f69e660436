"""A transparency-log witness (https://c2sp.org/tlog-witness): ``yoco-verify witness serve``.

Run by a customer or an auditor, outside the vendor, with nothing of the server installed.
For every log it knows (origin and the log's verifier key) it keeps the latest checkpoint
it cosigned, and cosigns a new checkpoint only when a consistency proof shows it extends
that one: a log that shrank, forked or went back is refused, and the state it remembers is
what ``yoco ledger verify`` compares the vendor's database with.

HTTP API (the spec's, plus one read of ours):

* ``POST /add-checkpoint`` — body ``old <size>``, proof lines, a blank line, the signed
  checkpoint; answers 200 with the cosignature line (``cosignature/v1``, Ed25519,
  timestamped), 400 malformed (or old size above the checkpoint's, or a proof from size 0),
  403 no valid signature by the log's key, 404 unknown origin, 409 old size is not the
  witness's (body: its size, ``Content-Type: text/x.tlog.size``) or same size and another
  root, 422 the consistency proof does not verify.
* ``GET /checkpoint/<origin, percent-encoded>`` — our extension (the spec leaves monitor
  retrieval open): the latest checkpoint the witness cosigned for that log, with the log's
  signature and the witness's cosignature; 404 when it has cosigned none.

State: one file per log under ``--state``, written to a temporary file, fsync'd, renamed
over the old one and the folder fsync'd, before the answer goes out: a crash leaves the
old state or the new one, never a mix. A lock per log makes check-and-update atomic (the
spec's race where a smaller checkpoint rolls the state back cannot happen), while other
logs are cosigned at the same time.

Why not depend on an existing witness (transparency-dev/witness's omniwitness, Sigsum's
litewitness): they are Go programs, so the customer would install and run a second
toolchain's binary next to this package; this one is the spec in a few hundred lines of
the verifier's own code (the same note, checkpoint and consistency-proof functions the
verifier checks exports with), and it speaks the same protocol, so either can replace it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from yoco_verify.shared.ledger import merkle, note
from yoco_verify.shared.ledger.cosign import (
    SIZE_MEDIA_TYPE,
    Cosigner,
    parse_add_checkpoint,
    signature_lines,
)
from yoco_verify.shared.ledger.errors import NoteError, ProofError

__all__ = ["Answer", "LogKeys", "Witness", "WitnessState", "generate_key", "run", "serve"]

_MAX_BODY = 1 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, content type, body."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Latest:
    """What the witness keeps per log: the last cosigned checkpoint (size, root, note)."""

    size: int
    root: bytes
    note: str


class LogKeys:
    """The logs a witness accepts: exact origins, or every origin under a prefix, each
    with the log's verifier key."""

    def __init__(self) -> None:
        self.exact: dict[str, note.Verifier] = {}
        self.prefixes: list[tuple[str, note.Verifier]] = []

    def add(self, spec: str) -> None:
        """Add ``ORIGIN=VKEY`` (one log) or ``PREFIX/*=VKEY`` (every log whose origin starts
        with ``PREFIX/``); raise ``ValueError`` naming what is wrong."""
        origin, sep, vkey = spec.partition("=")
        if not sep or not origin or not vkey:
            raise ValueError(f"--log {spec!r}: want ORIGIN=VKEY or PREFIX/*=VKEY")
        try:
            verifier = note.Verifier.from_text(vkey)
        except NoteError as exc:
            raise ValueError(f"--log {origin}: bad verifier key: {exc}") from None
        if origin.endswith("/*"):
            self.prefixes.append((origin[:-1], verifier))
        else:
            self.exact[origin] = verifier

    def key_of(self, origin: str) -> note.Verifier | None:
        """The verifier key of ``origin``'s log, or None when the witness does not know it."""
        if origin in self.exact:
            return self.exact[origin]
        for prefix, verifier in self.prefixes:
            if origin.startswith(prefix) and len(origin) > len(prefix):
                return verifier
        return None

    def __len__(self) -> int:
        return len(self.exact) + len(self.prefixes)


class WitnessState:
    """The latest cosigned checkpoint of each log, one file per log, crash-safe."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, origin: str) -> Path:
        return self.folder / (hashlib.sha256(origin.encode("utf-8")).hexdigest() + ".json")

    def get(self, origin: str) -> Latest | None:
        """The last checkpoint cosigned for ``origin``, or None."""
        try:
            data = json.loads(self._path(origin).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        cp = note.parse_checkpoint(note.unverified_text(data["note"]))
        if cp.origin != origin:
            raise RuntimeError(f"state file {self._path(origin)} holds another log's checkpoint")
        return Latest(cp.size, cp.root, data["note"])

    def put(self, origin: str, latest: Latest) -> None:
        """Record ``latest`` for ``origin`` durably (temp file, fsync, rename, fsync dir)."""
        path = self._path(origin)
        payload = json.dumps({"origin": origin, "size": latest.size, "note": latest.note})
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class Witness:
    """The witness's logic, without HTTP: :meth:`add_checkpoint` and :meth:`latest`."""

    def __init__(
        self,
        cosigner: Cosigner,
        logs: LogKeys,
        state: WitnessState,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cosigner = cosigner
        self.logs = logs
        self.state = state
        self.clock = clock
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def _lock_of(self, origin: str) -> threading.Lock:
        """The lock of one log: its check-and-update is atomic; other logs go on."""
        with self._locks_lock:
            return self._locks.setdefault(origin, threading.Lock())

    def add_checkpoint(self, body: bytes) -> Answer:
        """Check and cosign one submitted checkpoint (tlog-witness ``add-checkpoint``)."""
        try:
            req = parse_add_checkpoint(body)
            text = note.unverified_text(req.checkpoint)
            claimed = note.parse_checkpoint(text)
        except (ValueError, NoteError) as exc:
            return _text(400, f"malformed request: {exc}")
        verifier = self.logs.key_of(claimed.origin)
        if verifier is None:
            return _text(404, f"unknown log {claimed.origin!r}")
        try:
            cp = note.open_checkpoint(req.checkpoint, verifier, claimed.origin)
        except NoteError as exc:
            return _text(403, f"no valid signature by the log's key: {exc}")
        if req.old_size > cp.size:
            return _text(400, f"old size {req.old_size} is above the checkpoint's {cp.size}")
        if req.old_size == 0 and req.proof:
            return _text(400, "a proof from size 0 must be empty")
        with self._lock_of(cp.origin):  # check and update atomically (the rollback race)
            last = self.state.get(cp.origin)
            have = last.size if last is not None else 0
            if req.old_size != have:
                return Answer(409, f"{have}\n".encode(), SIZE_MEDIA_TYPE)
            if last is not None:
                if cp.size == last.size:
                    if cp.root != last.root:
                        return _text(409, f"same size {cp.size}, another root: a fork")
                else:
                    try:
                        merkle.verify_consistency(
                            last.size, cp.size, req.proof, last.root, cp.root
                        )
                    except ProofError as exc:
                        return _text(422, f"consistency proof {last.size} -> {cp.size}: {exc}")
            line = self.cosigner.cosign(text, int(self.clock()))
            cosigned = _first_signatures(req.checkpoint, verifier, cp.origin) + line
            self.state.put(cp.origin, Latest(cp.size, cp.root, text + "\n" + cosigned))
        return _text(200, line)

    def latest(self, origin: str) -> Answer:
        """The latest cosigned checkpoint of ``origin`` (our extension), or 404."""
        if self.logs.key_of(origin) is None:
            return _text(404, f"unknown log {origin!r}")
        last = self.state.get(origin)
        if last is None:
            return _text(404, f"no checkpoint of {origin!r} cosigned yet")
        return _text(200, last.note)


def _first_signatures(signed: str, verifier: note.Verifier, origin: str) -> str:
    """The log's own signature line(s) of ``signed`` (kept with the witness's state):
    by its key under the configured name or under the origin (the key name since the
    C2SP rule; :func:`note.checkpoint_verifiers`)."""
    prefixes = tuple(f"\u2014 {v.name} " for v in note.checkpoint_verifiers(verifier, origin))
    return "".join(ln for ln in signature_lines(signed) if ln.startswith(prefixes))


def _text(status: int, message: str) -> Answer:
    return Answer(status, (message if message.endswith("\n") else message + "\n").encode())


class _Handler(BaseHTTPRequestHandler):
    server_version = "yoco-witness/1"
    protocol_version = "HTTP/1.1"  # keep-alive, as the spec recommends
    # The headers and the body leave in separate writes: without TCP_NODELAY the client's
    # delayed ACK holds the body back ~40 ms on every answer (docs/benchmarks.md).
    disable_nagle_algorithm = True
    witness: Witness  # set on the subclass made by serve()

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def do_POST(self) -> None:
        """``/add-checkpoint``."""
        length = self.headers.get("Content-Length")
        if self.path != "/add-checkpoint":
            self._drain(length)
            self._send(_text(404, f"no such endpoint {self.path}"))
            return
        if length is None or not length.isdigit() or int(length) > _MAX_BODY:
            self.close_connection = True
            self._send(_text(400, "a body with a Content-Length up to 1 MiB is required"))
            return
        body = self.rfile.read(int(length))
        self._send(self.witness.add_checkpoint(body))

    def do_GET(self) -> None:
        """``/checkpoint/<origin>`` (our extension)."""
        if not self.path.startswith("/checkpoint/"):
            self._send(_text(404, f"no such endpoint {self.path}"))
            return
        self._send(self.witness.latest(unquote(self.path[len("/checkpoint/") :])))

    def _drain(self, length: str | None) -> None:
        if length is not None and length.isdigit() and int(length) <= _MAX_BODY:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """One line a request on stderr (the operator's record of refusals)."""
        sys.stderr.write(f"witness: {self.address_string()} {format % args}\n")


def serve(witness: Witness, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server of ``witness`` bound to ``host:port`` (call ``serve_forever``)."""
    handler = type("WitnessHandler", (_Handler,), {"witness": witness})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def generate_key(name: str, path: Path) -> Cosigner:
    """Create a new witness key named ``name`` at ``path`` (mode 0600; refuses to
    overwrite) and return it."""
    cosigner = Cosigner.generate(name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(cosigner.to_text() + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return cosigner


def _load_key(path: Path) -> Cosigner:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--key: cannot read {path}: {exc}") from None
    try:
        return Cosigner.from_text(text)
    except NoteError as exc:
        raise ValueError(f"--key {path}: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="yoco-verify witness",
        description="A C2SP tlog-witness: cosign a log's checkpoints only when they extend "
        "the last one it cosigned.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("keygen", help="create a witness key; print its verifier key")
    g.add_argument("name", help="the witness's name, e.g. witness.acme.example/w1")
    g.add_argument("--key", type=Path, required=True, help="file to create (mode 0600)")
    s = sub.add_parser("serve", help="run the witness over HTTP")
    s.add_argument("--state", type=Path, required=True, help="folder of the witness's state")
    s.add_argument("--key", type=Path, required=True, help="the witness's private key file")
    s.add_argument("--listen", default="127.0.0.1:7380", help="HOST:PORT (default %(default)s)")
    s.add_argument(
        "--log", action="append", default=[], required=True, metavar="ORIGIN=VKEY",
        help="a log to witness: its origin and verifier key; PREFIX/*=VKEY for every log "
        "under a prefix (e.g. every contract log of one operator); repeatable",
    )
    return p


def run(argv: Sequence[str]) -> int:
    """``yoco-verify witness ...``; return the exit status (2: bad usage)."""
    args = _parser().parse_args(list(argv))
    try:
        if args.command == "keygen":
            cosigner = generate_key(args.name, args.key)
            print(cosigner.key.to_text())
            return 0
        cosigner = _load_key(args.key)
        logs = LogKeys()
        for spec in args.log:
            logs.add(spec)
        host, sep, port_text = args.listen.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"--listen {args.listen!r}: want HOST:PORT")
        witness = Witness(cosigner, logs, WitnessState(args.state))
        server = serve(witness, host, int(port_text))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"witness {cosigner.key.to_text()} on http://{host}:{server.server_port}/ "
          f"({len(logs)} log key(s))", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def require_cosignatures(signed: str, keys: Sequence[str], quorum: int | None) -> list[str]:
    """Check that checkpoint note ``signed`` carries valid cosignatures of at least
    ``quorum`` (default: all) of the witness ``keys`` (key texts or files holding one);
    return the names of the witnesses that cosigned. Raises ``VerifyError`` naming the
    missing ones when the policy is not met, and ``ValueError`` on a bad key or quorum.
    The counting is :class:`WitnessPolicy`'s, the contract policy's own."""
    from yoco_verify import VerifyError
    from yoco_verify.shared.ledger.cosign import CosignerKey, WitnessPolicy
    from yoco_verify.shared.ledger.errors import WitnessPolicyError

    parsed = []
    for k in keys:
        text = k
        if "+" not in k or os.path.exists(k):
            try:
                text = Path(k).read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"--witness-key: cannot read {k}: {exc}") from None
        try:
            parsed.append(CosignerKey.from_text(text))
        except NoteError as exc:
            raise ValueError(f"--witness-key {k}: {exc}") from None
    need = len(parsed) if quorum is None else quorum
    if not 0 <= need <= len(parsed):
        raise ValueError(f"--quorum: {need} is not within 0..{len(parsed)} witness keys")
    try:
        policy = WitnessPolicy(tuple(parsed), max(need, 1))
    except WitnessPolicyError as exc:
        raise ValueError(f"--witness-key: {exc.reason}") from None
    check = policy.check(signed)
    if len(check.cosigned) < need:
        raise VerifyError(f"checkpoint: cosigned by {len(check.cosigned)} of the witnesses "
                          f"you trust, the policy needs {need} (missing: "
                          f"{', '.join(check.missing)})")
    return list(check.cosigned)
