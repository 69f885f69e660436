"""Leaving a worker process safely when a gloo wait of an abandoned generation is still
blocked in a helper thread.

gloo point-to-point ops have no future and report completion only through ``wait()``, so
:meth:`runtime.membership.Membership.wait` blocks in ``wait()`` on a daemon helper thread.
When a generation is abandoned (a peer died, a move), such a thread can stay blocked for
good: its peer never posts the matching op. At the end of the job the interpreter then
finalizes with that thread still inside ``wait()``; when a peer exits in that window its
socket closes, the wait returns with gloo's "Connection closed by peer", and the thread,
trying to take the GIL of a finalizing interpreter, is torn down by ``pthread_exit``
inside a ``noexcept`` frame: ``terminate called``, SIGABRT, and the supervisor saw a
member of a job whose every step was committed die (a stuck recv plus a peer exiting
during the finalization aborted every time without this guard, never with it;
docs/benchmarks-runtime.md, "Figures behind the code").

The same holds for a *collective* of an abandoned generation: it stays pending in a
thread of its process group, and when a peer's exit finally fails it, the group's thread
runs the Python completion callback -- taking the GIL of a finalizing interpreter:
``terminate called after throwing an instance of 'gloo::IoException'`` (seen at the end
of a job that had lost a host). Such collectives are counted too.

The guard is an ``atexit`` hook: if such a thread is still blocked, the process flushes
its output and leaves with ``os._exit`` and the exit status the script would have had
(0, 1 after an uncaught exception, or the code given to ``sys.exit``), skipping the
interpreter's teardown. Limits: ``atexit`` handlers registered *before* the guard (before
the :class:`runtime.job.Job` is built) run after it, so they are skipped in that case;
``raise SystemExit(n)`` (not ``sys.exit(n)``) is reported as 0.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from types import TracebackType
from typing import Any, NoReturn

#: Helper threads blocked in a gloo wait, and tokens of collectives whose completion
#: callback (Python, run on a process group thread) has not run yet.
_blocked: set[object] = set()
_lock = threading.Lock()
_state: dict[str, Any] = {"installed": False, "code": 0}


def track(item: object) -> None:
    """Note ``item`` (a helper thread, or a pending collective's token) as blocked in a
    gloo wait until :func:`untrack`."""
    with _lock:
        _blocked.add(item)


def untrack(item: object) -> None:
    """The wait of ``item`` returned (or its collective's callback ran)."""
    with _lock:
        _blocked.discard(item)


def blocked() -> int:
    """How many gloo waits are still blocked (live helper threads, pending collectives)."""
    with _lock:
        return sum(t.is_alive() if isinstance(t, threading.Thread) else 1 for t in _blocked)


def _exit_code(code: object) -> int:
    # What the interpreter makes of sys.exit's argument.
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def install() -> None:
    """Install the guard once per process (idempotent)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    original_hook = sys.excepthook
    original_exit = sys.exit

    def excepthook(kind: type[BaseException], value: BaseException,
                   tb: TracebackType | None) -> None:
        _state["code"] = 1
        original_hook(kind, value, tb)

    def exit_(code: str | int | None = None) -> None:
        _state["code"] = _exit_code(code)
        original_exit(code)

    sys.excepthook = excepthook
    sys.exit = exit_  # type: ignore[assignment]
    atexit.register(_guard)


def _guard() -> None:
    n = blocked()
    if not n:
        return  # nothing blocked: the normal teardown is safe
    print(f"[yoco] {n} gloo wait(s) or collective(s) of abandoned generations still "
          "pending: leaving without the interpreter's teardown", file=sys.stderr)
    leave(int(_state["code"]))


def leave(code: int) -> NoReturn:
    """End the process now with ``code``: logging shut down and the output flushed, then
    ``os._exit`` -- no interpreter teardown, so no C++ destructor of a torch object runs
    while a gloo thread of an abandoned generation may still be joinable."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
