"""Benchmarks of the multi-node runtime: node agents on this machine, each a simulated host
(own name, own process group), the real `yoco run --nnodes` on every host.

    python bench/nodes_bench.py [--section recovery|hang|remote|worker|throughput|scaling|all]
        [--reps N] [--node-timeout S] [--keep-logs DIR]

A run that fails (the job fails, never reaches the kill step, a host does not end) keeps
its folder -- every host's log, the coordinator's run folder and outbox -- and prints
where; ``--keep-logs DIR`` keeps every run's folder under DIR (default: a temporary
folder, deleted at the end).

* recovery: 3 training hosts + 1 spare host, one rank each; host 1's process group is
  SIGKILLed mid-training; the stall (kill -> first completed step on the new group,
  minus one steady step: design section 6) against the state bytes / loopback
  bandwidth (raw TCP and gloo send/recv, best of several, the same probes as
  bench/runtime_bench.py), state bytes counted from the model; each run's phases
  (detected, plan seen, group formed, state synced, first step) after the kill;
* hang: host 1's process group is SIGSTOPped; time from the stop to the fence (the
  coordinator's log line) against the steady step time;
* remote: 2 training hosts + 1 spare host, each in a network namespace of its own with
  its own machine id (tests/runtime/netns.py; needs root): the coordinator can neither
  read host 1's ``/proc`` nor signal it, as with a second machine. At step >= 45 host 1 is
  frozen (everything on it SIGSTOPped) or cut off (its switch port down), steps of the
  small model plus a 0.1 s sleep (~0.15 s); time from the
  fault to the fence (the coordinator's log line) against the steady step, with the node
  deadline the coordinator used (runtime.detection.node_deadline);
* worker: host 1's worker alone is SIGSTOPped at step 45 with the stopped-rank check off
  (``--hang-stopped-factor 0``: a hang ``/proc`` cannot see, its agent still beating);
  time from the stop to the step watchdog's fence (the coordinator's log line) against
  the steady step time;
* throughput: mean step time with 3 hosts of agents vs the single-host launcher with 3
  workers, interleaved;
* scaling: whole-host recovery at 2, 4 and 8 simulated training hosts (+ 1 spare host).

The figures and the model of what grows with the number of hosts are in
docs/benchmarks-runtime.md ("Across hosts").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from runtime_bench import ENV, SPARSE, gloo_bandwidth, load, tcp_bandwidth  # noqa: E402

from runtime.nodes import free_rendezvous_port  # noqa: E402
from runtime.sink import JsonlFileSink  # noqa: E402
from runtime.supervisor import LaunchConfig, launch  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
#: --keep-logs: keep every run's folder (a failed run's is always kept).
KEEP = False
HOSTS = [2, 4, 8]
# --model small: ~2.4 M parameters; with Adam's two moments 28 MB of state (a step of
# ~60-100 ms here: the hang and throughput sections' model).
SMALL = ["--hidden", "1024", "--layers", "3", "--dim", "256", "--batch", "32"]
# --model sparse: section 2's recommender model (12 embedding tables, sparse gradients,
# Adagrad): ~205 MB of state, a short step; the recovery's bytes term is measurable.
MODELS = {"small": SMALL, "sparse": SPARSE}
MODEL = SMALL


class Hosts:
    """H simulated hosts running `yoco run --nnodes`."""

    def __init__(self, tmp: Path, name: str, *, train: int, spare: int, steps: int,
                 node_timeout: float, sleep: float = 0.0, extra: tuple[str, ...] = ()
                 ) -> None:
        self.tmp, self.name = tmp / name, name
        self.tmp.mkdir(parents=True)
        self.sink = self.tmp / "records.jsonl"
        self.time_file = self.tmp / "step.time"
        port = free_rendezvous_port()
        self.procs = []
        for k in range(train + spare):
            log = (self.tmp / f"host{k}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "yoco.cli_runtime", "run", "--nnodes",
                 f"{train}:+{spare}", "--nproc-per-node", "1", "--node-rank", str(k),
                 "--node-name", f"host{k}", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--job-id", name, "--runs-root", str(self.tmp / "runs"),
                 "--sink", f"jsonl:{self.sink}", "--no-nvml", "--progress-every", "0.2",
                 "--node-timeout", str(node_timeout), *extra, EXAMPLE, *MODEL,
                 "--steps", str(steps),
                 "--warmup", "5", "--time-file", str(self.time_file),
                 "--step-sleep", str(sleep)],
                env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))

    def progress_at(self, step: int, timeout: float = 300) -> None:
        outbox = self.tmp / "runs" / self.name / "outbox" / "records.jsonl"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if outbox.exists() and any('"job_progress"' in ln and json.loads(ln)["step"] >= step
                                       for ln in outbox.read_text().splitlines()):
                return
            if self.procs[0].poll() is not None:
                self.fail(f"the coordinator's host ended (exit {self.procs[0].returncode}) "
                          f"before step {step}")
            time.sleep(0.02)
        self.fail(f"never reached step {step} in {timeout:.0f} s")

    def fail(self, why: str) -> NoReturn:
        """Stop every host (SIGCONT then SIGKILL of its group), keep this run's folder
        (every host's log, the run folder, the outbox) and raise with where it is."""
        for p in self.procs:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, sig)
        for p in self.procs:
            p.wait()
        kept = self.tmp if KEEP else \
            Path(tempfile.gettempdir()) / f"yoco-nodes-bench-failed-{self.name}-{os.getpid()}"
        if kept != self.tmp:
            shutil.copytree(self.tmp, kept, dirs_exist_ok=True)
        tail = (self.tmp / "host0.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{self.name}: {why}; logs kept in {kept}\n--- host0.log (tail)\n"
                           f"{tail}")

    def finish(self) -> list[dict[str, Any]]:
        try:
            code = self.procs[0].wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.fail("the coordinator's host did not end within 600 s")
        if code != 0:
            self.fail(f"the job failed (exit {code})")
        for k, p in enumerate(self.procs[1:], 1):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail(f"host{k} did not end within 60 s of the coordinator")
        return JsonlFileSink(self.sink).read_all()

    def done(self) -> None:
        """Delete this run's folder (kept with --keep-logs)."""
        if not KEEP:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _ts(rec: dict[str, Any]) -> float:
    return datetime.fromisoformat(rec["occurred_at"]).timestamp()


