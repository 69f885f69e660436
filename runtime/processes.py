"""The supervisor's worker processes: starting them (as new processes or forked from the
spare zygote), telling whether one is alive, and ending them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from runtime.zygote import ForkedProcess, Zygote, kept_zygote

log = logging.getLogger("yoco.runtime.processes")

_PF_EXITING = 0x4  # include/linux/sched.h: "getting shut down"
_HAVE_PROC = os.path.isdir("/proc/self")

Process = subprocess.Popen[bytes] | ForkedProcess



class _StatFiles:
    """``/proc/PID/stat`` of the processes being watched, each opened once and read again
    with ``pread``: the supervisor reads its members' every 5 ms, and an ``open`` each
    time cost four times the read (docs/benchmarks-runtime.md, "Figures behind the
    code"). A file held open keeps to its process: once that one is reaped the read fails
    (ESRCH) even if the number is given to a new process, and the file is closed then.
    At most :attr:`MAX` are held (the oldest closed first); thread-safe."""

    MAX = 256

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def read(self, pid: int) -> bytes | None:
        """The file's bytes, or None when process ``pid`` is gone."""
        with self._lock:
            fd = self._fds.get(pid)
            if fd is None:
                try:
                    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
                if len(self._fds) >= self.MAX:
                    os.close(self._fds.pop(next(iter(self._fds))))
                self._fds[pid] = fd
            try:
                raw = os.pread(fd, 4096, 0)
            except OSError:
                raw = b""
            if not raw:
                os.close(self._fds.pop(pid))
                return None
            return raw


_STAT_FILES = _StatFiles()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first), or None
    when the process is gone. The name is cut at the last ``)`` since it may hold spaces."""
    raw = _STAT_FILES.read(pid)
    if raw is None:
        return None
    return raw[raw.rindex(b")") + 2:].split()

def process_exiting(pid: int) -> bool:
    """True once the kernel has started to tear process ``pid`` down.

    A SIGKILLed process sets ``PF_EXITING`` (the flags word of ``/proc/PID/stat``, see
    proc(5)) at once, but its exit status becomes visible to ``waitpid`` only after its
    memory is unmapped, which for a torch process holding a few hundred MB takes a hundred
    times longer (docs/benchmarks-runtime.md, "Figures behind the code"). Deaths are
    therefore detected here, and classified by the exit status later.
    Without ``/proc`` this always answers False (``waitpid`` alone then detects deaths).
    """
    if not _HAVE_PROC:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return True  # already reaped
    return fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & _PF_EXITING)


#: The stopped-rank watchdog never fences before this many seconds without progress: a
#: few of the coordinator's 50 ms looks at the heartbeats, and a few 0.1 s beats missed.
STOPPED_FLOOR_S = 0.25


def stopped_deadline(step_seconds: float, factor: float) -> float:
    """Seconds without a committed step (or a heartbeat) after which a rank or host that
    ``/proc`` shows stopped is fenced: ``max(STOPPED_FLOOR_S, factor x step_seconds)``,
    the steady step being rank 0's mean of its last 20 steps. The rule's one home (the
    single-host watchdog and the node pool both use it); why it is safe: docs/runtime.md,
    "Hung worker"."""
    return max(STOPPED_FLOOR_S, factor * step_seconds)


def process_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped: state ``T`` (a stop signal: SIGSTOP,
    SIGTSTP) or ``t`` (held by a tracer) in ``/proc/PID/stat`` (proc(5)).

    A stopped process runs no instruction until it is continued, however loaded the
    machine is: a runnable but starved process is ``R``, one waiting for a peer or a
    sleep is ``S``, one in the kernel ``D``. This is the hang watchdog's confirmation
    that a silent rank or host is frozen rather than slow. Without ``/proc`` (or for a
    pid that is gone) it answers False.
    """
    if not _HAVE_PROC:
        return False
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in (b"T", b"t")


#: How long :meth:`WorkerPool.spawn` waits for a zygote that is still starting before it
#: starts a new process instead (a zygote that neither gets ready nor dies is broken).
ZYGOTE_START_WAIT_S = 120.0


