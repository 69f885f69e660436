"""A member with a gloo receive that its generation abandoned, still blocked at exit
(used by tests/runtime/test_end_barrier.py; not a test module).

argv: SLOT RANK STORE_PORT GUARD(1|0). Rank 1 posts a receive that rank 0 never sends,
waits on it through Membership.wait until the test publishes a new generation (so the
helper thread stays blocked), then exits. Rank 0 leaves, closing its sockets, at the
start of rank 1's exit (its first atexit hook: ``exiting``) when rank 1 has the exit
guard, and once rank 1's interpreter is finalizing (``finalizing``, set by a __del__
that then holds the finalization open until rank 0 has gone) when it has not: the
moment that aborted an unguarded process, made certain however loaded the machine.
Rank 0 notes ``formed0`` once its groups are formed: the test publishes the next
generation only then (a rank still forming them would take it for its own failure).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from datetime import timedelta

import torch

from runtime import exitguard
from runtime import protocol as P
from runtime.errors import GenerationChanged
from runtime.membership import Membership


class _SlowTeardown:
    """Runs in the interpreter's finalization (a module global's __del__): tells rank 0
    to leave now, then keeps the finalization going until rank 0 has exited and a while
    after. What it calls is bound now: by then module globals and builtins may be gone."""

    def __init__(self, store: object, peer: int) -> None:
        self.store = store
        self.stat = f"/proc/{peer}/stat"
        self.open, self.sleep, self.now = open, time.sleep, time.monotonic

    def _peer_gone(self) -> bool:
        try:
            with self.open(self.stat, "rb") as fh:
                return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
        except OSError:
            return True

    def __del__(self) -> None:
        self.store.set("finalizing", "1")  # type: ignore[attr-defined]
        deadline = self.now() + 120
        while not self._peer_gone() and self.now() < deadline:
            self.sleep(0.01)
        self.sleep(20.0)  # the abort comes within ms of the peer's exit; never waited out


def main() -> None:
    """Run one of the two members."""
    slot, rank, port, guard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if guard == "0":
        exitguard._state["installed"] = True  # what the runtime did before the guard
    m = Membership(slot=slot, store_addr=("127.0.0.1", port), use_nccl=False,
                   poll_interval_s=0.002, regroup_timeout_s=60, collective_timeout_s=60,
                   current_step=lambda: 0)
    if rank == 0:
        m.store.set("pid0", str(os.getpid()))
    m.await_gen(0)
    m.form_groups(0, rank, 2)
    t = torch.zeros(10)
    if rank == 0:
        m.mark("formed0", "1")
        m.store.wait(["exiting" if guard == "1" else "finalizing"], timedelta(seconds=120))
        os._exit(0)  # its sockets close while rank 1 exits
    work = m.cpu_pg.recv([t], 0, 7)
    m.mark("posted", "1")
    try:
        m.wait(work, phase=P.Phase.SYNC)
    except GenerationChanged:
        print("abandoned", flush=True)
    globals()["_slow"] = _SlowTeardown(m.store, int(m.store.get("pid0")))
    atexit.register(lambda: m.mark("exiting", "1"))  # runs first (atexit is LIFO)


if __name__ == "__main__":
    main()
