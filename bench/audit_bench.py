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

Each timed run is a child process of its own (nothing of the set-up in its memory),
which reports its wall time and its CPU time (``time.process_time``: comparable on a
shared, loaded machine, unlike wall time); the load average is printed with each.

``--keep DIR`` keeps the built archive, reports and key in ``DIR`` and reuses them when
``DIR`` already holds them (the set-up takes minutes; a profile of the verifier alone
then runs again and again on the same archive).  ``--code TREE`` (repeatable) times the
verifier of another source tree or git revision on the same archive, runs interleaved,
and prints each one's ratio to the first::

    python bench/audit_bench.py --records 1000000 --runs 3 --code main --code .
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "verifier")]

#: The files a kept set-up holds (``--keep``).
KEPT = ("log.tar.gz", "dec.html", "dec.pdf", "key.txt", "meta.json")

#: One timed verifier run, in a child process whose ``sys.path`` starts at the tree's
#: ``verifier/``: wall and CPU seconds around ``run(argv)`` alone, its exit code, output.
_CHILD = """
import contextlib, io, json, sys, time
sys.path.insert(0, sys.argv[1])
from yoco_verify.cli import run
out = io.StringIO()
w, c = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(out):
    code = run(sys.argv[2:])
w, c = time.perf_counter() - w, time.process_time() - c
print(json.dumps({"code": code, "wall": w, "cpu": c, "out": out.getvalue()}))
"""


def load_now() -> str:
    """The 1/5/15-minute load averages."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def verifier_of(code: str, tmp: Path) -> Path:
    """The ``verifier/`` folder of ``code``: a source tree, or a git revision of this
    repository (its ``verifier/`` written under ``tmp``)."""
    tree = Path(code)
    if (tree / "verifier" / "yoco_verify").is_dir():
        return (tree / "verifier").resolve()
    rev = subprocess.run(["git", "rev-parse", "--short", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    dest = tmp / f"code-{rev}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev, "verifier"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "verifier"


@dataclass(frozen=True, slots=True)
class Run:
    """One timed verifier run: exit code, wall and CPU seconds, output, load before it."""

    code: int
    wall: float
    cpu: float
    out: str
    load: str


def timed_run(verifier: Path, argv: list[str]) -> Run:
    """One ``yoco-verify ARGV`` of the ``verifier/`` folder given, in a child process."""
    load = load_now()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(verifier), *argv],
                          capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return Run(int(got["code"]), float(got["wall"]), float(got["cpu"]), str(got["out"]), load)


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=20000, help="records per transaction")
    parser.add_argument("--runs", type=int, default=3, help="timed verifier runs")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the archive, reports and key in DIR; reuse them if there")
    parser.add_argument("--code", action="append", metavar="TREE",
                        help="a source tree or git revision whose verifier is timed on the "
                        "same archive (repeatable; default: this tree)")
    args = parser.parse_args()

    keep: Path | None = args.keep
    if keep is not None and all((keep / name).exists() for name in KEPT):
        print(f"reusing the set-up kept in {keep}", flush=True)
        time_verifier(keep, args)
        return
    work = Path(tempfile.mkdtemp(prefix="yoco-audit-bench-"))
    try:
        build(work, args)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in KEPT:
                shutil.copyfile(work / name, keep / name)
            print(f"kept the set-up in {keep}", flush=True)
        time_verifier(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def time_verifier(where: Path, args: argparse.Namespace) -> None:
    """Time ``yoco-verify`` (of each ``--code``) on the archive and reports in ``where``."""
    meta = json.loads((where / "meta.json").read_text())
    argv = [str(where / "log.tar.gz"), "--public-key", (where / "key.txt").read_text().strip(),
            "--report", str(where / "dec.html"), "--report", str(where / "dec.pdf")]
    size = int(meta["tree_size"])
    tmp = Path(tempfile.mkdtemp(prefix="yoco-audit-code-"))
    try:
        codes = args.code or [str(ROOT)]
        trees = [verifier_of(c, tmp) for c in codes]
        print(f"{os.cpu_count()} CPUs; {size:,} entries; {meta.get('records')} records "
              "simulated", flush=True)
        runs: list[list[Run]] = [[] for _ in codes]
        for r in range(args.runs):
            for i, tree in enumerate(trees):  # interleaved: the same load for each tree
                res = timed_run(tree, argv)
                if res.code != 0:
                    raise SystemExit(f"[{codes[i]}] yoco-verify failed:\n{res.out[-3000:]}")
                runs[i].append(res)
                print(f"  run {r + 1} [{codes[i]}]: {res.wall:.1f} s wall, {res.cpu:.1f} s "
                      f"CPU, load {res.load}", flush=True)
        lines = runs[-1][-1].out.splitlines()
        matches = sum(1 for ln in lines if ln.startswith("  ") and ln.endswith("  matches"))
        print("\n".join(lines[:2] + lines[-3:]))
        first_cpu = min(x.cpu for x in runs[0])
        for i, code in enumerate(codes):
            walls = [x.wall for x in runs[i]]
            cpus = [x.cpu for x in runs[i]]
            loads = ", ".join(x.load for x in runs[i])
            ratio = f"; CPU best {first_cpu / min(cpus):.2f}x the first" if i else ""
            print(
                f"VERIFY+RECOMPUTE [{code}]: {size:,} entries, {matches} figures matched "
                f"(HTML and PDF): wall best {min(walls):.1f} s, worst {max(walls):.1f} s; "
                f"CPU best {min(cpus):.1f} s, worst {max(cpus):.1f} s of {args.runs} runs "
                f"= {size / min(walls):,.0f} entries/s wall (goal: < 5 s){ratio}; "
                f"load before each run {loads}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build(work: Path, args: argparse.Namespace) -> None:
    """The operator's side, for real: ledger, report, export; written into ``work``."""
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
        (work / "key.txt").write_text(signer.verifier_text() + "\n")
        (work / "meta.json").write_text(json.dumps(
            {"tree_size": info.tree_size, "records": len(stream), "kinds": kinds}))
    finally:
        engine.dispose()
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
