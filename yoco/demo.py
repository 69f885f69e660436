"""``yoco demo``: the product tour on one machine, each step labelled REAL or SIMULATED.

1. REAL: the database (the embedded PostgreSQL unless DATABASE_URL is set), migrated.
2. SAMPLE: contracts of made-up customers.
3. SIMULATED: an event stream (see :mod:`yoco.simulate`: nothing in it comes from a
   real cluster) from each contract's start to today 00:00 UTC, finished jobs only.
4. REAL: a training job under the migration runtime with injected faults, reporting into
   the ledger (once per ledger: a second run keeps the figures as they were).
5. REAL: signed checkpoints, then ``yoco ledger verify``'s full check.
6. REAL: the close-due scheduler's run (what ``yoco serve`` does hourly): ended years
   closed, credits issued — exactly once.
7. REAL: every contract year's figures.
8. REAL: last month's HTML and PDF reports, the finance export, an inclusion proof and
   its offline check, each written under ``$YOCO_DATA_DIR/demo``.
9. The portal: demo logins (created once) and the command that serves it.

Running it again on the same data folder on the same day finds every record, close,
report and export already in the ledger and changes nothing; on a later day the stream
only grows by the jobs finished since.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ledger.errors import ensure
from yoco.app import App

log = logging.getLogger(__name__)

#: The simulated stream's lanes (jobs running side by side per contract).
LANES = 2
#: Demo logins: (e-mail, role, display name); the customer user belongs to the first
#: sample contract's customer.
DEMO_USERS = (
    ("customer@acme.example", "customer", "Ada (Acme AI Labs)"),
    ("operator@vendor.example", "operator", "Olu (vendor operations)"),
    ("finance@vendor.example", "finance", "Fei (vendor finance)"),
)

SAMPLE_CONTRACTS: list[dict[str, Any]] = [
    {
        "contract_id": "ACME-2025-001",
        "customer": "Acme AI Labs",
        "start_date": "2025-01-01",
        "timezone": "America/New_York",
        "term_years": 3,
        "currency": "USD",
        "annual_value": "12000000.00",
        "renewal_value": "14500000.00",
        "gpu_hour_price": "2.85",
    },
    {
        "contract_id": "BRAVO-2024-007",
        "customer": "Bravo Research GmbH",
        "start_date": "2024-02-29",
        "timezone": "Europe/Berlin",
        "term_years": 3,
        "currency": "EUR",
        "annual_value": "4200000.00",
        "gpu_hour_price": "2.40",
        "terms": {"threshold_percent": "95", "credit_percent": "25"},
    },
    {
        "contract_id": "KAITO-2025-003",
        "customer": "Kaito Compute KK",
        "start_date": "2025-04-01",
        "timezone": "Asia/Tokyo",
        "term_years": 2,
        "currency": "JPY",
        "annual_value": "950000000",
        "terms": {"covered_classes": ["unplanned", "preemptive", "planned"]},
    },
    {
        "contract_id": "DELTA-2025-010",
        "customer": "Delta Robotics Inc.",
        "start_date": "2025-06-15",
        "timezone": "UTC",
        "term_years": 2,
        "currency": "KWD",
        "annual_value": "310000.000",
    },
]


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mlp_train.py"


def run_training_job(ctx: App, console: Console, contract_id: str) -> str | None:
    """Run a REAL training job under the runtime (2 workers, 1 hot spare) into the ledger.

    Faults are injected at chosen steps: a worker SIGKILLed (unplanned, live migration
    onto the hot spare), an ECC warning (pre-emptive move), a drain (planned move), then
    every worker killed at once (rollback to the last checkpoint). The runtime reports
    each failure and its outcome through its durable outbox into this ledger.
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        console.print(
            "[yellow]skipping the training job: torch is not installed "
            "(bash scripts/setup installs it)[/]"
        )
        return None
    if not EXAMPLE.exists():
        console.print(f"[yellow]skipping the training job: {EXAMPLE} not found[/]")
        return None
    import tempfile

    from runtime.faults import parse_fault
    from runtime.sink import SinkSpec
    from runtime.supervisor import LaunchConfig, launch

    console.print(
        f"examples/mlp_train.py on 2 workers + 1 hot spare for contract "
        f"{contract_id}, checkpoints every 10 steps. Faults injected (the plan; what "
        "happened is what the ledger recorded, printed below): SIGKILL of rank 1 at "
        "step 8 (expect a live migration onto the spare), rising corrected-ECC counts on "
        "rank 0 at step 14 (a pre-emptive move), a drain of rank 1 at step 20 (a planned "
        "move), then every worker killed at once near step 36 (no healthy replica is left: "
        "a rollback to the last checkpoint, losing the steps since it). Each spare "
        "called in is replaced by one forked from a process that has imported torch."
    )
    faults = ["kill:rank=1:step=8", "warn:rank=0:step=14:signal=ecc_rising",
              "drain:rank=1:step=20", "killall:step=36"]
    runs = Path(tempfile.mkdtemp(prefix="yoco-demo-runs-"))
    cfg = LaunchConfig(
        script=str(EXAMPLE),
        # 0.1 s per step leaves each move a second or more to find its forked spare.
        args=["--steps", "44", "--step-sleep", "0.1"],
        workers=2,
        spares=1,
        contract_id=contract_id,
        checkpoint_every=10,
        runs_root=str(runs),
        # The sink logs in as its own role (yoco_sink), like `yoco run`.
        sink=SinkSpec(target="yoco.sink:ledger_sink",
                      kwargs={"database_url": ctx.database.sink_url}),
        faults=[parse_fault(f) for f in faults],
        nvml=False,
        progress_interval_s=1.0,
    )
    t0 = time.perf_counter()
    result = launch(cfg)
    state = "finished" if result.exit_code == 0 else "FAILED"
    delivered = (
        "every record delivered to the ledger"
        if result.delivered
        else "[red]some records still in the outbox[/] (the ledger was unreachable)"
    )
    console.print(
        f"job {result.job_id}: {state} at step {result.final_step} in "
        f"{time.perf_counter() - t0:.1f} s; {len(result.recoveries)} recoveries; {delivered}",
        highlight=False,
    )
    from sqlalchemy import text

    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        rows = s.execute(
            text(
                "SELECT f.failure_class, f.cause, f.step, o.outcome, o.lost_steps, "
                "o.recovery_seconds FROM failures f "
                "LEFT JOIN outcomes o ON o.failure_event_id = f.event_id "
                "WHERE f.job_id = :job ORDER BY f.occurred_at"
            ),
            {"job": result.job_id},
        ).all()
    for cls, cause, step, outcome, lost, rec in rows:
        console.print(
            f"  step {step}: {cls:10s} {cause:16s} → {outcome} "
            f"(lost steps {lost}, recovery {float(rec):.3f} s)",
            highlight=False,
        )
    return result.job_id if result.exit_code == 0 else None


