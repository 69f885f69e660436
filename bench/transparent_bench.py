"""Transparent mode (``yoco run --transparent``) against plain ``torchrun`` and against
model-aware mode.

    python bench/transparent_bench.py [--reps N] [--dim D] [--layers L] [--epochs E]

* **throughput**: the unmodified small-GPT script (tests/runtime/scripts/ddp_gpt.py: DDP,
  DataLoader + DistributedSampler, AdamW, warm-up + cosine, clipping) under plain
  ``torchrun`` (the real DistributedDataParallel) and under ``yoco run --transparent`` (2
  workers + 1 idle spare), interleaved, N runs each; each run's figure is the median of
  the step times rank 0's script logs itself (its first 5 steps left out). Goal ≥ 0.98.
* **recovery**: the same script under ``--transparent`` with a rank SIGKILLed in its
  gradient reduction, against the model-aware reference script (examples/gpt_train.py,
  ``runtime.Job``) with the same kill; each failure's ``recovery_seconds`` and
  ``step_seconds`` as the runtime records them (the outcome record).

Every process runs with ``OMP_NUM_THREADS=1`` (what torchrun sets).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.faults import parse_fault  # noqa: E402
from runtime.sink import JsonlFileSink  # noqa: E402
from runtime.supervisor import LaunchConfig, launch  # noqa: E402
from runtime.transparent import LAUNCHER  # noqa: E402

GPT = str(ROOT / "tests" / "runtime" / "scripts" / "ddp_gpt.py")
AWARE = str(ROOT / "examples" / "gpt_train.py")
ENV = {"OMP_NUM_THREADS": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_step(timing: Path) -> float:
    steps = json.loads(timing.read_text())["step_seconds"][5:]
    return statistics.median(steps)


def _torchrun(tmp: Path, name: str, model: list[str]) -> float:
    timing = tmp / f"{name}.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-addr", "127.0.0.1", "--master-port", str(_port()), GPT,
                    *model, "--out", str(tmp / f"{name}.pt"), "--timing", str(timing)],
                   env={**os.environ, **ENV}, check=True, capture_output=True)
    return _median_step(timing)


def _transparent(tmp: Path, name: str, model: list[str], faults: list[str] = (),
                 ) -> tuple[float, list[dict[str, Any]]]:
    timing = tmp / f"{name}.json"
    sink = JsonlFileSink(tmp / f"{name}.jsonl")
    cfg = LaunchConfig(script=LAUNCHER, args=[GPT, *model, "--out", str(tmp / f"{name}.pt"),
                                              "--timing", str(timing)],
                       workers=2, spares=1, job_id=name, contract_id="bench",
                       runs_root=str(tmp / "runs"), nvml=False, env=dict(ENV),
                       faults=[parse_fault(f) for f in faults])
    result = launch(cfg, sink)
    if result.exit_code != 0:
        raise SystemExit(f"{name} failed: {result}")
    return _median_step(timing), sink.read_all()


def _aware(tmp: Path, name: str, faults: list[str]) -> list[dict[str, Any]]:
    sink = JsonlFileSink(tmp / f"{name}.jsonl")
    cfg = LaunchConfig(script=AWARE, args=["--steps", "40"], workers=2, spares=1,
                       job_id=name, contract_id="bench", runs_root=str(tmp / "runs"),
                       nvml=False, env=dict(ENV), faults=[parse_fault(f) for f in faults])
    result = launch(cfg, sink)
    if result.exit_code != 0:
        raise SystemExit(f"{name} failed: {result}")
    return sink.read_all()


def _outcomes(recs: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    return [(r["outcome"], r["recovery_seconds"], r["step_seconds"]) for r in recs
            if r["kind"] == "outcome"]


def main() -> None:
    """Run both sections and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=640)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = ["--dim", str(args.dim), "--layers", str(args.layers), "--epochs",
             str(args.epochs), "--samples", str(args.samples)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ref, ours = [], []
        for i in range(args.reps):
            ref.append(_torchrun(tmp, f"torchrun{i}", model))
            ours.append(_transparent(tmp, f"transparent{i}", model)[0])
        print(f"[throughput] {' '.join(model)}, 2 workers, {args.reps} interleaved runs; "
              f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"[throughput]   torchrun     median {statistics.median(ref) * 1e3:7.1f} "
              f"ms/step  (runs {[round(x * 1e3, 1) for x in ref]})")
        print(f"[throughput]   transparent  median {statistics.median(ours) * 1e3:7.1f} "
              f"ms/step  (runs {[round(x * 1e3, 1) for x in ours]})")
        ratios = [r / o for r, o in zip(ref, ours, strict=True)]
        print(f"[throughput] ratio transparent/torchrun (throughput): median "
              f"{statistics.median(ratios):.3f}, per run {[round(x, 3) for x in ratios]}")
        for i in range(args.reps):
            _, recs = _transparent(tmp, f"tkill{i}", model, ["kill:rank=1:step=12"])
            print(f"[recovery] transparent (outcome, recovery s, step s): {_outcomes(recs)}")
            print(f"[recovery] model-aware (outcome, recovery s, step s): "
                  f"{_outcomes(_aware(tmp, f'akill{i}', ['kill:rank=1:step=12']))}")
        print(f"[recovery] load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
