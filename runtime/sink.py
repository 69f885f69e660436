"""Where records go after the outbox: the :class:`RecordSink` protocol and two sinks.

The runtime never imports the ledger. The ledger (``ledger.sink.LedgerSink``) implements
:class:`RecordSink`; the composition root hands the supervisor a :class:`SinkSpec` (a
dotted path and keyword arguments, so it pickles and can be built inside the supervisor
process), and the supervisor builds the sink there.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from runtime.errors import RecordRefused, SinkSpecError


@runtime_checkable
class RecordSink(Protocol):
    """A durable, idempotent destination for ingestion records.

    ``deliver`` returns only once every record in ``records`` is durably acknowledged and
    raises on any failure (the caller retries the whole batch). It must be idempotent:
    delivering a record whose ``event_id`` is already stored is a no-op, because the
    outbox delivers at least once and relies on the sink for "exactly once".

    Two kinds of failure: an *outage* (the sink is down, slow or unreachable; retried
    with backoff, forever) and a *permanent refusal* (the sink will never accept this
    content; the record goes to the dead-letter file and later records keep flowing).
    A refusal is an exception whose ``permanent`` attribute is true (such as
    :class:`~runtime.errors.RecordRefused`), or one for which the sink's optional
    ``is_permanent(exc)`` method answers True (the ledger's sink uses it, so that the
    ledger need not import the runtime). See :func:`is_permanent_refusal`.
    """

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Durably store ``records`` (idempotent by ``event_id``) or raise."""
        ...


class JsonlFileSink:
    """Appends records to a JSONL file with fsync, storing each ``event_id`` once -- also
    across processes and instances writing to the same file.

    For tests and demos. A record whose ``event_id`` is already in the file is skipped if
    its content is identical and refused (:class:`RecordRefused`, permanent) if it
    differs, like the ledger does. Each delivery holds an exclusive ``flock`` on the file
    and first reads what other writers appended since this instance last looked (a
    restarted supervisor, or a second one delivering the same outbox), so a record is
    never stored twice. A torn last line (a writer that crashed mid-append; never
    acknowledged) is cut off before appending, so the next record starts on a line of
    its own.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # threads of this process; flock: other processes
        self._seen: dict[str, str] = {}
        self._offset = 0  # bytes of the file already read into _seen
        self._ino: int | None = None

    def _catch_up(self, fd: int) -> None:
        """Read what was appended since the last look (the caller holds the flock)."""
        st = os.fstat(fd)
        if st.st_ino != self._ino or st.st_size < self._offset:
            # Another file (replaced, or truncated): start over.
            self._seen, self._offset, self._ino = {}, 0, st.st_ino
        if st.st_size == self._offset:
            return
        data = os.pread(fd, st.st_size - self._offset, self._offset)
        whole = data.rfind(b"\n") + 1
        for line in data[:whole].splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line left by an older writer; never acknowledged
            self._seen[str(rec["event_id"])] = _canon(rec)
        self._offset += whole
        if whole < len(data):
            # A torn tail: no writer is appending (we hold the lock), so a writer died
            # mid-append before acknowledging it. Cut it, or the next line would be glued
            # onto it and both lost.
            os.ftruncate(fd, self._offset)

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append the records not yet in the file, fsync, then return."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND so that a crash never overwrites acknowledged lines.
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
                self._catch_up(fd)
                fresh: dict[str, str] = {}
                for rec in records:
                    eid = str(rec["event_id"])
                    canon = _canon(rec)
                    prior = self._seen.get(eid, fresh.get(eid))
                    if prior is None:
                        fresh[eid] = canon
                    elif prior != canon:
                        raise RecordRefused(f"event_id {eid} already stored with other "
                                            "content")
                if not fresh:
                    return
                data = "".join(c + "\n" for c in fresh.values()).encode()
                os.write(fd, data)
                os.fsync(fd)
                self._seen.update(fresh)
                self._offset += len(data)
            finally:
                os.close(fd)

    def read_all(self) -> list[dict[str, Any]]:
        """Return every stored record, in file order (for tests and demos)."""
        out: list[dict[str, Any]] = []
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out


def is_permanent_refusal(sink: object, exc: BaseException) -> bool:
    """True when ``exc``, raised by ``sink.deliver``, is a permanent refusal (see
    :class:`RecordSink`); anything else is an outage to retry."""
    if getattr(exc, "permanent", False) is True:
        return True
    hook = getattr(sink, "is_permanent", None)
    if callable(hook):
        try:
            return bool(hook(exc))
        except Exception:  # a broken hook must not turn an outage into a refusal
            return False
    return False


def _canon(rec: Mapping[str, Any]) -> str:
    return json.dumps(dict(rec), sort_keys=True, separators=(",", ":"))


@dataclass(kw_only=True, slots=True, frozen=True)
class SinkSpec:
    """A picklable recipe for a sink: ``target`` is ``"package.module:callable"``.

    ``build()`` imports the callable and calls it with ``kwargs``; the result must
    implement :class:`RecordSink`.
    """

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if ":" not in self.target or self.target.startswith(":") or self.target.endswith(":"):
            raise SinkSpecError(f"sink target must be 'module:callable', got {self.target!r}")

    def build(self) -> RecordSink:
        """Import and call the target; raise :class:`SinkSpecError` if that fails."""
        module_name, _, attr = self.target.partition(":")
        try:
            factory: Callable[..., Any] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise SinkSpecError(f"cannot import sink {self.target!r}: {exc}") from exc
        sink = factory(**dict(self.kwargs))
        if not isinstance(sink, RecordSink):
            raise SinkSpecError(f"{self.target!r} built {type(sink).__name__}, which has no "
                                "deliver(records) method")
        return sink


def parse_sink_spec(text: str, extra_kwargs: Mapping[str, str] | None = None) -> SinkSpec:
    """Parse ``jsonl:PATH`` or ``module.path:callable`` (plus ``key=value`` kwargs).

    ``jsonl:PATH`` is shorthand for :class:`JsonlFileSink` at PATH.
    """
    kwargs: dict[str, Any] = dict(extra_kwargs or {})
    if text.startswith("jsonl:"):
        path = text[len("jsonl:"):]
        if not path:
            raise SinkSpecError("jsonl sink needs a path: jsonl:PATH")
        return SinkSpec(target="runtime.sink:JsonlFileSink", kwargs={"path": path, **kwargs})
    return SinkSpec(target=text, kwargs=kwargs)