def _step(console: Console, n: int, kind: str, title: str) -> None:
    """A step's heading: REAL (the product doing its work), SIMULATED or SAMPLE data."""
    colour = {"REAL": "green", "SIMULATED": "yellow", "SAMPLE": "yellow"}[kind]
    console.rule(f"[bold]{n}. [{colour}]{kind}[/{colour}] · {title}", align="left")


def _money(amount: str, currency: str) -> str:
    return f"{Decimal(amount):,} {currency}"


def _percent(rate: str | None) -> str:
    if rate is None:
        return "no covered failures"
    return f"{(Decimal(rate) * 100).quantize(Decimal('0.01'))} %"


def window_end(now: datetime) -> datetime:
    """The simulated stream's end: today 00:00 UTC (so a day's runs see the same stream)."""
    day = now.astimezone(UTC).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def report_month(now: datetime) -> tuple[int, int]:
    """The last full calendar month before ``now`` (UTC): the month the demo reports."""
    first = now.astimezone(UTC).date().replace(day=1)
    last = first - timedelta(days=1)
    return last.year, last.month


def _demo_dir(ctx: App) -> Path:
    path = Path(ctx.settings.data_dir) / "demo"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _ingest_stream(ctx: App, console: Console, specs: list[Any], records: int, seed: int,
                   end: datetime) -> dict[str, int]:
    from billing.years import contract_year_bounds
    from ledger.ingest import RecordBatch, ingest_batch
    from yoco.database import unit_of_work
    from yoco.simulate import StreamConfig, simulate

    totals = {"appended": 0, "duplicates": 0}
    # Progress records at a fixed spacing (``records`` per contract-year over all lanes),
    # so the stream does not depend on the window's end.
    interval = LANES * 365.25 * 86400 / records
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        for i, spec in enumerate(specs):
            start, _ = contract_year_bounds(spec.start_date, spec.timezone, 1)
            if end <= start:
                continue
            stream = list(simulate(StreamConfig(
                contract_id=spec.contract_id, start=start, end=end, records=max(records, 10),
                seed=seed * 100 + i, parallel_jobs=LANES, progress_interval_s=interval)))
            task = bar.add_task(f"ingest {spec.contract_id}", total=len(stream))
            for lo in range(0, len(stream), 5000):
                part = stream[lo : lo + 5000]
                res = ingest_batch(lambda: unit_of_work(ctx.engine),
                                   RecordBatch(part, what=f"{spec.contract_id} stream"),
                                   ctx.projectors)
                totals["appended"] += res.appended
                totals["duplicates"] += res.duplicates
                bar.advance(task, len(part))
    return totals


