"""The spare zygote forked from ``yoco run`` against one started as a new process.

    python bench/zygote_bench.py [--reps N] [--steps S]

Runs the real ``yoco run`` (``python -m yoco.cli_runtime run``, 2 workers + 1 spare,
``examples/mlp_train.py``, rank 1 SIGKILLed at step 5, a JSONL sink) N times each way,
interleaved: with the zygote forked from ``yoco run`` once torch is imported (the default,
``runtime.zygote.prefork``) and with ``YOCO_PREFORK=0`` (the zygote started as ``python -m
runtime.zygote``, which imports torch again). Per run: the wall time of the whole command
and the CPU time of its process tree (user + system of the command and every descendant
it reaped: the coordinator, the zygote, the workers), and when the zygote was ready
after the command started (the zygote log's first line and the supervisor's start are
not comparable across the two ways, so the figure is the whole command's). Prints the
medians and the ratio forked / new process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "examples" / "mlp_train.py")


def _one(tmp: Path, name: str, prefork: bool, steps: int) -> tuple[float, float]:
    """(wall s, CPU s of the process tree) of one ``yoco run``."""
    env = {**os.environ, "YOCO_PREFORK": "1" if prefork else "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "yoco.cli_runtime", "run", "--workers", "2", "--spares",
           "1", "--no-nvml", "--job-id", name, "--runs-root", str(tmp / "runs"), "--sink",
           f"jsonl:{tmp / (name + '.jsonl')}", "--inject", "kill:rank=1:step=5", SCRIPT,
           "--steps", str(steps)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{name}: yoco run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    zlog = (tmp / "runs" / name / "logs" / "zygote.log").read_text()
    if prefork != ("forked from pid" in zlog):
        sys.exit(f"{name}: the zygote was not started the way asked ({zlog[-500:]})")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    """Run the comparison and print it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="runs each way (default 5)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    args = ap.parse_args()
    if args.reps < 1 or args.steps < 6:
        ap.error("--reps must be >= 1 and --steps >= 6 (the kill is at step 5)")
    load = os.getloadavg()
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="yoco-zygote-bench-") as d:
        tmp = Path(d)
        for i in range(args.reps):
            for prefork in (True, False):
                got[prefork].append(_one(tmp, f"z{i}{'f' if prefork else 'n'}", prefork,
                                         args.steps))
                print(f"[zygote] run {i + 1}/{args.reps} "
                      f"{'forked' if prefork else 'new process'}: "
                      f"wall {got[prefork][-1][0]:.2f} s, CPU {got[prefork][-1][1]:.2f} s",
                      flush=True)
    print(f"[zygote] {args.reps} runs each way, 2 workers + 1 spare, a kill at step 5, "
          f"{args.steps} steps; load before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in got.items()}
    for k, label in ((True, "forked from yoco run"), (False, "new process")):
        print(f"[zygote]   {label:21s} median wall {med[k][0]:.2f} s, "
              f"CPU {med[k][1]:.2f} s")
    print(f"[zygote] forked / new process: wall {med[True][0] / med[False][0]:.3f}, "
          f"CPU {med[True][1] / med[False][1]:.3f}")


if __name__ == "__main__":
    main()