def one_recovery(tmp: Path, name: str, train: int, node_timeout: float) -> dict[str, float]:
    """TRAIN training hosts + 1 spare host; host 1 (a training host) is killed. Returns
    the phases, in seconds after the kill (the coordinator's log lines and rank 0's
    timing of the new generation)."""
    h = Hosts(tmp, name, train=train, spare=1, steps=40, node_timeout=node_timeout)
    h.progress_at(15)
    killed = time.time()
    os.killpg(h.procs[1].pid, signal.SIGKILL)
    recs = h.finish()
    fails = [r for r in recs if r["kind"] == "failure"]
    outs = [r for r in recs if r["kind"] == "outcome"]
    of = {o["failure_event_id"]: o for o in outs}
    got = [(f["cause"], f["node"], of[f["event_id"]]["outcome"] if f["event_id"] in of else None,
            of[f["event_id"]]["lost_steps"] if f["event_id"] in of else None) for f in fails]
    if got != [("node_lost", "host1", "live_migrated", 0)]:
        h.fail(f"expected one live migration of host1's loss, got {got}")
    log = (h.tmp / "host0.log").read_text()
    lost = re.search(r"^(\S+ \S+) yoco\.runtime\.nodepool node host1 lost", log, re.M)
    ready = re.search(r"generation \d+ ready: (\{.*\})$", log, re.M)
    if not (lost and ready):
        h.fail("the coordinator's log lacks the loss or the ready line")
    t = json.loads(ready.group(1))
    first_step = _ts(fails[0]) + outs[0]["recovery_seconds"]
    h.done()
    return {"total": first_step - killed, "steady": outs[0]["step_seconds"],
            "bytes": t["bytes"],
            "detected": _log_ts(lost.group(1)) - killed, "seen": t["seen"] - killed,
            "pg": t["pg"] - killed, "synced": t["synced"] - killed}