def _training_step(ctx: App, console: Console, contract_id: str, demo_dir: Path) -> None:
    """Run the real job once per ledger: its marker names the job the ledger holds."""
    from sqlalchemy import text

    from yoco.database import unit_of_work

    marker = demo_dir / "training-job.json"
    if marker.exists():
        job_id = json.loads(marker.read_text()).get("job_id", "")
        with unit_of_work(ctx.engine) as s:
            known = s.execute(text("SELECT 1 FROM failures WHERE job_id = :j LIMIT 1"),
                              {"j": job_id}).first()
        if known:
            console.print(
                f"already in the ledger: job {job_id}, run by an earlier `yoco demo` "
                f"(details: {marker}). Not run again, so the figures stay as they were; "
                "`yoco run` starts jobs of your own.",
                highlight=False,
            )
            return
    job_id = run_training_job(ctx, console, contract_id)
    if job_id:
        marker.write_text(json.dumps({"job_id": job_id, "contract_id": contract_id,
                                      "ran_at": datetime.now(UTC).isoformat()}) + "\n")


def _years_table(ctx: App, specs: list[Any], now: datetime) -> Table:
    from billing.schedule import year_phase
    from billing.services import current_year, sla_figures
    from billing.verdict import verdict_of_json
    from billing.years import contract_year_bounds
    from ledger.contracts import get_contract
    from yoco.database import unit_of_work

    table = Table(show_lines=False)
    for col, just in (("contract", "left"), ("year", "right"), ("period (local)", "left"),
                      ("state", "left"), ("resolved / covered", "right"),
                      ("rate", "right"), ("threshold", "right"), ("guarantee", "left"),
                      ("lost GPU-h", "right"),
                      ("credit", "left")):
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for spec in specs:
        with unit_of_work(ctx.engine) as s:
            contract = get_contract(s, spec.contract_id)
            for k in range(1, current_year(contract, now) + 1):
                j = sla_figures(s, spec.contract_id, year=k, now=now).to_json()
                phase = year_phase(s, spec.contract_id, k, now=now)
                credit = j.get("credit")
                v = verdict_of_json(j)  # billing's one wording of each standing
                colour = {"ok": "green", "warn": "yellow", "bad": "red"}.get(v.tone, "default")
                standing = f"[{colour}]{v.word}[/]"
                start, end = contract_year_bounds(contract.start_date, contract.timezone, k)
                zone = ZoneInfo(contract.timezone)
                last_day = end.astimezone(zone).date() - timedelta(days=1)
                period = f"{start.astimezone(zone).date()} – {last_day}"
                table.add_row(
                    spec.contract_id, str(k), period, phase.label,
                    f"{j['resolved_failures']:,} / {j['covered_failures']:,}",
                    _percent(j["resolution_rate"]), f"≥ {v.threshold_percent} %", standing,
                    f"{Decimal(j['lost_gpu_hours']):,.0f}",
                    (f"{credit['credit_note']} {_money(credit['amount'], credit['currency'])}"
                     f" ({credit['status']})") if credit else "none",
                )
    return table


