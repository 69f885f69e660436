"""Batches prepared in a worker process while another batch is being written.

:func:`ledger.ingest.ingest_stream` hands each batch's validation and encoding
(:func:`ledger.prepare.prepare_batch`, no database) to a :class:`PrepareWorker`: a child
Python process (``python -m ledger.workers``) that reads batches from a pipe and writes
the prepared batches back, in order. With a core to spare, the records' checks run while
this process and the database append the batch before.

The child is started as a fresh interpreter (not forked, and not through
``multiprocessing``): it shares no connection, lock or thread of the parent, and the
parent's ``__main__`` is never re-imported (a script without a ``__main__`` guard can
use it). Frames on the pipes are an 8-byte length and a pickle; two threads here send
and receive them (the pipes' system calls release the GIL), so neither side waits on
the other while it works.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ledger.errors import InvariantBroken

__all__ = ["PrepareWorker", "WorkerFailed"]

_LENGTH = struct.Struct(">Q")
_STOP = None


class WorkerFailed(RuntimeError):
    """The worker process ended, or could not send back what it was asked for."""


def _write_frame(out: IO[bytes], payload: bytes) -> None:
    out.write(_LENGTH.pack(len(payload)))
    out.write(payload)
    out.flush()


def _read_frame(source: IO[bytes]) -> bytes | None:
    head = source.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    data = source.read(size)
    if len(data) < size:
        return None
    return data


class PrepareWorker:
    """One child process running :func:`ledger.prepare.prepare_batch`, first in, first out.

    :meth:`submit` never blocks (the batch is pickled and sent by a thread); :meth:`result`
    returns the prepared batches in submission order, raising what the child raised
    (or :class:`WorkerFailed` if it died). :meth:`close` ends the child, whatever it
    still holds. Use as a context manager.
    """

    def __init__(self) -> None:
        """Start the child process and the threads that talk to it."""
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._child = subprocess.Popen(
            [sys.executable, "-m", "ledger.workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=root,
        )
        self._outbox: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending = 0
        self._sender = threading.Thread(target=self._send, name="prepare-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive, name="prepare-recv", daemon=True)
        self._sender.start()
        self._receiver.start()

    def _send(self) -> None:
        stdin = self._child.stdin
        if stdin is None:
            raise InvariantBroken("the worker was started without a stdin pipe")
        try:
            while (job := self._outbox.get()) is not _STOP:
                _write_frame(stdin, pickle.dumps(job, pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            pass  # the child is gone: the receiver reports it
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def _receive(self) -> None:
        stdout = self._child.stdout
        if stdout is None:
            raise InvariantBroken("the worker was started without a stdout pipe")
        while (frame := _read_frame(stdout)) is not None:
            # The pipe's other end is the child this object started: trusted bytes.
            self._inbox.put(pickle.loads(frame))  # noqa: S301
        self._inbox.put(("gone", None))

    def submit(self, *args: Any) -> None:
        """Queue ``prepare_batch(*args)`` in the child."""
        self._pending += 1
        self._outbox.put(("prepare", args))

    def submit_index(self, *args: Any) -> None:
        """Queue ``ledger.stream.index_range(*args)`` in the child (a file's share)."""
        self._pending += 1
        self._outbox.put(("index", args))

    def result(self) -> Any:
        """The next prepared batch, in submission order (blocks until it is ready)."""
        if self._pending <= 0:
            raise WorkerFailed("no batch was submitted to the worker")
        status, value = self._inbox.get()
        if status == "gone":
            self._inbox.put((status, value))  # every later call says the same
            raise WorkerFailed(
                f"the ingest worker process ended (exit status {self._child.wait()})"
            )
        self._pending -= 1
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        """End the child: at once if it still works on something, else when it reads EOF."""
        self._outbox.put(_STOP)
        if self._pending:
            self._child.kill()
        try:
            self._child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._sender.join(timeout=5)
        self._receiver.join(timeout=5)
        if self._child.stdout is not None:
            self._child.stdout.close()

    def __enter__(self) -> PrepareWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(source: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: run each task read from ``source``, write its result to ``out``.

    A task is ``("prepare", (objs, what, now, kinds))`` (a batch to prepare) or
    ``("index", args)`` (:func:`ledger.stream.index_range`).
    """
    from ledger.prepare import prepare_batch
    from ledger.stream import index_range

    while (frame := _read_frame(source)) is not None:
        task, args = pickle.loads(frame)  # noqa: S301 (from the parent's pipe)
        try:
            if task == "index":
                reply: tuple[str, Any] = ("ok", index_range(*args))
            else:
                objs, what, now, kinds = args
                reply = ("ok", prepare_batch(objs, what, now, kinds, keep_keys=False))
        except Exception as exc:  # sent back and raised in the parent
            reply = ("error", exc)
        try:
            payload = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an exception that does not pickle
            payload = pickle.dumps(
                ("error", WorkerFailed(f"{type(exc).__name__}: {exc}")), pickle.HIGHEST_PROTOCOL
            )
        _write_frame(out, payload)


if __name__ == "__main__":
    # Ctrl-C reaches the whole foreground process group: the parent handles it and ends
    # this child (close(), or EOF on its pipe), which must not die on its own first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The pipes carry frames only: anything printed goes to stderr instead.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, protocol_out)
