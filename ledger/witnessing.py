"""Witnesses: submit each new signed checkpoint to the configured witnesses, keep their
cosignatures, serve checkpoints with them, and compare the database with what they saw.

A witness (C2SP ``tlog-witness``; ``yoco-verify witness serve`` is one, run by a customer
or an auditor) remembers the latest checkpoint it cosigned for every log and cosigns a
new one only with a consistency proof from it. So a head the vendor's database no longer
extends — entries removed by someone with superuser rights, a log rewritten — is refused
by every witness, and :func:`check_against_witnesses` (``yoco ledger verify``) names it.

Submission never holds a database transaction across the network: the pending heads and
their proofs are read in one short transaction, the witnesses asked outside it, and the
cosignatures stored in another. A witness that cannot be reached delays its cosignatures
(the next run tries again) and is reported in :class:`SubmitRun`; ingest and signing never
wait for it. Which witnesses and how many must cosign a contract's checkpoint is the
contract's policy (``terms.witnesses``, :class:`ledger.cosign.WitnessPolicy`, checked by
:mod:`billing.witness_policy`); ``YOCO_WITNESS_QUORUM`` of the configured witnesses
(:func:`quorum_met`) is the operator's rule for logs without one.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import zip_longest
from typing import Protocol
from urllib.parse import quote, urlsplit

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ledger import cosign, note, tree
from ledger.cosign import CosignerKey
from ledger.errors import NoteError, VerificationFailed
from ledger.models import Checkpoint, CheckpointCosignature, LedgerLog

__all__ = [
    "HttpAnswer",
    "Refusal",
    "SubmitRun",
    "Transport",
    "WitnessEndpoint",
    "WitnessHead",
    "check_against_witnesses",
    "cosigned_note",
    "cosigned_notes",
    "cosigners_of",
    "parse_witnesses",
    "quorum_met",
    "submit_pending",
]


@dataclass(frozen=True, slots=True)
class WitnessEndpoint:
    """A configured witness: its URL prefix and its cosigner (verifier) key."""

    url: str
    key: CosignerKey

    @property
    def name(self) -> str:
        """The witness's key name."""
        return self.key.name


def parse_witnesses(text: str) -> list[WitnessEndpoint]:
    """Parse ``YOCO_WITNESSES``: comma-separated ``URL VKEY`` pairs (the witness's URL
    prefix, white space, its ``cosignature/v1`` verifier key); raise ``ValueError`` naming
    the entry."""
    out: list[WitnessEndpoint] = []
    for i, entry in enumerate(e.strip() for e in text.split(",")):
        if not entry:
            continue
        parts = entry.split()
        if len(parts) != 2:
            raise ValueError(f"YOCO_WITNESSES entry {i + 1}: want 'URL VKEY', got {entry!r}")
        url, vkey = parts
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"YOCO_WITNESSES entry {i + 1}: {url!r} is not an http(s) URL")
        try:
            key = CosignerKey.from_text(vkey)
        except NoteError as exc:
            raise ValueError(f"YOCO_WITNESSES entry {i + 1}: bad witness key: {exc}") from None
        if any(w.key.to_text() == key.to_text() for w in out):
            raise ValueError(f"YOCO_WITNESSES entry {i + 1}: witness {key.name} listed twice")
        out.append(WitnessEndpoint(url.rstrip("/"), key))
    return out


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A witness's HTTP answer: status, content type, body text."""

    status: int
    content_type: str
    body: str


class Transport(Protocol):
    """How the ledger talks to a witness (tests and the benchmark use the real one)."""

    def __call__(self, method: str, url: str, body: bytes | None) -> HttpAnswer:
        """Send one request; raise ``OSError`` when the witness cannot be reached."""
        ...


