"""``yoco billing …``: year close, credits, applications, disputes, amendments, export.

Every write runs in one unit of work: all or nothing.  Refused input exits 2 with
nothing written (see :func:`yoco.cli.application`).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from yoco.cli import (
    application,
    err,
    fail,
    out,
    parse_now,
    print_json,
    shown,
    warn_witness_policies,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from yoco.app import App

T = TypeVar("T")

billing_app = typer.Typer(
    help="Billing: contract-year close, renewal credits, disputes, the finance export.",
    no_args_is_help=True,
)
dispute_app = typer.Typer(help="Customer disputes of failure events.", no_args_is_help=True)
billing_app.add_typer(dispute_app, name="dispute")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def register(app: typer.Typer) -> None:
    """Add the ``billing`` command group to the ``yoco`` application."""
    app.add_typer(billing_app, name="billing")


def _unit(ctx: App, fn: Callable[[Session], T]) -> T:
    """Run ``fn`` in one unit of work (commit on success, roll back on error)."""
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as session:
        return fn(session)


def _date(name: str, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        fail(f"{name} must be a date YYYY-MM-DD, got {value!r}")


def _print_json(obj: Any) -> None:
    print_json(obj)


def _money(credit: dict[str, Any], key: str = "amount") -> str:
    """An amount of a credit with separators and the currency (billing.money.format_money)."""
    from decimal import Decimal

    from billing.money import format_money

    return format_money(Decimal(credit[key]), credit["currency"])


def _print_close(r: Any) -> None:
    from decimal import Decimal

    from billing.verdict import verdict as judge

    fig = r.figures
    v = judge(fig["resolved_failures"], fig["covered_failures"],
              Decimal(fig["threshold_percent"]), True)
    verdict = v.word if v.covered else "met (no covered failures)"
    rate = v.rate
    if r.action == "unchanged":
        head = f"{r.contract_id} year {r.year}: already closed at {r.closed_at} (no change)"
    elif r.action == "adjusted":
        head = f"{r.contract_id} year {r.year}: adjusted"
    else:
        head = f"{r.contract_id} year {r.year}: closed"
    out.print(
        f"{head} — {fig['resolved_failures']}/{fig['covered_failures']} resolved "
        f"(rate {rate}, threshold {fig['threshold_percent']} %): guarantee {verdict}",
        highlight=False,
    )
    if r.credit_issued and r.credit:
        c = r.credit
        out.print(
            f"  credit issued: {c['credit_note']} {_money(c)}", highlight=False
        )
    elif r.credit:
        c = r.credit
        out.print(
            f"  credit: {c['credit_note']} {_money(c)} ({c['status']})",
            highlight=False,
        )
    if r.voided:
        out.print(f"  credit {r.voided} voided", highlight=False)
    if r.pending_adjustment:
        out.print("  pending adjustment: run close-year again to adjust", highlight=False)
    if r.checkpoint_size:
        out.print(f"  checkpoint signed at tree size {r.checkpoint_size}", highlight=False)


@billing_app.command("close-year")
def close_year_cmd(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    year: Annotated[int, typer.Option("--year", help="Contract year K (1 = the first).")],
    now: Annotated[
        str | None, typer.Option(help="Close time, ISO 8601 with offset (default: now).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Close contract year K: final figures, verdict, credit if missed, signed checkpoint.

    Closing twice reports the first close; a year with a pending adjustment (late
    records, resolved disputes) is adjusted instead.
    """
    from billing.closing import close_year

    at = parse_now(now)
    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: close_year(
                s,
                contract_id,
                year,
                now=at,
                signer=ctx.signer,
                origin_prefix=ctx.settings.log_origin,
            ),
        )
    if as_json:
        _print_json(r.to_json())
    else:
        _print_close(r)


