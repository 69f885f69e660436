"""Witness benchmark: what cosigning costs per checkpoint, and how long a scheduled
checkpoint run takes at 1,000 logs with two witnesses.

Usage::

    python bench/witness_bench.py [--logs 1000] [--cosign 2000] [--witnesses 2]
    python bench/witness_bench.py --section policy [--checkpoints 1000]

Uses ``DATABASE_URL`` if set, else a fresh embedded PostgreSQL in a temporary folder.

* cosign: the witness's own work per ``add-checkpoint`` (``yoco_verify.witness.Witness``
  in this process: parse, the log's signature, the consistency proof, the crash-safe
  state write with its two fsyncs, the cosignature), then the same over HTTP against a
  real ``yoco-verify witness serve`` process on 127.0.0.1 (keep-alive), a log of
  ``--cosign`` checkpoints growing one entry at a time;
* latency: ``--logs`` contracts, each with entries under a checkpoint and cosigned by
  ``--witnesses`` witness processes; then one entry appended to every log and the
  scheduled run timed: signing every log (``billing.schedule.checkpoint_run``), then the
  submission of every new head to every witness (``ledger.witnessing.submit_pending``);
* policy: one contract whose terms name a 2-of-2 witness policy, ``--checkpoints``
  checkpoints cosigned by two witness processes, then 100 more not cosigned yet: the time
  of what a contract's witness policy adds — the status of the 200 newest heads (the
  portal's checkpoints page, ``billing.witness_policy.checkpoint_statuses``), the status
  of one checkpoint (each report), and finding the newest witnessed checkpoint past 100
  uncosigned ones (issuing, ``latest_witnessed``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "verifier"))


def _start_witness(folder: Path, name: str, logs: list[str]) -> tuple[subprocess.Popen[str], str,
                                                                       str]:
    from yoco_verify.witness import generate_key

    folder.mkdir(parents=True, exist_ok=True)
    vkey = generate_key(name, folder / "key").key.to_text()
    args = [sys.executable, "-c", "from yoco_verify.cli import main; main()", "witness", "serve",
            "--state", str(folder / "state"), "--key", str(folder / "key"),
            "--listen", "127.0.0.1:0"]
    for spec in logs:
        args += ["--log", spec]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'verifier'}")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    assert proc.stdout is not None
    m = re.search(r"on http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("the witness did not start")
    return proc, f"http://127.0.0.1:{m.group(1)}", vkey


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"median {statistics.median(xs) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms"


def bench_cosign(n: int, tmp: Path) -> None:
    """Per-checkpoint cost of cosigning, in process and over HTTP."""
    from yoco_verify.witness import LogKeys, Witness, WitnessState

    from ledger import merkle, note
    from ledger.cosign import Cosigner, add_checkpoint_body
    from ledger.witnessing import HttpTransport

    signer = note.Signer.generate("bench.example/log")
    leaves = [merkle.leaf_hash(i.to_bytes(8, "big")) for i in range(n + 1)]
    cm = merkle.CompactRange()
    roots = [merkle.EMPTY_ROOT]
    for leaf in leaves:  # every root, incrementally
        cm.extend([leaf])
        roots.append(cm.root())
    bodies = []
    for size in range(1, n + 1):
        old = size - 1
        proof = merkle.reference_consistency_proof(old, leaves[:size]) if old else []
        cp = note.sign_checkpoint(signer, "bench.example/log/L", size, roots[size])
        bodies.append(add_checkpoint_body(old, proof, cp))
    logs = LogKeys()
    logs.add(f"bench.example/log/*={signer.verifier_text()}")
    w = Witness(Cosigner.generate("bench.example/w"), logs, WitnessState(tmp / "inproc"))
    times = []
    for body in bodies:
        t = time.perf_counter()
        answer = w.add_checkpoint(body)
        times.append(time.perf_counter() - t)
        assert answer.status == 200, answer
    print(f"cosign in process ({n} checkpoints, one log growing by one entry): {_ms(times)}")
    # The same without the state write's fsyncs, to show where the time goes.
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]
    try:
        w2 = Witness(Cosigner.generate("bench.example/w2"), logs, WitnessState(tmp / "nofsync"))
        t2 = []
        for body in bodies:
            t = time.perf_counter()
            w2.add_checkpoint(body)
            t2.append(time.perf_counter() - t)
    finally:
        os.fsync = real_fsync
    print(f"  of which not the fsyncs (state write without fsync): {_ms(t2)}")
    proc, url, _ = _start_witness(tmp / "http", "bench.example/wh",
                                  [f"bench.example/log/*={signer.verifier_text()}"])
    try:
        transport = HttpTransport(30)
        times = []
        for body in bodies:
            t = time.perf_counter()
            ans = transport("POST", f"{url}/add-checkpoint", body)
            times.append(time.perf_counter() - t)
            assert ans.status == 200, ans
        transport.close()
        print(f"cosign over HTTP (keep-alive, witness process on 127.0.0.1): {_ms(times)}")
    finally:
        proc.kill()
        proc.wait()


def bench_latency(n_logs: int, n_witnesses: int, tmp: Path) -> None:
    """A scheduled checkpoint run at ``n_logs`` logs with ``n_witnesses`` witnesses."""
    from sqlalchemy import create_engine

    from billing.schedule import checkpoint_run
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.note import Signer
    from ledger.records import parse_contracts, validate_batch
    from ledger.witnessing import HttpTransport, parse_witnesses, submit_pending
    from yoco.database import (
        embedded_url,
        ensure_database,
        make_engine,
        prepare,
        start_embedded,
        unit_of_work,
    )

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url = normalize_url(os.environ["DATABASE_URL"])
    else:
        server = start_embedded(tmp / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    create_engine(url, isolation_level="AUTOCOMMIT").dispose()
    engine = make_engine(prepare(url, f"bench_{uuid.uuid4().hex[:8]}").url)
    prefix = "bench.example/ledger"
    signer = Signer.generate(prefix)
    ids = [f"W-{i:05d}" for i in range(n_logs)]
    import json

    specs, errors = parse_contracts(json.dumps([
        {"contract_id": c, "customer": f"cust-{c}", "start_date": "2026-01-01",
         "currency": "USD", "annual_value": "1000.00", "term_years": 1} for c in ids
    ]).encode())
    assert not errors, errors[:3]

    def records(step: int) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for c in ids:
            at = f"2026-02-01T00:{step:02d}:00Z"
            if step == 0:
                out.append({"kind": "job_started", "event_id": str(uuid.uuid4()),
                            "contract_id": c, "occurred_at": at, "job_id": "j", "gpus": 8})
            else:
                out.append({"kind": "job_progress", "event_id": str(uuid.uuid4()),
                            "contract_id": c, "occurred_at": at, "job_id": "j",
                            "step": step, "step_seconds": 1.0})
        return out

    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    for step in range(2):
        recs, errs = validate_batch(records(step))
        assert not errs, errs[:3]
        with unit_of_work(engine) as s:
            ingest(s, recs, None, ())
    logs = [f"{prefix}/*={signer.verifier_text()}"]
    procs, cfg = [], []
    for i in range(n_witnesses):
        proc, wurl, vkey = _start_witness(tmp / f"w{i}", f"bench.example/w{i}", logs)
        procs.append(proc)
        cfg.append(f"{wurl} {vkey}")
    witnesses = parse_witnesses(", ".join(cfg))
    try:
        # The first run: every log signed and cosigned (the witnesses learn the logs).
        with unit_of_work(engine) as s:
            checkpoint_run(s, signer=signer, origin_prefix=prefix)
        transport = HttpTransport(30)
        first = submit_pending(engine, witnesses, transport)
        assert len(first.cosigned) == n_logs * n_witnesses, first.summary()
        rows = []
        for step in (2, 3, 4):
            recs, errs = validate_batch(records(step))
            assert not errs
            with unit_of_work(engine) as s:
                ingest(s, recs, None, ())
            t0 = time.perf_counter()
            with unit_of_work(engine) as s:
                run = checkpoint_run(s, signer=signer, origin_prefix=prefix)
            t1 = time.perf_counter()
            sub = submit_pending(engine, witnesses, transport)
            t2 = time.perf_counter()
            assert len(run.heads) == n_logs and len(sub.cosigned) == n_logs * n_witnesses, (
                sub.summary())
            rows.append((t1 - t0, t2 - t1))
            print(f"run {step - 1}: signed {n_logs} logs in {t1 - t0:.2f} s, "
                  f"{len(sub.cosigned)} cosignatures ({n_witnesses} witnesses) in "
                  f"{t2 - t1:.2f} s: checkpoint latency {t2 - t0:.2f} s "
                  f"({(t2 - t1) / len(sub.cosigned) * 1e3:.2f} ms per cosignature)")
        sign = statistics.median(r[0] for r in rows)
        cos = statistics.median(r[1] for r in rows)
        print(f"median of {len(rows)} runs at {n_logs} logs, {n_witnesses} witnesses: sign "
              f"{sign:.2f} s + cosign {cos:.2f} s = {sign + cos:.2f} s from the run's start to "
              "the last cosignature stored")
        transport.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        engine.dispose()


def _engine(tmp: Path) -> object:
    from sqlalchemy import create_engine

    from yoco.database import embedded_url, ensure_database, make_engine, prepare, start_embedded

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url = normalize_url(os.environ["DATABASE_URL"])
    else:
        server = start_embedded(tmp / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    create_engine(url, isolation_level="AUTOCOMMIT").dispose()
    return make_engine(prepare(url, f"bench_{uuid.uuid4().hex[:8]}").url)


def bench_policy(n_checkpoints: int, tmp: Path) -> None:
    """What a contract's witness policy costs the reports and the portal."""
    import json

    from sqlalchemy import select

    from billing.witness_policy import checkpoint_status, checkpoint_statuses, latest_witnessed
    from ledger.checkpoints import sign_log
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.models import Checkpoint
    from ledger.note import Signer
    from ledger.records import parse_contracts, validate_batch
    from ledger.witnessing import HttpTransport, parse_witnesses, submit_pending
    from yoco.database import unit_of_work

    engine: Any = _engine(tmp)
    prefix = "bench.example/ledger"
    signer = Signer.generate(prefix)
    logs = [f"{prefix}/*={signer.verifier_text()}"]
    procs, cfg, keys = [], [], []
    for i in range(2):
        proc, wurl, vkey = _start_witness(tmp / f"p{i}", f"bench.example/p{i}", logs)
        procs.append(proc)
        cfg.append(f"{wurl} {vkey}")
        keys.append(vkey)
    witnesses = parse_witnesses(", ".join(cfg))
    specs, errors = parse_contracts(json.dumps([{
        "contract_id": "P-1", "customer": "cust-P-1", "start_date": "2026-01-01",
        "currency": "USD", "annual_value": "1000.00",
        "terms": {"witnesses": {"keys": keys, "quorum": 2}}}]).encode())
    assert not errors, errors

    def grow(step: int) -> None:
        kind = "job_started" if step == 0 else "job_progress"
        extra: dict[str, object] = ({"gpus": 8} if step == 0
                                    else {"step": step, "step_seconds": 1.0})
        recs, errs = validate_batch([{
            "kind": kind, "event_id": str(uuid.uuid4()), "contract_id": "P-1",
            "occurred_at": f"2026-02-01T{step // 3600:02d}:{step // 60 % 60:02d}:"
                           f"{step % 60:02d}Z", "job_id": "j", **extra}])
        assert not errs, errs
        with unit_of_work(engine) as s:
            ingest(s, recs, None, ())
            sign_log(s, signer, "P-1", prefix)

    transport = HttpTransport(30)
    try:
        with unit_of_work(engine) as s:
            add_contracts(s, specs)
        for step in range(n_checkpoints):
            grow(step)
            sub = submit_pending(engine, witnesses, transport)
            assert len(sub.cosigned) == 2, sub.summary()
        for step in range(n_checkpoints, n_checkpoints + 100):
            grow(step)  # signed, not cosigned yet
        pages, ones, finds = [], [], []
        for _ in range(7):
            with unit_of_work(engine) as s:
                heads = list(s.execute(select(Checkpoint).where(Checkpoint.log_id == "P-1")
                                       .order_by(Checkpoint.tree_size.desc()).limit(200))
                             .scalars())
                t0 = time.perf_counter()
                statuses = checkpoint_statuses(s, "P-1", heads)
                t1 = time.perf_counter()
                one = checkpoint_status(s, heads[-1])
                t2 = time.perf_counter()
                cp, _ = latest_witnessed(s, "P-1")
                t3 = time.perf_counter()
            assert sum(st.met for st in statuses) == min(n_checkpoints, 100) and one.met
            assert cp is not None and cp.tree_size == n_checkpoints + 1
            pages.append(t1 - t0)
            ones.append(t2 - t1)
            finds.append(t3 - t2)
        print(f"policy, {n_checkpoints} cosigned + 100 uncosigned checkpoints, 2 of 2 "
              f"witnesses (median of {len(pages)}): status of the 200 newest heads "
              f"{statistics.median(pages) * 1e3:.1f} ms; one checkpoint's status "
              f"{statistics.median(ones) * 1e3:.2f} ms; newest witnessed checkpoint past 100 "
              f"uncosigned {statistics.median(finds) * 1e3:.2f} ms")
    finally:
        transport.close()
        for p in procs:
            p.kill()
            p.wait()
        engine.dispose()


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", type=int, default=1000)
    parser.add_argument("--cosign", type=int, default=2000, help="checkpoints to cosign")
    parser.add_argument("--witnesses", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=1000,
                        help="cosigned checkpoints of the policy section")
    parser.add_argument("--section", choices=("cosign", "latency", "policy", "all"),
                        default="all")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="yoco-witness-bench-"))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, state under {tmp}")
    if args.section in ("cosign", "all"):
        bench_cosign(args.cosign, tmp)
    if args.section in ("latency", "all"):
        bench_latency(args.logs, args.witnesses, tmp)
    if args.section in ("policy", "all"):
        bench_policy(args.checkpoints, tmp)


if __name__ == "__main__":
    main()
