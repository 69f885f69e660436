"""The ``yoco`` command line: one command, ``--help`` on every level.

Domain errors become a red message on stderr and an exit status: 2 for input
that was refused (nothing written), 1 for a failed verification.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from yoco.app import App, SchemaNotReady
from yoco_records.textsafe import safe_lines, safe_text

app = typer.Typer(
    name="yoco",
    help=(
        "yoco: training failures that cost no progress, and the ledger that proves it.\n\n"
        "Without DATABASE_URL every command uses an embedded PostgreSQL under the data "
        "directory (YOCO_DATA_DIR)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(help="The database: which one is used, and its schema.", no_args_is_help=True)
contracts_app = typer.Typer(help="Contracts and their guarantee terms.", no_args_is_help=True)
ledger_app = typer.Typer(
    help="The tamper-evident ledger: ingest, verify, sign, prove.", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(contracts_app, name="contracts")
app.add_typer(ledger_app, name="ledger")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
T = TypeVar("T")


def shown(value: Any) -> str:
    """Text from outside (stored in the ledger, or quoted from an input file) made safe
    for one console line: control and bidi characters neutralised by the one shared
    neutraliser (:func:`yoco_records.textsafe.safe_text`), rich markup escaped."""
    return escape(safe_text(value))


def print_json(obj: Any, ensure_ascii: bool = False) -> None:
    """Print ``obj`` as indented JSON to stdout with its stored text neutralised
    (:func:`yoco_records.textsafe.safe_lines`: still valid JSON, the same values)."""
    print(safe_lines(json.dumps(obj, indent=2, ensure_ascii=ensure_ascii)))


@dataclass(slots=True)
class Remote:
    """``yoco --server URL [--token T]``: read commands ask that portal's API instead of
    the database (:mod:`yoco.client`)."""

    server: str | None = None
    token: str | None = None


#: Set by the root options on every invocation.
REMOTE = Remote()
#: The commands that have a remote mode (the others refuse --server).
REMOTE_COMMANDS = ("yoco sla", "yoco contracts list", "yoco ledger public-key")


@app.callback()
def _root(
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            envvar="YOCO_SERVER",
            help="Ask a yoco portal's API at this address (https://…) instead of the "
            "database: remote mode, for 'sla', 'contracts list' and 'ledger public-key'.",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="YOCO_TOKEN",
            help="The API token of remote mode (yoco tokens create --customer …). Prefer "
            "the YOCO_TOKEN variable: a command line is visible to other local users.",
        ),
    ] = None,
) -> None:
    REMOTE.server = server
    REMOTE.token = token


@contextmanager
def remote_client() -> Iterator[Any]:
    """The API client of remote mode; its errors become exit status 2 with the server's
    message (1 when the server failed or cannot be reached)."""
    from yoco.client import ApiError, Client, ConnectionFailed, ServerError

    if REMOTE.server is None:
        fail("no --server given")
    try:
        api = Client(REMOTE.server, REMOTE.token)
    except ValueError as exc:
        fail(f"--server: {exc}")
    try:
        yield api
    except (ConnectionFailed, ServerError) as exc:
        fail(str(exc), 1)
    except ApiError as exc:
        fail(str(exc))
    finally:
        api.close()


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    err.print(f"[bold red]error:[/] {shown(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def parse_now(value: str | None) -> datetime | None:
    """The ``--now`` option: None when absent, else an aware datetime (exit 2 otherwise)."""
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        fail(f"--now must be ISO 8601 with an offset, got {value!r}")
    if t.tzinfo is None:
        fail(f"--now must carry a UTC offset, got {value!r}")
    return t


@contextmanager
def application(*, schema: bool = True) -> Iterator[App]:
    """The composition root for one command; turns domain errors into exit codes."""
    from ledger.errors import LedgerError, SuperuserLogin, VerificationFailed
    from yoco.database import DatabaseStartError

    if REMOTE.server is not None:
        from typer._click.globals import get_current_context  # typer vendors its own click

        here = get_current_context(silent=True)
        name = here.command_path if here is not None else "this command"
        fail(
            f"{name} works on the database only; remote mode (--server) is available for "
            f"{', '.join(REMOTE_COMMANDS)}"
        )
    try:
        ctx = App()
    except ValueError as exc:  # a malformed setting (yoco.settings.SettingsError)
        fail(str(exc))
    try:
        if schema:
            ctx.require_schema()
        yield ctx
    except VerificationFailed as exc:
        fail(str(exc), 1)
    except (LedgerError, SchemaNotReady, DatabaseStartError, SuperuserLogin, ValueError) as exc:
        fail(str(exc))
    finally:
        ctx.close()


def _unit(ctx: App, fn: Callable[[Any], T]) -> T:
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as session:
        return fn(session)


def _print_record_errors(errors: list[Any], limit: int = 50, more: int = 0) -> None:
    for e in errors[:limit]:
        err.print(f"  {shown(e)}", highlight=False, soft_wrap=True)
    if len(errors) + more > limit:
        err.print(f"  … and {len(errors) + more - limit} more")


# --- db -----------------------------------------------------------------------------


@db_app.command("url")
def db_url() -> None:
    """Print the database URL in use (password hidden); starts the embedded server if needed."""
    from yoco.database import redact

    with application(schema=False) as ctx:
        out.print(redact(ctx.database.url), highlight=False, soft_wrap=True)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Apply the schema migrations (starts the embedded PostgreSQL when DATABASE_URL is unset).

    Runs as the owner role (YOCO_OWNER_DATABASE_URL, default DATABASE_URL).  Given an
    administrator's (superuser's) URL it first creates yoco's roles (yoco_owner,
    yoco_app, yoco_portal and the logins yoco_cli, yoco_web, yoco_sink) and hands the
    schema to yoco_owner: the only time yoco acts as a superuser.
    """
    import migrations
    from yoco.database import migrate

    with application(schema=False) as ctx:
        url = ctx.database.owner_url
        before = migrations.current(url)
        migrate(url, revision)
        after = migrations.current(url)
        out.print(f"schema: {before or 'empty'} → {after}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision ('base' empties the schema).")],
    yes: Annotated[bool, typer.Option("--yes", help="Confirm that data will be dropped.")] = False,
) -> None:
    """Revert migrations down to REVISION. Drops tables: the ledger is lost below its revision."""
    import migrations

    if not yes:
        fail("downgrading drops tables and their data; pass --yes to confirm")
    from yoco.database import migrate

    with application(schema=False) as ctx:
        migrate(ctx.database.owner_url, revision, down=True)
        out.print(f"schema: {migrations.current(ctx.database.owner_url) or 'empty'}")


