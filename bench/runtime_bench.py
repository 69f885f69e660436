"""Benchmarks of the migration runtime on this machine (CPU, gloo, loopback), each with its
peers in the same run, interleaved, several repetitions.

    python bench/runtime_bench.py [--section throughput|recovery|torchft|jct|hang|all]
        [--reps N]

* throughput: examples/mlp_train.py under the runtime vs the same loop in plain DDP and in
  a manual flat-buffer allreduce loop (bench/runtime_ddp_worker.py);
* recovery: SIGKILL of one worker of a job whose state is ~200 MB (embedding model of
  examples/mlp_train.py, a short step), broken down into detection, regrouping, transfer
  and first step, against state bytes / loopback bandwidth measured in the same run
  (raw TCP and gloo send/recv, pre-faulted buffers, best of several);
* torchft: TorchFT 0.2.0's Manager (bench/runtime_torchft_worker.py) on the same model:
  steady step time and recovery next to ours;
* hang: SIGSTOP of one worker: how long the step watchdog takes to fence it, against
  the steady step time;
* jct: job completion time with 3 failures: the runtime vs a checkpoint-restart baseline
  behaving like torchrun (bench/runtime_baseline_worker.py restarted by a supervisor here)
  vs no failure.

See docs/benchmarks-runtime.md for the figures and where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
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

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runtime.faults import parse_fault  # noqa: E402
from runtime.sink import JsonlFileSink  # noqa: E402
from runtime.supervisor import LaunchConfig, launch  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
PEER = str(ROOT / "bench" / "runtime_ddp_worker.py")
BASELINE = str(ROOT / "bench" / "runtime_baseline_worker.py")
TORCHFT = str(ROOT / "bench" / "runtime_torchft_worker.py")
# Every process of every peer gets the same environment: one thread each, and glibc keeps
# freed blocks up to 32 MB in its heap (an embedding's dense gradient would otherwise be a
# fresh mmap, i.e. 2k page faults per table, every step).
ENV = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
       "MALLOC_TRIM_THRESHOLD_": str(1 << 31)}
MLP = ["--hidden", "1024", "--layers", "4", "--dim", "256", "--batch", "64"]
# 8 tables x 16384 x 128 floats = 16.8 M parameters; + Adam = 201 MB of state.
BIG = ["--tables", "8", "--rows", "16384", "--emb-dim", "128", "--bag", "16", "--hidden",
       "256", "--layers", "2", "--batch", "8", "--fused"]
# The same kind of model as a recommender trains it: 12 tables x 16384 x 128 with sparse
# gradients and Adagrad = 25.2 M parameters, 201 MB of state (parameters + Adagrad sums);
# a step reduces and updates only the ~1.5k rows it looked up.
SPARSE = ["--tables", "12", "--rows", "16384", "--emb-dim", "128", "--bag", "16", "--hidden",
          "256", "--layers", "2", "--batch", "8", "--sparse"]


def env() -> dict[str, str]:
    return {**os.environ, **ENV}


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def new_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=60))


# ----------------------------------------------------------------- runners
def run_runtime(tmp: Path, name: str, model: list[str], steps: int, warmup: int,
                workers: int, spares: int, faults: list[str] | None = None,
                ckpt: int = 0):
    tf = tmp / f"{name}.time"
    cfg = LaunchConfig(script=EXAMPLE, args=[*model, "--steps", str(steps), "--warmup",
                                             str(warmup), "--time-file", str(tf)],
                       workers=workers, spares=spares, job_id=name, runs_root=str(tmp),
                       checkpoint_every=ckpt, nvml=False, progress_interval_s=5,
                       faults=[parse_fault(f) for f in faults or []], env=ENV)
    t0 = time.perf_counter()
    result = launch(cfg, JsonlFileSink(tmp / f"{name}.jsonl"))
    wall = time.perf_counter() - t0
    assert result.exit_code == 0, result
    return float(tf.read_text()), result, wall


def run_peer(tmp: Path, mode: str, model: list[str], steps: int, warmup: int,
             workers: int) -> float:
    store = new_store()
    out = tmp / f"{mode}.time"
    procs = [subprocess.Popen([sys.executable, PEER, "--mode", mode, "--rank", str(r),
                               "--world", str(workers), "--port", str(store.port),
                               "--steps", str(steps), "--warmup", str(warmup), "--out",
                               str(out), *model], env=env())
             for r in range(workers)]
    for p in procs:
        assert p.wait() == 0
    return float(out.read_text())


# ----------------------------------------------------------------- throughput
def throughput(tmp: Path, reps: int) -> None:
    steps, warmup = 160, 20
    runs: dict[str, list[float]] = {"runtime": [], "ddp": [], "manual": []}
    for _ in range(reps):  # interleaved, so that load changes hit every peer alike
        runs["ddp"].append(run_peer(tmp, "ddp", MLP, steps, warmup, 2))
        runs["runtime"].append(run_runtime(tmp, "tp", MLP, steps, warmup, 2, 1)[0])
        runs["manual"].append(run_peer(tmp, "manual", MLP, steps, warmup, 2))
        shutil.rmtree(tmp / "tp", ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in runs.items()}
    print(f"[throughput] {' '.join(MLP)}, 2 workers (+1 idle spare for the runtime), "
          f"{steps - warmup} timed steps, {reps} interleaved runs; {load()}")
    for k, v in runs.items():
        print(f"[throughput]   {k:8s} median {med[k] * 1e3:6.1f} ms/step, best "
              f"{best[k] * 1e3:6.1f}  (runs {[round(x * 1e3, 1) for x in v]})")
    for peer in ("ddp", "manual"):
        print(f"[throughput] ratio runtime/{peer} (throughput): median "
              f"{med[peer] / med['runtime']:.3f}, best {best[peer] / best['runtime']:.3f}")


# ----------------------------------------------------------------- bandwidth probes
_TCP_RECV = """
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
buf = bytearray(n); buf[::4096] = b'\\x01' * len(range(0, n, 4096))  # pre-fault
view = memoryview(buf)
s = socket.create_connection(('127.0.0.1', port))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
while True:
    got = 0
    while got < n:
        k = s.recv_into(view[got:], min(n - got, 64 << 20))
        if not k:
            sys.exit(0)
        got += k
    s.sendall(b'k')
