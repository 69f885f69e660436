"""The local durable outbox and the thread that drains it into a :class:`RecordSink`.

Layout of an outbox directory:

* ``records.jsonl`` — every record, appended and fsync'd before :meth:`Outbox.append`
  returns, so the runtime only moves on once a record survives a crash;
* ``acked.jsonl`` — the ``event_id`` of every record the sink acknowledged, fsync'd
  after each acknowledged batch;
* ``dead.jsonl`` — dead letters: ``{"event_id", "reason", "at"}`` for every record the
  sink refused *permanently* (its content, not an outage), fsync'd before the record
  leaves the queue, so that one such record never stalls the records behind it.
  ``yoco outbox list`` shows them and ``yoco outbox resend`` delivers them again;
* ``drafts.json`` — failures already acted on whose record is not written yet (the
  supervisor's merge window, runtime.coordinator.MERGE_WINDOW_S): each the failure record
  it would write now, replaced atomically and fsync'd at every change, so that a
  supervisor dying inside the window loses none of them (``--resume`` records them).
  Drafts are not records: nothing delivers them.

Pending = records − acked − dead (a dead letter later acknowledged is delivered). A
crash between the sink's acknowledgement and the write to ``acked.jsonl`` makes the next
run deliver that batch again: the sink's idempotency turns this "at least once" into
"exactly once" in the ledger.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError, OutboxError
from runtime.records import validate_record
from runtime.sink import RecordSink, is_permanent_refusal
from yoco_records.backoff import backoff_s

log = logging.getLogger("yoco.runtime.outbox")


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append ``lines`` and fsync; on any error the file is cut back to its old end, so a
    full disk never leaves a torn line in the middle of the file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        data = "".join(line + "\n" for line in lines).encode()
        try:
            view = memoryview(data)
            while view:  # a nearly full disk takes part of a write, then refuses the rest
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_durably(path: Path, text: str) -> None:
    """Replace ``path`` by ``text``: a temporary file written and fsync'd, renamed over
    it, the folder fsync'd. On error the temporary file is removed and ``path`` is the
    old one, whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(text.encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _read_complete_lines(path: Path) -> list[str]:
    """Read the lines of ``path``, dropping (and truncating away) a torn last line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        # A crash mid-append left a partial line that was never acknowledged to anyone:
        # cut it so that the next append starts on a clean line.
        with path.open("r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    return [ln for ln in data[:end].decode("utf-8").splitlines() if ln.strip()]


class Outbox:
    """A crash-safe FIFO of records waiting for a sink's acknowledgement."""

    def __init__(self, directory: str | os.PathLike[str], *, reserve_bytes: int = 0) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Writes the disk refused (full, read-only), oldest first, per file: the records
        # stay deliverable from memory and the disk is retried (retry_disk).
        self._unwritten: dict[Path, list[str]] = {}
        self.disk_error: str | None = None  # the current disk problem, None when healthy
        self._reserve_path = self.dir / "reserve"
        self.reserve_bytes = reserve_bytes
        if reserve_bytes:
            self._reserve(reserve_bytes)
        self._records_path = self.dir / "records.jsonl"
        self._acked_path = self.dir / "acked.jsonl"
        self._dead_path = self.dir / "dead.jsonl"
        self._drafts_path = self.dir / "drafts.json"
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: dict[str, dict[str, Any]] = {}
        self._known: set[str] = set()
        acked = {json.loads(ln)["event_id"] for ln in _read_complete_lines(self._acked_path)}
        dead = {d["event_id"]: d for d in map(json.loads, _read_complete_lines(self._dead_path))}
        self._dead: dict[str, DeadLetter] = {}
        for line in _read_complete_lines(self._records_path):
            rec = json.loads(line)
            eid = rec["event_id"]
            self._known.add(eid)
            if eid in acked:
                continue
            if eid in dead:
                self._dead[eid] = DeadLetter(record=rec, reason=str(dead[eid]["reason"]),
                                             at=float(dead[eid]["at"]))
            else:
                self._pending[eid] = rec

    def _reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` of disk for the outbox in ``reserve`` (released when the disk
        fills up, so that records keep being written); OutboxError if the disk cannot."""
        if self._reserve_path.exists() and self._reserve_path.stat().st_size >= nbytes:
            return
        try:
            fd = os.open(self._reserve_path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, nbytes)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._reserve_path.unlink()
            raise OutboxError(f"cannot reserve {nbytes} bytes for the outbox in {self.dir}: "
                              f"{exc.strerror or exc}") from exc

    def _write(self, path: Path, lines: list[str]) -> bool:
        """Append ``lines`` to ``path`` after whatever is still held for it; keep them in
        memory if the disk refuses. Call with the lock held. True when on disk."""
        held = self._unwritten.setdefault(path, [])
        held.extend(lines)
        for attempt in range(2):
            try:
                _append_lines(path, held)
            except OSError as exc:
                if exc.errno == errno.ENOSPC and attempt == 0 and self._reserve_path.exists():
                    self._reserve_path.unlink()  # what the reserve is for
                    log.error("outbox disk full: released the outbox's %d-byte reserve in %s "
                              "to keep writing records; free space on that disk",
                              self.reserve_bytes, self.dir)
                    continue
                if self.disk_error is None:
                    log.error("cannot write the outbox in %s (%s): records are kept in memory "
                              "and delivered from there; retrying the disk", self.dir,
                              exc.strerror or exc)
                self.disk_error = exc.strerror or str(exc)
                return False
            break
        held.clear()
        return True

    def retry_disk(self) -> bool:
        """Write whatever the disk refused before; True when nothing is held anymore."""
        with self._cond:
            if self.disk_error is None:
                return True
            held = sum(len(v) for v in self._unwritten.values())
            for path in (self._records_path, self._dead_path, self._acked_path):
                if self._unwritten.get(path) and not self._write(path, []):
                    return False
            log.warning("outbox in %s writable again: wrote %d held line(s)", self.dir, held)
            self.disk_error = None
            if self.reserve_bytes:
                with contextlib.suppress(OutboxError):
                    self._reserve(self.reserve_bytes)
            return True

    def write_drafts(self, drafts: list[dict[str, Any]]) -> bool:
        """Replace ``drafts.json`` with ``drafts`` (an empty list removes it), fsync'd --
        file and folder -- before returning True. A disk that refuses (full: after the
        reserve is released, as for records; read-only) is logged and False returned: the
        drafts then live only in the supervisor's memory until their records are written."""
        path = self._drafts_path
        with self._lock:
            for attempt in range(2):
                try:
                    if drafts:
                        _replace_durably(path, json.dumps(drafts, separators=(",", ":")))
                    elif path.exists():
                        path.unlink()
                        _fsync_dir(self.dir)
                    return True
                except OSError as exc:
                    if exc.errno == errno.ENOSPC and attempt == 0 \
                            and self._reserve_path.exists():
                        self._reserve_path.unlink()
                        log.error("outbox disk full: released the outbox's %d-byte reserve "
                                  "in %s to write a failure's draft; free space on that "
                                  "disk", self.reserve_bytes, self.dir)
                        continue
                    log.error("cannot write %s (%s): a failure not yet recorded would be "
                              "lost with this supervisor", path, exc.strerror or exc)
                    return False
        return False

    def read_drafts(self) -> list[dict[str, Any]]:
        """The drafts ``drafts.json`` holds (see :meth:`write_drafts`); a file that cannot
        be read as a list of drafts counts as none (logged): it is only ever replaced
        whole, so that means someone else wrote it."""
        try:
            data = json.loads(self._drafts_path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error("ignoring %s: %s", self._drafts_path, exc)
            return []
        if not isinstance(data, list) or not all(
                isinstance(d, dict) and isinstance(d.get("event_id"), str) for d in data):
            log.error("ignoring %s: not a list of failure drafts", self._drafts_path)
            return []
        return data

    def held_records(self) -> list[dict[str, Any]]:
        """Records that are only in memory (the disk refused them)."""
        with self._lock:
            return [json.loads(ln) for ln in self._unwritten.get(self._records_path, [])]

    def append(self, record: Mapping[str, Any]) -> None:
        """Validate ``record`` and make it durable (fsync'd) before returning -- or, when
        the disk is full or read-only, keep it in memory (deliverable at once) and retry
        the disk later (see :meth:`retry_disk`, :attr:`disk_error`)."""
        rec = validate_record(dict(record))
        with self._cond:
            if rec["event_id"] in self._known:
                return  # the same producer id twice is one record
            # After whatever an earlier full disk still holds.
            self._write(self._records_path, [json.dumps(rec, separators=(",", ":"))])
            self._known.add(rec["event_id"])
            self._pending[rec["event_id"]] = rec
            self._cond.notify_all()

    def pending(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Return up to ``limit`` unacknowledged records, oldest first."""
        with self._lock:
            return list(self._pending.values())[:limit]

    def pending_count(self) -> int:
        """Return how many records still wait for an acknowledgement."""
        with self._lock:
            return len(self._pending)

    def mark_acked(self, event_ids: list[str]) -> None:
        """Durably note that the sink acknowledged ``event_ids``."""
        if not event_ids:
            return
        with self._cond:
            # A lost acknowledgement only means a redelivery (idempotent): never fatal.
            self._write(self._acked_path, [json.dumps({"event_id": e}) for e in event_ids])
            for e in event_ids:
                self._pending.pop(e, None)
                self._dead.pop(e, None)
            self._cond.notify_all()

    def dead_letter(self, event_id: str, reason: str) -> DeadLetter:
        """Durably move pending record ``event_id`` to the dead letters (the sink refused
        it for good): it leaves the delivery queue, its record stays in the outbox."""
        at = time.time()
        with self._cond:
            self._write(self._dead_path, [json.dumps(
                {"event_id": event_id, "reason": reason[:2000], "at": at})])
            rec = self._pending.pop(event_id)
            letter = DeadLetter(record=rec, reason=reason[:2000], at=at)
            self._dead[event_id] = letter
            self._cond.notify_all()
        return letter

    def refuse_again(self, event_id: str, reason: str) -> None:
        """Note a new refusal of dead letter ``event_id`` (a failed re-send)."""
        at = time.time()
        with self._cond:
            self._write(self._dead_path, [json.dumps(
                {"event_id": event_id, "reason": reason[:2000], "at": at})])
            old = self._dead[event_id]
            self._dead[event_id] = DeadLetter(record=old.record, reason=reason[:2000], at=at)

    def dead_letters(self) -> list[DeadLetter]:
        """Return the records the sink refused for good and nobody re-sent yet."""
        with self._lock:
            return list(self._dead.values())

    def wait_for_pending(self, timeout: float) -> bool:
        """Block until a record is pending or ``timeout`` passes; True if one is."""
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            return bool(self._pending)

    def wait_drained(self, timeout: float) -> bool:
        """Block until nothing is pending or ``timeout`` passes; True if drained."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


@dataclass(kw_only=True, slots=True, frozen=True)
class DeadLetter:
    """A record the sink refused for good, why, and when (epoch seconds)."""

    record: dict[str, Any]
    reason: str
    at: float

    @property
    def event_id(self) -> str:
        """The refused record's ``event_id``."""
        return str(self.record["event_id"])


@dataclass(kw_only=True, slots=True)
class DeliveryConfig:
    """Retry policy of the :class:`Deliverer`: after the n-th consecutive failed
    delivery it waits by the product's backoff rule (:mod:`yoco_records.backoff`):
    ``initial_backoff_s`` × 2^(n−1), at most ``max_backoff_s``, the second half of it
    jittered (the training nodes of a cluster that lost the portal together do not come
    back in lock-step)."""

    batch_size: int = 500
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError("batch_size must be >= 1")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ConfigError("need 0 < initial_backoff_s <= max_backoff_s")


class Deliverer:
    """A background thread that delivers outbox records to a sink until acknowledged."""

    def __init__(self, outbox: Outbox, sink: RecordSink,
                 config: DeliveryConfig | None = None) -> None:
        self.outbox = outbox
        self.sink = sink
        self.config = config or DeliveryConfig()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="yoco-outbox", daemon=True)
        self.failures = 0
        self.last_error: str | None = None  # the latest outage, None after a delivery

    def start(self) -> Deliverer:
        """Start delivering in the background; return self."""
        self._thread.start()
        return self

    def deliver_once(self) -> int:
        """Deliver one batch synchronously; return how many records left the queue
        (acknowledged, or dead-lettered after a permanent refusal).

        A permanent refusal of a batch is narrowed down record by record: the refused
        ones go to the dead letters (with a loud log line), the others are delivered.
        Raises whatever the sink raises for an outage; nothing is marked then.
        """
        batch = self.outbox.pending(self.config.batch_size)
        if not batch:
            return 0
        try:
            self.sink.deliver(batch)
        except Exception as exc:
            if not is_permanent_refusal(self.sink, exc):
                raise
            if len(batch) == 1:
                self._bury(batch[0], exc)
                return 1
            return self._deliver_singly(batch)
        self.outbox.mark_acked([r["event_id"] for r in batch])
        self.last_error = None
        return len(batch)

    def _deliver_singly(self, batch: list[dict[str, Any]]) -> int:
        # In outbox order, so that a record's references (its failure, its job) are
        # delivered before it; a record whose reference was refused is refused in turn.
        done = 0
        for rec in batch:
            try:
                self.sink.deliver([rec])
            except Exception as exc:
                if not is_permanent_refusal(self.sink, exc):
                    raise
                self._bury(rec, exc)
            else:
                self.outbox.mark_acked([rec["event_id"]])
            done += 1
        return done

    def _bury(self, rec: dict[str, Any], exc: BaseException) -> None:
        self.outbox.dead_letter(rec["event_id"], f"{type(exc).__name__}: {exc}")
        log.error("DEAD LETTER: the sink refused %s record %s for good (%s); it is kept in "
                  "%s and later records keep flowing. Inspect with `yoco outbox list "
                  "RUN`, re-send with `yoco outbox resend RUN` once fixed.",
                  rec.get("kind"), rec["event_id"], exc, self.outbox.dir / "dead.jsonl")

    def _run(self) -> None:
        failed = 0  # consecutive failed deliveries
        while not self._stop.is_set():
            if self.outbox.disk_error is not None:
                self.outbox.retry_disk()
            if not self.outbox.wait_for_pending(0.2):
                continue
            try:
                self.deliver_once()
                failed = 0
            except Exception as exc:  # an outage: retry, never drop
                self.failures += 1
                failed += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                wait = backoff_s(failed, base_s=self.config.initial_backoff_s,
                                 cap_s=self.config.max_backoff_s, jitter=random.random())
                log.warning("record delivery failed (%s); retrying in %.2fs", exc, wait)
                self._stop.wait(wait)

    def stop(self, drain_timeout: float = 10.0) -> bool:
        """Try to drain the outbox within ``drain_timeout`` s, then stop; True if drained.

        Undelivered records stay in the outbox for the next run.
        """
        drained = self.outbox.wait_drained(drain_timeout)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        return drained


