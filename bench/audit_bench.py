"""Audit-kit benchmark: verify a year of a 2,048-GPU contract's exported log and recompute
its monthly report, offline, with yoco-verify.

Usage::

    python bench/audit_bench.py --records 1000000

Builds the ledger for real (embedded PostgreSQL unless ``DATABASE_URL`` is set): one
contract, one contract year (2025), a SIMULATED stream (``yoco.simulate``) of 2,048-GPU
jobs back to back, failing at the Meta cluster-study rate, mostly progress records;
ingests it, signs the log, issues the December report (HTML and PDF) over that
checkpoint (its ``report`` entry recorded), signs again and exports the log as the
portal's ``.tar.gz`` download.  Only then it times the customer's side:
``yoco-verify LOG.tar.gz --public-key KEY --report DEC.html --report DEC.pdf`` (the
archive read in memory, every entry hashed and held to its rules, every tile and the
root checked, both files' digests found in the log, every figure of the month and the
year to date recomputed from the entries and compared with both files).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "verifier")]


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=20000, help="records per transaction")
    parser.add_argument("--runs", type=int, default=3, help="timed verifier runs")
    args = parser.parse_args()

    from yoco_verify.cli import run

    import yoco.simulate as simulate_mod
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.export import export_tar
    from ledger.ingest import ingest
    from ledger.note import Signer, generate_signer
    from ledger.records import parse_contracts, validate_batch
    from reports.monthly import issue_monthly_report
    from yoco.database import (
        embedded_url,
        ensure_database,
        make_engine,
        start_embedded,
        unit_of_work,
    )

    work = Path(tempfile.mkdtemp(prefix="yoco-audit-bench-"))
    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url, server = normalize_url(os.environ["DATABASE_URL"]), None
    else:
        server = start_embedded(work / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    db = f"bench_{uuid.uuid4().hex[:8]}"
    # Roles and a database owned by yoco_owner (migrated as it); the app's own login.
    from yoco.database import prepare

    url = prepare(url, db).url
    engine = make_engine(url)
    try:
        specs, errors = parse_contracts(
            b'{"contract_id":"AUDIT-2048","customer":"bench","start_date":"2025-01-01",'
            b'"currency":"USD","annual_value":"60000000.00","gpu_hour_price":"3.10",'
            b'"term_years":1}'
        )
        assert not errors
        with unit_of_work(engine) as s:
            add_contracts(s, specs)
        # A 2,048-GPU contract: one lane of 2,048-GPU jobs, back to back, all year.
        simulate_mod.GPU_SIZES, simulate_mod.GPU_WEIGHTS = (2048,), (1,)
        stream = list(
            simulate_mod.simulate(
                simulate_mod.StreamConfig(
                    contract_id="AUDIT-2048",
                    start=datetime(2025, 1, 1, tzinfo=UTC),
                    end=datetime(2026, 1, 1, tzinfo=UTC),
                    records=args.records,
                    seed=7,
                    parallel_jobs=1,
                )
            )
        )
        kinds: dict[str, int] = {}
        for r in stream:
            kinds[str(r["kind"])] = kinds.get(str(r["kind"]), 0) + 1
        print(f"simulated: {len(stream)} records {kinds}", flush=True)
        t = time.perf_counter()
        for lo in range(0, len(stream), args.batch):
            recs, errs = validate_batch(stream[lo : lo + args.batch])
            assert not errs, errs[:3]
            with unit_of_work(engine) as s:
                ingest(s, recs)
        print(f"ingested in {time.perf_counter() - t:.1f} s (set-up, not the figure)", flush=True)
        key, _ = generate_signer("bench.example/AUDIT-2048")
        signer = Signer.from_text(key)
        with unit_of_work(engine) as s:
            sign_all(s, signer, "bench.example")
        t = time.perf_counter()
        with unit_of_work(engine) as s:
            report, _ = issue_monthly_report(s, "AUDIT-2048", 2025, 12)
        html, pdf = work / "dec.html", work / "dec.pdf"
        html.write_bytes(report.html_bytes)
        pdf.write_bytes(report.pdf)
        print(f"report built and issued in {time.perf_counter() - t:.1f} s", flush=True)
        with unit_of_work(engine) as s:  # a checkpoint covering the report entry
            sign_all(s, signer, "bench.example")
        t = time.perf_counter()
        with unit_of_work(engine) as s:
            info, data = export_tar(s, "AUDIT-2048")
        archive = work / "log.tar.gz"
        archive.write_bytes(data)
        print(
            f"exported {info.tree_size} entries, {info.files} files, a "
            f"{len(data) / 1e6:.0f} MB archive in {time.perf_counter() - t:.1f} s "
            "(the portal's download)",
            flush=True,
        )
        argv = [str(archive), "--public-key", signer.verifier_text(), "--report",
                str(html), "--report", str(pdf)]  # fmt: skip
        times = []
        for _ in range(args.runs):
            out = io.StringIO()
            t = time.perf_counter()
            with contextlib.redirect_stdout(out):
                code = run(argv)
            times.append(time.perf_counter() - t)
            assert code == 0, out.getvalue()[-3000:]
        lines = out.getvalue().splitlines()
        matches = sum(1 for ln in lines if ln.startswith("  ") and ln.endswith("  matches"))
        print("\n".join(lines[:2] + lines[-3:]))
        best, worst = min(times), max(times)
        print(
            f"VERIFY+RECOMPUTE: {info.tree_size:,} entries, {matches} figures matched "
            f"(HTML and PDF): best {best:.1f} s, worst {worst:.1f} s of {args.runs} runs "
            f"= {info.tree_size / best:,.0f} entries/s (goal: well under 60 s)"
        )
    finally:
        engine.dispose()
        if server is not None:
            server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
