"""Issued monthly reports on a real PostgreSQL: issued once, kept byte for byte, drafts marked.

Issue a month (CLI and API), store its bytes, sign a new checkpoint over later records:
the stored bytes are still the issued ones, their digests are the ledger entry's, a
second issue returns the first, ``yoco reports monthly`` writes the issued bytes (or a
draft marked as one), and the scheduler issues last month's reports once the month has
ended in the contract's time zone (an injected clock).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from ledger.checkpoints import latest, sign_all
from ledger.ingest import ingest
from ledger.models import JournalEntry
from ledger.records import validate_batch
from reports import issued as ri
from reports import monthly as rm
from reports.errors import AlreadyIssued, MonthNotOver
from tests.reports import scenarios as sc
from tests.reports.pdfcheck import pdf_text
from yoco.cli import build_app
from yoco.database import unit_of_work

app = build_app()
runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def report_entries(engine: Any, cid: str) -> list[dict[str, Any]]:
    with unit_of_work(engine) as s:
        return rm.issued_reports(s, cid)


def later_failure(app_ctx: Any, cid: str = "C-TIP") -> None:
    """One more March failure recorded after the report was issued, then signed."""
    more = sc.failure_with(random.Random(9), cid, sc.at(2026, 3, 20), "rolled_back",
                           job="llm-70b", lost=5)
    recs, errors = validate_batch(more)
    assert not errors
    with unit_of_work(app_ctx.engine) as s:
        ingest(s, recs, None, app_ctx.projectors)
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)


def test_issue_store_new_checkpoint_still_the_issued_bytes(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contract, records = sc.tipping()
    seed([contract], records)
    out = tmp_path / "issued"
    text_out = yoco("reports", "issue", "--month", "2026-03", "--out", str(out))
    assert "C-TIP 2026-03: issued over checkpoint" in text_out and "1 issued" in text_out
    html = (out / "yoco-sla-C-TIP-2026-03.html").read_bytes()
    pdf = (out / "yoco-sla-C-TIP-2026-03.pdf").read_bytes()
    [entry] = report_entries(app_ctx.engine, "C-TIP")
    assert entry["html_sha256"] == sha(html) and entry["pdf_sha256"] == sha(pdf)
    assert entry["report"] == "monthly-sla" and entry["month"] == "2026-03"
    with unit_of_work(app_ctx.engine) as s:
        doc = ri.issued_document(s, "C-TIP", "2026-03")
        assert doc is not None
        assert doc.html_bytes == html and doc.pdf == pdf
        assert doc.checkpoint_size == entry["checkpoint_tree_size"]
        assert str(doc.event_id) == entry["event_id"]
        stored_entry = s.execute(select(JournalEntry.body).where(
            JournalEntry.log_id == "C-TIP", JournalEntry.seq == doc.seq)).scalar_one()
        assert stored_entry == entry
        # The CLI signed the log after issuing: the entry's inclusion proof exists now.
        cp = latest(s, "C-TIP")
        assert cp is not None and cp.tree_size > doc.seq
    issued_cp = doc.checkpoint_size

    # Later records and a newer checkpoint: the issued bytes do not change.
    later_failure(app_ctx)
    with unit_of_work(app_ctx.engine) as s:
        again = ri.issued_document(s, "C-TIP", "2026-03")
        newest = latest(s, "C-TIP")
        assert newest is not None and newest.tree_size > cp.tree_size
        draft = ri.render_draft(s, "C-TIP", 2026, 3)
    assert again is not None and again.html_bytes == html and again.pdf == pdf
    # A rendering over the newer checkpoint is a draft: other figures, marked, unrecorded.
    assert isinstance(draft, rm.MonthlyReport) and draft.draft
    assert draft.checkpoint_size == newest.tree_size and draft.figures.covered_failures == 7
    assert f"DRAFT over checkpoint {newest.tree_size}" in draft.html
    assert (f"the issued report of March 2026 was computed over checkpoint {issued_cp} and "
            f"is recorded in ledger entry {doc.seq}") in draft.html
    assert "DRAFT over checkpoint" not in html.decode()
    draft_pdf = tmp_path / "draft.pdf"
    draft_pdf.write_bytes(draft.pdf)
    assert f"DRAFT over checkpoint {newest.tree_size}: not an issued report" in pdf_text(draft_pdf)
    with unit_of_work(app_ctx.engine) as s:
        assert rm.find_issued(s, draft.html_sha256) == []
        assert rm.find_issued(s, draft.pdf_sha256) == []

    # Issuing again (even naming the newer checkpoint) returns the issued one.
    text_out = yoco("reports", "issue", "--month", "2026-03", "--contract", "C-TIP",
                    "--checkpoint", str(newest.tree_size))
    assert f"already issued over checkpoint {issued_cp}, ledger entry {doc.seq}" in text_out
    assert "0 issued, 1 already issued" in text_out
    assert len(report_entries(app_ctx.engine, "C-TIP")) == 1

    # `yoco reports monthly`: the issued bytes by default, a marked draft over another.
    month_out = tmp_path / "monthly"
    text_out = yoco("reports", "monthly", "--month", "2026-03", "--out", str(month_out),
                    "--jobs", "1")
    assert "1 issued (the stored bytes), 0 drafts" in text_out
    assert (month_out / "yoco-sla-C-TIP-2026-03.html").read_bytes() == html
    assert (month_out / "yoco-sla-C-TIP-2026-03.pdf").read_bytes() == pdf
    text_out = yoco("reports", "monthly", "--month", "2026-03", "--out", str(month_out),
                    "--jobs", "1", "--contract", "C-TIP", "--checkpoint",
                    str(newest.tree_size))
    assert "0 issued (the stored bytes), 1 draft" in text_out
    drafted = (month_out / "yoco-sla-C-TIP-2026-03-draft.html").read_text()
    assert "DRAFT over checkpoint" in drafted
    assert len(report_entries(app_ctx.engine, "C-TIP")) == 1  # a draft records nothing
    assert "all match" in yoco("ledger", "verify")


def test_issuing_is_idempotent_and_once_even_at_once(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.quiet()
    seed([contract], records)
    renders: list[str] = []

    def pdf_of(html: str) -> bytes:
        from reports.render import html_to_pdf

        renders.append(html)
        return html_to_pdf(html)

    barrier = threading.Barrier(2)
    got: list[ri.IssuedReport] = []

    def issue() -> None:
        barrier.wait()
        with unit_of_work(app_ctx.engine) as s:
            got.append(ri.issue_month(s, "C-QUIET", 2026, 3, pdf_renderer=pdf_of))

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2
    assert sorted(g.created for g in got) == [False, True]
    assert got[0].event_id == got[1].event_id and got[0].pdf == got[1].pdf
    assert len(report_entries(app_ctx.engine, "C-QUIET")) == 1
    with unit_of_work(app_ctx.engine) as s:
        third = ri.issue_month(s, "C-QUIET", 2026, 3, pdf_renderer=pdf_of)
        rows = s.execute(text("SELECT count(*) FROM issued_documents")).scalar_one()
        # The rendering API agrees: the same bytes, the existing entry.
        report, recorded = rm.issue_monthly_report(s, "C-QUIET", 2026, 3)
    assert not third.created and third.pdf == got[0].pdf and rows == 1
    assert not recorded.created and recorded.event_id == third.event_id
    assert report.pdf_sha256 == third.pdf_sha256
    assert len(renders) <= 2  # the third call rendered nothing
    later_failure_quiet = sc.failure_with(random.Random(5), "C-QUIET", sc.at(2026, 3, 9),
                                          "failed")
    recs, errors = validate_batch(later_failure_quiet)
    assert not errors
    with unit_of_work(app_ctx.engine) as s:
        ingest(s, recs, None, app_ctx.projectors)
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
        size = latest(s, "C-QUIET").tree_size  # type: ignore[union-attr]
    with unit_of_work(app_ctx.engine) as s, pytest.raises(AlreadyIssued, match="was issued"):
        rm.issue_monthly_report(s, "C-QUIET", 2026, 3, size)
    assert len(report_entries(app_ctx.engine, "C-QUIET")) == 1


def test_a_month_that_is_not_over_is_not_issued(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.quiet()
    contract["term_years"] = 50
    seed([contract], records)
    now = datetime.now(UTC)
    with unit_of_work(app_ctx.engine) as s, pytest.raises(MonthNotOver, match="draft"):
        ri.issue_month(s, "C-QUIET", now.year, now.month)
    out = runner.invoke(app, ["reports", "issue", "--month", f"{now.year:04d}-{now.month:02d}"])
    assert out.exit_code == 2 and "after its month ended" in " ".join(out.output.split())
    out = runner.invoke(app, ["reports", "issue"])
    assert out.exit_code == 2 and "give one of --month YYYY-MM, --year K" in out.output
    assert report_entries(app_ctx.engine, "C-QUIET") == []


def test_issued_bytes_cannot_be_changed_by_the_application(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.quiet()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        ri.issue_month(s, "C-QUIET", 2026, 3)
    for sql in ("UPDATE issued_documents SET pdf = html",
                "UPDATE issued_documents SET html_sha256 = pdf_sha256",
                "DELETE FROM issued_documents", "TRUNCATE issued_documents"):
        with pytest.raises(DBAPIError) as info, app_ctx.engine.begin() as c:
            c.execute(text(sql))
        assert info.value.orig.sqlstate == "42501", sql  # insufficient_privilege
    # A row whose digest is not its bytes' is refused by the database itself.
    with pytest.raises(DBAPIError, match="html_digest"), app_ctx.engine.begin() as c:
        c.execute(text(
            "INSERT INTO issued_documents (contract_id, document, period, event_id, seq, "
            "checkpoint_tree_size, checkpoint_root_hash, html, pdf, html_sha256, pdf_sha256) "
            "SELECT contract_id, document, '2026-04', gen_random_uuid(), seq, "
            "checkpoint_tree_size, checkpoint_root_hash, html, pdf, pdf_sha256, pdf_sha256 "
            "FROM issued_documents"))


def test_scheduler_issues_last_month_after_it_ends(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    from yoco.scheduler import CloseDueScheduler

    contract, records = sc.tipping()  # New York: March ends at 2026-04-01T04:00Z
    seed([contract], records)
    clock = [datetime(2026, 4, 1, 4, 30, tzinfo=UTC)]
    sched = CloseDueScheduler(app_ctx, 3600, clock=lambda: clock[0])
    run = sched.reports_once()
    # Ended, but within the grace period: February is the latest month due; nothing
    # was issued before, so only that month.
    assert [(r.contract_id, r.month) for r in run.results] == [("C-TIP", "2026-02")]
    clock[0] = datetime(2026, 4, 1, 5, 0, tzinfo=UTC) + ri.ISSUE_GRACE
    run = sched.reports_once()
    assert [(r.contract_id, r.month, r.issued is not None and r.issued.created)
            for r in run.results] == [("C-TIP", "2026-03", True)]
    march = run.results[0].issued
    assert march is not None
    [_, entry] = report_entries(app_ctx.engine, "C-TIP")
    assert entry["month"] == "2026-03" and entry["pdf_sha256"] == sha(march.pdf)
    with unit_of_work(app_ctx.engine) as s:
        cp = latest(s, "C-TIP")
        assert cp is not None and cp.tree_size > march.seq  # the entry is covered: provable
        n = s.execute(select(func.count()).select_from(JournalEntry).where(
            JournalEntry.kind == "report")).scalar_one()
    # The next runs find nothing due until April ends.
    clock[0] += timedelta(days=20)
    assert sched.reports_once().results == []
    with unit_of_work(app_ctx.engine) as s:
        assert s.execute(select(func.count()).select_from(JournalEntry).where(
            JournalEntry.kind == "report")).scalar_one() == n
    clock[0] = datetime(2026, 5, 1, 6, 0, tzinfo=UTC)
    run = sched.reports_once()
    assert [(r.contract_id, r.month) for r in run.results] == [("C-TIP", "2026-04")]


def test_year_end_statement_is_issued_after_the_year_close(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    from billing.closing import close_year
    from reports.statement import YearNotClosed, issue_year_statement
    from yoco.scheduler import CloseDueScheduler

    contract, records = sc.closed_year()  # year 1 (2025) missed: a 130,000.00 EUR credit
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s, pytest.raises(YearNotClosed, match="year close"):
        issue_year_statement(s, "C-CLOSED", 1)
    with unit_of_work(app_ctx.engine) as s:
        close_year(s, "C-CLOSED", 1, signer=app_ctx.signer,
                   origin_prefix=app_ctx.settings.log_origin)
    sched = CloseDueScheduler(app_ctx, 3600, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    run = sched.reports_once()
    assert [(r.month, r.issued is not None and r.issued.created) for r in run.results] == [
        ("2025-12", True), ("year-1", True)]
    st = run.results[1].issued
    assert st is not None and st.document == "year-statement"
    with unit_of_work(app_ctx.engine) as s:
        stored = ri.issued_document(s, "C-CLOSED", "year-1", "year-statement")
        entry = s.execute(select(JournalEntry.body).where(
            JournalEntry.log_id == "C-CLOSED", JournalEntry.seq == st.seq)).scalar_one()
    assert stored is not None and stored.pdf == st.pdf
    assert entry["kind"] == "report" and entry["report"] == "year-statement"
    assert entry["year"] == 1 and "month" not in entry
    assert entry["html_sha256"] == sha(stored.html_bytes)
    assert entry["pdf_sha256"] == sha(stored.pdf)
    assert entry["checkpoint_tree_size"] == st.checkpoint_size
    pdf = tmp_path / "statement.pdf"
    pdf.write_bytes(stored.pdf)
    text_pdf = " ".join(pdf_text(pdf).split())
    assert "Contract year 1: MISSED" in text_pdf
    assert "CN-C-CLOSED-Y1" in text_pdf and "130,000.00 EUR" in text_pdf
    # Once: the next run issues nothing, and issuing directly returns the stored one.
    assert sched.reports_once().results == []
    with unit_of_work(app_ctx.engine) as s:
        again = issue_year_statement(s, "C-CLOSED", 1)
    assert not again.created and again.pdf == stored.pdf
    out = tmp_path / "cli"
    text_out = yoco("reports", "issue", "--year", "1", "--contract", "C-CLOSED", "--out",
                    str(out))
    assert "C-CLOSED year-1: already issued over checkpoint" in text_out
    assert (out / "yoco-statement-C-CLOSED-year-1.pdf").read_bytes() == stored.pdf
    r = runner.invoke(app, ["reports", "issue", "--year", "2", "--contract", "C-CLOSED"])
    assert r.exit_code == 2 and "not closed at checkpoint" in " ".join(r.output.split())
