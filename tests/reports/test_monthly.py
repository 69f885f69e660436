"""Monthly SLA reports on a real PostgreSQL, rendered for real, read back as a customer would."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from billing import services as billing_services
from billing.sla import decimal_string
from billing.verdict import format_number
from ledger.checkpoints import sign_all
from ledger.ingest import ingest
from ledger.records import validate_batch
from reports import issued as ri
from reports import monthly as rm
from reports.errors import (
    BadMonth,
    CheckpointTooOld,
    MonthOutOfTerm,
    NoCheckpoint,
    UnknownCheckpoint,
)
from reports.render import html_to_pdf
from tests.reports import scenarios as sc
from tests.reports.pdfcheck import page_count, page_pixels, pdf_text
from yoco.cli import build_app
from yoco.database import unit_of_work

app = build_app()
runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def sla_json(cid: str, *period: str) -> dict[str, Any]:
    return json.loads(yoco("sla", cid, *period, "--json"))


def rate_text(j: dict[str, Any]) -> str:
    """The rate as every surface writes it (billing.verdict), from `yoco sla --json`."""
    if j["covered_failures"] == 0:
        return "no covered failures"
    pct = decimal_string(Fraction(j["resolved_failures"] * 100, j["covered_failures"]), 2)
    return f"{pct} % ({j['resolved_failures']} of {j['covered_failures']})"


def hours(text: str) -> str:
    """A six-decimal JSON figure with thousands separators, as the report prints it."""
    return format_number(Decimal(text), 6)


def expected_cells(j: dict[str, Any]) -> list[str]:
    """The figures of one `yoco sla --json` object as the report prints them."""
    goodput_pct = decimal_string(Fraction(Decimal(j["goodput"])) * 100, 4)
    return [
        rate_text(j),
        hours(j["allocated_gpu_hours"]),
        hours(j["lost_gpu_hours"]),
        f"{j['goodput']} ({goodput_pct} %)",
    ]


def summary_row(text: str, label: str) -> list[str]:
    """The two values after ``label`` in the summary table's text."""
    after = text.split(label, 1)[1].split()
    return after[:2]


def assert_same_figures(pdf: Path, month: dict[str, Any], year: dict[str, Any]) -> None:
    """The PDF's summary holds exactly the figures `yoco sla` prints for the two periods."""
    text = pdf_text(pdf, layout=True)
    for label, field in [
        ("Covered failures", "covered_failures"),
        ("Pending (no outcome recorded yet)", "pending_failures"),
        ("Excluded failures", "excluded_failures"),
        ("Rolled back to a checkpoint", "rolled_back_failures"),
        ("Failed (job did not recover)", "failed_failures"),
    ]:
        assert summary_row(text, label) == [str(month[field]), str(year[field])], label
    assert summary_row(text, "Resolved (live-migrated, no lost progress)") == [
        str(month["resolved_failures"]),
        str(year["resolved_failures"]),
    ]
    assert summary_row(text, "Allocated GPU-hours") == [
        hours(month["allocated_gpu_hours"]),
        hours(year["allocated_gpu_hours"]),
    ]
    assert summary_row(text, "Lost GPU-hours (all failures)") == [
        hours(month["lost_gpu_hours"]),
        hours(year["lost_gpu_hours"]),
    ]
    for j in (month, year):
        for cell in expected_cells(j):
            assert cell in text, (cell, j)
    assert month["period_start"] in text and month["period_end"] in text
    assert year["period_start"] in text


def ytd_as_of(text: str) -> str:
    """The instant the report's footnote gives to `yoco sla --as-of` for its year to date."""
    m = re.search(r"--as-of (\S+)", text)
    assert m, "the report names the command that prints its year-to-date figures"
    return m.group(1).rstrip(")")


def non_blank_pages(pdf: Path, tmp: Path, first: int = 1, last: int | None = None) -> None:
    for png, variance in page_pixels(pdf, tmp, first, last):
        assert png.exists()
        assert variance > 50, f"{png.name} looks blank (grey variance {variance:.1f})"