def _log_ts(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def bandwidth(nbytes: int) -> float:
    """The best loopback bandwidth (bytes/s) moving ``nbytes``: raw TCP or gloo."""
    return max(max(tcp_bandwidth(nbytes), gloo_bandwidth(nbytes)) for _ in range(3))


def report(tag: str, train: int, runs: list[dict[str, float]], bound: float) -> None:
    """Print each run's phases and the stall (kill -> first step minus one steady step)
    against the bound, then the median."""
    ratios = []
    for r in runs:
        stall = r["total"] - r["steady"]
        ratios.append(stall / bound)
        print(f"[nodes/{tag}]   {train} hosts: kill -> detected {r['detected'] * 1e3:.0f}, "
              f"plan seen {r['seen'] * 1e3:.0f}, group formed {r['pg'] * 1e3:.0f}, state "
              f"synced {r['synced'] * 1e3:.0f}, first step done {r['total'] * 1e3:.0f} ms; "
              f"steady step {r['steady'] * 1e3:.0f} ms; stall {stall * 1e3:.0f} ms = "
              f"{ratios[-1]:.2f} x bound")
    print(f"[nodes/{tag}] {train} training hosts + 1 spare: median stall / bound "
          f"{statistics.median(ratios):.2f} (goal <= 2; {len(runs)} runs); {load()}")


def recovery(tmp: Path, reps: int, node_timeout: float) -> None:
    scaling(tmp, reps, node_timeout, hosts=[3], tag="recovery")


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
        if not m:
            h.fail("the coordinator's log has no fence of host1")
        fenced = _log_ts(m.group(1))
        out = next(r for r in recs if r["kind"] == "outcome")
        detect = fenced - stopped
        ratios.append(detect / out["step_seconds"])
        print(f"[nodes/hang]   SIGSTOP -> fenced {detect * 1e3:.0f} ms; steady step "
              f"{out['step_seconds'] * 1e3:.0f} ms -> {ratios[-1]:.1f} x")
        h.done()
    print(f"[nodes/hang] --node-timeout {node_timeout}: median {statistics.median(ratios):.1f} x "
          f"the steady step (goal <= 5); {load()}")


#: remote: each step also sleeps this long (steps of ~0.15 s, as in the fencing tests).
REMOTE_SLEEP = 0.1


def remote(tmp: Path, reps: int, node_timeout: float) -> None:
    from tests.runtime.netns import Netns, NetnsCluster

    os.environ.update(ENV)  # the hosts' threads, as Hosts gives them
    ratios: dict[str, list[float]] = {"freeze": [], "cut": []}
    for i in range(reps):
        for fault, got in ratios.items():
            run = tmp / f"remote-{fault}{i}"
            with Netns(3, run / "net") as net:
                c = NetnsCluster(net, run, script=EXAMPLE,
                                 script_args=[*MODEL, "--steps", "80", "--warmup", "5",
                                              "--step-sleep", str(REMOTE_SLEEP)],
                                 nnodes="2:+1", nproc=1, job_id=f"remote{i}",
                                 extra=["--progress-every", "0.1", "--node-timeout",
                                        str(node_timeout)])
                try:
                    c.start_all()
                    c.progress_at(45, timeout=300)
                    at = time.time()
                    (net.freeze if fault == "freeze" else net.cut)(1)
                    c.wait_until(lambda c=c: "node host1 silent" in c.log(0), "the fence",
                                 120)
                    (net.thaw if fault == "freeze" else net.heal)(1)
                    code = c.wait(0, timeout=300)
                finally:
                    c.close()
                log, recs = c.log(0), c.records()
            m = re.search(r"^(\S+ \S+) yoco\.runtime\.nodepool node host1 silent for "
                          r"\S+ s \(no heartbeat; lost after (\S+) s\)", log, re.M)
            outs = [r for r in recs if r["kind"] == "outcome"]
            if code != 0 or not m or not outs:
                shutil.copytree(run, Path(tempfile.gettempdir()) / run.name,
                                dirs_exist_ok=True)
                raise RuntimeError(f"remote {fault}: exit {code}, fence line {bool(m)}, "
                                   f"outcomes {len(outs)}; logs kept in "
                                   f"{Path(tempfile.gettempdir()) / run.name}")
            detect = _log_ts(m.group(1)) - at
            step = outs[0]["step_seconds"]
            got.append(detect / step)
            print(f"[nodes/remote]   {fault} of a remote host -> fenced {detect * 1e3:.0f} ms "
                  f"(node deadline {float(m.group(2)) * 1e3:.0f} ms); steady step "
                  f"{step * 1e3:.0f} ms -> {got[-1]:.1f} x; {outs[0]['outcome']}, "
                  f"{outs[0]['lost_steps']} lost")
            if not KEEP:
                shutil.rmtree(run, ignore_errors=True)
    for fault, got in ratios.items():
        print(f"[nodes/remote] {fault} of a host on another machine (--node-timeout "
              f"{node_timeout}): median {statistics.median(got):.1f} x the steady step "
              f"(goal <= 5; {len(got)} runs); {load()}")


def worker(tmp: Path, reps: int, node_timeout: float) -> None:
    ratios = []
    for i in range(reps):
        h = Hosts(tmp, f"worker{i}", train=3, spare=1, steps=80, node_timeout=node_timeout,
                  extra=("--hang-stopped-factor", "0"))
        status = h.tmp / "runs" / h.name / "status.json"
        deadline = time.time() + 300
        pid = None
        while pid is None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                st = json.loads(status.read_text())
                if st["step"] >= 45:
                    pid = int(st["pids"]["w1"])
            if time.time() > deadline or h.procs[0].poll() is not None:
                h.fail("never reached step 45")
            time.sleep(0.002)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        recs = h.finish()
        log = (h.tmp / "host0.log").read_text()
        m = re.search(r"^(\S+ \S+) yoco\.runtime\.supervisor w1 is hung", log, re.M)
        if not m:
            h.fail("the coordinator's log has no fence of w1 by the step watchdog")
        detect = _log_ts(m.group(1)) - stopped
        out = next(r for r in recs if r["kind"] == "outcome")
        ratios.append(detect / out["step_seconds"])
        print(f"[nodes/worker]   SIGSTOP of w1 -> fenced {detect * 1e3:.0f} ms; steady step "
              f"{out['step_seconds'] * 1e3:.0f} ms -> {ratios[-1]:.1f} x")
        h.done()
    print(f"[nodes/worker] hung worker (stopped-rank check off): median "
          f"{statistics.median(ratios):.1f} x the steady step (goal <= 5); {load()}")


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


def scaling(tmp: Path, reps: int, node_timeout: float, hosts: list[int] | None = None,
            tag: str = "scaling") -> None:
    print(f"[nodes/{tag}] model {' '.join(MODEL)}; 1 rank per host; host1's process group "
          f"SIGKILLed at step >= 15; {reps} run(s) per point; {load()}")
    for n in hosts or HOSTS:
        runs = [one_recovery(tmp, f"{tag}{n}-{i}", n, node_timeout) for i in range(reps)]
        nbytes = max(int(r["bytes"]) for r in runs)
        bw = bandwidth(nbytes)
        bound = nbytes / bw
        print(f"[nodes/{tag}] state moved {nbytes / 1e6:.1f} MB; loopback best "
              f"{bw / 2**30:.2f} GiB/s -> bound {bound * 1e3:.0f} ms")
        report(tag, n, runs, bound)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default="all",
                    choices=["recovery", "hang", "remote", "worker", "throughput", "scaling",
                             "all"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--node-timeout", type=float, default=2.0)
    ap.add_argument("--hosts", default="2,4,8", help="scaling: training hosts to measure")
    ap.add_argument("--model", choices=sorted(MODELS), default="small",
                    help="small: 28 MB of state (default); sparse: section 2's 205 MB")
    ap.add_argument("--keep-logs", metavar="DIR", default=None,
                    help="keep every run's folder (host logs, run folder) under DIR")
    a = ap.parse_args()
    global KEEP, HOSTS, MODEL
    HOSTS = [int(x) for x in a.hosts.split(",")]
    MODEL = MODELS[a.model]
    torch.set_num_threads(1)
    if a.keep_logs:
        KEEP = True
        Path(a.keep_logs).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="yoco-nodes-bench-", dir=a.keep_logs))
        print(f"[nodes] keeping every run's logs under {tmp}")
    else:
        tmp = Path(tempfile.mkdtemp(prefix="yoco-nodes-bench-"))
    try:
        for name, fn in (("recovery", recovery), ("hang", hang), ("remote", remote),
                         ("worker", worker),
                         ("throughput", throughput), ("scaling", scaling)):
            if a.section in ("all", name):
                fn(tmp, a.reps, a.node_timeout)
    finally:
        if not KEEP:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
