"""A member with a gloo receive that its generation abandoned, still blocked at exit
(used by tests/runtime/test_end_barrier.py; not a test module).

argv: SLOT RANK STORE_PORT GUARD(1|0). Rank 1 posts a receive that rank 0 never sends,
waits on it through Membership.wait until the test publishes a new generation (so the
helper thread stays blocked), then exits. Rank 0 leaves when the ``exiting`` mark is set,
closing its sockets. Without the guard rank 1 sets that mark from inside its interpreter's
finalization (a ``__del__`` run when module globals are cleared, after the atexit hooks),
so the peer's sockets close while it finalizes -- whatever the machine's load, never
earlier, when the helper thread could still take the GIL and end cleanly. With the guard
rank 1 leaves from its atexit hook and never finalizes; the test sets the mark then.
"""

from __future__ import annotations

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
    """Run by the interpreter's finalization: lets rank 0 go, then keeps the finalization
    going (at most 60 s) while rank 0's sockets close. Without the guard the process dies
    of SIGABRT inside this sleep."""

    def __init__(self, store: object) -> None:
        self.store = store  # held here: module globals are already cleared when this runs

    def __del__(self) -> None:
        self.store.set("exiting", "1")  # type: ignore[attr-defined]
        time.sleep(60.0)


def main() -> None:
    """Run one of the two members."""
    slot, rank, port, guard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if guard == "0":
        exitguard._state["installed"] = True  # what the runtime did before the guard
    m = Membership(slot=slot, store_addr=("127.0.0.1", port), use_nccl=False,
                   poll_interval_s=0.002, regroup_timeout_s=60, collective_timeout_s=60,
                   current_step=lambda: 0)
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
    globals()["_slow"] = _SlowTeardown(m.store)


if __name__ == "__main__":
    main()
