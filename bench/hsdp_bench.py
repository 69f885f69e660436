"""HSDP benchmarks: the GPT example sharded with FSDP2 under the runtime.

    python bench/hsdp_bench.py [--section throughput|recovery|all] [--reps N]
                               [--models big,small] [--phases backward,reduce]

* throughput: ``examples/gpt_train.py --fsdp`` under the runtime (``--workers 4 --shards
  2``, no spare) against ``bench/hsdp_baseline_worker.py`` (plain FSDP2 HSDP on a 2-D
  mesh, one gloo world, no fault tolerance) and, when TorchFT is installed,
  ``bench/hsdp_torchft_worker.py`` (TorchFT's HSDP); same model, data and loop;
  interleaved runs, ratio of throughputs (goal >= 0.98 against plain FSDP2).
* recovery: the same job with a spare, rank 2 (replica group 1, shard 0) SIGKILLed in
  FSDP2's backward (``backward``: mid-step, where a failure lands most of the time) or
  with its cross-group reduction launched (``reduce``: the step's end), so that rank 0 is
  the one sending the shard (its timing is read). SIGKILL -> first completed step on the
  new group, and the stall (that minus one steady step: design §6), against the bytes
  the replacement received (its shard of the model and AdamW state) / the best measured
  loopback bandwidth (TCP or gloo send/recv, as bench/runtime_bench.py measures it, after
  each run). Goal: stall <= 3 x (the first round's), <= 1.5 x (design §6). Each run also prints
  the recovery's phases from every worker's timeline (``YOCO_TIMELINE``), the median of
  each over the runs, and the load average. ``big`` (the default): a ~170 MB shard per
  rank (~28 M parameters); ``small``: the throughput model (a ~19 MB shard).

CUDA/NCCL: not run here (no GPU); see docs/benchmarks-runtime.md for the one command.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.runtime_bench import env, gloo_bandwidth, load, new_store, tcp_bandwidth
from runtime import protocol as P
from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch

ROOT = Path(__file__).resolve().parents[1]
GPT = str(ROOT / "examples" / "gpt_train.py")
PEER = str(ROOT / "bench" / "hsdp_baseline_worker.py")
TORCHFT = str(ROOT / "bench" / "hsdp_torchft_worker.py")
# ~3.2 M parameters (dim 256, 4 blocks): 12.7 MB of weights, 38 MB with AdamW's moments;
# short sequences so that a step is a fraction of a second on a busy 2-core machine.
MODEL = ["--dim", "256", "--layers", "4", "--heads", "8", "--seq", "32", "--micro-batch",
         "2", "--accum", "2", "--text-chars", "50000", "--warmup-steps", "5"]
# The recovery's model: a shard that is large next to the fixed costs of a recovery (~28 M
# parameters, dim 768: each rank's shard of weights + AdamW state is ~170 MB; 5 such
# processes and their FSDP2 buffers take ~4 GB of the shared machine) and a step as short
# as that shard allows (one micro-batch of 16 tokens: the step is FSDP2's all-gathers,
# reduce-scatters and AdamW over 14 M parameters per rank, i.e. it grows with the shard
# whatever the batch), so that the stall is not lost in the step's own variation. See
# docs/benchmarks-runtime.md §6 for why this is the fair one of those that run here.
BIG = ["--dim", "768", "--layers", "4", "--heads", "12", "--seq", "16", "--micro-batch",
       "1", "--accum", "1", "--text-chars", "20000", "--warmup-steps", "5"]
WORKERS, SHARDS = 4, 2


def run_runtime(tmp: Path, name: str, steps: int, warmup: int, spares: int,
                faults: list[str] | None = None, model: list[str] | None = None,
                timeline: Path | None = None) -> tuple[float, object]:
    """Mean steady step time (rank 0) of the example under the runtime, and the result.
    ``timeline``: a directory where every worker stamps its recovery events."""
    tf = tmp / f"{name}.time"
    extra = {P.ENV_TIMELINE: str(timeline)} if timeline is not None else {}
    cfg = LaunchConfig(script=GPT, args=[*(model or MODEL), "--fsdp", "--steps", str(steps),
                                         "--warmup-timing", str(warmup), "--time-file",
                                         str(tf), "--log-every", "0"],
                       workers=WORKERS, shards=SHARDS, spares=spares, job_id=name,
                       runs_root=str(tmp), nvml=False, progress_interval_s=5,
                       faults=[parse_fault(f) for f in faults or []],
                       env={**env(), **extra})
    result = launch(cfg, JsonlFileSink(tmp / f"{name}.jsonl"))
    assert result.exit_code == 0, result
    return float(tf.read_text()), result


def run_baseline(tmp: Path, steps: int, warmup: int) -> float:
    """Mean steady step time (rank 0) of plain FSDP2 HSDP."""
    store = new_store()
    tf = tmp / "baseline.time"
    procs = [subprocess.Popen([sys.executable, PEER, "--rank", str(r), "--world",
                               str(WORKERS), "--shards", str(SHARDS), "--port",
                               str(store.port), "--steps", str(steps), "--warmup-timing",
                               str(warmup), "--time-file", str(tf), *MODEL], env=env())
             for r in range(WORKERS)]
    for p in procs:
        assert p.wait(timeout=1800) == 0
    return float(tf.read_text())


def run_torchft(tmp: Path, steps: int, warmup: int) -> float:
    """Mean steady step time (replica group 0, rank 0) of TorchFT's HSDP: FSDP2 inside each
    replica group, ``Manager.allreduce`` across them in FSDP2's all-reduce hook, a
    Lighthouse in this process (both replica groups required in the quorum)."""
    from torchft.coordination import LighthouseServer

    lh = LighthouseServer(bind="[::]:0", min_replicas=WORKERS // SHARDS,
                          join_timeout_ms=500, quorum_tick_ms=10, heartbeat_timeout_ms=2000)
    tf = tmp / "torchft.time"
    try:
        stores = [new_store() for _ in range(WORKERS // SHARDS)]
        procs = [subprocess.Popen([sys.executable, TORCHFT, "--replica", str(g),
                                   "--group-rank", str(r), "--replicas",
                                   str(WORKERS // SHARDS), "--shards", str(SHARDS), "--port",
                                   str(stores[g].port), "--lighthouse", lh.address(),
                                   "--steps", str(steps), "--warmup-timing", str(warmup),
                                   "--time-file", str(tf), *MODEL], env=env())
                 for g in range(WORKERS // SHARDS) for r in range(SHARDS)]
        for p in procs:
            assert p.wait(timeout=1800) == 0
    finally:
        lh.shutdown()
    return float(tf.read_text())


def throughput(tmp: Path, reps: int) -> None:
    """Interleaved runtime / plain FSDP2 HSDP / TorchFT HSDP runs; print the ratios of
    throughputs (runtime / FSDP2 is the goal; TorchFT is a peer when it is installed)."""
    steps, warmup = 60, 10
    try:
        import torchft  # noqa: F401
        peers = ["fsdp2", "runtime", "torchft"]
    except ImportError as exc:
        print(f"[hsdp throughput] TorchFT not installed ({exc}): not compared")
        peers = ["fsdp2", "runtime"]
    runs: dict[str, list[float]] = {k: [] for k in peers}
    for i in range(reps):
        for k in peers:
            if k == "fsdp2":
                runs[k].append(run_baseline(tmp, steps, warmup))
            elif k == "torchft":
                runs[k].append(run_torchft(tmp, steps, warmup))
            else:
                runs[k].append(run_runtime(tmp, f"tp{i}", steps, warmup, 0)[0])
                shutil.rmtree(tmp / f"tp{i}", ignore_errors=True)
        print(f"[hsdp throughput] rep {i}: " + ", ".join(
            f"{k} {runs[k][-1] * 1e3:.1f} ms" for k in peers) + f"; {load()}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"[hsdp throughput] GPT {' '.join(MODEL)}; {WORKERS} ranks = "
          f"{WORKERS // SHARDS} replica groups x {SHARDS} shards; {steps - warmup} timed "
          f"steps; {reps} interleaved runs; {load()}")
    for k, v in runs.items():
        print(f"[hsdp throughput]   {k:8s} median {med[k] * 1e3:7.1f} ms/step "
              f"(runs {[round(x * 1e3, 1) for x in v]})")
    # Per repetition (same minute, same load): the ratio of each pair of neighbouring runs.
    paired = [f / r for f, r in zip(runs["fsdp2"], runs["runtime"], strict=True)]
    print(f"[hsdp throughput] ratio runtime/fsdp2 (throughput): median of medians "
          f"{med['fsdp2'] / med['runtime']:.3f}, median of per-rep ratios "
          f"{statistics.median(paired):.3f} (per rep {[round(x, 3) for x in paired]}), best "
          f"{min(runs['fsdp2']) / min(runs['runtime']):.3f} (goal >= 0.98)")
    if "torchft" in runs:
        print(f"[hsdp throughput] ratio runtime/torchft (throughput): median "
              f"{med['torchft'] / med['runtime']:.3f}; torchft/fsdp2: "
              f"{med['fsdp2'] / med['torchft']:.3f}")


def timeline_phases(directory: Path, killed_at: float) -> dict[str, float]:
    """The recovery's phases from every worker's timeline (``YOCO_TIMELINE``), in seconds
    after the SIGKILL, each the last rank's: the survivors saw their step abandoned and
    left the loop body; the members had the new groups, had synced (the commit vote and
    the transfer's first part: the skeleton, the small tensors and the model shard), had
    the whole state in (the optimizer state arrives during the first step's
    forward/backward), began and committed the first step. ``steady step``: the median
    step of the survivors before the kill (steps 3 on: the first ones are cold), and
    ``first step``: that first step's duration (from its last rank's start)."""
    ev: dict[str, list[dict[str, float]]] = {}
    for f in directory.glob("*.jsonl"):
        ev[f.stem] = [json.loads(ln) for ln in f.read_text().splitlines()]
    after = {s: [e for e in es if e["t"] >= killed_at] for s, es in ev.items()}
    gen = int(min(e["gen"] for es in after.values() for e in es if e["ev"] == "groups"))
    members = [s for s, es in after.items()
               if any(e["ev"] == "groups" and e["gen"] == gen for e in es)]
    survivors = [s for s in members
                 if any(e["ev"] == "commit" and e["t"] < killed_at for e in ev[s])]
    nan = float("nan")

    def first(slot: str, name: str, g: int | None = None) -> float:
        return min((e["t"] - killed_at for e in after[slot] if e["ev"] == name
                    and (g is None or e["gen"] == g)), default=nan)

    def last(name: str, slots: list[str], g: int | None = None) -> float:
        return max(first(s, name, g) for s in slots)

    def state_in(slot: str) -> float:
        done = first(slot, "transfer_done")
        return max(first(slot, "synced", gen), done if done == done else -1.0)

    steady = []
    for s in survivors:
        commits = [e["t"] for e in ev[s] if e["ev"] == "commit" and e["t"] < killed_at]
        steady += [b - a for a, b in itertools.pairwise(commits[3:])]
    out = {
        "abandoned": max(min(first(s, "abandoned"), first(s, "void")) for s in survivors),
        "out of body": last("join", survivors),
        "groups": last("groups", members, gen),
        "synced": last("synced", members, gen),
        "state in": max(state_in(s) for s in members),
        "first step begins": last("step", members, gen),
        "first commit": last("commit", members, gen),
        "steady step": statistics.median(steady) if steady else nan,
    }
    out["first step"] = out["first commit"] - out["first step begins"]
    return out


def recovery(tmp: Path, reps: int, models: list[str], phases: list[str]) -> None:
    """One lost rank: SIGKILL -> first completed step, and the stall (that minus one
    steady step, design §6), vs shard bytes / loopback bandwidth; killed mid-step
    (FSDP2's backward) and at the step's end (the cross-group reduction launched, as the
    DDP benchmark kills)."""
    for label in models:
        model = BIG if label == "big" else MODEL
        for phase in phases:
            recovery_of(tmp, reps, label, model, phase)


def _quartiles(xs: list[float]) -> str:
    if len(xs) < 4:
        return "n/a"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


def recovery_of(tmp: Path, reps: int, label: str, model: list[str], phase: str) -> None:
    """``reps`` runs of one model and kill phase; prints each run, its timeline and the
    medians (with the interquartile range of the ratios)."""
    kill = 10 if label == "big" else 15
    steps = kill + 6
    rows: list[dict[str, float]] = []
    print(f"[hsdp recovery] {label} model {' '.join(model)}; {WORKERS} ranks = "
          f"{WORKERS // SHARDS} x {SHARDS} + 1 spare; rank 2 (replica group 1, shard 0) "
          f"SIGKILLed in step {kill} of {steps}, phase {phase}; {reps} runs; {load()}",
          flush=True)
    for i in range(reps):
        name = f"rec-{label}-{phase}{i}"  # its own records file: the sink appends
        tl = tmp / f"{name}.timeline"
        tl.mkdir()
        _, result = run_runtime(tmp, name, steps=steps, warmup=3, spares=1, model=model,
                                faults=[f"kill:rank=2:step={kill}:phase={phase}"],
                                timeline=tl)
        rec = result.recoveries[0]  # type: ignore[attr-defined]
        ph = timeline_phases(tl, rec["killed_at"])
        steady = ph["steady step"]
        moved = int(rec["bytes"])
        bw = max(tcp_bandwidth(moved), gloo_bandwidth(moved))
        bound = moved / bw
        total = rec["first_step"] - rec["killed_at"]
        row = {"bound": bound, "total": total, "stall": total - steady, "steady": steady,
               "detection": rec["detected"] - rec["killed_at"], **ph}
        rows.append(row)
        print(f"[hsdp recovery]   run {i}: shard moved {moved / 1e6:.1f} MB, loopback "
              f"{bw / 2**30:.2f} GiB/s -> bound {bound * 1e3:.0f} ms; SIGKILL -> first "
              f"step {total * 1e3:.0f} ms = {total / bound:.1f} x bound; steady step "
              f"{steady * 1e3:.0f} ms; stall {(total - steady) * 1e3:.0f} ms = "
              f"{(total - steady) / bound:.2f} x bound | {rec['outcome']}, lost "
              f"{rec['lost_steps']}; {load()}", flush=True)
        print("[hsdp recovery]     ms after the SIGKILL: detection "
              f"{row['detection'] * 1e3:.0f}, "
              + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in ph.items()), flush=True)
        shutil.rmtree(tmp / name, ignore_errors=True)
        shutil.rmtree(tl, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratios = [r["stall"] / r["bound"] for r in rows]
    print(f"[hsdp recovery] {label}/{phase}: {reps} runs; medians: bound "
          f"{med['bound'] * 1e3:.0f} ms, steady step {med['steady'] * 1e3:.0f} ms, SIGKILL -> "
          f"first step {med['total'] * 1e3:.0f} ms, stall {med['stall'] * 1e3:.0f} ms; "
          f"stall / bound median {statistics.median(ratios):.2f} (quartiles "
          f"{_quartiles(ratios)}; runs {[round(x, 2) for x in ratios]}) -- goal <= 3 "
          f"(first round), <= 1.5 (design §6); {load()}", flush=True)
    print(f"[hsdp recovery] {label}/{phase}: median phases, ms after the SIGKILL: "
          + ", ".join(f"{k} {med[k] * 1e3:.0f}" for k in
                      ("detection", "abandoned", "out of body", "groups", "synced",
                       "state in", "first step begins", "first commit"))
          + f"; first step {med['first step'] * 1e3:.0f} vs steady {med['steady'] * 1e3:.0f}",
          flush=True)


def main() -> None:
    """Run the chosen sections."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=["throughput", "recovery", "all"], default="all")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="big",
                    help="recovery: comma-separated big (a ~170 MB shard per rank), small "
                         "(the throughput model, a ~19 MB shard)")
    ap.add_argument("--phases", default="backward,reduce",
                    help="recovery: where the rank is killed (reduce: the step's end; "
                         "backward: mid-step)")
    args = ap.parse_args()
    os.environ.setdefault("RUST_LOG", "error")  # TorchFT's lighthouse logs every quorum
    tmp = Path(tempfile.mkdtemp(prefix="yoco-hsdp-bench-"))
    t0 = time.time()
    try:
        if args.section in ("throughput", "all"):
            throughput(tmp, args.reps)
        if args.section in ("recovery", "all"):
            recovery(tmp, args.reps, args.models.split(","), args.phases.split(","))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[hsdp] done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
