"""The local durable outbox and the thread that drains it into a :class:`RecordSink`.

Layout of an outbox directory:

* ``records.jsonl`` — every record, appended and fsync'd before :meth:`Outbox.append`
  returns, so the runtime only moves on once a record survives a crash;
* ``acked.jsonl`` — the ``event_id`` of every record the sink acknowledged, fsync'd
  after each acknowledged batch.

Pending = records − acked. A crash between the sink's acknowledgement and the write to
``acked.jsonl`` makes the next run deliver that batch again: the sink's idempotency turns
this "at least once" into "exactly once" in the ledger.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError, OutboxError
from runtime.records import validate_record
from runtime.sink import RecordSink

log = logging.getLogger("yoco.runtime.outbox")


def _append_lines(path: Path, lines: list[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(line + "\n" for line in lines).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._records_path = self.dir / "records.jsonl"
        self._acked_path = self.dir / "acked.jsonl"
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: dict[str, dict[str, Any]] = {}
        self._known: set[str] = set()
        acked = {json.loads(ln)["event_id"] for ln in _read_complete_lines(self._acked_path)}
        for line in _read_complete_lines(self._records_path):
            rec = json.loads(line)
            self._known.add(rec["event_id"])
            if rec["event_id"] not in acked:
                self._pending[rec["event_id"]] = rec

    def append(self, record: Mapping[str, Any]) -> None:
        """Validate ``record`` and make it durable (fsync'd) before returning."""
        rec = validate_record(dict(record))
        with self._cond:
            if rec["event_id"] in self._known:
                return  # the same producer id twice is one record
            try:
                _append_lines(self._records_path, [json.dumps(rec, separators=(",", ":"))])
            except OSError as exc:
                raise OutboxError(f"cannot write outbox {self._records_path}: {exc}") from exc
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
        _append_lines(self._acked_path, [json.dumps({"event_id": e}) for e in event_ids])
        with self._cond:
            for e in event_ids:
                self._pending.pop(e, None)
            self._cond.notify_all()

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


@dataclass(kw_only=True, slots=True)
class DeliveryConfig:
    """Retry policy of the :class:`Deliverer`."""

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

    def start(self) -> Deliverer:
        """Start delivering in the background; return self."""
        self._thread.start()
        return self

    def deliver_once(self) -> int:
        """Deliver one batch synchronously; return how many records were acknowledged.

        Raises whatever the sink raises; nothing is marked acknowledged then.
        """
        batch = self.outbox.pending(self.config.batch_size)
        if not batch:
            return 0
        self.sink.deliver(batch)
        self.outbox.mark_acked([r["event_id"] for r in batch])
        return len(batch)

    def _run(self) -> None:
        backoff = self.config.initial_backoff_s
        while not self._stop.is_set():
            if not self.outbox.wait_for_pending(0.2):
                continue
            try:
                self.deliver_once()
                backoff = self.config.initial_backoff_s
            except Exception as exc:  # the sink may raise anything; retry, never drop
                self.failures += 1
                log.warning("record delivery failed (%s); retrying in %.2fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.config.max_backoff_s)

    def stop(self, drain_timeout: float = 10.0) -> bool:
        """Try to drain the outbox within ``drain_timeout`` s, then stop; True if drained.

        Undelivered records stay in the outbox for the next run.
        """
        drained = self.outbox.wait_drained(drain_timeout)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        return drained
