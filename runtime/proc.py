"""Process plumbing shared by the supervisor's children (workers and the spare zygote)."""

from __future__ import annotations

import contextlib
import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op
    elsewhere). A worker or zygote must not outlive its supervisor: it would keep
    training with nobody reporting, or hold the CPU after a supervisor SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
