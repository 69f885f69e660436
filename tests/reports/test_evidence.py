"""A month's evidence pack, built from what was issued and checked by the real
``yoco-verify`` with the command its own README gives; a changed report byte is refused;
a month not issued has no pack; the CLI writes it without overwriting anything."""

from __future__ import annotations

import hashlib
import io
import shlex
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from yoco_verify.cli import run as yoco_verify

from reports import issued as ri
from reports.errors import BadMonth, NotIssued
from reports.evidence import EvidenceNotReady, build_evidence_pack
from tests.reports import scenarios as sc
from yoco.database import unit_of_work


@pytest.fixture
def issued(seed: Callable[..., None], app_ctx: Any) -> Any:
    """C-TIP's March 2026 issued over a checkpoint signed after it, then the log signed
    again (as the scheduler and ``yoco reports issue`` do) so the entry is covered."""
    from ledger.checkpoints import sign_log

    c, recs = sc.tipping()
    seed([c], recs)
    with unit_of_work(app_ctx.engine) as s:
        doc = ri.issue_month(s, "C-TIP", 2026, 3)
    with unit_of_work(app_ctx.engine) as s:
        sign_log(s, app_ctx.signer, "C-TIP", app_ctx.settings.log_origin)
    return doc


def _unpack(data: bytes, into: Path) -> Path:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        [top] = {n.split("/", 1)[0] for n in names}
        zf.extractall(into)
    return into / top