@dataclass(kw_only=True, slots=True, frozen=True)
class ResendResult:
    """What :func:`resend_dead_letters` did with one dead letter."""

    event_id: str
    kind: str
    delivered: bool
    reason: str  # why not ("" when delivered)


def resend_dead_letters(outbox: Outbox, sink: RecordSink,
                        event_ids: list[str] | None = None) -> list[ResendResult]:
    """Deliver dead letters (all, or those in ``event_ids``) again, one by one in outbox
    order. A delivered one is acknowledged and leaves the dead letters; a refused one
    stays (with the new reason); an outage stops the resend (the rest are not tried).
    """
    letters = outbox.dead_letters()
    if event_ids is not None:
        unknown = set(event_ids) - {d.event_id for d in letters}
        if unknown:
            raise OutboxError(f"no dead letter with event_id {', '.join(sorted(unknown))}")
        letters = [d for d in letters if d.event_id in set(event_ids)]
    out: list[ResendResult] = []
    for i, letter in enumerate(letters):
        kind = str(letter.record.get("kind"))
        try:
            sink.deliver([letter.record])
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if is_permanent_refusal(sink, exc):
                outbox.refuse_again(letter.event_id, reason)
                out.append(ResendResult(event_id=letter.event_id, kind=kind,
                                        delivered=False, reason=f"refused: {reason}"))
                continue
            for rest in letters[i:]:
                out.append(ResendResult(event_id=rest.event_id,
                                        kind=str(rest.record.get("kind")), delivered=False,
                                        reason=f"sink unreachable: {reason}"))
            break
        outbox.mark_acked([letter.event_id])
        out.append(ResendResult(event_id=letter.event_id, kind=kind, delivered=True,
                                reason=""))
    return out


def rescue_held_records(outbox: Outbox, directory: Path) -> Path | None:
    """Write the records only held in memory and not acknowledged (the outbox's disk
    refused them and the sink did not take them) to ``directory`` (another disk); return
    the file, or None when there is nothing to rescue."""
    pending = {r["event_id"] for r in outbox.pending(limit=10**9)}
    held = [r for r in outbox.held_records() if r["event_id"] in pending]
    if not held:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rescued-{int(time.time())}-{os.getpid()}.jsonl"
    _append_lines(path, [json.dumps(r, separators=(",", ":")) for r in held])
    return path
