"""Benchmarks of the multi-node runtime: node agents on this machine, each a simulated host
(own name, own process group), the real `yoco run --nnodes` on every host.

    python bench/nodes_bench.py [--section recovery|hang|throughput|scaling|all] [--reps N]
        [--node-timeout S]

* recovery: 3 training hosts + 1 spare host, one rank each; host 1's process group is
  SIGKILLed mid-training; kill -> first completed step on the new group, against the
  state bytes / loopback bandwidth (raw TCP and gloo send/recv, best of several, the
  same probes as bench/runtime_bench.py), state bytes counted from the model;
* hang: host 1's process group is SIGSTOPped; time from the stop to the fence (the
  coordinator's log line) against the steady step time;
* throughput: mean step time with 3 hosts of agents vs the single-host launcher with 3
  workers, interleaved;
* scaling: whole-host recovery at 2, 4 and 8 simulated training hosts (+ 1 spare host).

The figures and the model of what grows with the number of hosts are in
docs/benchmarks-runtime.md ("Across hosts").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from runtime_bench import ENV, gloo_bandwidth, load, tcp_bandwidth  # noqa: E402

from runtime.sink import JsonlFileSink  # noqa: E402
from runtime.supervisor import LaunchConfig, launch  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
# ~3.2 M parameters; with Adam's two moments 38 MB of state.
MODEL = ["--hidden", "1024", "--layers", "3", "--dim", "256", "--batch", "32"]


def state_bytes() -> int:
    """Parameters and Adam's two moments of MODEL, in bytes (what a transfer moves)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import mlp_train  # type: ignore[import-not-found,unused-ignore]

    ap = argparse.ArgumentParser()
    mlp_train.add_model_args(ap)
    model = mlp_train.build_model(ap.parse_args(MODEL))
    return sum(p.numel() * p.element_size() * 3 for p in model.parameters())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Hosts:
    """H simulated hosts running `yoco run --nnodes`."""

    def __init__(self, tmp: Path, name: str, *, train: int, spare: int, steps: int,
                 node_timeout: float, sleep: float = 0.0) -> None:
        self.tmp, self.name = tmp / name, name
        self.tmp.mkdir(parents=True)
        self.sink = self.tmp / "records.jsonl"
        self.time_file = self.tmp / "step.time"
        port = free_port()
        self.procs = []
        for k in range(train + spare):
            log = (self.tmp / f"host{k}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "yoco.cli_runtime", "run", "--nnodes",
                 f"{train}:+{spare}", "--nproc-per-node", "1", "--node-rank", str(k),
                 "--node-name", f"host{k}", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--job-id", name, "--runs-root", str(self.tmp / "runs"),
                 "--sink", f"jsonl:{self.sink}", "--no-nvml", "--progress-every", "0.2",
                 "--node-timeout", str(node_timeout), EXAMPLE, *MODEL, "--steps", str(steps),
                 "--warmup", "5", "--time-file", str(self.time_file),
                 "--step-sleep", str(sleep)],
                env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))

    def progress_at(self, step: int) -> None:
        outbox = self.tmp / "runs" / self.name / "outbox" / "records.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline:
            if outbox.exists() and any('"job_progress"' in ln and json.loads(ln)["step"] >= step
                                       for ln in outbox.read_text().splitlines()):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: never reached step {step}")

    def finish(self) -> list[dict[str, Any]]:
        code = self.procs[0].wait(timeout=600)
        if code != 0:  # keep the run folder (logs of every host) for a look
            kept = Path(tempfile.gettempdir()) / f"yoco-nodes-bench-failed-{self.name}"
            shutil.copytree(self.tmp, kept, dirs_exist_ok=True)
            raise RuntimeError(f"{self.name}: the job failed (exit {code}); logs in {kept}")
        for p in self.procs[1:]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        return JsonlFileSink(self.sink).read_all()


def _ts(rec: dict[str, Any]) -> float:
    return datetime.fromisoformat(rec["occurred_at"]).timestamp()


def one_recovery(tmp: Path, name: str, train: int, node_timeout: float) -> dict[str, float]:
    """TRAIN training hosts + 1 spare host; host 1 (a training host) is killed."""
    h = Hosts(tmp, name, train=train, spare=1, steps=40, node_timeout=node_timeout)
    h.progress_at(15)
    killed = time.time()
    os.killpg(h.procs[1].pid, signal.SIGKILL)
    recs = h.finish()
    fail = next(r for r in recs if r["kind"] == "failure")
    out = next(r for r in recs if r["kind"] == "outcome")
    assert (fail["cause"], out["outcome"], out["lost_steps"]) == ("node_lost", "live_migrated", 0)
    first_step = _ts(fail) + out["recovery_seconds"]
    shutil.rmtree(h.tmp, ignore_errors=True)
    return {"total": first_step - killed, "steady": out["step_seconds"]}


