"""`yoco ledger ingest FILE` on the user's path: records/s into a ledger that holds data.

Usage::

    python bench/ingest_file_bench.py [--existing 1000000] [--records 1000000]
                                      [--demo-records 256299] [--tenants 4] [--skip-demo]

Starts a fresh embedded PostgreSQL (or uses ``DATABASE_URL``, a superuser's: it only
creates yoco's roles and a database per case owned by the owner role, which migrates
it), then, logged in as the product's roles (never a superuser):

1. **large**: imports ``--tenants`` contracts of as many customers with ``yoco contracts
   import``, fills the ledger with ``--existing`` SIMULATED entries through the product's
   stream path (``ledger.ingest.ingest_stream`` as the CLI's login), ANALYZEs the journal
   as the owner (what autovacuum does: the statistics that once flipped the duplicate
   check to a sequential scan), then times ``yoco ledger ingest FILE`` as a
   child process for a file of ``--records`` new SIMULATED lines (contracts of the same
   customers);
2. **after demo**: a second database where ``yoco demo --no-training`` ran first, then
   ``yoco ledger ingest`` of a ``--demo-records``-line file (the 256,299-line file a
   user once reported as slow).

Prints, per case, the lines, the wall time of the ``yoco`` process, records/s, its peak
RSS and the load average before and after (other work on the machine slows it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

START = datetime(2025, 1, 1, tzinfo=UTC)
END = datetime(2026, 1, 1, tzinfo=UTC)


def contract(cid: str, customer: str) -> dict[str, Any]:
    """A one-year contract object as ``yoco contracts import`` takes it."""
    return {
        "contract_id": cid,
        "customer": customer,
        "start_date": "2025-01-01",
        "currency": "USD",
        "annual_value": "10000000.00",
        "term_years": 1,
    }


def simulated(cid: str, count: int, seed: int) -> list[dict[str, Any]]:
    """The first ``count`` SIMULATED records of contract ``cid`` (time order).

    The window is the contract's year for 250,000 records or more, and shorter in
    proportion below: failures come at a fixed rate per GPU-hour, so the mix of kinds
    (~2.5% failures, as many outcomes, the rest mostly progress) does not depend on
    ``count``.
    """
    from yoco.simulate import StreamConfig, simulate

    end = START + (END - START) * min(1.0, count / 250_000)
    config = StreamConfig(
        contract_id=cid, start=START, end=end, records=int(count * 1.1) + 100, seed=seed,
        parallel_jobs=16,
    )
    return list(islice(simulate(config), count))


def write_file(path: Path, cids: list[str], total: int, seed: int) -> int:
    """Write about ``total`` SIMULATED lines for ``cids`` (a share each); return the count."""
    count = 0
    with path.open("w") as fh:
        for k, cid in enumerate(cids):
            share = total // len(cids) + (1 if k < total % len(cids) else 0)
            for rec in simulated(cid, share, seed + k):
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                count += 1
    return count


def cli_env(db: Any, data_dir: Path) -> dict[str, str]:
    """The environment under which ``yoco`` logs in as the product's roles."""
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        DATABASE_URL=db.url,
        YOCO_OWNER_DATABASE_URL=db.owner_url,
        YOCO_PORTAL_DATABASE_URL=db.portal_url,
        YOCO_SINK_DATABASE_URL=db.sink_url,
        YOCO_DATA_DIR=str(data_dir),
    )


def yoco(env: dict[str, str], *args: str) -> str:
    """Run ``yoco ARGS`` as a child process; its stdout (exit on failure)."""
    done = subprocess.run(
        [sys.executable, "-m", "yoco.cli", *args], env=env, cwd=ROOT, capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"yoco {' '.join(args)} failed: {done.stderr[-3000:]}")
    return done.stdout


