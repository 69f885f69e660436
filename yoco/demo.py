"""``yoco demo``: the whole story on one machine, on the embedded database.

Migrates, creates sample contracts, ingests a SIMULATED event stream (see
:mod:`yoco.simulate`: nothing in it comes from a real cluster), signs a
checkpoint, verifies the ledger, proves one entry offline and prints every
contract year's figures.  The stream is seeded and dated, so running the demo
again finds every record already in the ledger and changes nothing.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from yoco.app import App

DEMO_END = datetime(2026, 11, 1, tzinfo=UTC)
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


def run_training_job(ctx: App, console: Console, contract_id: str) -> None:
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
            "(pip install torch==2.13.0)[/]"
        )
        return
    if not EXAMPLE.exists():
        console.print(f"[yellow]skipping the training job: {EXAMPLE} not found[/]")
        return
    import tempfile

    from runtime.faults import parse_fault
    from runtime.sink import SinkSpec
    from runtime.supervisor import LaunchConfig, launch

    console.rule("[bold]a real training job under the runtime")
    console.print(
        f"examples/mlp_train.py on 2 workers + 1 hot spare for contract "
        f"{contract_id}; injected: SIGKILL of rank 1 at step 8 (live migration onto "
        "the spare), rising corrected-ECC counts on rank 0 at step 14 (pre-emptive move), "
        "a drain of rank 1 at step 20 (planned move), then every worker killed at step 36 "
        "(rollback to the checkpoint of step 30; checkpoints every 10 steps). Each spare "
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
        sink=SinkSpec(target="yoco.sink:ledger_sink", kwargs={"database_url": ctx.database.url}),
        faults=[parse_fault(f) for f in faults],
        nvml=False,
        progress_interval_s=1.0,
    )
    t0 = time.perf_counter()
    result = launch(cfg)
    state = "finished" if result.exit_code == 0 else "FAILED"
    console.print(
        f"job {result.job_id}: {state} at step {result.final_step} in "
        f"{time.perf_counter() - t0:.1f} s; {len(result.recoveries)} recoveries; "
        f"records delivered to the ledger: {result.delivered}",
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


def run_demo(
    ctx: App, console: Console, *, contracts: int, records: int, seed: int, training: bool = True
) -> None:
    """Run the demo; raises on any failure (the CLI turns that into an exit code)."""
    import json

    import migrations
    from billing.services import current_year, sla_figures
    from billing.years import contract_year_bounds
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts, get_contract
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from ledger.services import inclusion_bundle
    from ledger.verify import verify_all
    from yoco.database import redact, unit_of_work
    from yoco.render import print_sla
    from yoco.simulate import StreamConfig, simulate

    if not 1 <= contracts <= len(SAMPLE_CONTRACTS):
        raise ValueError(f"--contracts must be between 1 and {len(SAMPLE_CONTRACTS)}")
    if records < 100:
        raise ValueError("--records must be at least 100")
    console.rule("[bold]yoco demo")
    where = "embedded PostgreSQL" if ctx.database.embedded else "DATABASE_URL"
    console.print(f"database: {redact(ctx.database.url)} ({where})", highlight=False)
    migrations.upgrade(ctx.database.url)
    console.print(f"schema migrated to {migrations.current(ctx.database.url)}")

    chosen = SAMPLE_CONTRACTS[:contracts]
    specs, errors = parse_contracts(json.dumps(chosen).encode())
    assert not errors, errors
    with unit_of_work(ctx.engine) as s:
        added = add_contracts(s, specs)
    console.print(f"contracts: {len(added.created)} created, {len(added.unchanged)} already there")

    console.print(
        "[yellow]SIMULATED[/] event stream: jobs of 8–4,096 GPUs failing at the Meta "
        "cluster-study rate (MTTF ≈ 7.9 h at 1,024 GPUs); not real cluster data."
    )
    per_contract = records // contracts
    totals = {"appended": 0, "duplicates": 0}
    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        for i, spec in enumerate(specs):
            start, _ = contract_year_bounds(spec.start_date, spec.timezone, 1)
            stream = list(
                simulate(
                    StreamConfig(
                        contract_id=spec.contract_id,
                        start=start,
                        end=DEMO_END,
                        records=per_contract,
                        seed=seed * 100 + i,
                    )
                )
            )
            task = bar.add_task(f"ingest {spec.contract_id}", total=len(stream))
            for lo in range(0, len(stream), 5000):
                recs, errs = validate_batch(stream[lo : lo + 5000])
                assert not errs, errs[:3]
                with unit_of_work(ctx.engine) as s:
                    res = ingest(s, recs, extra_projectors=ctx.projectors)
                totals["appended"] += res.appended
                totals["duplicates"] += res.duplicates
                bar.advance(task, len(recs))
    dt = time.perf_counter() - t0
    console.print(
        f"ingested: {totals['appended']} appended, {totals['duplicates']} already in "
        f"the ledger, in {dt:.1f} s"
    )

    with unit_of_work(ctx.engine) as s:
        heads = sign_all(s, ctx.signer, ctx.settings.log_origin)
    console.print(
        f"checkpoints: {sum(h.created for h in heads)} signed "
        f"(verifier key {ctx.signer.verifier_text()})",
        highlight=False,
    )
    with unit_of_work(ctx.engine) as s:
        report = verify_all(
            s,
            ctx.verifier,
            extra=ctx.projectors,
            extra_tables=ctx.projection_tables,
            kinds=ctx.projected_kinds,
        )
    console.print(
        f"verified: {report.entries} entries, {report.nodes} Merkle nodes, "
        f"{report.checkpoints} signed checkpoints, {report.projection_rows} projection rows "
        "— all match"
    )

    with unit_of_work(ctx.engine) as s:
        from sqlalchemy import select

        from ledger.models import Failure

        fid = s.execute(select(Failure.event_id).order_by(Failure.occurred_at).limit(1)).scalar()
        if fid is not None:
            from ledger.proofs import verify_inclusion_bundle

            bundle = inclusion_bundle(s, str(fid))
            verify_inclusion_bundle(bundle, ctx.signer.verifier_text())
            console.print(
                f"inclusion proof of failure {fid}: verified offline against the "
                f"signed head (size {bundle['tree_size']})",
                highlight=False,
            )

    if training:
        run_training_job(ctx, console, specs[0].contract_id)
        with unit_of_work(ctx.engine) as s:
            sign_all(s, ctx.signer, ctx.settings.log_origin)

    now = datetime.now(UTC)
    for spec in specs:
        with unit_of_work(ctx.engine) as s:
            contract = get_contract(s, spec.contract_id)
            for k in range(1, current_year(contract, now) + 1):
                print_sla(console, sla_figures(s, spec.contract_id, year=k, now=now))
    console.rule("[bold]done")
    console.print(
        "Next: `yoco sla CONTRACT --json`, `yoco ledger prove EVENT_ID`, `yoco ledger verify`."
    )