def _yoco_command() -> str:
    """How to type ``yoco`` again: plain when it is on PATH, else the path it ran from
    (``.venv/bin/yoco`` right after ``bash scripts/setup``)."""
    import shutil
    import sys

    argv0 = Path(sys.argv[0])
    found = shutil.which("yoco")
    if argv0.name != "yoco" or (found and Path(found).resolve() == argv0.resolve()):
        return "yoco"
    try:
        return str(argv0.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(argv0)


def _report_checkpoint(session: Any, contract_id: str) -> int | None:
    """The checkpoint the demo reports over: the latest one signed before the log's first
    report entry (None: the latest). A later run thus issues the very same report (already
    recorded) instead of a new one over the checkpoint that the report entries grew."""
    from sqlalchemy import func, select

    from ledger.models import Checkpoint, JournalEntry

    first_report = session.execute(
        select(func.min(JournalEntry.seq)).where(
            JournalEntry.log_id == contract_id, JournalEntry.kind == "report")
    ).scalar()
    if first_report is None:
        return None
    size: int | None = session.execute(
        select(func.max(Checkpoint.tree_size)).where(
            Checkpoint.log_id == contract_id, Checkpoint.tree_size <= first_report)
    ).scalar()
    return size


def _demo_logins(ctx: App, demo_dir: Path, customer: str) -> list[tuple[str, str, str | None]]:
    """The demo users (created once), with the passwords kept in ``demo/logins.json``."""
    from sqlalchemy import select

    from web.accounts import add_user
    from web.models import PortalUser
    from web.security import password_hasher
    from yoco.database import unit_of_work

    path = demo_dir / "logins.json"
    saved: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    out: list[tuple[str, str, str | None]] = []
    with unit_of_work(ctx.engine) as s:
        for email, role, name in DEMO_USERS:
            exists = s.execute(select(PortalUser.email).where(PortalUser.email == email)).first()
            if exists is None:
                saved[email] = secrets.token_urlsafe(12)
                add_user(s, password_hasher(), email=email, name=name, role=role,
                         password=saved[email],
                         customer=customer if role == "customer" else None)
            out.append((email, role, saved.get(email)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(saved, f, indent=2)
        f.write("\n")
    return out


def run_demo(
    ctx: App, console: Console, *, contracts: int, records: int, seed: int, training: bool = True,
    now: datetime | None = None,
) -> None:
    """Run the tour; raises on any failure (the CLI turns that into an exit code)."""
    import migrations
    from billing.export import export_credits
    from billing.schedule import close_due_run
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.proofs import verify_inclusion_bundle
    from ledger.records import parse_contracts
    from ledger.services import inclusion_bundle
    from ledger.verify import verify_all
    from reports import issued
    from reports import monthly as rm
    from yoco.database import migrate, redact, unit_of_work
    from yoco.render import print_table

    if not 1 <= contracts <= len(SAMPLE_CONTRACTS):
        raise ValueError(f"--contracts must be between 1 and {len(SAMPLE_CONTRACTS)}")
    if records < 100:
        raise ValueError("--records must be at least 100")
    now = now or datetime.now(UTC)
    started = time.perf_counter()
    demo_dir = _demo_dir(ctx)

    _step(console, 1, "REAL", "the database")
    where = "embedded PostgreSQL" if ctx.database.embedded else "DATABASE_URL"
    console.print(f"{redact(ctx.database.url)} ({where})", highlight=False, soft_wrap=True)
    # As the owner, like `yoco db upgrade`: the CLI's login may not create tables.
    migrate(ctx.database.owner_url)
    console.print(f"schema migrated to {migrations.current(ctx.database.owner_url)}")

    _step(console, 2, "SAMPLE", "contracts of made-up customers")
    chosen = SAMPLE_CONTRACTS[:contracts]
    specs, errors = parse_contracts(json.dumps(chosen).encode())
    ensure(not errors, f"the sample contracts are refused: {errors}")
    with unit_of_work(ctx.engine) as s:
        added = add_contracts(s, specs)
    for c in chosen:
        console.print(f"  {c['contract_id']}: {c['customer']}, from {c['start_date']} "
                      f"({c['timezone']}), {_money(c['annual_value'], c['currency'])} a year",
                      highlight=False)
    console.print(f"{len(added.created)} created, {len(added.unchanged)} already there")

    end = window_end(now)
    _step(console, 3, "SIMULATED", f"an event stream up to {end:%Y-%m-%d} 00:00 UTC")
    console.print(
        "Jobs of 8–4,096 GPUs failing at the Meta cluster-study rate (MTTF ≈ 7.9 h at "
        "1,024 GPUs); not real cluster data. Finished jobs only; seeded, so a run on the "
        "same day finds every record already in the ledger."
    )
    t0 = time.perf_counter()
    totals = _ingest_stream(ctx, console, specs, records, seed, end)
    console.print(f"ingested: {totals['appended']:,} appended, {totals['duplicates']:,} "
                  f"already in the ledger, in {time.perf_counter() - t0:.1f} s")

    _step(console, 4, "REAL", "a training job under the migration runtime")
    if training:
        _training_step(ctx, console, specs[0].contract_id, demo_dir)
    else:
        console.print("skipped (--no-training)")

    _step(console, 5, "REAL", "signed checkpoints and a full verification")
    with unit_of_work(ctx.engine) as s:
        heads = sign_all(s, ctx.signer, ctx.settings.log_origin)
    console.print(f"checkpoints: {sum(h.created for h in heads)} signed "
                  f"(verifier key {ctx.signer.verifier_text()})", highlight=False, soft_wrap=True)
    with unit_of_work(ctx.engine) as s:
        report = verify_all(
            s,
            ctx.verifier,
            extra=ctx.projectors,
            extra_tables=ctx.projection_tables,
            kinds=ctx.projected_kinds,
        )
    console.print(
        f"verified: {report.entries:,} entries, {report.nodes:,} Merkle nodes, "
        f"{report.checkpoints:,} signed checkpoints, {report.projection_rows:,} projection "
        "rows — all match"
    )

    _step(console, 6, "REAL", "ended contract years closed, credits issued (exactly once)")
    with unit_of_work(ctx.engine) as s:
        run = close_due_run(s, now=now, signer=ctx.signer,
                            origin_prefix=ctx.settings.log_origin, wait=True)
    for r in run.results:
        cr = r.credit
        console.print(
            f"  {r.contract_id} year {r.year}: closed, guarantee "
            + ("met" if r.guarantee_met else "[red]missed[/]")
            + (f"; credit {cr['credit_note']} of {_money(cr['amount'], cr['currency'])} issued"
               if r.credit_issued and cr else ""),
            highlight=False,
        )
    if not run.results:
        console.print("nothing to close: every ended year was closed before")
    console.print("This is the scheduler `yoco serve` runs every hour (and `yoco billing "
                  "close-due` from cron, a systemd timer or a Kubernetes CronJob: deploy/).")

    _step(console, 7, "REAL", "every contract year's figures, from the ledger")
    print_table(console, _years_table(ctx, specs, now))

    year, month = report_month(now)
    _step(console, 8, "REAL", f"monthly reports for {year:04d}-{month:02d}, HTML and PDF")
    reports_dir = demo_dir / "reports"
    reports_dir.mkdir(exist_ok=True)
    for spec in specs:
        with unit_of_work(ctx.engine) as s:  # issued once: a later run finds the issued one
            size = _report_checkpoint(s, spec.contract_id)
            made = issued.issue_month(s, spec.contract_id, year, month, size)
        stem = rm.file_stem(spec.contract_id, year, month)
        (reports_dir / f"{stem}.html").write_bytes(made.html_bytes)
        (reports_dir / f"{stem}.pdf").write_bytes(made.pdf)
        console.print(f"  {reports_dir / stem}.html and .pdf, issued over checkpoint "
                      f"{made.checkpoint_size} (ledger entry {made.seq})"
                      + ("" if made.created else ", issued before"),
                      highlight=False, soft_wrap=True)

    _step(console, 9, "REAL", "the finance export of credits")
    with unit_of_work(ctx.engine) as s:
        export = export_credits(s, "csv")
    export_path = demo_dir / "finance-export.csv"
    export_path.write_bytes(export.data)
    console.print(f"  {export_path}: {export.row_count} credit(s), batch {export.batch_id}, "
                  f"sha256 {export.sha256[:16]}…", highlight=False, soft_wrap=True)

    _step(console, 10, "REAL", "an inclusion proof, checked offline")
    with unit_of_work(ctx.engine) as s:
        from sqlalchemy import select

        from ledger.models import Failure

        fid = s.execute(select(Failure.event_id).order_by(Failure.occurred_at).limit(1)).scalar()
        bundle = inclusion_bundle(s, str(fid)) if fid is not None else None
    if bundle is not None:
        proof_path = demo_dir / "proof.json"
        key_path = demo_dir / "verifier.key"
        proof_path.write_text(json.dumps(bundle, indent=2) + "\n")
        key_path.write_text(ctx.signer.verifier_text() + "\n")
        verify_inclusion_bundle(bundle, ctx.signer.verifier_text())
        console.print(
            f"failure {fid}: proof verified against the signed head (size "
            f"{bundle['tree_size']:,}). The same check, as a customer runs it with no "
            f"database:\n  {_yoco_command()} ledger prove {fid} --out {proof_path}\n"
            f"  {_yoco_command()} verify-proof {proof_path} --public-key {key_path}",
            highlight=False, soft_wrap=True,
        )

    _step(console, 11, "REAL", "the portal")
    logins = _demo_logins(ctx, demo_dir, specs[0].customer)
    console.print("Serve it (Ctrl-C stops it), then open http://127.0.0.1:8000/ and log in:")
    console.print(f"  {_yoco_command()} serve" + (f"   (with YOCO_DATA_DIR={ctx.settings.data_dir})"
                                    if os.environ.get("YOCO_DATA_DIR") else ""),
                  highlight=False, soft_wrap=True)
    for email, role, password in logins:
        shown = password or f"(see {demo_dir / 'logins.json'})"
        console.print(f"  {role:9s} {email:26s} password {shown}",
                      highlight=False, soft_wrap=True)
    console.rule(f"[bold]done in {time.perf_counter() - started:.0f} s")
    y = _yoco_command()
    console.print(f"Everything written is in {demo_dir}. Next: `{y} sla CONTRACT --json`, "
                  f"`{y} billing status CONTRACT`, `{y} contracts list`, `{y} ledger verify`.",
                  highlight=False, soft_wrap=True)