def timed_ingest(env: dict[str, str], path: Path, code: Path = ROOT) -> tuple[float, int, str]:
    """``yoco ledger ingest PATH`` with the ``yoco`` of source tree ``code``, in a wrapper
    of its own: (seconds, peak KiB, output)."""
    env = dict(env, PYTHONPATH=os.pathsep.join((str(code), env.get("PYTHONPATH", ""))))
    # The wrapper's RUSAGE_CHILDREN is then the ingest's (and its workers') peak alone.
    wrapper = (
        "import resource, subprocess, sys, time; t = time.monotonic(); "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "s = time.monotonic() - t; "
        "print(r.returncode, s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "print(r.stdout.strip() or r.stderr[-2000:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "yoco.cli", "ledger", "ingest",
         str(path)],
        env=env, cwd=code, capture_output=True, text=True, check=True,
    )
    head, _, out = done.stdout.partition("\n")
    rc, seconds, peak = head.split()
    if rc != "0":
        raise SystemExit(f"ingest failed ({rc}): {out[-2000:]}")
    return float(seconds), int(peak), out.strip()


def fill(db: Any, cids: list[str], total: int, seed: int, batch: int = 20000) -> float:
    """Append ``total`` SIMULATED entries for ``cids`` through the stream path, as the CLI's
    login; return the seconds it took."""
    from ledger.ingest import RecordBatch, ingest_stream
    from ledger.projections import KINDS
    from yoco.app import extra_projected_kinds, extra_projectors
    from yoco.database import make_engine, unit_of_work

    engine = make_engine(db.url)
    t = time.monotonic()
    try:
        for k, cid in enumerate(cids):
            share = total // len(cids) + (1 if k < total % len(cids) else 0)
            records = simulated(cid, share, seed + k)
            batches = [
                RecordBatch(records[lo : lo + batch], what=f"{cid} {lo}")
                for lo in range(0, len(records), batch)
            ]
            for _ in ingest_stream(
                lambda: unit_of_work(engine),
                batches,
                extra_projectors(),
                projected_kinds=KINDS | extra_projected_kinds(),
                workers=1,
            ):
                pass
    finally:
        engine.dispose()
    return time.monotonic() - t


def copy_database(base: str, db: Any) -> Any:
    """A copy of database ``db`` (``CREATE DATABASE ... TEMPLATE``, as the superuser)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from yoco.database import (
        CLI_LOGIN,
        OWNER_ROLE,
        PORTAL_LOGIN,
        SINK_LOGIN,
        Database,
        login_url,
    )

    name = make_url(db.url).database
    copy = f"{name}_c{uuid.uuid4().hex[:6]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{copy}" TEMPLATE "{name}" OWNER {OWNER_ROLE}'))
    finally:
        admin.dispose()
    url = make_url(base).set(database=copy).render_as_string(hide_password=False)
    return Database(
        url=login_url(url, CLI_LOGIN),
        owner_url=login_url(url, OWNER_ROLE),
        portal_url=login_url(url, PORTAL_LOGIN),
        sink_url=login_url(url, SINK_LOGIN),
    )


def analyze(db: Any) -> int:
    """ANALYZE the journal as the owner (as autovacuum would); return its row count."""
    from sqlalchemy import text

    from yoco.database import make_engine

    owner = make_engine(db.owner_url, app_role=False)
    try:
        with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("ANALYZE journal_entries"))
            return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())
    finally:
        owner.dispose()


def report(case: str, lines: int, held: int, seconds: float, peak: int, load: str, out: str
           ) -> None:
    """Print one case's figures."""
    print(
        f"{case}: {lines:,} lines into a ledger of {held:,} entries: {seconds:.1f} s, "
        f"{lines / seconds:,.0f} records/s, peak RSS {peak / 1024:.0f} MiB; "
        f"load {load} -> {load_now()}\n    ({out})",
        flush=True,
    )


def load_now() -> str:
    """The 1/5/15-minute load averages."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--existing", type=int, default=1_000_000,
                        help="entries in the ledger before the timed ingest")
    parser.add_argument("--records", type=int, default=1_000_000, help="lines of the file")
    parser.add_argument("--demo-records", type=int, default=256_299,
                        help="lines of the file ingested after `yoco demo`")
    parser.add_argument("--tenants", type=int, default=4, help="customers (one contract each)")
    parser.add_argument("--skip-demo", action="store_true", help="only the large case")
    parser.add_argument(
        "--code", type=Path, action="append",
        help="source tree(s) whose `yoco ledger ingest` is timed, each on a fresh copy of "
        "the large case's ledger (default: this one); pass an older checkout to compare",
    )
    args = parser.parse_args()

    from yoco.database import embedded_url, ensure_database, prepare, start_embedded

    tmp = Path(tempfile.mkdtemp(prefix="yoco-ingest-bench-"))
    print(f"{os.cpu_count()} CPUs; load {load_now()}; files in {tmp}", flush=True)
    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        base = normalize_url(os.environ["DATABASE_URL"])
    else:
        server = start_embedded(tmp / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        base = embedded_url(server)

    # Case 1: a file of new records into a ledger that already holds --existing entries.
    db = prepare(base, f"bench_{uuid.uuid4().hex[:8]}")
    env = cli_env(db, tmp / "data-large")
    held_ids = [f"HELD-{k}" for k in range(args.tenants)]
    new_ids = [f"NEW-{k}" for k in range(args.tenants)]
    contracts = tmp / "contracts.json"
    contracts.write_text(json.dumps(
        [contract(c, f"customer-{k}") for k, c in enumerate(held_ids)]
        + [contract(c, f"customer-{k}") for k, c in enumerate(new_ids)]
    ))
    yoco(env, "contracts", "import", str(contracts))
    if args.existing:
        seconds = fill(db, held_ids, args.existing, seed=1)
        print(f"filled {args.existing:,} entries in {seconds:.0f} s (stream path)", flush=True)
    held = analyze(db)
    data = tmp / "records.jsonl"
    lines = write_file(data, new_ids, args.records, seed=101)
    print(f"file: {data.stat().st_size / 1e6:.0f} MB, {lines:,} lines (SIMULATED)", flush=True)
    codes = args.code or [ROOT]
    template = db
    for i, code in enumerate(codes):
        if i + 1 < len(codes):
            # Each tree gets the same ledger: a copy of it, made before the ingest.
            db = copy_database(base, template)
            env = cli_env(db, tmp / f"data-large-{i}")
        else:
            db = template
            env = cli_env(db, tmp / "data-large")
        load = load_now()
        seconds, peak, out = timed_ingest(env, data, code)
        report(f"large [{code}]", lines, held, seconds, peak, load, out)

    if args.skip_demo:
        return
    # Case 2: `yoco demo` first (its contracts and SIMULATED stream), then a large file.
    db = prepare(base, f"bench_{uuid.uuid4().hex[:8]}")
    env = cli_env(db, tmp / "data-demo")
    t = time.monotonic()
    yoco(env, "demo", "--no-training")
    print(f"yoco demo --no-training: {time.monotonic() - t:.0f} s", flush=True)
    yoco(env, "contracts", "import", str(contracts))
    held = analyze(db)
    data = tmp / "after-demo.jsonl"
    lines = write_file(data, new_ids[:1], args.demo_records, seed=202)
    load = load_now()
    seconds, peak, out = timed_ingest(env, data)
    report("after demo", lines, held, seconds, peak, load, out)


if __name__ == "__main__":
    main()
