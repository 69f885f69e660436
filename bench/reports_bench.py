"""Monthly report benchmark: `yoco reports monthly` over a batch of contracts.

Usage::

    python bench/reports_bench.py --contracts 200 --jobs 2

Uses ``DATABASE_URL`` if set (a server where it may create a database), else a fresh
embedded PostgreSQL in a temporary folder.  Seeds ``--contracts`` contracts, each with
SIMULATED records for January to March 2026 (2–4 jobs, 0–40 failures a month of every
class and outcome, a few exclusions), signs every log, then runs the real command
``yoco reports monthly --month 2026-03 --out DIR --jobs N`` in a subprocess and prints
the seconds per report (goal: < 2 s per contract, DESIGN section 6).  ``--big`` also
times one report of a month with that many failures, rendered in this process.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _rec(kind: str, cid: str, at: datetime, rng: random.Random, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "event_id": _id(rng), "contract_id": cid,
            "occurred_at": at.isoformat(), **fields}


def contract_records(cid: str, seed: int, per_month: tuple[int, int]) -> list[dict[str, Any]]:
    """January–March 2026 of one simulated contract."""
    rng = random.Random(seed)
    recs: list[dict[str, Any]] = []
    start = datetime(2026, 1, 2, tzinfo=UTC)
    end = datetime(2026, 3, 30, tzinfo=UTC)
    jobs = [f"job-{j}" for j in range(rng.randint(2, 4))]
    for j in jobs:
        gpus = rng.choice([64, 512, 2048])
        recs.append(_rec("job_started", cid, start, rng, job_id=j, gpus=gpus))
    for month in (1, 2, 3):
        for _ in range(rng.randint(*per_month)):
            at = datetime(2026, month, 1, tzinfo=UTC) + timedelta(
                seconds=rng.randint(3600 * 24, 27 * 86400))
            r = rng.random()
            cls = "unplanned" if r < 0.7 else "preemptive" if r < 0.93 else "planned"
            cause = rng.choice(["gpu_lost", "ecc_uncorrectable", "node_power", "thermal",
                                "ecc_rising", "network_wide_outage"])
            fail = _rec("failure", cid, at, rng, job_id=rng.choice(jobs), failure_class=cls,
                        cause=cause, node=f"node-{rng.randint(1, 256):03d}", gpu=rng.randint(0, 7))
            recs.append(fail)
            o = rng.random()
            if o < 0.98:
                outcome = "live_migrated" if o < 0.9 else "rolled_back" if o < 0.96 else "failed"
                lost = rng.randint(1, 300) if outcome == "rolled_back" else 0
                recovery = f"{rng.uniform(0.5, 600):.3f}"
                affected = rng.choice([8, 16, 64])
                # reported 30 s after the recovery ended: the ledger refuses an outcome
                # reported before its recovery is over (docs/definitions.md)
                recs.append(_rec(
                    "outcome", cid, at + timedelta(seconds=30 + float(recovery)), rng,
                    failure_event_id=fail["event_id"], outcome=outcome, lost_steps=lost,
                    recovery_seconds=recovery, step_seconds="2.5", gpus_affected=affected))
            if rng.random() < 0.03:
                recs.append(_rec("exclusion", cid, at + timedelta(hours=2), rng,
                                 failure_event_id=fail["event_id"],
                                 reason="customer maintenance window", approved_by="ops"))
    for j in jobs:
        recs.append(_rec("job_finished", cid, end, rng, job_id=j, step=100000))
    # Recovery seconds as JSON numbers, as producers send them.
    for r in recs:
        if "recovery_seconds" in r:
            r["recovery_seconds"] = float(r["recovery_seconds"])
            r["step_seconds"] = float(r["step_seconds"])
    return recs


def main() -> None:
    """Seed, sign, run the command, print the figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contracts", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--min-failures", type=int, default=0)
    parser.add_argument("--max-failures", type=int, default=40)
    parser.add_argument("--big", type=int, default=0, help="also time one month with N failures")
    args = parser.parse_args()

    import json

    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.note import load_or_create_signer
    from ledger.records import parse_contracts, validate_batch
    from yoco.database import (
        embedded_url,
        ensure_database,
        make_engine,
        start_embedded,
        unit_of_work,
    )

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url = normalize_url(os.environ["DATABASE_URL"])
    else:
        server = start_embedded(Path(tempfile.mkdtemp(prefix="yoco-bench-")) / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    db = f"bench_reports_{uuid.uuid4().hex[:8]}"
    # Roles and a database owned by yoco_owner (migrated as it); the app's own login.
    from yoco.database import prepare

    url = prepare(url, db).url
    engine = make_engine(url)
    data_dir = Path(tempfile.mkdtemp(prefix="yoco-bench-data-"))
    origin = "bench.example/ledger"
    signer = load_or_create_signer(data_dir / "keys" / "checkpoint-signer.key", origin)

    t = time.perf_counter()
    ids = [f"B-{i:04d}" for i in range(args.contracts)]
    contracts = [{"contract_id": cid, "customer": f"Customer {i:03d} Ltd",
                  "start_date": "2026-01-01", "currency": "USD",
                  "annual_value": "2400000.00", "gpu_hour_price": "2.75", "term_years": 1}
                 for i, cid in enumerate(ids)]
    specs, errors = parse_contracts(json.dumps(contracts).encode())
    assert not errors, errors
    failures = 0
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    for i, cid in enumerate(ids):
        stream = contract_records(cid, i, (args.min_failures, args.max_failures))
        failures += sum(1 for r in stream if r["kind"] == "failure")
        recs, errs = validate_batch(stream)
        assert not errs, errs[:3]
        with unit_of_work(engine) as s:
            ingest(s, recs)
    if args.big:
        stream = contract_records("BIG", 999, (args.big, args.big))
        specs, _ = parse_contracts(json.dumps([dict(contracts[0], contract_id="BIG")]).encode())
        with unit_of_work(engine) as s:
            add_contracts(s, specs)
            ingest(s, validate_batch(stream)[0])
    with unit_of_work(engine) as s:
        sign_all(s, signer, origin)
    print(f"seeded {len(ids)} contracts, {failures} failures (Jan–Mar 2026) "
          f"in {time.perf_counter() - t:.1f} s")

    out = Path(tempfile.mkdtemp(prefix="yoco-bench-reports-"))
    env = dict(os.environ, DATABASE_URL=url, YOCO_DATA_DIR=str(data_dir),
               YOCO_LOG_ORIGIN=origin)
    cmd = [sys.executable, "-m", "yoco.cli", "reports", "monthly", "--month", "2026-03",
           "--out", str(out), "--jobs", str(args.jobs)]
    for cid in ids:
        cmd += ["--contract", cid]
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    load = os.getloadavg()[0]
    pdfs = sorted(out.glob("*.pdf"))
    size = sum(p.stat().st_size for p in pdfs) / max(len(pdfs), 1)
    print(f"REPORTS: {len(pdfs)} reports (HTML + PDF: drafts, not issued) in {wall:.1f} s "
          f"with --jobs {args.jobs} = {wall / len(ids):.2f} s per contract "
          f"(goal < 2 s; includes process start-up); mean PDF {size / 1024:.0f} KiB")
    print(f"CPU: {cpu:.1f} CPU-seconds in the command and its workers = {cpu / len(ids):.2f} "
          f"CPU-s per report, i.e. {cpu / len(ids) / args.jobs:.2f} s per report on "
          f"{args.jobs} idle cores (load average at the end: {load:.1f})")

    if args.big:
        from reports.monthly import build_monthly_report

        with unit_of_work(engine) as s:
            build_monthly_report(s, ids[0], 2026, 3)  # warm the fonts
            t = time.perf_counter()
            rep = build_monthly_report(s, "BIG", 2026, 3)
            big = time.perf_counter() - t
        from io import BytesIO

        from pypdf import PdfReader

        pages = len(PdfReader(BytesIO(rep.pdf)).pages)
        print(f"BIG MONTH: {len(rep.rows)} failures, {pages} pages, PDF "
              f"{len(rep.pdf) / 1024:.0f} KiB in {big:.1f} s (one process, one report)")
    engine.dispose()


if __name__ == "__main__":
    main()
