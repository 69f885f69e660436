"""`yoco ledger ingest` of one large JSONL file: wall time and peak memory (issue 11).

Usage::

    python bench/ingest_file_bench.py --mb 50 [--code DIR ...]

Writes a SIMULATED file of about ``--mb`` megabytes (``yoco.simulate``: one contract,
jobs failing at the Meta cluster-study rate, mostly progress records, in time order),
starts a fresh embedded PostgreSQL (or uses ``DATABASE_URL``, a superuser's: it creates
yoco's roles and a database per run), and for each ``--code`` tree (default: this one)
migrates the fresh database as the owner role (``yoco db upgrade``) and runs ``yoco ledger
ingest FILE`` as the CLI's login in a child process with ``PYTHONPATH=DIR``. Prints
records, seconds, records/s and the child's peak RSS (``ru_maxrss``). Pass an older
checkout as a second ``--code`` to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTRACT = {
    "contract_id": "BENCH-1",
    "customer": "bench",
    "start_date": "2025-01-01",
    "currency": "USD",
    "annual_value": "10000000.00",
    "term_years": 1,
}


def write_file(path: Path, megabytes: float) -> int:
    """Write about ``megabytes`` MB of simulated records to ``path``; return the count."""
    from yoco.simulate import StreamConfig, simulate

    target = int(megabytes * 1_000_000)
    # ~250 bytes a record: ask for a little more than needed, stop at the size.
    count = 0
    size = 0
    with path.open("w") as fh:
        for rec in simulate(
            StreamConfig(
                contract_id="BENCH-1",
                start=datetime(2025, 1, 1, tzinfo=UTC),
                end=datetime(2026, 1, 1, tzinfo=UTC),
                records=target // 200,
                seed=42,
                parallel_jobs=16,
            )
        ):
            line = json.dumps(rec, separators=(",", ":")) + "\n"
            fh.write(line)
            size += len(line)
            count += 1
            if size >= target:
                break
    return count


def run(code: Path, url: str, data: Path, contracts: Path) -> tuple[float, int, str]:
    """Migrate, add the contract and ingest with the code in ``code``; (s, peak KiB, out)."""
    from yoco.database import CLI_LOGIN, OWNER_ROLE, login_url

    # As `yoco db upgrade` and `yoco ledger ingest` run in production: migrated by the
    # owner role, ingested by the CLI's login (neither a superuser; the CLI refuses one).
    env = dict(
        os.environ,
        PYTHONPATH=str(code),
        DATABASE_URL=login_url(url, CLI_LOGIN),
        YOCO_OWNER_DATABASE_URL=login_url(url, OWNER_ROLE),
    )
    cli = [sys.executable, "-c", "from yoco.cli import main; main()"]
    for step in (["db", "upgrade"], ["contracts", "import", str(contracts)]):
        done = subprocess.run([*cli, *step], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"yoco {' '.join(step)} failed: {done.stderr[-2000:]}")
    # The ingest runs under a wrapper of its own, so that RUSAGE_CHILDREN there is the
    # ingest's peak alone (not the migration's or the contract import's).
    wrapper = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "s = time.perf_counter() - t; "
        "print(r.returncode, s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "print(r.stdout.strip() or r.stderr[-2000:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *cli, "ledger", "ingest", str(data)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    head, _, out = done.stdout.partition("\n")
    rc, seconds, peak = head.split()
    if rc != "0":
        raise SystemExit(f"ingest failed ({rc}): {out[-2000:]}")
    return float(seconds), int(peak), out.strip()


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=50.0, help="size of the file in MB")
    parser.add_argument("--code", type=Path, action="append", help="source tree(s) to run")
    args = parser.parse_args()
    codes = args.code or [ROOT]

    from sqlalchemy.engine import make_url

    from yoco.database import bootstrap, embedded_url, ensure_database, start_embedded

    tmp = Path(tempfile.mkdtemp(prefix="yoco-ingest-bench-"))
    data = tmp / "records.jsonl"
    contracts = tmp / "contracts.json"
    contracts.write_text(json.dumps([CONTRACT]))
    count = write_file(data, args.mb)
    print(f"file: {data.stat().st_size / 1e6:.1f} MB, {count:,} records (SIMULATED)")

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        base = normalize_url(os.environ["DATABASE_URL"])
    else:
        server = start_embedded(tmp / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        base = embedded_url(server)
    for code in codes:
        db = f"bench_{uuid.uuid4().hex[:8]}"
        # yoco's roles and a database owned by the owner role (the superuser's only job);
        # each code tree then migrates it with its own `yoco db upgrade`.
        bootstrap(base, db)
        url = make_url(base).set(database=db).render_as_string(hide_password=False)
        # Each run is a fresh child; RUSAGE_CHILDREN keeps the max, so run each code
        # tree in a child of its own to read its peak alone.
        seconds, peak_kib, out = run_isolated(code, url, data, contracts)
        print(
            f"{code}: {seconds:.1f} s, {count / seconds:,.0f} records/s, "
            f"peak RSS {peak_kib / 1024:.0f} MiB  ({out})"
        )


def run_isolated(code: Path, url: str, data: Path, contracts: Path) -> tuple[float, int, str]:
    """:func:`run` in a child process of its own, so its peak RSS is its own."""
    args = [str(ROOT / "bench"), str(code), url, str(data), str(contracts)]
    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); "
        "from ingest_file_bench import run; from pathlib import Path; "
        "print(json.dumps(run(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), "
        "Path(sys.argv[5]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    seconds, peak, out = json.loads(done.stdout.strip().splitlines()[-1])
    return float(seconds), int(peak), str(out)


if __name__ == "__main__":
    main()
