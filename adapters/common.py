"""What every adapter shares: its configuration, the state folder, and the outbox.

**Exactly once, whoever reports.** Records carry producer-chosen random UUID v4 ids (the
ledger refuses any other version), so duplicates cannot be avoided by *deriving* ids.
Instead each record an adapter writes is *decided once*: :meth:`StateDir.claim` builds the
record (with a fresh random id), writes it to ``records/NAME.json`` in the shared state
folder and publishes it with ``link()``, which fails when the name exists. Whoever comes
later -- another rank that noticed the same restart, or the next incarnation of a
reporter killed between the claim and its outbox -- reads the published record and
appends *the same bytes* again. The outbox keeps one copy per ``event_id``, and the ledger
stores an id once and refuses the same id with other content, so the record lands once.

**Progress without cost.** :class:`Progress` notes the steps done and their time with one
fixed-width ``pwrite`` per step and no fsync: it survives any death of the process (the
page cache keeps it), not a crash of the machine (see docs/adapters.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError
from runtime.outbox import Deliverer, Outbox
from runtime.records import validate_record
from runtime.sink import SinkSpec, parse_sink_spec

log = logging.getLogger("yoco.adapters")

#: Environment variables every adapter reads (``AdapterConfig.from_env``).
ENV_CONTRACT = "YOCO_CONTRACT_ID"
ENV_JOB = "YOCO_JOB_ID"
ENV_STATE_DIR = "YOCO_ADAPTER_DIR"
ENV_SINK = "YOCO_SINK"
ENV_SINK_ARGS = "YOCO_SINK_ARGS"
ENV_GPUS_PER_PROCESS = "YOCO_GPUS_PER_PROCESS"

#: The ``detail`` field holds at most this many characters (yoco_records.schema).
DETAIL_MAX = 4000


@dataclass(kw_only=True, slots=True)
class AdapterConfig:
    """Where an adapter's records go and what they are about.

    ``state_dir`` must be one folder that every rank and every restart of the job sees (a
    shared file system across nodes, like the checkpoints): it holds the decided records,
    the attempts, the progress markers and the outbox. ``sink`` delivers the outbox (the
    ledger: ``SinkSpec(target="yoco.sink:ledger_sink", kwargs={"database_url": ...})``);
    without one, records wait in the outbox for ``yoco outbox deliver``.
    """

    contract_id: str
    job_id: str
    state_dir: Path
    sink: SinkSpec | None = None
    #: Devices one training process drives (1 on GPUs, one process per GPU; also 1 on CPU,
    #: where a process stands for a device in the figures).
    gpus_per_process: int = 1
    #: How long ``finished()`` waits for the sink to acknowledge everything.
    deliver_timeout_s: float = 30.0
    node: str = field(default_factory=socket.gethostname)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if not isinstance(self.gpus_per_process, int) or self.gpus_per_process < 1:
            raise ConfigError(f"gpus_per_process must be an integer >= 1, got "
                              f"{self.gpus_per_process!r}")
        if self.deliver_timeout_s < 0:
            raise ConfigError("deliver_timeout_s must be >= 0")
        # The ids go into every record: refuse a bad one now, naming the setting, rather
        # than at the first failure (yoco_records decides what an id is).
        probe = {"kind": "job_finished", "event_id": "00000000-0000-4000-8000-000000000000",
                 "contract_id": self.contract_id, "job_id": self.job_id, "step": 0,
                 "occurred_at": "2025-01-01T00:00:00+00:00"}
        try:
            validate_record(probe)
        except ValueError as exc:
            raise ConfigError(f"contract_id {self.contract_id!r} / job_id {self.job_id!r}: "
                              f"{exc}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 default_job_id: str | None = None, **overrides: Any) -> AdapterConfig:
        """Build the configuration from ``YOCO_*`` variables (keyword overrides win).

        ``YOCO_CONTRACT_ID`` (required), ``YOCO_JOB_ID`` (default ``default_job_id``),
        ``YOCO_ADAPTER_DIR`` (required), ``YOCO_SINK`` (``jsonl:PATH`` or
        ``module:callable``), ``YOCO_SINK_ARGS`` (a JSON object of the sink's keyword
        arguments), ``YOCO_GPUS_PER_PROCESS``. Raises :class:`ConfigError` naming the
        variable that is missing or bad.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, var in (("contract_id", ENV_CONTRACT), ("state_dir", ENV_STATE_DIR)):
            if key not in overrides and not env.get(var):
                raise ConfigError(f"{var} is not set")
            if env.get(var):
                values[key] = env[var]
        job = env.get(ENV_JOB) or default_job_id
        if job:
            values["job_id"] = job
        elif "job_id" not in overrides:
            raise ConfigError(f"{ENV_JOB} is not set")
        if env.get(ENV_SINK):
            try:
                kwargs = json.loads(env.get(ENV_SINK_ARGS) or "{}")
            except ValueError as exc:
                raise ConfigError(f"{ENV_SINK_ARGS} is not JSON: {exc}") from None
            if not isinstance(kwargs, dict):
                raise ConfigError(f"{ENV_SINK_ARGS} must be a JSON object")
            values["sink"] = parse_sink_spec(env[ENV_SINK], kwargs)
        if env.get(ENV_GPUS_PER_PROCESS):
            try:
                values["gpus_per_process"] = int(env[ENV_GPUS_PER_PROCESS])
            except ValueError:
                raise ConfigError(f"{ENV_GPUS_PER_PROCESS} must be an integer") from None
        return cls(**{**values, **overrides})


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: Path, data: bytes) -> bool:
    """Publish ``data`` at ``path`` only if nothing is there yet; True if this call did.

    The bytes are written and fsync'd under a private name first and then ``link()``-ed
    into place, which fails when ``path`` exists: readers never see a partial file, and
    of two writers exactly one wins.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)
    return True


class StateDir:
    """The shared folder of one job: decided records, attempts, progress, exit notes."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ decided records
    def record_path(self, name: str) -> Path:
        """Where the decided record ``name`` lives."""
        return self.root / "records" / f"{name}.json"

    def decided(self, name: str) -> dict[str, Any] | None:
        """The record decided under ``name``, or None if none is yet."""
        path = self.record_path(name)
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None

    def claim(self, name: str, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Return the record decided under ``name``, deciding it with ``build()`` if no
        one has: the first caller's record is the only one ever returned for ``name``."""
        prior = self.decided(name)
        if prior is not None:
            return prior
        record = validate_record(build())
        data = json.dumps(record, separators=(",", ":")).encode()
        if write_new(self.record_path(name), data):
            return record
        won = self.decided(name)
        assert won is not None  # link() said it exists, and nothing removes it
        return won

    # ------------------------------------------------------------ attempts
    def new_attempt(self, info: Mapping[str, Any], folder: str = "attempts") -> int:
        """Register a new attempt (one start of the reporting process) and return its
        number, 0 for the first. ``info`` is stored with it."""
        n = len(self.attempts(folder))
        while True:
            body = json.dumps({**info, "attempt": n}, separators=(",", ":")).encode()
            if write_new(self.root / folder / f"{n:06d}.json", body):
                return n
            n += 1

    def attempts(self, folder: str = "attempts") -> list[dict[str, Any]]:
        """Every attempt's info, in order."""
        base = self.root / folder
        if not base.is_dir():
            return []
        return [json.loads(p.read_text(encoding="utf-8"))
                for p in sorted(base.glob("[0-9]*.json"))]

    # ------------------------------------------------------------ exit notes
    def write_note(self, key: str, name: str, note: Mapping[str, Any]) -> None:
        """Leave exit note ``name`` under ``key`` (why a process is ending), fsync'd;
        never raises."""
        try:
            write_new(self.root / "notes" / f"{key}.{name}.{os.getpid()}.json",
                      json.dumps(dict(note), separators=(",", ":")).encode())
        except OSError as exc:  # a full disk must not hide the exception being noted
            log.warning("cannot write exit note in %s: %s", self.root, exc)

    def notes(self, key: str) -> list[dict[str, Any]]:
        """The exit notes left under ``key``, oldest first."""
        base = self.root / "notes"
        if not base.is_dir():
            return []
        found = []
        for p in base.glob(f"{key}.*.json"):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(p.read_text(encoding="utf-8")))
        return sorted(found, key=lambda n: float(n.get("at", 0.0)))