def _readme_command(folder: Path) -> list[str]:
    lines = [line.strip() for line in (folder / "README.txt").read_text().splitlines()
             if line.strip().startswith("yoco-verify ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_the_pack_checks_with_the_readme_command_and_a_changed_byte_is_refused(
    issued: Any, app_ctx: Any, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    with unit_of_work(app_ctx.engine) as s:
        pack = build_evidence_pack(s, "C-TIP", "2026-03")
    assert pack.file_name == "yoco-evidence-C-TIP-2026-03.zip"
    assert pack.issued_checkpoint == issued.checkpoint_size
    assert pack.log_tree_size > pack.report_seq == issued.seq
    folder = _unpack(pack.data, tmp_path)
    stem = "yoco-sla-C-TIP-2026-03"
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        "README.txt", "SHA256SUMS", f"{stem}.pdf", f"{stem}.html", "report-entry.json",
        "report-entry-proof.json", f"checkpoint-{issued.checkpoint_size}",
        f"C-TIP-log-{pack.log_tree_size}.tar.gz",
    ])
    # The stored bytes, whose digests the entry (the leaf in the pack) records.
    assert (folder / f"{stem}.pdf").read_bytes() == issued.pdf
    assert (folder / f"{stem}.html").read_bytes() == issued.html_bytes
    entry = (folder / "report-entry.json").read_text()
    assert issued.pdf_sha256 in entry and issued.html_sha256 in entry
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    # The README's other command, as a customer runs it (coreutils).
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and check.stdout.count(": OK") == 6, check.stdout
    readme = (folder / "README.txt").read_text()
    assert f"ledger entry {issued.seq}" in readme and "sha256sum -c SHA256SUMS" in readme

    # The operator's key, pinned by the customer apart from the pack.
    (folder / "operator.key").write_text(app_ctx.signer.verifier_text() + "\n")
    argv = _readme_command(folder)
    assert argv[0] == "yoco-verify" and "--since" in argv and argv.count("--report") == 2
    monkeypatch.chdir(folder)
    code = yoco_verify(argv[1:])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("is recorded by report entry") == 2, out
    assert f"since checkpoint {issued.checkpoint_size}: this log of {pack.log_tree_size} " \
        "entries extends it (consistency proof checked)" in out, out
    assert out.rstrip().endswith("OK: every check passed and every figure matches"), out

    # One byte of the issued PDF changed: refused, naming the file and its digest.
    pdf = bytearray((folder / f"{stem}.pdf").read_bytes())
    pdf[len(pdf) // 2] ^= 0x01
    (folder / f"{stem}.pdf").write_bytes(bytes(pdf))
    code = yoco_verify(argv[1:])
    out = capsys.readouterr().out
    assert code == 1, out
    digest = hashlib.sha256(bytes(pdf)).hexdigest()
    assert (f"report {stem}.pdf: issued: SHA-256 {digest} is recorded by no report entry "
            "of this log") in out, out
    assert out.rstrip().splitlines()[-1].startswith("FAILED:"), out


def test_the_same_checkpoint_gives_the_same_pack(issued: Any, app_ctx: Any) -> None:
    with unit_of_work(app_ctx.engine) as s:
        one = build_evidence_pack(s, "C-TIP", "2026-03")
    with unit_of_work(app_ctx.engine) as s:
        two = build_evidence_pack(s, "C-TIP", "2026-03", tree_size=one.log_tree_size)
    assert one.data == two.data


def test_only_an_issued_month_covered_by_a_checkpoint_has_a_pack(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    c, recs = sc.tipping()
    seed([c], recs)
    with unit_of_work(app_ctx.engine) as s:
        with pytest.raises(NotIssued, match=r"2026-02 has not been issued \(yet\): only an "
                           "issued month has an evidence pack"):
            build_evidence_pack(s, "C-TIP", "2026-02")
        with pytest.raises(BadMonth):
            build_evidence_pack(s, "C-TIP", "2026-13")
    with unit_of_work(app_ctx.engine) as s:
        doc = ri.issue_month(s, "C-TIP", 2026, 3)
    # Issued, but no checkpoint holds its entry yet.
    with unit_of_work(app_ctx.engine) as s, pytest.raises(
        EvidenceNotReady, match=f"ledger entry {doc.seq} .* is not under a signed checkpoint"
    ):
        build_evidence_pack(s, "C-TIP", "2026-03")


def _cli(*args: str) -> Any:
    from yoco.cli import build_app

    return CliRunner().invoke(build_app(), list(args))


def test_the_cli_writes_the_pack_and_never_overwrites(
    issued: Any, app_ctx: Any, tmp_path: Path
) -> None:
    out = tmp_path / "pack.zip"
    result = _cli("reports", "evidence", "--contract", "C-TIP", "--month", "2026-03",
                  "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "evidence pack of C-TIP 2026-03 written to" in result.stdout, result.stdout
    with zipfile.ZipFile(out) as zf:
        assert "yoco-evidence-C-TIP-2026-03/README.txt" in zf.namelist()
    before = out.read_bytes()

    again = _cli("reports", "evidence", "--contract", "C-TIP", "--month", "2026-03",
                 "--out", str(out))
    assert again.exit_code == 2
    assert "--out" in again.stderr and "exists" in again.stderr, again.stderr
    assert out.read_bytes() == before

    for args, field, words in (
        (("--contract", "C-NOPE", "--month", "2026-03"), "--contract", "unknown contract"),
        (("--contract", "C-TIP", "--month", "2026-3x"), "--month", "YYYY-MM"),
        (("--contract", "C-TIP", "--month", "2026-02"), "--month", "has not been issued"),
    ):
        target = tmp_path / f"{field.strip('-')}.zip"
        bad = _cli("reports", "evidence", *args, "--out", str(target))
        assert bad.exit_code == 2, bad.output
        assert field in bad.stderr and words in bad.stderr, bad.stderr
        assert not target.exists()
    assert not list(tmp_path.glob("*.part"))


# --------------------------------------------------------------------------- statements


@pytest.fixture
def statement(seed: Callable[..., None], app_ctx: Any) -> Any:
    """C-CLOSED's year 1 (2025, missed: a credit) closed, its year-end statement issued,
    then the log signed so a checkpoint holds the statement's ``report`` entry."""
    from billing.closing import close_year
    from ledger.checkpoints import sign_log
    from reports.statement import issue_year_statement

    c, recs = sc.closed_year()
    seed([c], recs)
    with unit_of_work(app_ctx.engine) as s:
        close_year(s, "C-CLOSED", 1, signer=app_ctx.signer,
                   origin_prefix=app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        doc = issue_year_statement(s, "C-CLOSED", 1)
    with unit_of_work(app_ctx.engine) as s:
        sign_log(s, app_ctx.signer, "C-CLOSED", app_ctx.settings.log_origin)
    return doc


def test_a_statements_pack_checks_with_its_readme_command_and_a_changed_byte_is_refused(
    statement: Any, app_ctx: Any, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    with unit_of_work(app_ctx.engine) as s:
        pack = build_evidence_pack(s, "C-CLOSED", "year-1")
    assert pack.file_name == "yoco-evidence-C-CLOSED-year-1.zip"
    assert (pack.document, pack.period) == ("year-statement", "year-1")
    assert pack.issued_checkpoint == statement.checkpoint_size
    assert pack.log_tree_size > pack.report_seq == statement.seq
    folder = _unpack(pack.data, tmp_path)
    stem = "yoco-statement-C-CLOSED-year-1"
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        "README.txt", "SHA256SUMS", f"{stem}.pdf", f"{stem}.html", "report-entry.json",
        "report-entry-proof.json", f"checkpoint-{statement.checkpoint_size}",
        f"C-CLOSED-log-{pack.log_tree_size}.tar.gz",
    ])
    assert (folder / f"{stem}.pdf").read_bytes() == statement.pdf
    assert (folder / f"{stem}.html").read_bytes() == statement.html_bytes
    entry = (folder / "report-entry.json").read_text()
    assert '"report":"year-statement"' in entry and statement.pdf_sha256 in entry
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and check.stdout.count(": OK") == 6, check.stdout
    readme = (folder / "README.txt").read_text()
    assert readme.startswith("Evidence pack: year-end statement of contract year 1 of "
                             "contract C-CLOSED (Closed Year Ltd)")
    assert f"ledger entry {statement.seq}" in readme

    (folder / "operator.key").write_text(app_ctx.signer.verifier_text() + "\n")
    argv = _readme_command(folder)
    assert argv[0] == "yoco-verify" and "--since" in argv and argv.count("--report") == 2
    monkeypatch.chdir(folder)
    code = yoco_verify(argv[1:])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("is recorded by report entry") == 2, out
    assert f"statement {stem}.pdf: C-CLOSED contract year 1, checkpoint " \
        f"{statement.checkpoint_size}" in out, out
    # The close the statement shows, its figures recomputed from the entries before it.
    assert out.count("states contract year 1's figures as the entries before it give "
                     "them (60.00 % (3 of 5), missed); its credit follows the rule") == 2, out
    assert out.count("shows covered failures 5  matches") == 2, out
    assert f"since checkpoint {statement.checkpoint_size}: this log of " \
        f"{pack.log_tree_size} entries extends it" in out, out
    assert out.rstrip().endswith("OK: every check passed and every figure matches"), out

    # One byte of the issued HTML changed: refused, naming the file and its digest.
    html = bytearray((folder / f"{stem}.html").read_bytes())
    at = html.index(b"Covered failures")
    html[at] = ord("c")
    (folder / f"{stem}.html").write_bytes(bytes(html))
    code = yoco_verify(argv[1:])
    out = capsys.readouterr().out
    assert code == 1, out
    digest = hashlib.sha256(bytes(html)).hexdigest()
    assert (f"report {stem}.html: issued: SHA-256 {digest} is recorded by no report entry "
            "of this log") in out, out
    assert out.rstrip().splitlines()[-1].startswith("FAILED:"), out


def test_only_an_issued_statement_under_a_checkpoint_has_a_pack(
    seed: Callable[..., None], app_ctx: Any
) -> None:
    from billing.closing import close_year
    from reports.statement import issue_year_statement

    c, recs = sc.closed_year()
    seed([c], recs)
    with unit_of_work(app_ctx.engine) as s:
        with pytest.raises(NotIssued, match=r"statement of contract year 1 of 'C-CLOSED' has "
                           r"not been issued \(yet\): only an issued statement has an "
                           "evidence pack"):
            build_evidence_pack(s, "C-CLOSED", "year-1")
        for bad in ("year-0", "year-x", "year-1000"):
            with pytest.raises(BadMonth):
                build_evidence_pack(s, "C-CLOSED", bad)
    with unit_of_work(app_ctx.engine) as s:
        close_year(s, "C-CLOSED", 1, signer=app_ctx.signer,
                   origin_prefix=app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        doc = issue_year_statement(s, "C-CLOSED", 1)
    # Issued, but no checkpoint holds its entry yet.
    with unit_of_work(app_ctx.engine) as s, pytest.raises(
        EvidenceNotReady, match=f"ledger entry {doc.seq} .* is not under a signed checkpoint"
    ):
        build_evidence_pack(s, "C-CLOSED", "year-1")


def test_the_cli_writes_a_statements_pack_with_year(
    statement: Any, app_ctx: Any, tmp_path: Path
) -> None:
    out = tmp_path / "year.zip"
    result = _cli("reports", "evidence", "--contract", "C-CLOSED", "--year", "1",
                  "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "evidence pack of C-CLOSED year-1 written to" in result.stdout, result.stdout
    assert "the issued statement over checkpoint" in result.stdout, result.stdout
    with unit_of_work(app_ctx.engine) as s:
        assert out.read_bytes() == build_evidence_pack(s, "C-CLOSED", "year-1").data
    for args, field, words in (
        (("--year", "2"), "--year", "has not been issued"),
        (("--year", "1", "--month", "2025-12"), "--month/--year", "give one of"),
        ((), "--month/--year", "give one of"),
        (("--year", "0"), "--year", "greater than or equal to 1"),
    ):
        target = tmp_path / f"bad-{len(args)}.zip"
        bad = _cli("reports", "evidence", "--contract", "C-CLOSED", *args, "--out",
                   str(target))
        assert bad.exit_code == 2, bad.output
        assert field in bad.stderr and words in bad.stderr, bad.stderr
        assert not target.exists()
