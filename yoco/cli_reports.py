"""``yoco reports``: monthly SLA reports, HTML and PDF; issued once, drafts otherwise.

``issue`` issues a month (stored bytes, a ``report`` ledger entry); ``monthly`` writes
the issued report of a month, or a draft.  The database work (figures, HTML) runs in
this process; drafts' PDFs are rendered by a pool of worker processes (``--jobs``,
default: every core), which never touch the database.
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
                     "issued report, else the latest checkpoint). Needs exactly one "
                     "--contract."),
    ] = None,
    jobs: Annotated[
        int, typer.Option(min=1, help="Processes rendering PDFs (default: one per core).")
    ] = max(os.cpu_count() or 1, 1),
) -> None:
    """Write one monthly SLA report per contract (HTML and PDF): the issued one, or a draft.

    A month that was issued (yoco reports issue, or the scheduler after the month
    ended) is written as issued: the stored bytes, whose digests its ledger entry holds.
    Otherwise (or over another --checkpoint) a draft is rendered over the checkpoint,
    marked as a draft on every page and in its file name (…-draft.html), and recorded
    nowhere.  Contracts that cannot be reported (no signed checkpoint yet, …) are listed
    at the end and make the exit status 2.
    """
    from reports import issued as ri
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

    from ledger.errors import LedgerError
    from yoco.database import unit_of_work

    started = time.perf_counter()
    problems: list[tuple[str, str]] = []
    written = issued_n = drafts = 0
    label = f"{year:04d}-{mon:02d}"
    with application() as ctx:
        ids = _contract_ids(ctx, contract, year, mon)
        out_dir.mkdir(parents=True, exist_ok=True)

        def write(stem: str, html: bytes, pdf: bytes) -> None:
            nonlocal written
            if "html" in chosen:
                _write(out_dir / f"{stem}.html", html)
            if "pdf" in chosen:
                _write(out_dir / f"{stem}.pdf", pdf)
            written += 1

        def finish(prepared: PreparedReport, pdf: bytes) -> None:
            nonlocal drafts
            report = rm.finish_report(prepared, pdf)
            write(rm.file_stem(report.contract_id, year, mon) + DRAFT_SUFFIX,
                  report.html_bytes, report.pdf)
            drafts += 1

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
                task = bar.add_task(f"reports {label}", total=len(ids))

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
                            doc = ri.issued_document(s, cid, label)
                            if doc is not None and checkpoint in (None, doc.checkpoint_size):
                                write(rm.file_stem(cid, year, mon), doc.html_bytes, doc.pdf)
                                issued_n += 1
                                bar.advance(task)
                                continue
                            prepared = ri.render_draft(s, cid, year, mon, checkpoint,
                                                       with_pdf=False)
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
        f"{written} report{'s' if written != 1 else ''} for {label} written to "
        f"{out_dir} ({', '.join(chosen)}) in {seconds:.1f} s{per}: {issued_n} issued (the "
        f"stored bytes), {drafts} draft{'s' if drafts != 1 else ''} (not issued, recorded "
        "nowhere)",
        highlight=False,
        soft_wrap=True,
    )
    _problems(problems)


#: Appended to the file name of a draft, so a draft is never taken for the issued report.
DRAFT_SUFFIX = "-draft"


def _contract_ids(ctx: Any, contract: list[str] | None, year: int, mon: int) -> list[str]:
    from ledger.contracts import get_contract
    from reports import monthly as rm
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        if contract:
            ids = list(dict.fromkeys(contract))
            for cid in ids:
                get_contract(s, cid)
            return ids
        return rm.contracts_active_in(s, year, mon)


def _problems(problems: list[tuple[str, str]]) -> None:
    if problems:
        err.print(f"[bold red]error:[/] {len(problems)} contract(s) not reported:")
        for cid, message in problems:
            err.print(shown(f"  {cid}: {message}"), highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def issue(
    month: Annotated[
        str | None,
        typer.Option(help="The calendar month, YYYY-MM (in each contract's time zone)."),
    ] = None,
    contract: Annotated[
        list[str] | None,
        typer.Option("--contract", help="Only this contract (repeat for several). Default: every "
                     "contract active in the month."),
    ] = None,
    checkpoint: Annotated[
        int | None,
        typer.Option(help="Tree size of the signed checkpoint to issue over (default: the "
                     "latest). Needs exactly one --contract."),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Also write the issued files into this folder.")
    ] = None,
    due: Annotated[
        bool, typer.Option("--due", help="Issue every month and year-end statement that is "
                           "due, as the scheduler does (for cron); instead of --month.")
    ] = False,
    year: Annotated[
        int | None,
        typer.Option("--year", min=1, help="Issue contract year K's year-end statement (the "
                     "year close and its credit note) instead of a month's report."),
    ] = None,
) -> None:
    """Issue the monthly SLA report of a month (or, with --year, a year-end statement):
    once per contract and period, for good.

    The report is rendered over a signed checkpoint signed after the month ended, its
    HTML and PDF are stored as issued and their SHA-256 digests appended to the
    contract's log as a report entry; the log is then signed so the entry's inclusion
    proof can be downloaded.  A month already issued is not issued again: the issued
    one is reported (and written with --out).
    """
    from datetime import UTC, datetime

    from ledger.checkpoints import sign_log
    from ledger.errors import LedgerError
    from reports import issued as ri
    from reports import monthly as rm
    from reports.errors import ReportError
    from yoco.database import unit_of_work

    if sum((due, month is not None, year is not None)) != 1:
        fail("give one of --month YYYY-MM, --year K (a year-end statement) or --due (every "
             "month and statement that is due)")
    if checkpoint is not None and len(contract or []) != 1:
        fail("--checkpoint names a tree size of one contract's log: give exactly one --contract")
    problems: list[tuple[str, str]] = []
    with application() as ctx:
        prefix = ctx.settings.log_origin
        if due:
            run = ri.issue_due(lambda: unit_of_work(ctx.engine), now=datetime.now(UTC),
                               signer=ctx.signer, origin_prefix=prefix,
                               contract_ids=list(dict.fromkeys(contract)) if contract else None)
            done = [(r.issued, r.contract_id, r.month) for r in run.results if r.issued]
            problems = [(r.contract_id, f"{r.month}: {r.problem}") for r in run.results
                        if r.problem]
        elif year is not None:
            from ledger.contracts import get_contract, list_contracts
            from reports.statement import issue_year_statement

            with unit_of_work(ctx.engine) as s:
                if contract:
                    for cid in contract:
                        get_contract(s, cid)
                ids = list(dict.fromkeys(contract)) if contract else [
                    c.contract_id for c in list_contracts(s)]
            done = []
            for cid in ids:
                try:
                    with unit_of_work(ctx.engine) as s:
                        doc = issue_year_statement(s, cid, year, checkpoint)
                except (ReportError, LedgerError, ValueError) as exc:
                    problems.append((cid, str(exc)))
                    continue
                done.append((doc, cid, doc.period))
                if doc.created:
                    with unit_of_work(ctx.engine) as s:
                        sign_log(s, ctx.signer, cid, prefix)
        else:
            if month is None:  # the options' check above leaves one of --month/--year
                fail("give --month YYYY-MM or --year K")
            try:
                y, mon = rm.parse_month(month)
            except ReportError as exc:
                fail(str(exc))
            done = []
            for cid in _contract_ids(ctx, contract, y, mon):
                try:
                    with unit_of_work(ctx.engine) as s:
                        doc = ri.issue_month(s, cid, y, mon, checkpoint)
                except (ReportError, LedgerError, ValueError) as exc:
                    problems.append((cid, str(exc)))
                    continue
                done.append((doc, cid, doc.period))
                if doc.created:
                    with unit_of_work(ctx.engine) as s:
                        sign_log(s, ctx.signer, cid, prefix)
        for doc, cid, label in done:
            what = "issued" if doc.created else "already issued"
            out.print(
                f"{cid} {label}: {what} over checkpoint {doc.checkpoint_size}, ledger entry "
                f"{doc.seq} (html sha256 {doc.html_sha256}, pdf sha256 {doc.pdf_sha256})",
                highlight=False, soft_wrap=True,
            )
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                with unit_of_work(ctx.engine) as s:
                    stored = ri.issued_document(s, cid, label, doc.document)
                if stored is None:  # pragma: no cover - issued documents are never deleted
                    fail(f"{cid} {label}: the issued document is gone")
                stem = _stem(cid, label)
                _write(out_dir / f"{stem}.html", stored.html_bytes)
                _write(out_dir / f"{stem}.pdf", stored.pdf)
    created = sum(1 for d, _, _ in done if d.created)
    out.print(f"{created} issued, {len(done) - created} already issued", highlight=False)
    _problems(problems)


def evidence(
    contract: Annotated[str, typer.Option("--contract", help="The contract's id.")],
    out_file: Annotated[
        Path, typer.Option("--out", help="The ZIP file to write (never overwritten).")
    ],
    month: Annotated[
        str | None,
        typer.Option(help="The issued month, YYYY-MM (in the contract's time zone)."),
    ] = None,
    year: Annotated[
        int | None,
        typer.Option("--year", min=1, max=999,
                     help="Contract year K: the pack of its issued year-end statement."),
    ] = None,
) -> None:
    """Write the evidence pack of an issued month (--month) or year-end statement
    (--year): one ZIP file a customer checks alone.

    It holds the issued document (HTML and PDF, the stored bytes), their digests, its
    ledger entry and its inclusion proof, the signed checkpoint it was issued over (with
    its cosignatures), the contract's whole log up to a checkpoint holding that entry
    (for a contract with a witness policy, the newest that meets it), and a README with
    the yoco-verify command that checks it all.  Only an issued document has a pack.  An
    existing --out file is never overwritten.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ledger.errors import UnknownContract
    from reports import monthly as rm
    from reports.errors import BadMonth, NotIssued
    from reports.evidence import STAGES, build_evidence_pack
    from reports.statement import statement_period
    from yoco.database import unit_of_work

    if (month is None) == (year is None):
        fail("--month/--year: give one of --month YYYY-MM (an issued month) or --year K "
             "(an issued year-end statement)")
    field = "--month" if year is None else "--year"
    if month is not None:
        try:
            rm.parse_month(month)
        except BadMonth as exc:
            fail(f"--month: {exc}")
    period = month if year is None else statement_period(year)
    if out_file.exists() or out_file.is_symlink():
        fail(f"--out: {out_file} exists: nothing was written (choose another path, or "
             "remove it first)")
    words = {"report": "reading the issued document", "proof": "proving its ledger entry",
             "log": "exporting the log", "pack": "packing"}
    with application() as ctx, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("evidence pack", total=len(STAGES))

        def step(stage: str) -> None:
            bar.update(task, completed=STAGES.index(stage), description=words[stage])

        try:
            with unit_of_work(ctx.engine) as s:
                pack = build_evidence_pack(s, contract, period or "", progress=step)
        except UnknownContract as exc:
            fail(f"--contract: {exc}")
        except NotIssued as exc:
            fail(f"{field}: {exc}")
        bar.update(task, completed=len(STAGES))
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_file.with_name(f".{out_file.name}.{os.getpid()}.part")
        tmp.write_bytes(pack.data)
        try:
            os.link(tmp, out_file)  # fails, rather than overwrite, if it appeared since
        finally:
            tmp.unlink()
    except FileExistsError:
        fail(f"--out: {out_file} exists: nothing was written (choose another path, or "
             "remove it first)")
    except OSError as exc:
        fail(f"--out: cannot write {out_file}: {exc.strerror or exc}")
    out.print(shown(
        f"evidence pack of {contract} {pack.period} written to {out_file} "
        f"({len(pack.data):,} bytes): the issued "
        f"{'statement' if year is not None else 'report'} over checkpoint "
        f"{pack.issued_checkpoint}, its ledger entry {pack.report_seq} and proof, and the "
        f"log up to checkpoint {pack.log_tree_size}; see README.txt inside for the "
        "yoco-verify command that checks it"), highlight=False, soft_wrap=True)


def _stem(contract_id: str, period: str) -> str:
    """The file name (without extension) of an issued report or statement."""
    from reports import monthly as rm
    from reports.statement import statement_stem

    if period.startswith("year-"):
        return statement_stem(contract_id, int(period.removeprefix("year-")))
    y, m = rm.parse_month(period)
    return rm.file_stem(contract_id, y, m)


def register(app: typer.Typer) -> None:
    """Add the ``reports`` command group to the ``yoco`` application."""
    reports_app = typer.Typer(
        help="Monthly SLA reports (HTML and PDF): issued once per month, drafts otherwise.",
        no_args_is_help=True,
    )
    reports_app.command("monthly")(monthly)
    reports_app.command("issue")(issue)
    reports_app.command("evidence")(evidence)
    app.add_typer(reports_app, name="reports")