@dataclass(kw_only=True, slots=True, frozen=True)
class Mark:
    """What a progress marker says: ``steps`` done by ``at`` (epoch seconds), the mean
    step time of the last steps (0 when fewer than two steps were seen)."""

    steps: int
    at: float
    step_seconds: float


class Progress:
    """Steps done by one attempt, in one fixed-width line rewritten in place.

    One ``pwrite`` per step, no fsync: cheap enough for every step, and it survives the
    death of the process (not of the machine).
    """

    WIDTH = 64

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._times: deque[float] = deque(maxlen=21)

    def note(self, steps: int, at: float | None = None) -> Mark:
        """Record that ``steps`` steps are done (at ``at``, default now)."""
        now = time.time() if at is None else at
        self._times.append(now)
        mean = ((self._times[-1] - self._times[0]) / (len(self._times) - 1)
                if len(self._times) > 1 else 0.0)
        line = f"{steps} {now!r} {mean!r}".ljust(self.WIDTH - 1) + "\n"
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._fd, line.encode()[: self.WIDTH], 0)
        return Mark(steps=steps, at=now, step_seconds=mean)

    def close(self) -> None:
        """Close the file (the marker stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def read(path: Path) -> Mark | None:
        """The marker at ``path``, or None when the attempt did no step."""
        try:
            steps, at, mean = path.read_text(encoding="ascii").split()
            return Mark(steps=int(steps), at=float(at), step_seconds=float(mean))
        except (FileNotFoundError, ValueError):
            return None


class Reporter:
    """An outbox with its delivery thread: what the reporting process of a job holds.

    Only one process at a time may hold an outbox folder (the runtimes here guarantee it:
    torchrun stops the whole worker group before restarting it; a TorchFT replica group is
    restarted after its process is gone). Records appended here are fsync'd before
    :meth:`emit` returns and delivered in the background; a record the next incarnation
    appends again is one record (the outbox and the ledger keep one per ``event_id``).
    """

    def __init__(self, outbox_dir: Path, sink: SinkSpec | None) -> None:
        self.outbox = Outbox(outbox_dir)
        self.deliverer: Deliverer | None = None
        if sink is not None:
            self.deliverer = Deliverer(self.outbox, sink.build()).start()

    def emit(self, record: Mapping[str, Any]) -> None:
        """Make ``record`` durable in the outbox (validated again there)."""
        self.outbox.append(record)

    def close(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the sink, stop delivering; True when nothing is
        left undelivered (always False without a sink while records wait)."""
        drained = (self.deliverer.stop(timeout) if self.deliverer is not None
                   else self.outbox.pending_count() == 0)
        sink = self.deliverer.sink if self.deliverer is not None else None
        closer = getattr(sink, "close", None)
        if callable(closer):
            with contextlib.suppress(Exception):
                closer()
        if not drained:
            log.warning("%d record(s) not yet delivered; they wait in %s (deliver them with "
                        "`yoco outbox deliver`)", self.outbox.pending_count(), self.outbox.dir)
        return drained