class HttpTransport:
    """Keep-alive HTTP(S) connections, one per witness host and thread, with a timeout
    per request; safe to share between threads."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()

    def _conns(self) -> dict[tuple[str, str], http.client.HTTPConnection]:
        conns: dict[tuple[str, str], http.client.HTTPConnection] | None = getattr(
            self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _conn(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        conns = self._conns()
        conn = conns.get((scheme, netloc))
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(netloc, timeout=self.timeout_s)
            conns[(scheme, netloc)] = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._conns().pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def __call__(self, method: str, url: str, body: bytes | None) -> HttpAnswer:
        """One request, retried once on a fresh connection when a kept one was closed."""
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (1, 2):
            conn = self._conn(parts.scheme, parts.netloc)
            try:
                conn.request(method, path, body=body,
                             headers={"Content-Type": "text/plain; charset=utf-8"})
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop(parts.scheme, parts.netloc)
                if attempt == 2:
                    raise
                continue
            except (OSError, http.client.HTTPException) as exc:
                self._drop(parts.scheme, parts.netloc)
                raise OSError(f"{url}: {exc}") from exc
            return HttpAnswer(resp.status, resp.getheader("Content-Type") or "",
                              data.decode("utf-8", "replace"))
        raise OSError(f"{url}: no answer")  # pragma: no cover (the loop returns or raises)

    def close(self) -> None:
        """Close every connection opened (by any thread)."""
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


# --------------------------------------------------------------------------- submitting


@dataclass(frozen=True, slots=True)
class Refusal:
    """A witness refused a checkpoint (HTTP status and its words)."""

    witness: str
    log_id: str
    tree_size: int
    status: int
    message: str


@dataclass(slots=True)
class SubmitRun:
    """One submission run: cosignatures stored, witnesses down (name: error and the time
    of their last cosignature, None if never), refusals."""

    cosigned: list[tuple[str, str, int]] = field(default_factory=list)
    down: dict[str, tuple[str, datetime | None]] = field(default_factory=dict)
    refused: list[Refusal] = field(default_factory=list)
    pending: int = 0
    #: Submissions answered 404: the witness does not watch that log (a customer's
    #: witness configured with its own contracts' origins only). Not a refusal.
    not_watched: int = 0

    def summary(self) -> str:
        """One line for the operator's log."""
        return (f"witnesses: {len(self.cosigned)} cosignature(s) stored, {self.pending} "
                f"submission(s), {len(self.down)} witness(es) down, "
                f"{len(self.refused)} refusal(s), {self.not_watched} not watched")


@dataclass(frozen=True, slots=True)
class _Pending:
    log_id: str
    origin: str
    tree_size: int
    note: str
    old_size: int
    proof: list[bytes]


def _pending(session: Session, witness: WitnessEndpoint) -> list[_Pending]:
    """The latest checkpoint of every log this witness has not cosigned, with the proof
    from the size it last cosigned (from this database's record)."""
    newest = (
        select(Checkpoint.log_id, func.max(Checkpoint.tree_size).label("size"))
        .group_by(Checkpoint.log_id).subquery()
    )
    done = (
        select(CheckpointCosignature.log_id,
               func.max(CheckpointCosignature.tree_size).label("size"))
        .where(CheckpointCosignature.witness == witness.key.to_text())
        .group_by(CheckpointCosignature.log_id).subquery()
    )
    rows = session.execute(
        select(Checkpoint.log_id, Checkpoint.origin, Checkpoint.tree_size, Checkpoint.note,
               func.coalesce(done.c.size, 0))
        .join(newest, (newest.c.log_id == Checkpoint.log_id)
              & (newest.c.size == Checkpoint.tree_size))
        .outerjoin(done, done.c.log_id == Checkpoint.log_id)
        .where(Checkpoint.tree_size > func.coalesce(done.c.size, 0))
        .order_by(Checkpoint.log_id)
    ).all()
    return [
        _Pending(log_id, origin, size, text, old, _proof(session, log_id, old, size))
        for log_id, origin, size, text, old in rows
    ]


def _proof(session: Session, log_id: str, old: int, size: int) -> list[bytes]:
    return tree.consistency_proof(session, log_id, old, size) if 0 < old < size else []


def _last_ok(session: Session, witness: WitnessEndpoint) -> datetime | None:
    return session.execute(
        select(func.max(CheckpointCosignature.received_at))
        .where(CheckpointCosignature.witness == witness.key.to_text())
    ).scalar_one_or_none()


def _cosignature(witness: WitnessEndpoint, signed: str, answer: str) -> tuple[str, int]:
    """The answer's line that is a valid cosignature by ``witness``, and its timestamp."""
    for line in cosign.cosignature_lines(answer):
        found = cosign.cosignatures(signed + line, [witness.key])
        if found:
            return line, next(iter(found.values()))
    raise NoteError(f"answer holds no valid cosignature by {witness.key.to_text()}")