def report_files(out: Path, cid: str, month: str) -> tuple[Path, Path]:
    y, m = month.split("-")
    stem = rm.file_stem(cid, int(y), int(m))
    return out / f"{stem}.html", out / f"{stem}.pdf"


# --------------------------------------------------------------------------- scenarios


def test_quiet_month_via_cli_matches_sla_and_is_reproducible(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contract, records = sc.quiet()
    seed([contract], records)
    out = tmp_path / "out"
    text = yoco("reports", "issue", "--month", "2026-03", "--out", str(out))
    assert "C-QUIET 2026-03: issued over checkpoint 7" in text and "1 issued" in text
    html, pdf = report_files(out, "C-QUIET", "2026-03")
    assert html.read_bytes().startswith(b"<!DOCTYPE html>")
    assert pdf.read_bytes().startswith(b"%PDF-")

    month = sla_json("C-QUIET", "--month", "2026-03")
    text_pdf = pdf_text(pdf)
    # The footnote's command prints the year-to-date column.
    year = sla_json("C-QUIET", "--as-of", ytd_as_of(text_pdf))
    assert year["period_end"] == "2026-04-01T00:00:00+00:00"
    assert_same_figures(pdf, month, year)
    assert "No failure was recorded for this contract in March 2026" in text_pdf
    assert "no covered failures" in text_pdf and "no credit" in text_pdf
    non_blank_pages(pdf, tmp_path, 1, page_count(pdf))

    # Recorded: one report entry with both digests.
    with unit_of_work(app_ctx.engine) as s:
        issued = rm.issued_reports(s, "C-QUIET")
    assert len(issued) == 1
    entry = issued[0]
    assert entry["html_sha256"] == hashlib.sha256(html.read_bytes()).hexdigest()
    assert entry["pdf_sha256"] == hashlib.sha256(pdf.read_bytes()).hexdigest()
    assert entry["month"] == "2026-03" and entry["kind"] == "report"
    assert entry["checkpoint_tree_size"] == 7

    # Rendered again over the same checkpoint (as a report, not a draft): byte-identical.
    with unit_of_work(app_ctx.engine) as s:
        again = rm.build_monthly_report(s, "C-QUIET", 2026, 3, 7)
    assert again.html_bytes == html.read_bytes()
    assert again.pdf == pdf.read_bytes()
    # `monthly` writes the issued bytes; nothing new is recorded.
    first_html, first_pdf = html.read_bytes(), pdf.read_bytes()
    text = yoco("reports", "monthly", "--month", "2026-03", "--contract", "C-QUIET",
                "--out", str(out), "--jobs", "1", "--checkpoint", "7")
    assert "1 issued (the stored bytes), 0 drafts" in text
    assert html.read_bytes() == first_html
    assert pdf.read_bytes() == first_pdf
    with unit_of_work(app_ctx.engine) as s:
        assert len(rm.issued_reports(s, "C-QUIET")) == 1
    assert "all match" in yoco("ledger", "verify")


def test_month_that_tips_the_year_into_a_miss(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contract, records = sc.tipping()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        feb = rm.build_monthly_report(s, "C-TIP", 2026, 2)
        report, recorded = rm.issue_monthly_report(s, "C-TIP", 2026, 3)
    assert recorded.created
    assert report.year_to_date.guarantee_met is False and feb.year_to_date.guarantee_met
    pdf = tmp_path / "tip.pdf"
    pdf.write_bytes(report.pdf)
    text = pdf_text(pdf)
    month = sla_json("C-TIP", "--month", "2026-03")
    year = sla_json("C-TIP", "--as-of", ytd_as_of(text))
    assert_same_figures(pdf, month, year)
    assert year["guarantee_met"] is False and rate_text(year) == "80.95 % (17 of 21)"
    # The year is still running: below the guarantee so far, not (yet) missed.
    assert year["standing"] == "below"
    assert "Contract year 1 to date: BELOW SO FAR" in text
    assert "below the guaranteed 90 % while the period is still running" in text
    # February on its own terms: met with room to spare.
    feb_pdf = tmp_path / "feb.pdf"
    feb_pdf.write_bytes(feb.pdf)
    assert "Contract year 1 to date: ON TRACK" in pdf_text(feb_pdf)
    # The contract's time zone shows in the exact bounds (midnight in New York).
    assert "2026-03-01T05:00:00+00:00" in text and "2026-04-01T04:00:00+00:00" in text
    # Cost of lost GPU-hours at 2.49 USD, rounded half up to the cent.
    lost = Fraction(Decimal(month["lost_gpu_hours"]))
    cost = pdf_text(pdf, layout=True).split("Cost of lost GPU-hours", 1)[1].split()
    assert cost[1] == "USD" and cost[3] == "USD"
    assert abs(Fraction(Decimal(cost[0].replace(",", ""))) - lost * Fraction("2.49")) \
        <= Fraction(1, 200)
    # Exclusions with reason and approver, excluded causes, corrections, pending.
    assert "customer's own OOM killer (ticket 4411) (approved by j.doe)" in text
    assert "excluded cause: facility power" in text  # billing.labels.cause_label
    assert "corrected: latest of 2 outcomes counts" in text
    assert "class planned is not covered" in text
    for row in report.rows:
        assert row.failure.event_id in text
    # Verification section: the note, its size and root, how to check.
    assert f"Tree size {report.checkpoint_size}" in text
    assert report.checkpoint_root in text
    assert "yoco verify-proof proof.json --public-key KEY" in text
    assert report.checkpoint_note.split("\n")[2] in text
    non_blank_pages(pdf, tmp_path, 1, page_count(pdf))


def test_closed_year_with_its_credit(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contract, records = sc.closed_year()
    seed([contract], records)
    from billing.closing import close_year

    with unit_of_work(app_ctx.engine) as s:  # billing's year close issues the credit
        close_year(s, "C-CLOSED", 1, signer=app_ctx.signer,
                   origin_prefix=app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, "C-CLOSED", 2025, 12)
        credit = billing_services.credit_status(s, "C-CLOSED", 1)
    pdf = tmp_path / "closed.pdf"
    pdf.write_bytes(report.pdf)
    text = pdf_text(pdf)
    month = sla_json("C-CLOSED", "--month", "2025-12")
    year = sla_json("C-CLOSED", "--year", "1")
    assert sla_json("C-CLOSED", "--as-of", ytd_as_of(text)) | {"credit": None} == year | {
        "credit": None, "as_of": ytd_as_of(text), "computed_at": ytd_as_of(text)}
    assert_same_figures(pdf, month, year)
    # The year is over: its figures are final and equal `yoco sla --year 1` exactly.
    assert "Contract year 1: MISSED" in text and "to date" not in text.split("Figure")[0][-40:]
    assert rate_text(year) == "60.00 % (3 of 5)" and year["standing"] == "missed"
    assert "credit base 520,000.00 EUR (the renewal value)" in text
    assert credit is not None and credit["amount"] == "130000.00"  # 25 % of 520,000.00
    if credit:
        assert f"Credit for contract year 1: 130,000.00 EUR ({credit['status']})" in text
        assert year["credit"]["amount"] == credit["amount"]
    else:
        assert "Credit for contract year 1: none recorded yet" in text
    non_blank_pages(pdf, tmp_path, 1, 2)


def test_month_with_500_failures_paginates_with_repeated_headers(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contract, records = sc.busy(n=500)
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, "C-BUSY", 2026, 3)
    pdf = tmp_path / "busy.pdf"
    pdf.write_bytes(report.pdf)
    text = pdf_text(pdf)
    pages = page_count(pdf)
    assert pages >= 12
    assert_same_figures(pdf, sla_json("C-BUSY", "--month", "2026-03"),
                        sla_json("C-BUSY", "--as-of", ytd_as_of(text)))
    assert len(report.rows) == 500
    missing = [r.failure.event_id for r in report.rows if r.failure.event_id not in text]
    assert not missing
    # Every page of the table repeats its header; every page says "page N of M".
    table_pages = text.count("Time (UTC) / event id")
    assert table_pages >= pages - 5
    for n in (1, pages // 2, pages):
        assert f"page {n} of {pages}" in text
    non_blank_pages(pdf, tmp_path, pages // 2, pages // 2 + 1)


def test_forged_report_no_longer_matches_the_ledger(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.tipping()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        report, recorded = rm.issue_monthly_report(s, "C-TIP", 2026, 3)
    with unit_of_work(app_ctx.engine) as s:
        assert rm.find_issued(s, report.html_sha256)[0]["event_id"] == str(recorded.event_id)
        assert rm.find_issued(s, report.pdf_sha256, "C-TIP")[0]["month"] == "2026-03"
        # One figure changed: 17 of 21 becomes 19 of 21.
        assert report.html.count("80.95 % (17 of 21)") >= 1
        forged_html = report.html.replace("80.95 % (17 of 21)", "90.48 % (19 of 21)")
        forged_pdf = html_to_pdf(forged_html)
        for doc in (forged_html.encode(), forged_pdf):
            assert rm.find_issued(s, hashlib.sha256(doc).hexdigest()) == []
        with pytest.raises(ValueError, match="64 hex digits"):
            rm.find_issued(s, "not-a-digest")


def test_report_counts_only_entries_under_its_checkpoint(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    contract, records = sc.tipping()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        first = rm.select_checkpoint(s, "C-TIP")
    # Later entries: a new March failure (rolled back), and the job's end moved on.
    more = sc.failure_with(__import__("random").Random(9), "C-TIP", sc.at(2026, 3, 20),
                           "rolled_back", job="llm-70b", lost=5)
    recs, errors = validate_batch(more)
    assert not errors
    with unit_of_work(app_ctx.engine) as s:
        ingest(s, recs, None, app_ctx.projectors)
    with unit_of_work(app_ctx.engine) as s:
        old = rm.build_monthly_report(s, "C-TIP", 2026, 3, first.tree_size)
        assert old.figures.covered_failures == 6  # the new failure is after the checkpoint
        with pytest.raises(UnknownCheckpoint, match=f"signed sizes: {first.tree_size}"):
            rm.build_monthly_report(s, "C-TIP", 2026, 3, first.tree_size + 1)
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        new, _ = rm.issue_monthly_report(s, "C-TIP", 2026, 3)
    assert new.figures.covered_failures == 7 and new.checkpoint_size == first.tree_size + 2
    assert new.html != old.html
    # The report entry is in the log now; a checkpoint over it changes no figure.
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        after = rm.build_monthly_report(s, "C-TIP", 2026, 3)
    assert after.checkpoint_size == new.checkpoint_size + 1
    assert after.figures.to_json() == new.figures.to_json()
    assert after.year_to_date.to_json() == new.year_to_date.to_json()
    def figures_part(html: str) -> str:
        """The summary and charts, without the footnote that names the latest checkpoint."""
        part = html.split('<section id="summary">')[1].split('<section id="definitions">')[0]
        return re.sub(r'<p class="small muted">.*?</p>', "", part, flags=re.S)

    assert figures_part(after.html) == figures_part(new.html)


def test_refusals_are_clear(seed: Callable[..., None], app_ctx: Any, tmp_path: Path) -> None:
    contract, records = sc.quiet()
    contract["term_years"] = 50
    seed([contract], records, sign=False)
    with unit_of_work(app_ctx.engine) as s:
        with pytest.raises(NoCheckpoint, match="yoco ledger checkpoint"):
            rm.build_monthly_report(s, "C-QUIET", 2026, 3)
        with pytest.raises(MonthOutOfTerm, match="outside the term of contract 'C-QUIET'"):
            rm.build_monthly_report(s, "C-QUIET", 2080, 1)
        with pytest.raises(BadMonth):
            rm.build_monthly_report(s, "C-QUIET", 2026, 13)
    with pytest.raises(BadMonth, match="YYYY-MM"):
        rm.parse_month("2026-3")
    out = runner.invoke(app, ["reports", "monthly", "--month", "March", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "YYYY-MM" in out.output
    out = runner.invoke(app, ["reports", "monthly", "--month", "2026-03", "--out",
                              str(tmp_path), "--format", "docx"])
    assert out.exit_code == 2 and "--format takes html, pdf" in out.output
    out = runner.invoke(app, ["reports", "monthly", "--month", "2026-03", "--out",
                              str(tmp_path), "--checkpoint", "3"])
    assert out.exit_code == 2 and "exactly one --contract" in out.output
    out = runner.invoke(app, ["reports", "monthly", "--month", "2026-03", "--out",
                              str(tmp_path), "--contract", "NOPE"])
    assert out.exit_code == 2 and "unknown contract" in out.output
    out = runner.invoke(app, ["reports", "monthly", "--month", "2026-03", "--out",
                              str(tmp_path), "--jobs", "1"])
    assert out.exit_code == 2 and "C-QUIET: contract 'C-QUIET' has no signed checkpoint" \
        in " ".join(out.output.split())
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    soon = datetime.now(UTC) + timedelta(days=40)
    with unit_of_work(app_ctx.engine) as s, pytest.raises(CheckpointTooOld, match="began"):
        rm.build_monthly_report(s, "C-QUIET", soon.year, soon.month)


def test_batch_of_contracts_in_parallel(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    contracts, records = [], []
    for fn in (sc.quiet, sc.tipping, sc.closed_year):
        c, r = fn()
        contracts.append(c)
        records += r
    seed(contracts, records)
    out = tmp_path / "batch"
    text = yoco("reports", "monthly", "--month", "2026-03", "--out", str(out), "--jobs", "2",
                "--format", "pdf")
    # C-CLOSED runs 2025-2026: active in March 2026 too.  Nothing issued yet: drafts.
    assert "3 reports for 2026-03 written to" in text and "(pdf)" in text
    assert "0 issued (the stored bytes), 3 drafts" in text
    assert sorted(p.name for p in out.iterdir()) == sorted(
        report_files(out, cid, "2026-03")[1].name.replace(".pdf", "-draft.pdf")
        for cid in ("C-QUIET", "C-TIP", "C-CLOSED")
    )
    with unit_of_work(app_ctx.engine) as s:
        for cid in ("C-QUIET", "C-TIP", "C-CLOSED"):
            assert rm.issued_reports(s, cid, ["2026-03"]) == []  # a draft records nothing
        # Rendered again here, in this process: the same bytes as the worker's PDF.
        again = ri.render_draft(s, "C-TIP", 2026, 3)
    draft_pdf = out / report_files(out, "C-TIP", "2026-03")[1].name.replace(".pdf", "-draft.pdf")
    assert isinstance(again, rm.MonthlyReport) and again.pdf == draft_pdf.read_bytes()
    # Issued: one entry each, whose digest is the stored PDF's.
    issued_dir = tmp_path / "issued"
    assert "3 issued, 0 already issued" in yoco("reports", "issue", "--month", "2026-03",
                                                 "--out", str(issued_dir))
    with unit_of_work(app_ctx.engine) as s:
        for cid in ("C-QUIET", "C-TIP", "C-CLOSED"):
            [entry] = rm.issued_reports(s, cid, ["2026-03"])
            pdf = report_files(issued_dir, cid, "2026-03")[1]
            assert entry["pdf_sha256"] == hashlib.sha256(pdf.read_bytes()).hexdigest()
    assert "projections rebuilt" in yoco("ledger", "rebuild")
    assert "all match" in yoco("ledger", "verify")


def test_the_pdf_is_tagged_and_no_page_ends_on_a_heading(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    import re
    import subprocess

    contract, records = sc.tipping()
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        report = rm.build_monthly_report(s, "C-TIP", 2026, 3)
    pdf = tmp_path / "tip.pdf"
    pdf.write_bytes(report.pdf)
    info = subprocess.run(["pdfinfo", str(pdf)], check=True, capture_output=True,
                          text=True).stdout
    assert re.search(r"^Tagged:\s+yes$", info, re.M), info
    heading = re.compile(r"^\d\. [A-Z]")
    for n in range(1, page_count(pdf) + 1):
        page = subprocess.run(["pdftotext", "-layout", "-f", str(n), "-l", str(n), str(pdf),
                               "-"], check=True, capture_output=True, text=True).stdout
        lines = [ln.strip() for ln in page.splitlines() if ln.strip()]
        body = [ln for ln in lines if not ln.startswith("page ")]  # the running footer
        assert body and not heading.match(body[-1]), f"page {n} ends on {body[-1]!r}"
