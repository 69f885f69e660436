"""A member with a gloo receive that its generation abandoned, still blocked at exit
(used by tests/runtime/test_end_barrier.py; not a test module).

argv: SLOT RANK STORE_PORT GUARD(1|0). Rank 1 posts a receive that rank 0 never sends,
waits on it through Membership.wait until the test publishes a new generation (so the
helper thread stays blocked), then exits; at the start of its exit rank 0 leaves too,
closing its sockets while rank 1's interpreter is finalizing (held open until rank 0
has gone).
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


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


class _SlowTeardown:
    """Keeps the interpreter's finalization going (it runs this __del__) until the peer
    has exited and a while after, so that the peer's exit falls inside it however loaded
    the machine is (a fixed pause can end before a starved peer has left)."""

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def __del__(self) -> None:
        deadline = time.monotonic() + 120
        while not _gone(self.peer) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(20.0)  # the abort comes within ms of the peer's exit; never waited out


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
        m.store.wait(["exiting"], timedelta(seconds=120))
        os._exit(0)  # its sockets close while rank 1 finalizes
    work = m.cpu_pg.recv([t], 0, 7)
    m.mark("posted", "1")
    try:
        m.wait(work, phase=P.Phase.SYNC)
    except GenerationChanged:
        print("abandoned", flush=True)
    globals()["_slow"] = _SlowTeardown(int(m.store.get("pid0")))
    atexit.register(lambda: m.mark("exiting", "1"))  # runs first (atexit is LIFO)


if __name__ == "__main__":
    main()
