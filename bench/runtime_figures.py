"""Small measurements behind the runtime's design comments (not a product benchmark: the
runtime's benchmarks are bench/runtime_bench.py and bench/hsdp_bench.py).

    python bench/runtime_figures.py

Prints: the time of ``import torch`` and then of ``import torch._dynamo`` in a fresh
interpreter (runtime/zygote.py); the median time of a gloo allreduce between two ranks
(threads of one process, loopback) for 4 B, 64 KiB and 1 MiB (runtime/state.py packs
tensors under 256 KiB into one buffer); and, for a SIGKILLed torch process holding
300 MB, when ``PF_EXITING`` shows in /proc and when ``waitpid`` returns
(runtime/processes.py). Quoted in docs/benchmarks-runtime.md, "Figures behind the code".
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IMPORTS = ("import time; t = time.monotonic(); import torch; a = time.monotonic() - t; "
           "t = time.monotonic(); import torch._dynamo; b = time.monotonic() - t; "
           "print(f'{a:.2f} {b:.2f}')")
HOLDER = ("import time, torch; x = torch.ones(300 * 2**20 // 4); x.add_(1); "
          "print('ready', flush=True); time.sleep(60)")


def _imports(runs: int = 3) -> None:
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                             check=True, timeout=120).stdout.split()
        print(f"import torch {out[0]} s, then import torch._dynamo {out[1]} s")


def _gloo_pair() -> list:
    import torch.distributed as dist

    store = dist.HashStore()
    pgs: list = [None, None]

    def make(rank: int) -> None:
        pgs[rank] = dist.ProcessGroupGloo(dist.PrefixStore("p/", store), rank, 2,
                                          timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return pgs


def _collectives(reps: int = 200) -> None:
    import torch

    pgs = _gloo_pair()
    for n in (1, 16 * 1024, 256 * 1024):
        xs = [torch.ones(n), torch.ones(n)]
        times = []
        for _ in range(reps):
            t = time.monotonic()
            works = [pgs[r].allreduce([xs[r]]) for r in range(2)]
            for w in works:
                w.wait()
            times.append(time.monotonic() - t)
        print(f"gloo allreduce of {n * 4} bytes, 2 ranks: median "
              f"{statistics.median(times) * 1e3:.3f} ms over {reps}")


def _kill(runs: int = 3) -> None:
    from runtime.processes import process_exiting

    for _ in range(runs):
        child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout is not None
        child.stdout.readline()
        t = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        deadline = t + 10
        while not process_exiting(child.pid) and time.monotonic() < deadline:
            time.sleep(0.0002)
        exiting = time.monotonic() - t
        child.wait(timeout=10)
        reaped = time.monotonic() - t
        print(f"SIGKILL of a torch process holding 300 MB: PF_EXITING after "
              f"{exiting * 1e3:.1f} ms, waitpid after {reaped * 1e3:.1f} ms")


if __name__ == "__main__":
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    _imports()
    _collectives()
    _kill()