def recovery(tmp: Path, reps: int, node_timeout: float) -> None:
    nbytes = state_bytes()
    runs = [one_recovery(tmp, f"rec{i}", 3, node_timeout) for i in range(reps)]
    bw = max(max(tcp_bandwidth(nbytes), gloo_bandwidth(nbytes)) for _ in range(2))
    bound = nbytes / bw
    totals = [r["total"] for r in runs]
    print(f"[nodes/recovery] 3 hosts + 1 spare host, 1 rank each, host1's process group "
          f"SIGKILLed at step >= 15; {reps} runs; {load()}")
    print(f"[nodes/recovery] state {nbytes / 1e6:.1f} MB; loopback best {bw / 2**30:.2f} GiB/s "
          f"-> bound {bound * 1e3:.0f} ms; steady step "
          f"{statistics.median(r['steady'] for r in runs) * 1e3:.0f} ms")
    for t in totals:
        print(f"[nodes/recovery]   kill -> first completed step {t * 1e3:.0f} ms = "
              f"{t / bound:.2f} x bound")
    med = statistics.median(totals)
    print(f"[nodes/recovery] median {med * 1e3:.0f} ms = {med / bound:.2f} x bound (goal <= 3)")


def hang(tmp: Path, reps: int, node_timeout: float) -> None:
    ratios = []
    for i in range(reps):
        h = Hosts(tmp, f"hang{i}", train=3, spare=1, steps=40, node_timeout=node_timeout)
        h.progress_at(15)
        stopped = time.time()
        os.killpg(h.procs[1].pid, signal.SIGSTOP)
        recs = h.finish()
        log = (h.tmp / "host0.log").read_text()
        m = re.search(r"^(\S+ \S+) yoco\.runtime\.nodepool node host1 silent", log, re.M)
        assert m, log
        fenced = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out = next(r for r in recs if r["kind"] == "outcome")
        detect = fenced - stopped
        ratios.append(detect / out["step_seconds"])
        print(f"[nodes/hang]   SIGSTOP -> fenced {detect * 1e3:.0f} ms; steady step "
              f"{out['step_seconds'] * 1e3:.0f} ms -> {ratios[-1]:.1f} x")
        shutil.rmtree(h.tmp, ignore_errors=True)
    print(f"[nodes/hang] --node-timeout {node_timeout}: median {statistics.median(ratios):.1f} x "
          f"the steady step (goal <= 5); {load()}")


def throughput(tmp: Path, reps: int, node_timeout: float) -> None:
    agents, single = [], []
    for i in range(reps):
        h = Hosts(tmp, f"tp{i}", train=3, spare=0, steps=80, node_timeout=node_timeout)
        h.finish()
        agents.append(float(h.time_file.read_text()))
        tf = tmp / f"single{i}.time"
        cfg = LaunchConfig(script=EXAMPLE, args=[*MODEL, "--steps", "80", "--warmup", "5",
                                                 "--time-file", str(tf)],
                           workers=3, spares=0, job_id=f"single{i}", runs_root=str(tmp),
                           nvml=False, progress_interval_s=0.2, env=ENV)
        assert launch(cfg, JsonlFileSink(tmp / f"single{i}.jsonl")).exit_code == 0
        single.append(float(tf.read_text()))
        print(f"[nodes/throughput]   step: agents {agents[-1] * 1e3:.1f} ms, single host "
              f"{single[-1] * 1e3:.1f} ms")
    ratio = statistics.median(single) / statistics.median(agents)
    print(f"[nodes/throughput] 3 hosts x 1 rank vs 3 workers on the single-host launcher; "
          f"{reps} runs interleaved; throughput ratio (agents / single) {ratio:.3f} "
          f"(goal >= 0.98); {load()}")


def scaling(tmp: Path, reps: int, node_timeout: float) -> None:
    for hosts in (2, 4, 8):
        totals = [one_recovery(tmp, f"sc{hosts}-{i}", hosts, node_timeout)["total"]
                  for i in range(reps)]
        print(f"[nodes/scaling] {hosts} training hosts + 1 spare: kill -> first step "
              f"median {statistics.median(totals) * 1e3:.0f} ms "
              f"({', '.join(f'{t * 1e3:.0f}' for t in totals)}); {load()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default="all",
                    choices=["recovery", "hang", "throughput", "scaling", "all"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--node-timeout", type=float, default=2.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="yoco-nodes-bench-"))
    try:
        for name, fn in (("recovery", recovery), ("hang", hang), ("throughput", throughput),
                         ("scaling", scaling)):
            if a.section in ("all", name):
                fn(tmp, a.reps, a.node_timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