# --- contracts ------------------------------------------------------------------------


@contracts_app.command("add")
def contracts_add(
    contract_id: Annotated[str, typer.Option("--id", help="Contract id, e.g. C-2026-001.")],
    customer: Annotated[str, typer.Option(help="Customer id or name.")],
    start: Annotated[str, typer.Option(help="Start date, YYYY-MM-DD.")],
    currency: Annotated[str, typer.Option(help="ISO 4217 code, e.g. USD.")],
    annual_value: Annotated[str, typer.Option(help="Annual value, a decimal string.")],
    timezone: Annotated[str, typer.Option(help="IANA time zone of contract years.")] = "UTC",
    term_years: Annotated[int, typer.Option(help="Length of the term in years.")] = 1,
    renewal_value: Annotated[
        str | None, typer.Option(help="Base of a credit (default: the annual value).")
    ] = None,
    gpu_hour_price: Annotated[
        str | None, typer.Option(help="Price of a GPU-hour, for the cost of lost hours.")
    ] = None,
    threshold_percent: Annotated[
        str | None, typer.Option(help="Guaranteed resolution rate, percent (default 90).")
    ] = None,
    credit_percent: Annotated[
        str | None, typer.Option(help="Credit when missed, percent of the base (default 25).")
    ] = None,
    covered_class: Annotated[
        list[str] | None,
        typer.Option(help="A covered failure class (repeat; default unplanned, preemptive)."),
    ] = None,
    excluded_cause: Annotated[
        list[str] | None,
        typer.Option(
            help="An excluded cause (repeat; default network_wide_outage, "
            "facility_power, customer_code)."
        ),
    ] = None,
) -> None:
    """Create one contract (recorded in the ledger as the first entry of its log)."""
    from ledger.records import parse_contracts

    obj: dict[str, Any] = {
        "contract_id": contract_id,
        "customer": customer,
        "start_date": start,
        "timezone": timezone,
        "term_years": term_years,
        "currency": currency,
        "annual_value": annual_value,
    }
    if renewal_value is not None:
        obj["renewal_value"] = renewal_value
    if gpu_hour_price is not None:
        obj["gpu_hour_price"] = gpu_hour_price
    terms: dict[str, Any] = {}
    if threshold_percent is not None:
        terms["threshold_percent"] = threshold_percent
    if credit_percent is not None:
        terms["credit_percent"] = credit_percent
    if covered_class:
        terms["covered_classes"] = covered_class
    if excluded_cause:
        terms["excluded_causes"] = excluded_cause
    if terms:
        obj["terms"] = terms
    specs, errors = parse_contracts(json.dumps([obj]).encode())
    if errors:
        err.print("[bold red]error:[/] contract refused, nothing written:")
        _print_record_errors(errors)
        raise typer.Exit(2)
    _add_specs(specs, None)