def submit_pending(
    engine: Engine,
    witnesses: Sequence[WitnessEndpoint],
    transport: Transport,
    *,
    concurrency: int = 8,
) -> SubmitRun:
    """Submit every log's latest checkpoint that a witness has not cosigned yet, and store
    the cosignatures. Up to ``concurrency`` requests are in flight at once (the witnesses
    and the logs are independent; a witness keeps each log's check-and-update atomic).
    A witness that cannot be reached is skipped for the rest of the run (listed in
    ``down``); a refusal is listed in ``refused``. Never raises for a witness's fault;
    commits its own short transactions."""
    if concurrency < 1:
        raise ValueError(f"concurrency: must be at least 1, got {concurrency}")
    run = SubmitRun()
    last_ok: dict[str, datetime | None] = {}
    queues: list[list[tuple[WitnessEndpoint, _Pending]]] = []
    with Session(engine) as s, s.begin():
        for witness in witnesses:
            queues.append([(witness, p) for p in _pending(s, witness)])
            last_ok[witness.name] = _last_ok(s, witness)
    # Interleaved, so every witness is asked from the start of the run.
    work = [item for items in zip_longest(*queues) for item in items if item is not None]
    run.pending = len(work)
    lock = threading.Lock()
    got: list[tuple[WitnessEndpoint, _Pending, str, int]] = []

    def one(witness: WitnessEndpoint, p: _Pending) -> None:
        if witness.name in run.down:
            return
        refused: list[Refusal] = []
        try:
            answer: HttpAnswer | None = _add(transport, witness, p)
            if (answer is not None and answer.status == 409
                    and answer.content_type.startswith(cosign.SIZE_MEDIA_TYPE)):
                answer = _resubmit(engine, transport, witness, p, answer, refused)
        except OSError as exc:
            with lock:
                run.down.setdefault(witness.name, (str(exc), last_ok[witness.name]))
            return
        result: tuple[str, int] | None = None
        if answer is not None and answer.status == 404:
            with lock:
                run.not_watched += 1
            return
        if answer is not None and answer.status != 200:
            refused.append(Refusal(witness.name, p.log_id, p.tree_size, answer.status,
                                   answer.body.strip()[:500]))
        elif answer is not None:
            try:
                result = _cosignature(witness, p.note, answer.body)
            except NoteError as exc:
                refused.append(Refusal(witness.name, p.log_id, p.tree_size, 200, str(exc)))
        with lock:
            run.refused.extend(refused)
            if result is not None:
                got.append((witness, p, *result))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(one, w, p) for w, p in work]:
            f.result()
    if got:
        with Session(engine) as s, s.begin():
            for witness, p, line, ts in sorted(got, key=lambda g: (g[0].name, g[1].log_id)):
                s.execute(
                    insert(CheckpointCosignature)
                    .values(log_id=p.log_id, tree_size=p.tree_size,
                            witness=witness.key.to_text(), line=line,
                            cosigned_at=datetime.fromtimestamp(ts, UTC))
                    .on_conflict_do_nothing()
                )
                run.cosigned.append((witness.name, p.log_id, p.tree_size))
    return run


def _add(transport: Transport, witness: WitnessEndpoint, p: _Pending) -> HttpAnswer:
    body = cosign.add_checkpoint_body(p.old_size, p.proof, p.note)
    return transport("POST", f"{witness.url}/add-checkpoint", body)


def _resubmit(
    engine: Engine, transport: Transport, witness: WitnessEndpoint, p: _Pending,
    answer: HttpAnswer, refused: list[Refusal],
) -> HttpAnswer | None:
    """The witness knows another size than our record (a cosignature we did not store, or
    a database that lost entries): submit again from its size, if it is not beyond ours."""
    text = answer.body.strip()
    if not text.isdigit():
        refused.append(Refusal(witness.name, p.log_id, p.tree_size, 409,
                               f"409 with a malformed size {text[:40]!r}"))
        return None
    theirs = int(text)
    if theirs > p.tree_size:
        refused.append(Refusal(
            witness.name, p.log_id, p.tree_size, 409,
            f"the witness cosigned size {theirs}, beyond this database's head {p.tree_size}: "
            "entries are missing here — run `yoco ledger verify`"))
        return None
    with Session(engine) as s, s.begin():
        proof = _proof(s, p.log_id, theirs, p.tree_size)
    again = _Pending(p.log_id, p.origin, p.tree_size, p.note, theirs, proof)
    return _add(transport, witness, again)


# --------------------------------------------------------------------------- serving


def cosigners_of(session: Session, log_id: str, tree_size: int) -> list[tuple[str, str]]:
    """The stored cosignatures of one checkpoint: ``(witness key, line)``, by witness."""
    return [
        (w, line)
        for w, line in session.execute(
            select(CheckpointCosignature.witness, CheckpointCosignature.line)
            .where(CheckpointCosignature.log_id == log_id,
                   CheckpointCosignature.tree_size == tree_size)
            .order_by(CheckpointCosignature.witness)
        ).all()
    ]


def cosigned_note(session: Session, cp: Checkpoint) -> str:
    """The checkpoint's signed note with every stored witness cosignature appended (the
    C2SP note format: extra signature lines; a verifier ignores keys it does not know)."""
    lines = [line for _, line in cosigners_of(session, cp.log_id, cp.tree_size)]
    return cosign.with_signatures(cp.note, lines) if lines else cp.note


