"""A fork server for a job's processes: a process that has already imported torch and
forks a new worker at once instead of a fresh interpreter's seconds of imports.

Why: a spare that replaces one called in must be *warm* before the next move can use it,
and a fresh ``import torch`` takes seconds, several times longer on a loaded machine
(docs/benchmarks-runtime.md, "Figures behind the code"). The first workers and spares
are forked from it too (once it is ready): N fresh interpreters would make the same
imports N times over on the same CPUs, so they would be ready no sooner, and on a small
machine much later. The zygote imports torch and the runtime once, stays single-threaded
in Python and runs no torch op (so a fork is safe), and forks a child per request; the
child points its stdout/stderr at the worker's log, takes the worker's environment and
runs the training script as ``__main__``, exactly as ``python SCRIPT ARGS`` would.

Protocol (JSON lines): the supervisor writes ``{"slot", "env", "log", "argv"}`` to the
zygote's stdin; the zygote answers ``{"ready": true}`` once, then ``{"slot", "pid"}`` per
fork and ``{"pid", "rc"}`` when it has reaped a child (``rc`` as ``subprocess`` reports
it: negative for a signal). The zygote dies with the supervisor (parent-death signal),
and its children die with the zygote, so nothing outlives a killed supervisor.

Forked from the process that runs the job (:func:`prefork`): ``yoco run`` has torch
imported before it starts a thread, so it forks its zygote at that point instead of
starting ``python -m runtime.zygote``, which would import torch a second time (seconds of
CPU per host, before the first worker can start). The fork waits, doing nothing, until
:class:`Zygote` takes it with the job's environment and log; asked for with another
environment (torch reads some variables when it is imported) or another interpreter, the
fork ends and the zygote starts as a new process, as without it. A worker forked from a
preforked zygote ends the way ``python SCRIPT`` does (its exit status, an uncaught
exception's traceback through ``sys.excepthook``, the interpreter's shutdown), though its
stack holds the frames of ``yoco run`` that forked it: see :func:`_run_script`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from runtime.proc import set_parent_death_signal

log = logging.getLogger(__name__)


def _child(req: dict[str, Any]) -> None:
    """In the forked child: become the worker. Does not return: the script's end (or
    its exception) unwinds out of the zygote's loop and ends this process the way
    ``python SCRIPT`` ends, interpreter finalization included, so a forked worker costs
    the same at exit as one started as a new process."""
    try:
        # stdout (the zygote's report pipe) and stderr become the worker's log.
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if fd > 2:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if req.get("full_env"):  # the whole environment, not additions to the zygote's
            os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = list(req["argv"])
        sys.path[0] = str(Path(req["argv"][0]).resolve().parent)
        # A log on a full disk must not end the worker before it starts (its output is
        # then lost; the job is not).
        with contextlib.suppress(OSError):
            print(f"[yoco] {req['slot']} forked by the spare zygote (torch already "
                  "imported)", flush=True)
    except BaseException:  # could not even become the worker
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
        os._exit(1)
    _run_script(req["argv"][0])


def _run_script(path: str) -> None:
    """Run the script as ``__main__`` and end the process as ``python SCRIPT`` ends. Never
    returns: the script's end raises ``SystemExit`` (with the script's exit status), which
    unwinds to the interpreter's top level and its usual shutdown (non-daemon threads
    joined, ``atexit`` handlers, destructors).

    Why the script's exceptions are caught here: in a zygote forked from ``yoco run``
    (:func:`prefork`), the frames between this one and the top level are the CLI's, which
    would treat an exception as theirs (click turns ``KeyboardInterrupt`` into "Aborted!",
    a CLI's error handler would print its own message). ``SystemExit`` passes through them
    untouched, so any other exception is reported here, through ``sys.excepthook`` as the
    interpreter would, and becomes exit status 1. An uncaught ``KeyboardInterrupt`` ends
    the process by SIGINT after its traceback, as the interpreter does, but without the
    interpreter's shutdown."""
    global _in_worker
    _in_worker = True
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)  # not reached: SIGINT's default ends the process
    except BaseException:
        sys.excepthook(*sys.exc_info())
        raise SystemExit(1) from None
    raise SystemExit(0)


#: True in a worker forked by the zygote (its exceptions are the script's, not the
#: zygote's: they unwind, whatever kind of zygote forked it).
_in_worker = False