def warn_witness_policies(ctx: App, contract_ids: list[str] | None) -> None:
    """Print a warning for each contract (all, or ``contract_ids``) whose witness policy
    names a witness not in ``YOCO_WITNESSES``, naming it, and raise the operator's
    ``witness_policy_unmet`` alert where the configured witnesses cannot meet the policy
    (:func:`yoco.scheduler.check_witness_policies`). What was recorded stays recorded."""
    from yoco.scheduler import check_witness_policies

    for reach in check_witness_policies(ctx, contract_ids):
        alert = "" if reach.can_be_met else " (operator alert witness_policy_unmet raised)"
        err.print(f"[bold yellow]warning:[/] {reach.words()}{alert}", highlight=False,
                  soft_wrap=True)


def _add_specs(specs: list[Any], where: list[str] | None) -> None:
    from ledger.contracts import add_contracts
    from ledger.errors import IngestRefused

    with application() as ctx:
        try:
            result = _unit(ctx, lambda s: add_contracts(s, specs, where))
        except IngestRefused as exc:
            err.print("[bold red]error:[/] contracts refused, nothing written:")
            _print_record_errors(exc.errors)
            raise typer.Exit(2) from None
        for cid in result.created:
            out.print(f"created contract {cid}", highlight=False)
        for cid in result.unchanged:
            out.print(f"contract {cid} already recorded, unchanged", highlight=False)
        warn_witness_policies(ctx, [*result.created, *result.unchanged])


@contracts_app.command("import")
def contracts_import(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="A JSON array of contracts, or one JSON object per line.",
        ),
    ],
) -> None:
    """Create contracts from FILE; all or nothing."""
    from ledger.records import parse_contracts

    specs, errors = parse_contracts(file.read_bytes())
    if errors:
        err.print(f"[bold red]error:[/] {file}: contracts refused, nothing written:")
        _print_record_errors(errors)
        raise typer.Exit(2)
    _add_specs(specs, [f"contract {s.contract_id!r}" for s in specs])