"""


def tcp_bandwidth(nbytes: int, tries: int = 5) -> float:
    """Best bytes/s of one loopback TCP stream over ``tries`` transfers of ``nbytes``
    between pre-faulted buffers (receiver in another process)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    child = subprocess.Popen([sys.executable, "-c", _TCP_RECV, str(nbytes),
                              str(srv.getsockname()[1])])
    conn, _ = srv.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    data = bytearray(nbytes)
    data[::4096] = b"\x01" * len(range(0, nbytes, 4096))
    best = 0.0
    for _ in range(tries):
        t0 = time.perf_counter()
        conn.sendall(data)
        conn.recv(1)
        best = max(best, nbytes / (time.perf_counter() - t0))
    conn.close()
    srv.close()
    child.wait()
    return best


def gloo_bandwidth(nbytes: int, tries: int = 5) -> float:
    """Best bytes/s of a gloo send/recv of one ``nbytes`` tensor into a pre-faulted
    ``torch.zeros`` buffer (two processes, as the runtime's transfer)."""
    store = new_store()
    out = Path(tempfile.mkdtemp()) / "bw"
    procs = [subprocess.Popen([sys.executable, __file__, "--probe-gloo", str(r),
                               str(store.port), str(nbytes), str(tries), str(out)], env=env())
             for r in range(2)]
    for p in procs:
        assert p.wait() == 0
    bw = float(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return bw


def _probe_gloo(rank: int, port: int, nbytes: int, tries: int, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
    buf = torch.zeros(nbytes // 4)
    best = 0.0
    for i in range(tries):
        pg.barrier().wait()
        t0 = time.perf_counter()
        if rank == 0:
            pg.send([buf], 1, i).wait()
            pg.recv([buf[:1]], 1, 1000 + i).wait()  # the receiver's ack
        else:
            pg.recv([buf], 0, i).wait()
            pg.send([buf[:1]], 0, 1000 + i).wait()
        best = max(best, nbytes / (time.perf_counter() - t0))
    if rank == 0:
        Path(out).write_text(repr(best))


# ----------------------------------------------------------------- recovery
def recovery(tmp: Path, reps: int) -> None:
    for label, model in (("sparse", SPARSE), ("dense", BIG)):
        recovery_of(tmp, reps, label, model)


def recovery_of(tmp: Path, reps: int, label: str, model: list[str]) -> None:
    runs = []
    probes: list[tuple[float, float]] = []
    state_bytes = 0
    for i in range(reps):
        name = f"rec-{label}{i}"  # its own records file: the sink appends
        _, result, _ = run_runtime(tmp, name, model, steps=30, warmup=5, workers=2,
                                   spares=1, faults=["kill:rank=1:step=15"])
        rec = result.recoveries[0]
        outcome = next(r for r in JsonlFileSink(tmp / f"{name}.jsonl").read_all()
                       if r["kind"] == "outcome")
        rec["steady"] = outcome["step_seconds"]  # mean step time before the failure
        state_bytes = int(rec["bytes"])
        probes.append((tcp_bandwidth(state_bytes), gloo_bandwidth(state_bytes)))
        runs.append(rec)
        shutil.rmtree(tmp / name, ignore_errors=True)
    tcp = max(p[0] for p in probes)
    gloo = max(p[1] for p in probes)
    bw = max(tcp, gloo)
    bound = state_bytes / bw
    print(f"[recovery] {label} model: {' '.join(model)}; 2 workers + 1 spare, rank 1 "
          f"SIGKILLed in step 15 (its allreduce launched); {reps} runs; {load()}")
    print(f"[recovery] state moved {state_bytes / 1e6:.1f} MB; loopback best of "
          f"{5 * reps}: TCP {tcp / 2**30:.2f} GiB/s, gloo send/recv {gloo / 2**30:.2f} GiB/s "
          f"(per run: {[(round(a / 2**30, 2), round(b / 2**30, 2)) for a, b in probes]}) "
          f"-> lower bound {bound * 1e3:.0f} ms")
    totals, stalls = [], []
    for rec in runs:
        done = rec.get("transferred", rec["synced"])  # rank 0's sends all complete
        parts = {
            "detection": rec["detected"] - rec["killed_at"],
            "regroup": rec["pg"] - rec["detected"],
            "transfer": done - rec["pg"],
            "rest of first step": rec["first_step"] - done,
        }
        total = rec["first_step"] - rec["killed_at"]
        totals.append(total)
        stalls.append(total - rec["steady"])
        print(f"[recovery]   SIGKILL -> first completed step {total * 1e3:5.0f} ms = "
              f"{total / bound:.2f} x bound | " + ", ".join(
                  f"{k} {v * 1e3:.0f}" for k, v in parts.items())
              + f" | steady step {rec['steady'] * 1e3:.0f} ms, stall (total - steady step) "
              f"{(total - rec['steady']) * 1e3:.0f} ms = {(total - rec['steady']) / bound:.2f} x "
              f"bound | {rec['outcome']}, lost {rec['lost_steps']}")
    med = statistics.median(totals)
    print(f"[recovery] median {med * 1e3:.0f} ms = {med / bound:.2f} x bound; best "
          f"{min(totals) * 1e3:.0f} ms = {min(totals) / bound:.2f} x bound; stall median "
          f"{statistics.median(stalls) * 1e3:.0f} ms = {statistics.median(stalls) / bound:.2f} "
          f"x bound")


# ----------------------------------------------------------------- torchft
def torchft_peer(tmp: Path, reps: int) -> None:
    try:
        from torchft.coordination import LighthouseServer
    except ImportError as exc:
        print(f"[torchft] not runnable: {exc}")
        return
    steps, kill = 40, 15
    lh_opts = {"min_replicas": 1, "join_timeout_ms": 500, "quorum_tick_ms": 10,
               "heartbeat_timeout_ms": 500}
    print(f"[torchft] torchft 0.2.0, {' '.join(BIG)}, 2 replica groups x 1 process, "
          f"lighthouse in this process {lh_opts}; {load()}")
    for i in range(reps):
        # steady state: ours and TorchFT, side by side
        ours, _, _ = run_runtime(tmp, f"ftours{i}", BIG, steps=steps, warmup=10, workers=2,
                                 spares=1)
        shutil.rmtree(tmp / f"ftours{i}", ignore_errors=True)
        logs = _run_torchft(tmp, f"ft{i}", LighthouseServer, lh_opts, steps, kill=None)
        t = [float(ln.split()[1]) for ln in logs[0] if int(ln.split()[2]) == 2]
        ft_step = (t[-1] - t[10]) / (len(t) - 1 - 10) if len(t) > 12 else float("nan")
        print(f"[torchft]   run {i}: steady step: runtime {ours * 1e3:.1f} ms, TorchFT "
              f"{ft_step * 1e3:.1f} ms (ratio TorchFT/runtime {ft_step / ours:.2f})")
        # long enough for the restarted replica to start, heal and commit
        logs = _run_torchft(tmp, f"ftk{i}", LighthouseServer, lh_opts, 3 * steps, kill=kill)
        marker = tmp / f"ftk{i}.1.log.killed"
        if not marker.exists():  # replica 1 never reached its kill step: say why
            err = (tmp / f"ftk{i}.1.err").read_text(errors="replace").strip().splitlines()
            print(f"[torchft]   run {i}: TorchFT replica 1 did not reach step {kill}; its "
                  f"stderr ends: {' | '.join(err[-3:])}")
            continue
        killed = float(marker.read_text())
        after0 = [ln.split() for ln in logs[0] if float(ln.split()[1]) > killed]
        first0 = float(after0[0][1]) - killed if after0 else float("nan")
        after1 = [ln.split() for ln in logs[1] if float(ln.split()[1]) > killed]
        healed = float(after1[0][1]) - killed if after1 else float("nan")
        print(f"[torchft]   run {i}: SIGKILL -> survivor's first committed step "
              f"{first0 * 1e3:.0f} ms (on {after0[0][2] if after0 else '?'} replica); "
              f"-> restarted replica's first committed step (healed from its peer) "
              f"{healed:.2f} s")


def _run_torchft(tmp: Path, name: str, server, opts, steps: int, kill: int | None):
    lh = server(bind="[::]:0", **opts)
    try:
        logs = [tmp / f"{name}.{r}.log" for r in range(2)]

        def start(r: int, kill_step: int | None) -> subprocess.Popen[bytes]:
            args = [sys.executable, TORCHFT, "--replica", str(r), "--lighthouse",
                    lh.address(), "--steps", str(steps), "--log", str(logs[r]), *BIG]
            if kill_step is not None:
                args += ["--kill-step", str(kill_step)]
            return subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL,
                                    stderr=open(tmp / f"{name}.{r}.err", "ab"))

        procs = [start(0, None), start(1, kill)]
        while procs[1].poll() is None and procs[0].poll() is None:
            time.sleep(0.005)
        if procs[1].returncode == -signal.SIGKILL:
            procs[1] = start(1, None)  # the restart torchx/slurm would do
        for p in procs:
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
        return [lg.read_text().splitlines() if lg.exists() else [] for lg in logs]
    finally:
        lh.shutdown()


# ----------------------------------------------------------------- job completion time
JCT_STEPS, JCT_CKPT = 200, 40
JCT_KILLS = [(1, 60), (0, 100), (1, 180)]  # (rank, step): mid-interval, K/2 lost each
JCT_MODEL = ["--hidden", "512", "--layers", "4", "--dim", "256", "--batch", "64"]


def run_baseline(tmp: Path, name: str, kills: list[tuple[int, int]],
                 workers: int = 2) -> tuple[float, int]:
    """A torchrun-like agent: start all workers on a fresh rendezvous; poll them every
    0.1 s (torchrun's --monitor-interval); when one fails, stop all (SIGTERM, then
    SIGKILL after 5 s) and restart all, which resume from the newest checkpoint."""
    ckdir = tmp / name
    ckdir.mkdir(parents=True, exist_ok=True)
    restarts = 0
    t0 = time.perf_counter()
    while True:
        store = new_store()
        procs = [subprocess.Popen(
            [sys.executable, BASELINE, "--rank", str(r), "--world", str(workers), "--port",
             str(store.port), "--steps", str(JCT_STEPS), "--ckpt-dir", str(ckdir),
             "--ckpt-every", str(JCT_CKPT), *[f"--kill={k}:{s}" for k, s in kills], *JCT_MODEL],
            env=env(), stderr=subprocess.DEVNULL) for r in range(workers)]
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.1)
        if all(c == 0 for c in codes):
            break
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        restarts += 1
        del store
    return time.perf_counter() - t0, restarts


def jct(tmp: Path, reps: int) -> None:
    faults = [f"kill:rank={r}:step={s}" for r, s in JCT_KILLS]
    res: dict[str, list[float]] = {"runtime": [], "runtime+3": [], "baseline": [],
                                   "baseline+3": []}
    lost = []
    for i in range(reps):
        res["baseline"].append(run_baseline(tmp, f"b{i}", [])[0])
        res["runtime"].append(run_runtime(tmp, f"j{i}", JCT_MODEL, JCT_STEPS, 5, 2, 1,
                                          ckpt=JCT_CKPT)[2])
        w, restarts = run_baseline(tmp, f"bf{i}", JCT_KILLS)
        assert restarts == 3, restarts
        res["baseline+3"].append(w)
        _, result, w = run_runtime(tmp, f"jf{i}", JCT_MODEL, JCT_STEPS, 5, 2, 1, faults=faults,
                                   ckpt=JCT_CKPT)
        res["runtime+3"].append(w)
        lost.append([(r["outcome"], r["lost_steps"], round(r["first_step"] - r["detected"], 3))
                     for r in result.recoveries])
        for d in (f"b{i}", f"j{i}", f"bf{i}", f"jf{i}"):
            shutil.rmtree(tmp / d, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"[jct] {' '.join(JCT_MODEL)}, 2 workers, {JCT_STEPS} steps, checkpoint every {JCT_CKPT} "
          f"(both), kills (rank, step) {JCT_KILLS}; runtime +1 spare; {reps} interleaved runs; "
          f"{load()}")
    for k, v in res.items():
        print(f"[jct]   {k:11s} median {med[k]:6.2f} s  (runs {[round(x, 2) for x in v]})")
    ours = med["runtime+3"] - med["runtime"]
    base = med["baseline+3"] - med["baseline"]
    print(f"[jct] extra time for 3 failures: runtime {ours:.2f} s, checkpoint-restart "
          f"{base:.2f} s; ratio {ours / base:.3f} (goal <= 0.5)")
    print(f"[jct] runtime recoveries (outcome, lost steps, recovery_seconds): {lost}")


#: hang: the step at which the worker is stopped, of HANG_STEPS (late enough for the
#: adaptive deadline: it adapts after 32 steps seen past a 2-step warm-up).
HANG_AT, HANG_STEPS = 50, 100


def hang(tmp: Path, reps: int) -> None:
    """SIGSTOP one of 2 workers at step HANG_AT; the watchdog fences it. Latency = the
    fenced worker's end (SIGKILL, seen in /proc) - the SIGSTOP; against the steady step
    time (the outcome's step_seconds). The defaults (the stopped-rank check: 3 steps,
    0.25 s floor), then the step deadline alone (the check off: a hang /proc cannot see)
    with its defaults (adaptive) and with the former ones (3 s floor, factor 4)."""
    import json
    import threading

    for label, kw in (("stopped-rank check (default)", {}),
                      ("step deadline only, defaults", {"hang_stopped_factor": 0.0}),
                      ("step deadline only, 3 s floor, factor 4",
                       {"hang_stopped_factor": 0.0, "hang_floor_s": 3.0, "hang_factor": 4.0})):
        rows = []
        for i in range(reps):
            name = f"hang-{len(kw)}-{i}"
            run_dir = tmp / name
            stopped: list[tuple[int, float]] = []

            def stop(run_dir: Path = run_dir, stopped: list[tuple[int, float]] = stopped
                     ) -> None:
                while True:
                    try:
                        status = json.loads((run_dir / "status.json").read_text())
                        if status["step"] >= HANG_AT:
                            pid = status["pids"]["w1"]
                            os.kill(pid, signal.SIGSTOP)
                            stopped.append((pid, time.time()))
                            break
                    except (OSError, ValueError, KeyError):
                        pass
                    time.sleep(0.002)
                while True:  # until the watchdog has fenced it (SIGKILL)
                    try:
                        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
                    except OSError:
                        state = "X"
                    if state in "ZX":
                        stopped.append((pid, time.time()))
                        return
                    time.sleep(0.002)

            threading.Thread(target=stop, daemon=True).start()
            cfg = LaunchConfig(script=EXAMPLE, args=[*MLP, "--steps", str(HANG_STEPS)],
                               workers=2, spares=1, job_id=name, runs_root=str(tmp),
                               nvml=False, progress_interval_s=5, env=ENV,
                               **kw)  # type: ignore[arg-type]
            sink = JsonlFileSink(tmp / f"{name}.jsonl")
            result = launch(cfg, sink)
            for pid, _ in stopped[:1]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert result.exit_code == 0 and len(stopped) == 2, result
            [out] = [r for r in sink.read_all() if r["kind"] == "outcome"]
            assert [r["cause"] for r in sink.read_all() if r["kind"] == "failure"] == ["hang"]
            lat = stopped[1][1] - stopped[0][1]
            rows.append((lat, out["step_seconds"], out["recovery_seconds"]))
        lat = statistics.median(r[0] for r in rows)
        step = statistics.median(r[1] for r in rows)
        rec = statistics.median(r[2] for r in rows)
        print(f"[hang] {label}: detection {lat:.3f} s (median of {reps}; "
              f"{', '.join(f'{r[0]:.3f}' for r in rows)}), steady step {step * 1000:.1f} ms, "
              f"ratio {lat / step:.1f} (goal <= 5); recovery_seconds recorded (stall included) "
              f"{rec:.3f} s; {load()}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe-gloo":
        r, port, n, tries = (int(a) for a in sys.argv[2:6])
        _probe_gloo(r, port, n, tries, sys.argv[6])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default="all",
                    choices=["all", "throughput", "recovery", "torchft", "jct", "hang"])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    os.environ.update(ENV)
    os.environ.setdefault("RUST_LOG", "error")  # TorchFT's lighthouse logs every quorum
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.section in ("all", "throughput"):
            throughput(tmp, a.reps)
        if a.section in ("all", "recovery"):
            recovery(tmp, a.reps)
        if a.section in ("all", "torchft"):
            torchft_peer(tmp, a.reps)
        if a.section in ("all", "jct"):
            jct(tmp, a.reps)
        if a.section in ("all", "hang"):
            hang(tmp, a.reps)


if __name__ == "__main__":
    main()
