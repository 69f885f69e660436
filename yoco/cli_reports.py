"""``yoco reports``: monthly SLA reports, HTML and PDF, recorded in the ledger.

The database work (figures, HTML, the ledger entry) runs in this process; PDFs are
rendered by a pool of worker processes (``--jobs``, default: every core), which never
touch the database.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from yoco.cli import application, err, fail, out, shown

if TYPE_CHECKING:
    from reports.monthly import PreparedReport

FORMATS = ("html", "pdf")


def _formats(text: str) -> tuple[str, ...]:
    from reports.errors import BadFormat

    chosen = tuple(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
    bad = [p for p in chosen if p not in FORMATS]
    if bad or not chosen:
        raise BadFormat(f"--format takes html, pdf or html,pdf; got {text!r}")
    return chosen


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def monthly(
    month: Annotated[
        str, typer.Option(help="The calendar month, YYYY-MM (in each contract's time zone).")
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder to write the reports into (created).")
    ],
    contract: Annotated[
        list[str] | None,
        typer.Option("--contract", help="Only this contract (repeat for several). Default: every "
                     "contract active in the month."),
    ] = None,
    formats: Annotated[
        str, typer.Option("--format", help="Files to write: html, pdf or html,pdf.")
    ] = "html,pdf",
    checkpoint: Annotated[
        int | None,
        typer.Option(help="Tree size of the signed checkpoint to report over (default: the "
                     "latest of each contract's log). Needs exactly one --contract."),
    ] = None,
    jobs: Annotated[
        int, typer.Option(min=1, help="Processes rendering PDFs (default: one per core).")
    ] = max(os.cpu_count() or 1, 1),
) -> None:
    """Write one monthly SLA report per contract (HTML and PDF) and record each in the ledger.

    Each report is computed over one signed checkpoint of the contract's log and says
    which; its SHA-256 digests are appended to that log as a report entry (issuing
    the same report again records nothing new).  Contracts that cannot be reported
    (no signed checkpoint yet, …) are listed at the end and make the exit status 2.
    """
    from reports import monthly as rm
    from reports.errors import ReportError
    from reports.render import html_to_pdf

    try:
        year, mon = rm.parse_month(month)
        chosen = _formats(formats)
    except ReportError as exc:
        fail(str(exc))
    if checkpoint is not None and len(contract or []) != 1:
        fail("--checkpoint names a tree size of one contract's log: give exactly one --contract")

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ledger.contracts import get_contract
    from ledger.errors import LedgerError
    from yoco.database import unit_of_work

    started = time.perf_counter()
    problems: list[tuple[str, str]] = []
    written = created = already = 0
    with application() as ctx:
        with unit_of_work(ctx.engine) as s:
            if contract:
                ids = list(dict.fromkeys(contract))
                for cid in ids:
                    get_contract(s, cid)
            else:
                ids = rm.contracts_active_in(s, year, mon)
        out_dir.mkdir(parents=True, exist_ok=True)

        def finish(prepared: PreparedReport, pdf: bytes) -> None:
            nonlocal written, created, already
            report = rm.finish_report(prepared, pdf)
            with unit_of_work(ctx.engine) as s:
                recorded = rm.record_report(s, report)
            stem = rm.file_stem(report.contract_id, year, mon)
            if "html" in chosen:
                _write(out_dir / f"{stem}.html", report.html_bytes)
            if "pdf" in chosen:
                _write(out_dir / f"{stem}.pdf", report.pdf)
            written += 1
            if recorded.created:
                created += 1
            else:
                already += 1

        workers = min(jobs, len(ids))
        pool = None
        if workers > 1:
            import multiprocessing

            # spawn: workers must not inherit this process's database connections.
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        pending: deque[tuple[PreparedReport, Future[bytes]]] = deque()
        columns: list[Any] = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ]
        try:
            with Progress(*columns, console=err, transient=False) as bar:
                task = bar.add_task(f"reports {year:04d}-{mon:02d}", total=len(ids))

                def drain(limit: int) -> None:
                    while len(pending) > limit:
                        prepared, fut = pending.popleft()
                        try:
                            finish(prepared, fut.result())
                        except (ReportError, LedgerError, ValueError) as exc:
                            problems.append((prepared.contract_id, str(exc)))
                        bar.advance(task)

                for cid in ids:
                    try:
                        with unit_of_work(ctx.engine) as s:
                            prepared = rm.prepare_monthly_report(s, cid, year, mon, checkpoint)
                    except (ReportError, LedgerError, ValueError) as exc:
                        problems.append((cid, str(exc)))
                        bar.advance(task)
                        continue
                    if pool is None:
                        try:
                            finish(prepared, html_to_pdf(prepared.html))
                        except (ReportError, LedgerError, ValueError) as exc:
                            problems.append((cid, str(exc)))
                        bar.advance(task)
                    else:
                        pending.append((prepared, pool.submit(html_to_pdf, prepared.html)))
                        drain(2 * workers)
                drain(0)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)

    seconds = time.perf_counter() - started
    per = f", {seconds / written:.2f} s per report" if written else ""
    out.print(
        f"{written} report{'s' if written != 1 else ''} for {year:04d}-{mon:02d} written to "
        f"{out_dir} ({', '.join(chosen)}) in {seconds:.1f} s{per}; ledger: {created} recorded, "
        f"{already} already recorded",
        highlight=False,
        soft_wrap=True,
    )
    if problems:
        err.print(f"[bold red]error:[/] {len(problems)} contract(s) not reported:")
        for cid, message in problems:
            err.print(shown(f"  {cid}: {message}"), highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the ``reports`` command group to the ``yoco`` application."""
    reports_app = typer.Typer(
        help="Monthly SLA reports (HTML and PDF), each recorded in the ledger.",
        no_args_is_help=True,
    )
    reports_app.command("monthly")(monthly)
    app.add_typer(reports_app, name="reports")
