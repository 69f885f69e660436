"""Ledger benchmark: sustained ingest, full verification, inclusion proofs, SLA figures.

Usage::

    python bench/ledger_bench.py --records 1000000

Uses ``DATABASE_URL`` if set, else a fresh embedded PostgreSQL in a temporary folder.
The stream is SIMULATED (``yoco.simulate``): one contract, one contract year, jobs of
8–4,096 GPUs failing at the Meta cluster-study rate, mostly progress records.
Prints each figure next to its goal (DESIGN section 6).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def server_cpu(pid: int | None) -> float:
    """CPU seconds used so far by the database server ``pid`` and every process it ran.

    Its own time, its reaped children's (backends that ended) and its live children's,
    from /proc (Linux, a local server); 0.0 when they cannot be read.
    """
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")

    def fields(p: int | str) -> list[str]:
        with open(f"/proc/{p}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()

    try:
        own = fields(pid)
        total = sum(int(x) for x in own[11:15])  # utime, stime, cutime, cstime
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            children = fh.read().split()
    except OSError:
        return 0.0
    for child in children:
        try:
            total += sum(int(x) for x in fields(child)[11:13])
        except OSError:
            continue  # it ended meanwhile (counted in cutime next time)
    return total / tick


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=20000, help="records per transaction")
    parser.add_argument("--proofs", type=int, default=200, help="inclusion proofs to time")
    parser.add_argument("--sla-runs", type=int, default=20)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes validating ahead (0: validate in this process, in turn)",
    )
    args = parser.parse_args()

    from sqlalchemy import create_engine, text

    from billing.services import sla_figures
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.note import Signer, generate_signer
    from ledger.records import parse_contracts
    from ledger.services import inclusion_bundle
    from ledger.verify import verify_all
    from yoco.database import (
        embedded_url,
        ensure_database,
        make_engine,
        start_embedded,
        unit_of_work,
    )
    from yoco.simulate import StreamConfig, simulate

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url = normalize_url(os.environ["DATABASE_URL"])
        server = None
    else:
        server = start_embedded(Path(tempfile.mkdtemp(prefix="yoco-bench-")) / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")

    # Roles and a database owned by yoco_owner (migrated as it); the app's own login.
    from yoco.database import prepare

    url = prepare(url, db).url
    engine = make_engine(url)

    start = datetime(2025, 1, 1, tzinfo=UTC)
    end = datetime(2026, 1, 1, tzinfo=UTC)
    specs, errors = parse_contracts(
        b'{"contract_id":"BENCH-1","customer":"bench","start_date":"2025-01-01",'
        b'"currency":"USD","annual_value":"10000000.00","term_years":1}'
    )
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)

    t = time.perf_counter()
    stream = list(
        simulate(
            StreamConfig(
                contract_id="BENCH-1",
                start=start,
                end=end,
                records=args.records,
                seed=42,
                parallel_jobs=16,
            )
        )
    )
    gen_s = time.perf_counter() - t
    kinds: dict[str, int] = {}
    for r in stream:
        kinds[str(r["kind"])] = kinds.get(str(r["kind"]), 0) + 1
    print(f"simulated stream: {len(stream)} records {kinds} in {gen_s:.1f} s")

    # Ingest: validation + canonical bytes + hashing + Merkle nodes + projections, batched,
    # through the product's stream path (ledger.ingest.ingest_stream): batch N+1 is
    # validated and encoded in a worker process while batch N is written.
    from ledger.ingest import RecordBatch, ingest_stream
    from ledger.projections import KINDS
    from yoco.app import extra_projected_kinds, extra_projectors

    batches = [
        RecordBatch(stream[lo : lo + args.batch], what=f"batch {lo // args.batch}")
        for lo in range(0, len(stream), args.batch)
    ]
    n = len(stream)
    postmaster = server.get_postmaster_info().pid if server is not None else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    db_cpu = server_cpu(postmaster)
    cpu = time.process_time()
    t0 = time.perf_counter()
    done = 0
    for i, result in enumerate(
        ingest_stream(
            lambda: unit_of_work(engine),
            batches,
            extra_projectors(),
            projected_kinds=KINDS | extra_projected_kinds(),
            workers=args.workers,
        )
    ):
        done += result.appended
        if i % 10 == 0:
            rate = done / (time.perf_counter() - t0)
            print(f"  ingested {done}: {rate:,.0f} records/s", flush=True)
    total = time.perf_counter() - t0
    cpu = time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    engine.dispose()  # the backends end, so their time is counted
    db_cpu = server_cpu(postmaster) - db_cpu
    assert done == n, (done, n)
    print(
        f"INGEST: {n} records in {total:.1f} s = {n / total:,.0f} records/s "
        f"(batches of {args.batch}, {args.workers} worker process(es); goal >= 15,000/s "
        f"at 1,000,000); CPU: this process {cpu:.1f} s, workers {workers_cpu:.1f} s, "
        f"database server {db_cpu:.1f} s"
    )

    key, _ = generate_signer("bench.example/log")
    signer = Signer.from_text(key)
    with unit_of_work(engine) as s:
        sign_all(s, signer, "bench.example/log")
    from ledger.note import Verifier

    verifier = Verifier.from_text(signer.verifier_text())
    from ledger.verify import verify_projections
    from yoco.app import extra_projection_tables

    every = {
        "extra": extra_projectors(),
        "extra_tables": extra_projection_tables(),
        "kinds": KINDS | extra_projected_kinds(),
    }
    t = time.perf_counter()
    with unit_of_work(engine) as s:
        report = verify_all(s, verifier, **every)  # type: ignore[arg-type]
    vs = time.perf_counter() - t
    t = time.perf_counter()
    with unit_of_work(engine) as s:
        verify_projections(s, **every)  # type: ignore[arg-type]
    ps = time.perf_counter() - t
    print(
        f"VERIFY: {report.entries} entries, {report.nodes} nodes, "
        f"{report.projection_rows} projection rows in {report.projection_tables} tables "
        f"in {vs:.2f} s = {report.entries / vs:,.0f} entries/s (goal >= 100,000/s); "
        f"the projections alone {ps:.2f} s"
    )

    from sqlalchemy import select

    from ledger.models import JournalEntry

    with unit_of_work(engine) as s:
        ids = [str(x) for x in s.execute(select(JournalEntry.event_id)).scalars()]
    rng = random.Random(1)
    picks = rng.sample(ids, min(args.proofs, len(ids)))
    lat = []
    with unit_of_work(engine) as s:
        for eid in picks:
            t = time.perf_counter()
            inclusion_bundle(s, eid)
            lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    print(
        f"PROOF at {len(ids):,} entries: p50 {statistics.median(lat):.2f} ms, "
        f"p99 {lat[int(len(lat) * 0.99) - 1]:.2f} ms, max {lat[-1]:.2f} ms "
        "(goal: p99 < 10 ms at 1,000,000)"
    )

    now = datetime(2026, 6, 1, tzinfo=UTC)
    times = []
    for _ in range(args.sla_runs):
        with unit_of_work(engine) as s:
            t = time.perf_counter()
            rep = sla_figures(s, "BENCH-1", year=1, now=now)
            times.append((time.perf_counter() - t) * 1000)
    times.sort()
    j = rep.to_json()
    print(
        f"SLA over {len(ids):,} events ({j['covered_failures']} covered failures, "
        f"rate {j['resolution_rate']}, goodput {j['goodput']}): p50 "
        f"{statistics.median(times):.1f} ms, max {times[-1]:.1f} ms (goal < 50 ms)"
    )

    engine.dispose()
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE "{db}" WITH (FORCE)'))
    admin.dispose()
    if server is not None:
        server.cleanup()


if __name__ == "__main__":
    main()