@billing_app.command("close-due")
def close_due_cmd(
    include_pending: Annotated[
        bool, typer.Option(help="Also adjust closed years with a pending adjustment.")
    ] = False,
    now: Annotated[
        str | None, typer.Option(help="As of, ISO 8601 with offset (default: now).")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="When another run is in progress, wait for it and then "
                     "run (default: leave the work to it and exit 0)."),
    ] = False,
    alerts: Annotated[
        bool,
        typer.Option("--alerts/--no-alerts", help="Then run the alerts (detect, deliver): "
                     "see 'yoco alerts run'."),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Close every contract year that has ended and is not closed yet (the scheduler's run).

    Credits are claim-free: 'yoco serve' runs this every hour in the background, and a
    cron entry, systemd timer or Kubernetes CronJob can run it too (deploy/). Idempotent
    and safe from several places at once: a run takes a PostgreSQL advisory lock, and a
    run that finds another one at work does nothing (exit 0). A year is never closed
    twice and never gets two credits. Afterwards the alerts run (docs/alerts.md); a
    failed alert delivery is reported on stderr and in 'yoco alerts deliveries', and
    does not change the exit status.
    """
    from billing.schedule import close_due_run

    at = parse_now(now)
    with application() as ctx:
        run = _unit(
            ctx,
            lambda s: close_due_run(
                s,
                now=at,
                signer=ctx.signer,
                origin_prefix=ctx.settings.log_origin,
                include_pending=include_pending,
                wait=wait,
            ),
        )
        if alerts:
            from yoco.alerting import alerts_config, run_alerts

            try:
                alerts_run = run_alerts(ctx.engine, alerts_config(ctx.settings), now=at)
            except Exception as exc:  # the years are closed: report, do not fail the run
                err.print(f"alerts run failed: {type(exc).__name__}: {exc}", highlight=False)
            else:
                happened = alerts_run.sent or (alerts_run.detect and alerts_run.detect.raised)
                if happened and not as_json:
                    err.print(alerts_run.summary(), highlight=False)
    if not run.ran:
        err.print("another close-due run is in progress; it closes what is due (nothing done)")
    if as_json:
        _print_json([r.to_json() for r in run.results])
        return
    if not run.ran:
        return
    if not run.results:
        out.print("nothing to close")
    for r in run.results:
        _print_close(r)


@billing_app.command("status")
def status_cmd(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    year: Annotated[
        int | None,
        typer.Option("--year", help="Contract year K (default: the current one, as 'yoco sla')."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Whether a contract year is open, ended and closing, or closed; and its credit.

    Ended years are closed automatically (by the scheduler in 'yoco serve', or a close-due
    timer); the status says when the year's credit, if the guarantee is missed, is issued.
    """
    from billing.schedule import year_phase
    from billing.services import credit_status, current_year, year_status
    from billing.yearend import closed_verdict_text, period_text, year_days
    from ledger.contracts import get_contract

    def read(s: Any) -> tuple[Any, Any, Any, int, Any]:
        k = year
        c = get_contract(s, contract_id)
        if k is None:
            k = current_year(c, datetime.now(UTC))
        return (year_status(s, contract_id, k), credit_status(s, contract_id, k),
                year_phase(s, contract_id, k), k, c)

    with application() as ctx:
        st, cr, phase, year, contract = _unit(ctx, read)
    period, tz = period_text(*year_days(contract.start_date, year)), contract.timezone
    if as_json:
        _print_json({"contract_id": contract_id, "year": year, "close": st, "credit": cr,
                     "phase": phase.to_json()})
        return
    # billing.yearend's words, as the credits page and the finance export write them
    head = f"{contract_id} year {year} ({period}, {tz}): {phase.label}"
    if st is None:
        out.print(f"{head} — {phase.credit_note}", highlight=False)
    else:
        out.print(
            f"{head} at {st['closed_at']}, {closed_verdict_text(st['guarantee_met'])}, "
            f"{st['adjustments']} adjustment(s)"
            + (", PENDING ADJUSTMENT" if st["pending_adjustment"] else ""),
            highlight=False,
        )
    if cr:
        out.print(
            f"  credit {cr['credit_note']}: {_money(cr)} ({cr['status']}), applied "
            f"{_money(cr, 'applied_amount')}, remaining {_money(cr, 'remaining_amount')}",
            highlight=False,
        )


@billing_app.command("credits")
def credits_cmd(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    as_json: JsonOpt = False,
) -> None:
    """List a contract's credits (void ones too)."""
    from rich.table import Table

    from billing.services import credits_of
    from billing.yearend import period_text, year_days
    from ledger.contracts import get_contract

    with application() as ctx:
        rows, start = _unit(
            ctx, lambda s: (credits_of(s, contract_id), get_contract(s, contract_id).start_date)
        )
    if as_json:
        _print_json(rows)
        return
    from yoco.render import grouped, print_table

    if not rows:
        out.print(f"{contract_id}: no credit has been issued", highlight=False)
        return
    table = Table("credit note", "year", "period (first and last day)", "amount", "currency",
                  "status", "applied", "remaining")
    for c in rows:
        table.add_row(
            c["credit_note"],
            str(c["year"]),
            period_text(*year_days(start, int(c["year"]))),
            grouped(c["amount"]),
            c["currency"],
            c["status"],
            grouped(c["applied_amount"]),
            grouped(c["remaining_amount"]),
        )
    print_table(out, table)


@billing_app.command("apply")
def apply_cmd(
    credit: Annotated[str, typer.Argument(help="Credit id or credit-note number (CN-…).")],
    invoice: Annotated[str, typer.Option(help="Invoice reference.")],
    invoice_amount: Annotated[str, typer.Option(help="Invoice total, a decimal string.")],
    applied_on: Annotated[str, typer.Option("--date", help="Date applied, YYYY-MM-DD.")],
    kind: Annotated[str, typer.Option(help="Invoice kind: renewal or expansion.")] = "renewal",
    amount: Annotated[
        str | None,
        typer.Option(help="Amount to apply (default: as much as the invoice takes)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Record that a credit was applied to a renewal or expansion invoice.

    What the invoice cannot take stays on the credit (carried forward).
    """
    from billing.credits import apply_credit

    d = _date("--date", applied_on)
    if d is None:
        fail("--date: required")
    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: apply_credit(
                s,
                credit,
                invoice_ref=invoice,
                invoice_amount=invoice_amount,
                applied_on=d,
                invoice_kind=kind,
                amount=amount,
            ),
        )
    j = r.to_json()
    if as_json:
        _print_json(j)
        return
    c = j["credit"]
    out.print(
        f"{c['credit_note']}: applied {j['applied']} {c['currency']} to {invoice}"
        + ("" if r.created else " (already recorded)")
        + f"; remaining {c['remaining_amount']} {c['currency']} ({c['status']})",
        highlight=False,
    )


@billing_app.command("export")
def export_cmd(
    fmt: Annotated[str, typer.Option("--format", help="csv, xlsx or json.")],
    out_file: Annotated[Path, typer.Option("--out", help="File to write (-: standard output).")],
    since: Annotated[
        str | None, typer.Option(help="Only credits issued on or after DATE (UTC).")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            help="Only credits with this status (repeat): issued, partially_applied, applied, void."
        ),
    ] = None,
    contract: Annotated[str | None, typer.Option(help="Only this contract.")] = None,
) -> None:
    """Write the finance export of credits (one row per credit) and record it in the ledger.

    The same selection over unchanged credits gives the same batch id and identical bytes.
    """
    from billing.export import export_credits

    since_d = _date("--since", since)
    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: export_credits(s, fmt, since=since_d, statuses=status, contract_id=contract),
        )
    if str(out_file) == "-":
        import sys

        sys.stdout.buffer.write(r.data)
        sys.stdout.buffer.flush()
        err.print(f"export {r.batch_id}: {r.row_count} credit(s) (sha256 {r.sha256})",
                  highlight=False)
        return
    out_file.write_bytes(r.data)
    out.print(
        f"export {r.batch_id}: {r.row_count} credit(s) → {out_file} (sha256 {r.sha256})",
        highlight=False,
    )


def _witness_policy_file(arg: str) -> Any:
    """The JSON of ``--witnesses FILE`` (None for ``none``); exit 2 naming the option when
    the file cannot be read or is not JSON (its fields are checked by the amendment)."""
    import json

    if arg == "none":
        return None
    try:
        with open(arg, "rb") as f:
            raw = f.read(1 << 20)
        return json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        fail(f"--witnesses {arg}: cannot read a JSON policy: {exc}")


@billing_app.command("amend")
def amend_cmd(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    kind: Annotated[str, typer.Option("--type", help="renewal, expansion, value or terms.")],
    effective: Annotated[str, typer.Option(help="Effective date, YYYY-MM-DD (local).")],
    annual_value: Annotated[str | None, typer.Option(help="New annual value.")] = None,
    renewal_value: Annotated[str | None, typer.Option(help="New renewal value.")] = None,
    term_years: Annotated[int | None, typer.Option(help="New (longer) term, in years.")] = None,
    threshold_percent: Annotated[str | None, typer.Option(help="New threshold.")] = None,
    credit_percent: Annotated[str | None, typer.Option(help="New credit percent.")] = None,
    witnesses: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="New witness policy: a JSON file holding an object with \"keys\" (the "
            "witnesses' cosignature/v1 keys) and \"quorum\" (how many must cosign), "
            "docs/audit.md §7; or 'none' to remove it. It governs every checkpoint signed "
            "after the amendment is recorded, whatever --effective says.",
        ),
    ] = None,
    in_progress: Annotated[
        bool,
        typer.Option(
            "--applies-to-year-in-progress",
            help="Also govern the contract year containing the effective date.",
        ),
    ] = False,
    amendment_id: Annotated[
        str | None, typer.Option("--id", help="Your reference (makes a retry a no-op).")
    ] = None,
) -> None:
    """Amend a contract from an effective date (a renewal extends the term)."""
    from billing.amendments import amend_contract

    eff = _date("--effective", effective)
    if eff is None:
        fail("--effective: required")
    changes: dict[str, Any] = {}
    if annual_value is not None:
        changes["annual_value"] = annual_value
    if renewal_value is not None:
        changes["renewal_value"] = renewal_value
    if term_years is not None:
        changes["term_years"] = term_years
    terms: dict[str, Any] = {}
    if threshold_percent is not None:
        terms["threshold_percent"] = threshold_percent
    if credit_percent is not None:
        terms["credit_percent"] = credit_percent
    if witnesses is not None:
        terms["witnesses"] = _witness_policy_file(witnesses)
    if terms:
        changes["terms"] = terms
    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: amend_contract(
                s,
                contract_id,
                amendment_type=kind,
                effective_date=eff,
                changes=changes,
                applies_to_year_in_progress=in_progress,
                amendment_id=amendment_id,
            ),
        )
        out.print(
            f"amendment {r.event_id} of {contract_id}"
            + (" recorded" if r.created else " already recorded"),
            highlight=False,
        )
        if witnesses is not None:
            warn_witness_policies(ctx, [contract_id])


@dispute_app.command("open")
def dispute_open_cmd(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    failure_event_id: Annotated[str, typer.Argument(help="The disputed failure event.")],
    reason: Annotated[str, typer.Option(help="Why the customer disputes it.")],
    by: Annotated[str, typer.Option(help="Who opens it.")] = "customer",
) -> None:
    """Open a dispute of a failure event."""
    from billing.disputes import open_dispute

    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: open_dispute(s, contract_id, failure_event_id, reason=reason, opened_by=by),
        )
    out.print(f"dispute {r.dispute['dispute_id']} opened", highlight=False)


@dispute_app.command("resolve")
def dispute_resolve_cmd(
    dispute_id: Annotated[str, typer.Argument(help="The dispute.")],
    by: Annotated[str, typer.Option(help="The operator deciding.")],
    note: Annotated[str, typer.Option(help="The decision's reason.")],
    exclusion: Annotated[
        bool, typer.Option("--exclusion", help="Resolve by excluding the failure.")
    ] = False,
    failure_class: Annotated[
        str | None, typer.Option("--class", help="Reclassify: the new failure class.")
    ] = None,
    cause: Annotated[str | None, typer.Option(help="Reclassify: the new cause.")] = None,
) -> None:
    """Resolve a dispute by an exclusion (--exclusion) or a reclassification (--class/--cause)."""
    from billing.disputes import resolve_dispute

    reclass = failure_class is not None or cause is not None
    if exclusion == reclass:
        fail("give either --exclusion or a reclassification (--class and/or --cause)")
    with application() as ctx:
        r = _unit(
            ctx,
            lambda s: resolve_dispute(
                s,
                dispute_id,
                resolution="exclusion" if exclusion else "reclassification",
                decided_by=by,
                note=note,
                failure_class=failure_class,
                cause=cause,
            ),
        )
    out.print(f"dispute {dispute_id} resolved by {r.dispute['resolution']}", highlight=False)


@dispute_app.command("reject")
def dispute_reject_cmd(
    dispute_id: Annotated[str, typer.Argument(help="The dispute.")],
    by: Annotated[str, typer.Option(help="The operator deciding.")],
    note: Annotated[str, typer.Option(help="Why it is rejected.")],
) -> None:
    """Reject a dispute."""
    from billing.disputes import reject_dispute

    with application() as ctx:
        _unit(ctx, lambda s: reject_dispute(s, dispute_id, decided_by=by, note=note))
    out.print(f"dispute {dispute_id} rejected", highlight=False)


@dispute_app.command("list")
def dispute_list_cmd(
    contract: Annotated[str | None, typer.Option(help="Only this contract.")] = None,
    status: Annotated[str | None, typer.Option(help="open, resolved or rejected.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List disputes."""
    from billing.disputes import list_disputes

    with application() as ctx:
        rows = _unit(ctx, lambda s: list_disputes(s, contract, status))
    if as_json:
        _print_json(rows)
        return
    if not rows:
        err.print("no disputes")
    for d in rows:
        out.print(
            shown(
                f"{d['dispute_id']} {d['contract_id']} failure {d['failure_event_id']} "
                f"{d['status']}"
                + (f" ({d['resolution']})" if d["resolution"] else "")
                + f": {d['reason']}"
            ),
            highlight=False,
        )