@contracts_app.command("list")
def contracts_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List contracts with the terms of their current year: the covered failure classes,
    the excluded causes, the threshold and the credit."""
    from rich.table import Table

    from billing.terms import Terms

    if REMOTE.server is not None:
        with remote_client() as api:
            rows: list[dict[str, Any]] = [
                {"contract_id": c.contract_id, "customer": c.customer,
                 "start_date": c.start_date, "timezone": c.timezone,
                 "term_years": c.term_years, "currency": c.currency,
                 "annual_value": c.annual_value, "current_year": c.current_year,
                 "terms": Terms.from_json(c.terms).to_json()}
                for c in api.contracts()
            ]
    else:
        with application() as ctx:
            rows = _unit(ctx, _contract_rows)
    if as_json:
        print_json(rows, ensure_ascii=True)
        return
    from billing.display import plain
    from billing.labels import causes_text, classes_text
    from billing.yearend import period_text, year_days
    from yoco.render import grouped, print_table

    table = Table("contract", "customer", "current year (first and last day)",
                  "covered classes", "excluded causes", "threshold", "credit if missed",
                  "time zone", "annual value")
    for r in rows:
        terms = Terms.from_json(r["terms"])
        k = int(r["current_year"])
        first, last = year_days(date.fromisoformat(r["start_date"]), k)
        table.add_row(
            r["contract_id"],
            r["customer"],
            f"{k} of {r['term_years']} ({period_text(first, last)})",
            classes_text(terms.covered_classes),
            causes_text(terms.excluded_causes),
            f"≥ {plain(terms.threshold_percent)} % resolved",
            f"{plain(terms.credit_percent)} % of the renewal",
            r["timezone"],
            f"{grouped(r['annual_value'])} {r['currency']}",
        )
    print_table(out, table)


def _contract_rows(s: Any) -> list[dict[str, Any]]:
    """Every contract with the terms in force in its current year (amendments applied)."""
    from billing.amendments import contract_in_force
    from billing.services import current_year
    from ledger.contracts import get_contract, list_contracts

    now = datetime.now(UTC)
    rows = []
    for r in list_contracts(s):
        k = current_year(get_contract(s, r.contract_id), now)
        force = contract_in_force(s, r.contract_id, k)
        rows.append(
            {"contract_id": r.contract_id, "customer": r.customer,
             "start_date": r.start_date.isoformat(), "timezone": r.timezone,
             "term_years": force.term_years, "currency": r.currency,
             "annual_value": str(r.annual_value), "current_year": k,
             "terms": force.terms.to_json()}
        )
    return rows


# --- ledger ---------------------------------------------------------------------------


@ledger_app.command("ingest")
def ledger_ingest(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="Records, one JSON object per line (see the README).",
        ),
    ],
) -> None:
    """Append the records of FILE to the ledger: idempotent, and all or nothing per file.

    A record whose event_id is already stored with the same content is skipped;
    any refused record (named by line and field) means nothing is written. The order
    of lines does not matter (records are appended in causal order). Large files are
    streamed in bounded memory, with a progress bar on stderr when it is a terminal.
    Ctrl-C before the file is committed writes nothing (exit status 130).
    """
    import signal

    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ledger.errors import IngestRefused
    from ledger.ingest import FileBatch, ingest_batch
    from ledger.projections import KINDS
    from ledger.stream import default_workers
    from yoco.app import extra_projected_kinds
    from yoco.database import unit_of_work
    from yoco.render import UnitsColumn

    # Ctrl-C raises KeyboardInterrupt (the unit of work rolls back) until the file's
    # commit starts; from then on it waits for the commit, so "nothing written" is
    # never said of a file that was written.
    committing = False
    late_interrupt = False

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal late_interrupt
        if committing:
            late_interrupt = True
            return
        raise KeyboardInterrupt

    # The one ingest path (ledger.ingest.ingest_batch), in two passes in bounded memory:
    # validate every line into a compact index and a spool of encoded rows (worker
    # processes for a large file; before the database is even started), then append
    # in causal order, reading the spool back chunk by chunk, in one unit of work.
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            UnitsColumn(),  # the file's bytes while validating, then records appended
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as bar, application(schema=False) as ctx:
            size = file.stat().st_size
            task = bar.add_task("validating", total=size, unit="bytes")
            steps: list[Any] = []

            def appending(keys: Any) -> None:
                bar.update(task, completed=size)
                steps.append(bar.add_task("appending", total=len(keys), unit="records"))

            @contextmanager
            def unit() -> Iterator[Any]:
                nonlocal committing
                ctx.require_schema()
                with unit_of_work(ctx.engine) as session:
                    yield session
                    committing = True  # the block ends with the commit

            try:
                result = ingest_batch(
                    unit,
                    FileBatch(
                        file,
                        progress=lambda done: bar.update(task, completed=done),
                        projected_kinds=KINDS | extra_projected_kinds(),
                        workers=default_workers(),
                    ),
                    ctx.projectors,
                    before_write=appending,
                    progress=lambda n: bar.advance(steps[-1], n),
                )
            except IngestRefused as exc:
                err.print(
                    f"[bold red]error:[/] {file}: {exc.count} record(s) refused, "
                    "nothing written:"
                )
                _print_record_errors(exc.errors, more=exc.count - len(exc.errors))
                raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err.print(
            f"[bold red]interrupted:[/] {file}: nothing written (a file is appended all or "
            "nothing); run the same command again to ingest it"
        )
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(result.by_kind.items())) or "none"
    out.print(
        f"{file}: {result.appended} appended ({kinds}), {result.duplicates} already in the ledger",
        highlight=False,
    )
    if late_interrupt:
        err.print(f"interrupted while {file} was being committed: it was written in full")
        raise typer.Exit(130)


@ledger_app.command("verify")
def ledger_verify() -> None:
    """Recompute every leaf hash, Merkle node and signed root, and every projection.

    The projections (failures, outcomes, job spans, closes, credits, disputes, ...:
    everything a figure is computed from) are recomputed from the journal and
    compared row by row with the stored tables.  Exits 1 naming the first bad entry,
    or the first differing table, row and column, when anything was edited.
    """
    from rich.progress import Progress

    from ledger.verify import total_entries, verify_all

    with application() as ctx:
        verifier = ctx.verifier if ctx.settings.signer_key_file.exists() else None

        def run(session: Any) -> Any:
            total = total_entries(session)
            with Progress(console=err, transient=True) as bar:
                task = bar.add_task("verifying", total=total)
                return verify_all(
                    session,
                    verifier,
                    lambda n: bar.advance(task, n),
                    extra=ctx.projectors,
                    extra_tables=ctx.projection_tables,
                    kinds=ctx.projected_kinds,
                )

        report = _unit(ctx, run)
        heads = _check_witnesses(ctx, verifier) if ctx.witnesses else None
    out.print(
        f"ledger verified: {report.logs:,} logs, {report.entries:,} entries, "
        f"{report.nodes:,} Merkle nodes, {report.checkpoints:,} signed checkpoints, "
        f"{report.projection_tables} projection tables ({report.projection_rows:,} rows) "
        "— all match"
    )
    if heads is not None:
        out.print(f"witnesses: {len(heads)} cosigned head(s) of {len(ctx.witnesses)} "
                  "witness(es) compared — the database extends every one")
    if verifier is None:
        out.print("(no signer key here: checkpoint signatures were not checked)")


def _check_witnesses(ctx: App, verifier: Any) -> list[Any]:
    """Compare the database with every witness's latest cosigned head of every log
    (:func:`ledger.witnessing.check_against_witnesses`); exit 1 naming the log and sizes
    when it is shorter or inconsistent, or when a witness cannot be asked."""
    from ledger.witnessing import HttpTransport, check_against_witnesses

    transport = HttpTransport(ctx.settings.witness_timeout_s)
    try:
        return _unit(ctx, lambda s: check_against_witnesses(
            s, ctx.witnesses, transport, verifier))
    except OSError as exc:
        err.print(f"[bold red]FAILED:[/] could not compare with the witnesses: {exc}",
                  highlight=False)
        raise typer.Exit(1) from None
    finally:
        transport.close()


@ledger_app.command("checkpoint")
def ledger_checkpoint() -> None:
    """Sign and store a new tree head for every log that grew since its last checkpoint.

    This is the scheduled checkpoint run (what 'yoco serve' does every
    YOCO_LEDGER_CHECKPOINT_EVERY_S seconds, and the deploy/ timers run where no
    'yoco serve' does); it waits for a checkpoint run in progress, so it is safe next to
    them.
    With YOCO_WITNESSES set, every head a witness has not cosigned is then submitted.
    A log whose size, tree or journal disagree is named (with why) and left unsigned;
    every other log is signed all the same, then the command exits 1.
    """
    from billing.schedule import checkpoint_run

    with application() as ctx:
        run = _unit(ctx, lambda s: checkpoint_run(
            s, signer=ctx.signer, origin_prefix=ctx.settings.log_origin, wait=True))
        for h in run.heads:
            out.print(f"signed: {h.log_id} size {h.tree_size} root {h.root_hash.hex()}",
                      highlight=False)
        for exc in run.refused:
            err.print(f"NOT SIGNED: {exc}", highlight=False, soft_wrap=True)
        if not run.heads and not run.refused:
            out.print("nothing to sign: no log has entries beyond its last checkpoint")
        warn_witness_policies(ctx, None)
        if ctx.witnesses:
            from yoco.scheduler import submit_and_alert

            sub = submit_and_alert(ctx)
            out.print(sub.summary(), highlight=False)
            for name, (error, _) in sorted(sub.down.items()):
                err.print(f"witness {name} down: {error}", highlight=False)
            for r in sub.refused:
                err.print(f"witness {r.witness} refused {r.log_id} size {r.tree_size} "
                          f"(HTTP {r.status}): {r.message}", highlight=False)
    if run.refused:
        raise typer.Exit(1)


@ledger_app.command("prove")
def ledger_prove(
    event_id: Annotated[str, typer.Argument(help="The event id (UUID) of a ledger entry.")],
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write the proof to this file (- or none: stdout).")
    ] = None,
) -> None:
    """Print a self-contained inclusion proof (JSON) against the latest signed tree head."""
    from ledger.services import inclusion_bundle

    with application() as ctx:
        bundle = _unit(ctx, lambda s: inclusion_bundle(s, event_id))
    text = json.dumps(bundle, indent=2, ensure_ascii=False) + "\n"
    if out_file and str(out_file) != "-":
        out_file.write_text(text)
        err.print(f"proof written to {out_file}")
    else:
        sys.stdout.write(safe_lines(text))


@ledger_app.command("export-log")
def ledger_export_log(
    contract_id: Annotated[str, typer.Argument(help="The contract whose log to export.")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory to write the log into (created if needed).")
    ],
    checkpoint: Annotated[
        int | None,
        typer.Option(
            "--checkpoint",
            min=1,
            help="Tree size of the signed checkpoint to export up to (default: the latest).",
        ),
    ] = None,
) -> None:
    """Export a contract's whole log up to a signed checkpoint (C2SP tlog-tiles layout).

    Writes checkpoint, tile/entries/... (the entries' exact bytes) and tile/<L>/...
    (hash tiles): check them offline with yoco-verify DIR --public-key KEY (docs/audit.md).
    """
    from rich.progress import Progress

    from ledger.export import export_to_dir

    with application() as ctx, Progress(console=err, transient=True) as bar:
        task = bar.add_task("exporting the log", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        info = _unit(ctx, lambda s: export_to_dir(s, contract_id, out_dir, checkpoint, tick))
    out.print(
        f"exported {info.contract_id}: {info.tree_size} entries up to checkpoint "
        f"{info.tree_size} (root {info.root_hash.hex()}), {info.files} files in {out_dir}",
        highlight=False,
    )


@ledger_app.command("public-key")
def ledger_public_key(
    log: Annotated[str | None, typer.Option(
        "--log", metavar="CONTRACT",
        help="The same key under that contract log's origin, the key name its checkpoints "
             "are signed with (what Go's note.Open needs)")] = None,
) -> None:
    """Print the checkpoint signer's verifier key (C2SP note verifier key); yoco's tools
    accept it for every log's checkpoints, old and new."""
    if REMOTE.server is not None:
        if log is not None:
            err.print("[bold red]error:[/] --log: run this on the ledger's host (a remote "
                      "server gives its key under its own name)")
            raise typer.Exit(2)
        with remote_client() as api:
            print(api.public_key())
        return
    with application(schema=False) as ctx:
        if log is None:
            print(ctx.signer.verifier_text())
            return
        from ledger.checkpoints import origin_of
        from ledger.errors import NoteError

        try:
            print(ctx.signer.verifier.named(origin_of(ctx.settings.log_origin, log)).to_text())
        except NoteError as exc:
            err.print(f"[bold red]error:[/] --log: {shown(exc)}")
            raise typer.Exit(2) from None


@ledger_app.command("rebuild")
def ledger_rebuild() -> None:
    """Recreate every projection (failures, outcomes, jobs, …) from the journal alone.

    The rebuild path: it logs in as the owner role (YOCO_OWNER_DATABASE_URL), the only
    role besides a superuser that may delete and rewrite projection rows.
    """
    from ledger.projections import rebuild
    from yoco.database import unit_of_work

    with application() as ctx:
        engine = ctx.database.owner_engine()
        try:
            with unit_of_work(engine) as session:
                n = rebuild(session, ctx.projectors, ctx.projection_tables)
        finally:
            engine.dispose()
    out.print(f"projections rebuilt from {n} journal entries")


@app.command("verify-proof")
def verify_proof(
    proof: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A proof JSON file.")],
    public_key: Annotated[
        str, typer.Option("--public-key", help="The verifier key text, or a file holding it.")
    ],
) -> None:
    """Check a proof offline, with no database: signature, leaf hash and Merkle path."""
    from ledger.canonical import parse_json_strict
    from ledger.errors import LedgerError
    from ledger.proofs import verify_bundle

    key_path = Path(public_key)
    key = key_path.read_text().strip() if key_path.is_file() else public_key.strip()
    try:
        bundle = parse_json_strict(proof.read_bytes())
        verified = verify_bundle(bundle, key)
    except (LedgerError, ValueError) as exc:
        fail(f"proof does not verify: {exc}", 1)
    out.print(f"proof verified: {shown(verified)}", highlight=False, soft_wrap=True)


def _parse_month(month: str | None) -> tuple[int, int] | None:
    if month is None:
        return None
    from billing.years import parse_month

    try:
        return parse_month(month)
    except ValueError as exc:
        fail(f"--month: {exc}")


def _parse_as_of(session: Any, contract_id: str, value: str | None) -> datetime | None:
    """``--as-of``: an instant with an offset, or a date (local midnight in the contract's zone)."""
    if value is None:
        return None
    from billing.years import local_midnight
    from ledger.contracts import get_contract

    text = value.strip()
    if len(text) == 10:
        try:
            d = date.fromisoformat(text)
        except ValueError:
            fail(f"--as-of must be YYYY-MM-DD or ISO 8601 with an offset, got {value!r}")
        return local_midnight(d, get_contract(session, contract_id).timezone)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--as-of must be YYYY-MM-DD or ISO 8601 with an offset, got {value!r}")
    if t.tzinfo is None:
        fail(f"--as-of must carry a UTC offset (e.g. +00:00), got {value!r}")
    return t


@app.command("sla")
def sla(
    contract_id: Annotated[str, typer.Argument(help="The contract.")],
    year: Annotated[int | None, typer.Option(help="Contract year K (1 = the first).")] = None,
    month: Annotated[str | None, typer.Option(help="A calendar month, YYYY-MM.")] = None,
    as_of: Annotated[
        str | None,
        typer.Option(
            "--as-of",
            help="The contract year to date as of an instant: ISO 8601 with a UTC offset "
            "(2026-04-01T00:00:00+00:00), or a date YYYY-MM-DD meaning midnight at its start "
            "in the contract's time zone. The year-to-date column of a monthly report.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The SLA figures of a contract year (default: the current one), a month, or the
    year to date as of an instant."""
    from billing.services import sla_figures
    from yoco.render import print_sla

    if sum(x is not None for x in (year, month, as_of)) > 1:
        fail("give one of --year, --month or --as-of")
    ym = _parse_month(month)
    if REMOTE.server is not None:
        if as_of is not None:
            fail("--as-of works on the database only (the API serves years and months)")
        with remote_client() as api:
            data = api.sla(contract_id, year=year, month=month).data
        if as_json:
            print_json(data, ensure_ascii=True)
        else:
            print_sla(out, data)
        return
    with application() as ctx:
        def figures(s: Any) -> Any:
            at = _parse_as_of(s, contract_id, as_of)
            return sla_figures(s, contract_id, year=year, month=ym, as_of=at)

        report = _unit(ctx, figures)
    if as_json:
        print_json(report.to_json(), ensure_ascii=True)
    else:
        print_sla(out, report)


@app.command("demo")
def demo(
    contracts: Annotated[int, typer.Option(help="Sample contracts to create (1 to 4).")] = 3,
    records: Annotated[
        int,
        typer.Option(
            help="Simulated job-progress records per contract and contract year (failures, "
            "their outcomes and the jobs' start and end come on top)."
        ),
    ] = 1500,
    seed: Annotated[int, typer.Option(help="Seed of the simulated stream.")] = 7,
    training: Annotated[
        bool, typer.Option("--training/--no-training",
                           help="Also run a real training job under the runtime (needs torch; "
                           "once per ledger).")
    ] = True,
) -> None:
    """The product tour on one machine, each step labelled REAL or SIMULATED.

    Sample contracts, a SIMULATED event stream up to today, a REAL training job under the
    migration runtime with injected faults, signed checkpoints and verification, ended
    years closed with their credits, every year's figures, last month's HTML and PDF
    reports, the finance export, an inclusion proof checked offline, and the portal's
    demo logins. Files go to $YOCO_DATA_DIR/demo. Running it again changes nothing.
    """
    from yoco.demo import run_demo

    with application(schema=False) as ctx:
        run_demo(ctx, out, contracts=contracts, records=records, seed=seed, training=training)


#: Command modules of the other domains; each exposes ``register(app)``.
COMMAND_MODULES = (
    "yoco.cli_billing",
    "yoco.cli_reports",
    "yoco.cli_web",
    "yoco.cli_runtime",
    "yoco.cli_risk",
    "yoco.cli_alerts",
)


def _register_optional() -> None:
    import importlib

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Runtime commands need torch (the ``runtime`` extra): without it the rest
            # of the CLI still works.  Any other missing module is a bug.
            if exc.name == "torch":
                continue
            raise
        module.register(app)


_registered = False


def build_app() -> typer.Typer:
    """The full ``yoco`` application with every domain's commands registered (once)."""
    global _registered
    if not _registered:
        _registered = True
        _register_optional()
        _flags_show_no_type()
    return app


def _flags_show_no_type() -> None:
    """Help pages show no type for a flag: Typer writes ``--json <bool>`` and
    ``-h <bool>``, which reads as if the flag took a value (it takes none)."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_yoco_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich._yoco_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def main() -> None:
    """Entry point of the ``yoco`` console script. A command of a role whose extra is not
    installed here (a server command on a training node, ``yoco run`` without torch)
    exits 2 with the extra to install (:mod:`yoco.extras`)."""
    from yoco.extras import missing_extra

    try:
        build_app()()
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        from rich.markup import escape

        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":  # pragma: no cover
    main()
