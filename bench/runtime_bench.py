"""Benchmarks of the migration runtime on this machine (CPU, gloo, loopback).

    python bench/runtime_bench.py [--section throughput|recovery|all]

Prints figures as ratios against peers run in the same process:
* throughput: examples/mlp_train.py under the runtime vs the same loop in plain DDP;
* recovery: SIGKILL of one worker of a job whose state is ~200 MB, broken down into
  detection, regrouping, transfer and first step, against state bytes / loopback TCP
  bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch.distributed as dist  # noqa: E402

from runtime.faults import parse_fault  # noqa: E402
from runtime.sink import JsonlFileSink  # noqa: E402
from runtime.supervisor import LaunchConfig, launch  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "mlp_train.py")


def run_runtime(tmp: Path, name: str, model: list[str], steps: int, warmup: int,
                workers: int, spares: int, faults: list[str] | None = None,
                ckpt: int = 0):
    tf = tmp / f"{name}.time"
    cfg = LaunchConfig(script=EXAMPLE, args=[*model, "--steps", str(steps), "--warmup",
                                             str(warmup), "--time-file", str(tf)],
                       workers=workers, spares=spares, job_id=name, runs_root=str(tmp),
                       checkpoint_every=ckpt, nvml=False, progress_interval_s=5,
                       faults=[parse_fault(f) for f in faults or []])
    result = launch(cfg, JsonlFileSink(tmp / f"{name}.jsonl"))
    return float(tf.read_text()), result


def run_ddp(tmp: Path, name: str, hidden: int, layers: int, dim: int, batch: int,
            steps: int, warmup: int, workers: int) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    out = tmp / f"{name}.time"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "runtime_ddp_worker.py"),
                               str(r), str(workers), str(store.port), str(steps), str(out),
                               str(hidden), str(layers), str(dim), str(batch), str(warmup)])
             for r in range(workers)]
    for p in procs:
        p.wait()
    return float(out.read_text())


def throughput(tmp: Path) -> None:
    hidden, layers, dim, batch = 1024, 4, 256, 64
    model = ["--hidden", str(hidden), "--layers", str(layers), "--dim", str(dim),
             "--batch", str(batch)]
    steps, warmup = 160, 20
    ours, ddp = [], []
    for i in range(3):
        ddp.append(run_ddp(tmp, f"ddp{i}", hidden, layers, dim, batch, steps, warmup, 2))
        ours.append(run_runtime(tmp, f"tp{i}", model, steps, warmup, 2, 1)[0])
    o, d = statistics.median(ours), statistics.median(ddp)
    print(f"[throughput] model hidden={hidden} layers={layers} dim={dim} batch={batch}/worker, "
          f"2 workers (+1 idle spare for ours), {steps - warmup} timed steps, median of 3")
    print(f"[throughput] step time: runtime {o * 1e3:.1f} ms, plain DDP {d * 1e3:.1f} ms; "
          f"throughput ratio runtime/DDP = {d / o:.3f}  (runs ms: ours "
          f"{[round(x * 1e3, 1) for x in ours]}, ddp {[round(x * 1e3, 1) for x in ddp]})")


def loopback_bandwidth(nbytes: int) -> float:
    """Bytes/s of one TCP stream over loopback (receiver in another process)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = (f"import socket,sys;s=socket.create_connection(('127.0.0.1',{port}));"
            "buf=bytearray(1<<22);n=0\nwhile True:\n k=s.recv_into(buf)\n if not k: break\n"
            " n+=k\ns.sendall(b'k')")
    child = subprocess.Popen([sys.executable, "-c", code])
    conn, _ = srv.accept()
    data = bytes(nbytes)
    best = 0.0
    t0 = time.perf_counter()
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    best = nbytes / (time.perf_counter() - t0)
    child.wait()
    conn.close()
    srv.close()
    return best


def recovery(tmp: Path) -> None:
    model = ["--hidden", "2048", "--layers", "5", "--dim", "256", "--batch", "16"]
    _, result = run_runtime(tmp, "rec", model, steps=40, warmup=5, workers=2, spares=1,
                            faults=["kill:rank=1:step=20"])
    rec = result.recoveries[0]
    state_bytes = rec["bytes"]
    bw = statistics.median(loopback_bandwidth(state_bytes) for _ in range(3))
    bound = state_bytes / bw
    total = rec["first_step"] - rec["killed_at"]
    parts = {
        "detection (SIGKILL -> supervisor sees it)": rec["detected"] - rec["killed_at"],
        "regroup (plan, abandon step, new gloo group)": rec["pg"] - rec["detected"],
        "transfer (commit vote + state to spare)": rec["synced"] - rec["pg"],
        "first step on the new group": rec["first_step"] - rec["synced"],
    }
    print(f"[recovery] state moved {state_bytes / 1e6:.1f} MB; loopback TCP {bw / 2**30:.2f} GiB/s "
          f"-> lower bound {bound * 1e3:.0f} ms")
    for k, v in parts.items():
        print(f"[recovery]   {k}: {v * 1e3:.0f} ms")
    print(f"[recovery] SIGKILL -> first completed step: {total * 1e3:.0f} ms = "
          f"{total / bound:.2f} x bound (recorded recovery_seconds, from detection: "
          f"{(rec['first_step'] - rec['detected']) * 1e3:.0f} ms); outcome {rec['outcome']}, "
          f"lost steps {rec['lost_steps']}; steady step time {rec['step_seconds'] * 1e3:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default="all", choices=["all", "throughput", "recovery"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if a.section in ("all", "throughput"):
            throughput(tmp)
        if a.section in ("all", "recovery"):
            recovery(tmp)


if __name__ == "__main__":
    main()