def main(*, preforked: bool = False) -> None:
    """Run the zygote: import torch, then fork a worker per request until stdin closes.
    ``preforked``: forked from ``yoco run`` (:func:`prefork`), which has set this process's
    parent-death signal and imported torch already."""
    if not preforked:
        set_parent_death_signal()
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # the point of this process
    import torch._dynamo  # an optimizer's constructor imports it lazily (seconds)
    import torch.distributed

    import runtime.job  # noqa: F401

    # Build each common optimizer once, for the rest of their lazy imports. No torch op
    # runs on more than one element (no parallel work), so no thread pool exists that a
    # fork would break.
    probe = torch.nn.Parameter(torch.zeros(1))
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad):
        cls([probe])
    _freeze_imported()

    out = sys.stdout.fileno()

    def send(obj: dict[str, Any]) -> None:
        os.write(out, (json.dumps(obj) + "\n").encode())

    send({"ready": True})
    stdin = sys.stdin.buffer
    buf = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.005)
        if readable:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                break  # the supervisor closed the pipe (or died)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children.add(pid)
                send({"id": req.get("id", req["slot"]), "slot": req["slot"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            send({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})
    for pid in children:  # the supervisor is done or gone: so are its workers
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:  # reap them, so that no zombie is left behind
        with contextlib.suppress(OSError):
            _, status = os.waitpid(pid, 0)
            send({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})
    # Leave without the interpreter's teardown: the zygote holds nothing to flush or
    # release (its reports are written unbuffered), and tearing down an interpreter with
    # torch and torch._dynamo loaded takes seconds, which the job's end waits for. (Its
    # children never get here: a child's script ends by raising out of this function.)
    sys.stderr.flush()
    os._exit(0)


class ForkedProcess:
    """A worker forked by the zygote, with the part of ``subprocess.Popen``'s interface
    the supervisor uses (its exit status comes from the zygote, which reaps it)."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        """The exit status once the zygote has reaped the process, else None."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._zygote.cond:
            while self.returncode is None:
                if not self._zygote.alive:
                    self.returncode = -signal.SIGKILL  # died with the zygote
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
                self._zygote.cond.wait(left)
            return self.returncode

    def kill(self) -> None:
        """Send SIGKILL (nothing if it has already been reaped)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """The supervisor's handle on its fork server (see the module docstring)."""

    def __init__(self, python: str, env: dict[str, str], log: IO[bytes]) -> None:
        self.cond = threading.Condition()
        self.ready = False
        self.alive = True
        self.log = log  # where the zygote's own output goes
        self._procs: dict[int, ForkedProcess] = {}
        self._exits: dict[int, int] = {}  # reaped before their pid was claimed
        # By request id (slot names repeat in every job a kept zygote serves).
        self._pids: dict[str, int] = {}
        self._requests = 0
        # Forks given up on (spawn timed out; the caller started a new process for the
        # slot instead): killed as soon as the zygote reports them, so that no second
        # process runs as that slot.
        self._abandoned: set[str] = set()
        self._proc: subprocess.Popen[bytes] | PreforkedProcess
        taken = take_preforked(python, env, getattr(log, "name", None))
        self.preforked = taken is not None
        if taken is not None:
            self._proc = taken
        else:
            self._proc = subprocess.Popen([python, "-m", "runtime.zygote"], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log)
        self.pid = self._proc.pid
        threading.Thread(target=self._read, name="yoco-zygote", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            msg = json.loads(raw)
            with self.cond:
                if msg.get("ready"):
                    self.ready = True
                elif "rc" in msg:
                    proc = self._procs.get(msg["pid"])
                    if proc is not None:
                        proc.returncode = int(msg["rc"])
                    else:
                        self._exits[msg["pid"]] = int(msg["rc"])
                elif msg.get("id", msg["slot"]) in self._abandoned:
                    self._abandoned.discard(msg.get("id", msg["slot"]))
                    with contextlib.suppress(OSError):
                        os.kill(int(msg["pid"]), signal.SIGKILL)
                else:
                    self._pids[msg.get("id", msg["slot"])] = int(msg["pid"])
                self.cond.notify_all()
        with self.cond:
            self.alive = False
            self.ready = False
            self.cond.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the zygote to be ready; True when it is
        (False at once when it has exited)."""
        with self.cond:
            return self.cond.wait_for(lambda: self.ready or not self.alive, timeout) \
                and self.ready

    def spawn(self, slot: str, argv: list[str], env: dict[str, str], log: Path,
              timeout: float = 10.0, *, full_env: bool = False) -> ForkedProcess:
        """Fork a worker named ``slot`` running ``argv`` (script first) with ``env``
        added to the zygote's environment (``full_env``: ``env`` is the whole of it) and
        its output appended to ``log``."""
        assert self._proc.stdin is not None
        with self.cond:
            self._requests += 1
            rid = f"{slot}#{self._requests}"
        req = {"id": rid, "slot": slot, "argv": argv, "env": env, "log": str(log),
               "full_env": full_env}
        try:
            if not self.alive:
                raise ValueError("exited")
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:  # closed, or the zygote died
            raise RuntimeError(f"the spare zygote is not running: {exc}") from exc
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self._pids or not self.alive, timeout):
                self._abandoned.add(rid)
                raise RuntimeError(f"the spare zygote did not fork {slot} in {timeout} s")
            if rid not in self._pids:
                raise RuntimeError("the spare zygote exited")
            pid = self._pids.pop(rid)
            proc = ForkedProcess(pid, self)
            if pid in self._exits:
                proc.returncode = self._exits.pop(pid)
            self._procs[pid] = proc
            return proc

    def kill(self) -> None:
        """SIGKILL the zygote now, without waiting (a watchdog's way: no blocking call);
        nothing if it has ended. Its forked children are not its to end then."""
        if self._proc.poll() is None:
            self._proc.kill()

    def close(self) -> None:
        """Stop the zygote (it kills any child still running)."""
        with contextlib.suppress(Exception):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# Zygotes kept for the next job of this process (see keep_zygotes).

_keep: tuple[str, ...] | None = None  # None: off; else the variables a key ignores
_kept: dict[tuple[str, frozenset[tuple[str, str]]], Zygote] = {}
_kept_lock = threading.Lock()  # two jobs launched at once from two threads: one zygote
#: The most zygotes kept at once (one per interpreter and environment; the oldest goes).
KEPT_MAX = 4


def keep_zygotes(*, ignore_env: tuple[str, ...] = ()) -> None:
    """From now on, a zygote a job of this process starts is kept when the job ends, and
    the next job started with the same interpreter and environment forks from it instead
    of starting one (which imports torch again: seconds of CPU). For a program that runs
    jobs one after another through :func:`runtime.supervisor.launch` (a test suite, a
    driver of many small jobs); ``yoco run`` forks its own zygote instead (:func:`prefork`).

    ``ignore_env``: variables that may differ between two jobs sharing a zygote (none of
    them read when torch is imported), e.g. ``PYTEST_CURRENT_TEST``. A kept zygote's
    workers get the job's whole environment (not additions to the zygote's), so nothing
    of an earlier job's leaks into a later one's."""
    global _keep
    _keep = tuple(ignore_env)


def kept_zygote(python: str, env: dict[str, str], log: IO[bytes]) -> Zygote | None:
    """The kept zygote for ``python`` and ``env`` (started now, logging to ``log``, if
    there is none alive), or None when zygotes are not kept (:func:`keep_zygotes`)."""
    if _keep is None:
        return None
    key = (python, frozenset((k, v) for k, v in env.items() if k not in _keep))
    with _kept_lock:
        z = _kept.get(key)
        if z is not None and z.alive:
            return z
        _kept.pop(key, None)
        while len(_kept) >= KEPT_MAX:
            _kept.pop(next(iter(_kept))).close()
        z = Zygote(python, env, log)
        _kept[key] = z
        return z


# A zygote forked from the process that runs the job (see the module docstring).


class PreforkedProcess:
    """A zygote forked by :func:`prefork`, with the part of ``subprocess.Popen``'s
    interface :class:`Zygote` uses (this process is its parent and reaps it)."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time (Popen has the same)

    def poll(self) -> int | None:
        """The exit status once the zygote has ended (reaped here), else None."""
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its status is lost
                    self.returncode = -signal.SIGKILL
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout or 0)
            time.sleep(0.01)
        return rc

    def kill(self) -> None:
        """Send SIGKILL (nothing once it has been reaped)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


@dataclass
class _Fork:
    pid: int
    to_child: int  # the start message, then the fork requests (the zygote's stdin)
    from_child: int  # the zygote's reports (its stdout)
    env: dict[str, str]


_fork: _Fork | None = None


def _freeze_imported() -> None:
    """Move every object the imports made out of the cyclic garbage collector's sight
    (``gc.freeze``), as Python's documentation advises before forks without exec.

    torch, torch._dynamo and sympy leave about a million objects behind. A worker forked
    from here otherwise walks all of them in each full collection, the ones of its
    interpreter's shutdown included, writing to every page of the zygote's heap it shares
    (copy on write): about half a second of CPU per forked process, more than a short
    job's training (docs/benchmarks-runtime.md, "Figures behind the code"). Frozen, they
    are never collected: they live as long as the process anyway. The shutdown itself is
    unchanged (``atexit`` handlers, destructors, file flushes)."""
    gc.collect()
    gc.freeze()


def prefork() -> bool:
    """Fork this process's spare zygote now (see the module docstring). Returns True when
    one was forked, False where it cannot be: no ``fork``, another thread running (a fork
    copies only the calling thread, so a lock held by another one would stay held in the
    zygote forever), or one forked already.

    Call it from the main thread once torch is imported and before any thread starts,
    in a frame from which ``SystemExit`` unwinds to the interpreter's top level: the
    workers forked from this zygote end by raising it out of this call. The zygote waits
    for :func:`take_preforked` and ends when this process does, or closes its end."""
    global _fork
    if _fork is not None or not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    import torch  # noqa: F401  (the point: the zygote has it already)

    _freeze_imported()  # this process's imports too: its zygote shares them
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    env = dict(os.environ)
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        os.close(to_child_w)
        os.close(from_child_r)
        _serve_preforked(parent, to_child_r, from_child_w)  # returns in a worker only
        return False  # not reached: a worker raises SystemExit
    os.close(to_child_r)
    os.close(from_child_w)
    _fork = _Fork(pid, to_child_w, from_child_r, env)
    return True


def _serve_preforked(parent: int, requests: int, reports: int) -> None:
    """In the forked zygote: wait for the start message, then serve as the zygote. Never
    returns, except by an exception raised out of a worker it forked."""
    try:
        set_parent_death_signal()
        if os.getppid() != parent:  # it died before the death signal was set
            os._exit(0)
        sys.excepthook = sys.__excepthook__  # the script's, not the CLI's, if any
        line = bytearray()
        while not line.endswith(b"\n"):  # a byte at a time: the requests follow it
            chunk = os.read(requests, 1)
            if not chunk:  # not taken: this process ended or gave it up
                os._exit(0)
            line += chunk
        start = json.loads(line)
        os.environ.clear()
        os.environ.update(start["env"])
        log_fd = os.open(start["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 2)
        os.dup2(requests, 0)
        os.dup2(reports, 1)
        for fd in (log_fd, requests, reports):
            if fd > 2:
                os.close(fd)
        print(f"[yoco] spare zygote forked from pid {parent} (torch already imported)",
              file=sys.stderr, flush=True)
        main(preforked=True)
    except BaseException:
        if _in_worker:
            raise  # a worker's end: to the top level, as ``python SCRIPT`` ends
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # not reached: main() leaves by os._exit


def _discard(fork: _Fork) -> None:
    """End a forked zygote that will not be used (it reads end-of-file and exits) and
    reap it."""
    os.close(fork.to_child)
    os.close(fork.from_child)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(fork.pid, 0)


def take_preforked(python: str, env: dict[str, str], log_path: str | None
                   ) -> PreforkedProcess | None:
    """The zygote :func:`prefork` forked, started with ``env`` and its stderr appended to
    ``log_path``; None when there is none, or when it would not be the zygote asked for
    (the interpreter is not this one, ``env`` is not the environment it was forked with, or
    no log path): then it ends, and the caller starts ``python -m runtime.zygote``."""
    global _fork
    fork, _fork = _fork, None
    if fork is None:
        return None
    unusable = ("no log file" if not isinstance(log_path, str)
                else "another environment" if env != fork.env
                else "another interpreter"
                if os.path.realpath(python) != os.path.realpath(sys.executable) else None)
    if unusable is not None:
        _discard(fork)
        log.info("the zygote forked at start-up is not used (%s): starting a new one",
                 unusable)
        return None
    try:
        os.write(fork.to_child, (json.dumps({"env": env, "log": log_path}) + "\n").encode())
    except OSError:  # it has died
        _discard(fork)
        return None
    return PreforkedProcess(fork.pid, os.fdopen(fork.to_child, "wb"),
                            os.fdopen(fork.from_child, "rb"))


if __name__ == "__main__":
    main()