def parse_iso(text: str) -> float:
    """The POSIX time of an ISO 8601 instant with an offset (a record's ``occurred_at``)."""
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def close_main(argv: list[str] | None, *, prog: str, description: str,
               close_job: Callable[[AdapterConfig], tuple[int, bool]]) -> int:
    """The ``python -m adapters.X close`` command every adapter has: read the job's
    configuration (flags over ``YOCO_*`` variables), run ``close_job`` and say what it did.

    Exit 0 when every record was delivered, 3 when records wait in the outbox, 2 on bad
    configuration (nothing written)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog=prog, description=description)
    sub = ap.add_subparsers(dest="command", required=True)
    close = sub.add_parser("close", help="record the end of the job and deliver")
    close.add_argument("--state-dir", help="the job's state folder (YOCO_ADAPTER_DIR)")
    close.add_argument("--job-id", help="the job id (YOCO_JOB_ID)")
    close.add_argument("--contract", help="the contract id (YOCO_CONTRACT_ID)")
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("state_dir", args.state_dir), ("job_id", args.job_id),
                                    ("contract_id", args.contract)) if v}
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = AdapterConfig.from_env(**overrides)
        failures, delivered = close_job(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"job {config.job_id}: {failures} failure(s) recorded; "
          + ("every record delivered" if delivered else "records wait in the outbox"))
    return 0 if delivered else 3


def iso(ts: float) -> str:
    """Epoch seconds as an ISO 8601 timestamp with a UTC offset (microseconds)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat()


def clip(text: str, limit: int = DETAIL_MAX) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis when cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: What a rank raises when a *peer* went away: a consequence of the failure, not its cause.
_COMMUNICATION = re.compile(
    r"gloo|nccl|connection (closed|reset|refused)|broken pipe|timed out|timeout|"
    r"socket|peer|process group|heartbeat", re.IGNORECASE)


def is_communication_error(note: Mapping[str, Any]) -> bool:
    """Whether exit ``note`` records a collective or connection error (a rank that lost a
    peer) rather than an exception of its own (the script's, or a device's)."""
    name = str(note.get("exception", ""))
    module = str(note.get("module", ""))
    if name.startswith("Dist") or "distributed" in module:
        return True  # torch.distributed's DistError, DistBackendError, DistNetworkError...
    return bool(_COMMUNICATION.search(str(note.get("message", ""))))


def failure_cause(silent: Sequence[int], notes: Sequence[Mapping[str, Any]]) -> str:
    """The cause of a group's end from its exit notes (docs/adapters.md).

    A rank that raised something other than a communication error started it (the
    others then lost a peer, or were stopped by the launcher without a word):
    ``process_crashed``. Otherwise a rank that ended without a note was killed (a
    signal, the OOM killer, a lost node): ``process_killed``. Otherwise every rank lost a
    peer and none died: ``collective_error``.
    """
    if any(not is_communication_error(n) for n in notes):
        return "process_crashed"
    if silent:
        return "process_killed"
    return "collective_error"


def exception_note(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """The exit note of a process ending with ``exc``."""
    return {"at": time.time(), "pid": os.getpid(), "exception": type(exc).__name__,
            "module": type(exc).__module__, "message": clip(str(exc), 500), **extra}