class WorkerPool:
    """Every process of one job, by slot name (``w0``, ``w1``, ...)."""

    def __init__(self, *, python: str, script: str, args: list[str], log_dir: Path) -> None:
        self.python = python
        self.argv = [script, *args]
        self.log_dir = log_dir
        self.procs: dict[str, Process] = {}
        self.zygote: Zygote | None = None
        self._zygote_kept = False  # this process's kept zygote: not closed with the job
        self._logs: dict[str, IO[bytes]] = {}
        self._next_slot = 0

    def next_slot(self) -> str:
        """Reserve and return the next slot name."""
        slot = f"w{self._next_slot}"
        self._next_slot += 1
        return slot

    @property
    def started(self) -> int:
        """How many slots were handed out so far."""
        return self._next_slot

    def start_zygote(self, env: Mapping[str, str]) -> None:
        """Start the fork server (runtime.zygote) that the job's processes are forked
        from: the first workers and spares as well as their replacements -- or take this
        process's kept one (:func:`runtime.zygote.keep_zygotes`), which outlives the job."""
        log = (self.log_dir / "zygote.log").open("ab")
        kept = kept_zygote(self.python, dict(env), log)
        self._logs["zygote"] = log
        if kept is not None:
            self.zygote, self._zygote_kept = kept, True
            if kept.log is not log:  # kept from an earlier job: this job's log says so
                with contextlib.suppress(OSError):
                    log.write(f"[yoco] the zygote kept from an earlier job (pid "
                              f"{kept.pid}) forks this job's processes\n".encode())
                    log.flush()
            return
        self.zygote = Zygote(self.python, dict(env), log)

    def spawn(self, slot: str, env: dict[str, str]) -> None:
        """Start ``slot``: forked from the zygote (waiting up to
        :data:`ZYGOTE_START_WAIT_S` for one still starting), else a new process."""
        log_path = self.log_dir / f"{slot}.log"
        # A zygote still importing torch is waited for rather than raced: a new process
        # would make the same imports (on the same CPUs, slowing both down), so the
        # fork after the wait is ready no later, and N processes cost one import, not N.
        if self.zygote is not None and self.zygote.wait_ready(ZYGOTE_START_WAIT_S):
            try:
                self.procs[slot] = self.zygote.spawn(slot, self.argv, env, log_path,
                                                     full_env=self._zygote_kept)
                return
            except (RuntimeError, OSError) as exc:
                log.warning("spare zygote failed (%s): starting %s as a new process",
                            exc, slot)
        logf = log_path.open("ab")
        self._logs[slot] = logf
        self.procs[slot] = subprocess.Popen([self.python, *self.argv], env=env, stdout=logf,
                                            stderr=subprocess.STDOUT)

    def alive(self, slot: str) -> bool:
        """True while ``slot``'s process runs and is not being torn down."""
        p = self.procs.get(slot)
        return p is not None and p.poll() is None and not process_exiting(p.pid)

    def kill(self, slot: str) -> None:
        """SIGKILL ``slot``'s process."""
        self.procs[slot].kill()

    def exiting(self, slot: str) -> bool:
        """True once ``slot``'s process has started to die (see :func:`process_exiting`)."""
        return process_exiting(self.procs[slot].pid)

    def stopped(self, slot: str) -> bool:
        """True when ``slot``'s process is stopped (see :func:`process_stopped`)."""
        p = self.procs.get(slot)
        return p is not None and p.poll() is None and process_stopped(p.pid)

    def has_room(self) -> bool:
        """One host: always room for another process."""
        return True

    def room(self) -> int | None:
        """One host: no limit (None)."""
        return None

    def node_of(self, slot: str) -> str | None:
        """One host: the supervisor's own (None: the caller's default)."""
        return None

    def take_node_failures(self) -> list[Any]:
        """One host: no node is lost apart from the supervisor's own."""
        return []

    #: One host: the supervisor is never cut off from its processes (NodePool's).
    cut_off: str | None = None

    def quiet_nodes(self) -> set[str]:
        """One host: no node is ever silent (NodePool's: nodes that missed heartbeats)."""
        return set()

    def node_silences(self) -> dict[str, float]:
        """One host: no node heartbeats (NodePool's: seconds since each node's)."""
        return {}

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for every process to end, kill the rest, close logs."""
        deadline = time.time() + grace_s
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.time(), 0.05))
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.zygote is not None and not self._zygote_kept:
            self.zygote.close()
        for f in self._logs.values():
            f.close()