def cosigned_notes(session: Session, cps: Sequence[Checkpoint]) -> list[str]:
    """:func:`cosigned_note` of each of ``cps`` (one query for all), in their order."""
    if not cps:
        return []
    keys = {(cp.log_id, cp.tree_size) for cp in cps}
    lines: dict[tuple[str, int], list[str]] = {}
    for log_id, size, line in session.execute(
        select(CheckpointCosignature.log_id, CheckpointCosignature.tree_size,
               CheckpointCosignature.line)
        .where(CheckpointCosignature.log_id.in_({k[0] for k in keys}),
               CheckpointCosignature.tree_size.in_({k[1] for k in keys}))
        .order_by(CheckpointCosignature.witness)
    ).all():
        if (log_id, size) in keys:
            lines.setdefault((log_id, size), []).append(line)
    return [
        cosign.with_signatures(cp.note, lines[(cp.log_id, cp.tree_size)])
        if (cp.log_id, cp.tree_size) in lines else cp.note
        for cp in cps
    ]


def quorum_met(signed: str, witnesses: Sequence[CosignerKey], quorum: int) -> bool:
    """Whether ``signed`` carries valid cosignatures of at least ``quorum`` of
    ``witnesses`` (the global policy: k of n)."""
    if quorum < 0:
        raise ValueError(f"quorum: must not be negative, got {quorum}")
    return len(cosign.cosignatures(signed, witnesses)) >= quorum


# --------------------------------------------------------------------------- detection


@dataclass(frozen=True, slots=True)
class WitnessHead:
    """What a witness says it last cosigned for a log: size and root."""

    witness: str
    log_id: str
    size: int
    root: bytes


def _fetch_head(
    transport: Transport, witness: WitnessEndpoint, origin: str, verifier: note.Verifier | None
) -> note.Checkpoint | None:
    answer = transport("GET", f"{witness.url}/checkpoint/{quote(origin, safe='')}", None)
    if answer.status == 404:
        return None
    if answer.status != 200:
        raise OSError(f"witness {witness.name}: GET checkpoint of {origin}: HTTP "
                      f"{answer.status} {answer.body.strip()[:200]}")
    signed = answer.body
    if not cosign.cosignatures(signed, [witness.key]):
        raise OSError(f"witness {witness.name}: its checkpoint of {origin} carries no valid "
                      "cosignature by its key")
    cp = (note.open_checkpoint(signed, verifier) if verifier is not None
          else note.parse_checkpoint(note.unverified_text(signed)))
    if cp.origin != origin:
        raise OSError(f"witness {witness.name}: asked for {origin}, answered {cp.origin}")
    return cp


def check_against_witnesses(
    session: Session,
    witnesses: Sequence[WitnessEndpoint],
    transport: Transport,
    verifier: note.Verifier | None,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[WitnessHead]:
    """Ask every witness for its latest cosigned checkpoint of every log and compare.

    Raises :class:`VerificationFailed` naming the log, the witness and the sizes when the
    database's log is shorter than what a witness cosigned, or its tree at that size has
    another root (a rewritten or forked log). A witness that cannot be reached raises
    ``OSError`` (the check is then incomplete, not passed). Returns the heads compared.
    """
    logs: Iterable[tuple[str, int]] = session.execute(
        select(LedgerLog.log_id, LedgerLog.size).order_by(LedgerLog.log_id)
    ).all()
    origins = dict(session.execute(
        select(Checkpoint.log_id, func.min(Checkpoint.origin)).group_by(Checkpoint.log_id)
    ).all())
    seen: list[WitnessHead] = []
    for log_id, size in logs:
        origin = origins.get(log_id)
        if origin is None:
            continue  # never signed: no witness can have seen it
        for witness in witnesses:
            cp = _fetch_head(transport, witness, origin, verifier)
            if cp is None:
                continue
            head = WitnessHead(witness.name, log_id, cp.size, cp.root)
            if size < cp.size:
                raise VerificationFailed(
                    f"log {log_id!r}: the database holds {size} entries, but witness "
                    f"{witness.name} cosigned size {cp.size}: entries were removed",
                    log_id=log_id, seq=size)
            if tree.root(session, log_id, cp.size) != cp.root:
                raise VerificationFailed(
                    f"log {log_id!r}: at size {cp.size} the database's tree does not have the "
                    f"root witness {witness.name} cosigned ({cp.root.hex()}): the log was "
                    "rewritten", log_id=log_id)
            seen.append(head)
        if progress:
            progress(1)
    return seen
