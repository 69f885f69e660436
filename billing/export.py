"""The finance export of renewal credits: CSV, XLSX and JSON, byte-stable.

One row per credit (see :data:`COLUMNS`), in a stable order (issue time, contract,
year, credit note).  The export batch id is derived from the selection and the rows'
content (``EXP-`` + 20 hex digits of a SHA-256), so the same selection over unchanged
credits gives the same id and byte-identical files; a change of any credit (an
application, a void, a new credit) gives a new id.  No export-time clock is written
into the file (XLSX document properties and zip entry times are fixed).  Every
export is recorded in the ledger (log ``yoco:billing-exports``) as an ``export``
entry: batch id, selection, format, row count and the file's SHA-256 (an identical
re-export is the same entry, recorded once).

Dates are UTC dates (``issue_date``) or the contract's local dates (``period_start``
is the year's first day, ``period_end`` its last day, inclusive).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing import entries
from billing.errors import ExportRefused
from billing.models import Credit
from billing.money import format_minor, minor_unit_exponent
from billing.sla import decimal_string
from billing.yearend import year_days
from ledger import journal
from ledger.canonical import canonical_bytes
from ledger.contracts import get_contract
from ledger.models import Contract, JournalEntry
from yoco_records.textsafe import isolate

__all__ = [
    "COLUMNS",
    "FORMATS",
    "FORMULA_TRIGGERS",
    "STATUSES",
    "ExportResult",
    "export_credits",
    "export_rows",
    "spreadsheet_text",
]

FORMATS = ("csv", "xlsx", "json")
STATUSES = ("issued", "partially_applied", "applied", "void")

#: Export columns, in order.
COLUMNS: tuple[str, ...] = (
    "export_batch_id",
    "credit_id",
    "credit_note",
    "issue_date",
    "customer_id",
    "customer_name",
    "contract_id",
    "contract_year",
    "period_start",
    "period_end",
    "covered_failures",
    "resolved_failures",
    "resolution_rate",
    "threshold_percent",
    "credit_percent",
    "base_amount",
    "base_minor_units",
    "credit_amount",
    "credit_minor_units",
    "currency",
    "status",
    "applied_amount",
    "applied_minor_units",
    "remaining_balance",
    "remaining_minor_units",
    "void_date",
    "ledger_entry_hash",
)
_DATES = {"issue_date", "period_start", "period_end", "void_date"}
_MONEY = {"base_amount", "credit_amount", "applied_amount", "remaining_balance"}
_INTS = {
    "contract_year",
    "covered_failures",
    "resolved_failures",
    "base_minor_units",
    "credit_minor_units",
    "applied_minor_units",
    "remaining_minor_units",
}
_PERCENTS = {"threshold_percent", "credit_percent"}
_FIXED_TIME = datetime(2000, 1, 1)
#: Columns whose values are text from the ledger (customer names, contract ids …), not
#: numbers or dates yoco formatted itself: neutralised by :func:`spreadsheet_text`.
_TEXT = frozenset(COLUMNS) - _DATES - _MONEY - _INTS - _PERCENTS - {"resolution_rate"}
#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV
#: injection): ``=``, ``+``, ``-``, ``@``, TAB and CR, and their full-width forms, which
#: some spreadsheets fold to the ASCII ones.
FORMULA_TRIGGERS = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20")


def spreadsheet_text(value: str) -> str:
    """``value`` as a spreadsheet must show it, never run it nor let it reorder its row:
    prefixed with a single quote when it starts with a formula trigger
    (:data:`FORMULA_TRIGGERS`), as OWASP's CSV-injection guidance says, and a bidi
    isolate when it holds right-to-left text or a bidi control
    (``yoco_records.textsafe.isolate``: a U+202E in a customer name cannot reverse the
    rest of the row where the CSV is read as text); unchanged otherwise.  The quote
    stays the cell's first character.  The one neutraliser of the CSV and the XLSX
    export (the JSON carries the exact text)."""
    text = isolate(value)
    if value and value[0] in FORMULA_TRIGGERS:
        return "'" + text
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """An export: its batch id, the file's bytes and SHA-256, and its ledger record."""

    batch_id: str
    format: str
    selection: dict[str, Any]
    row_count: int
    data: bytes
    sha256: str
    event_id: str | None
    recorded: bool


def _selection(
    since: date | None, statuses: Sequence[str] | None, contract_id: str | None
) -> dict[str, Any]:
    if since is not None and (not isinstance(since, date) or isinstance(since, datetime)):
        raise ExportRefused(f"since: expected a date, got {since!r}")
    chosen: list[str] | None = None
    if statuses:
        bad = sorted(set(statuses) - set(STATUSES))
        if bad:
            raise ExportRefused(f"status: unknown status(es) {bad}; expected {list(STATUSES)}")
        chosen = sorted(set(statuses))
    return {
        "since": since.isoformat() if since else None,
        "status": chosen,
        "contract_id": contract_id,
    }


def export_rows(
    session: Session,
    *,
    since: date | None = None,
    statuses: Sequence[str] | None = None,
    contract_id: str | None = None,
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The batch id, the normalized selection and the rows of an export (plain values).

    Money as decimal strings at the currency's exponent plus integer minor units; dates
    as ``YYYY-MM-DD``; percents as decimal strings.  Raises :class:`ExportRefused`.
    """
    sel = _selection(since, statuses, contract_id)
    if contract_id is not None:
        get_contract(session, contract_id)
    q = (
        select(Credit, Contract.customer, Contract.start_date, JournalEntry.leaf_hash)
        .join(Contract, Contract.contract_id == Credit.contract_id)
        .join(JournalEntry, JournalEntry.event_id == Credit.credit_id)
    )
    if since is not None:
        q = q.where(Credit.issued_at >= datetime(since.year, since.month, since.day, tzinfo=UTC))
    if sel["status"]:
        q = q.where(Credit.status.in_(sel["status"]))
    if contract_id is not None:
        q = q.where(Credit.contract_id == contract_id)
    q = q.order_by(Credit.issued_at, Credit.contract_id, Credit.year, Credit.credit_note)
    rows: list[dict[str, Any]] = []
    for c, customer, start_date, leaf in session.execute(q):
        first, last = year_days(start_date, c.year)
        cur = c.currency
        remaining = 0 if c.status == "void" else c.amount_minor - c.applied_minor
        rows.append(
            {
                "credit_id": str(c.credit_id),
                "credit_note": c.credit_note,
                "issue_date": c.issued_at.astimezone(UTC).date().isoformat(),
                "customer_id": customer,
                "customer_name": customer,
                "contract_id": c.contract_id,
                "contract_year": c.year,
                "period_start": first.isoformat(),
                "period_end": last.isoformat(),
                "covered_failures": c.covered_failures,
                "resolved_failures": c.resolved_failures,
                "resolution_rate": ""
                if c.covered_failures == 0
                else decimal_string(Fraction(c.resolved_failures, c.covered_failures)),
                "threshold_percent": format(c.threshold_percent, "f"),
                "credit_percent": format(c.credit_percent, "f"),
                "base_amount": format_minor(c.base_minor, cur),
                "base_minor_units": c.base_minor,
                "credit_amount": format_minor(c.amount_minor, cur),
                "credit_minor_units": c.amount_minor,
                "currency": cur,
                "status": c.status,
                "applied_amount": format_minor(c.applied_minor, cur),
                "applied_minor_units": c.applied_minor,
                "remaining_balance": format_minor(remaining, cur),
                "remaining_minor_units": remaining,
                "void_date": c.voided_at.astimezone(UTC).date().isoformat() if c.voided_at else "",
                "ledger_entry_hash": bytes(leaf).hex(),
            }
        )
    digest = hashlib.sha256(canonical_bytes({"selection": sel, "rows": rows})).hexdigest()
    batch_id = f"EXP-{digest[:20]}"
    return batch_id, sel, [{"export_batch_id": batch_id, **r} for r in rows]


def _csv(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([spreadsheet_text(r[c]) if c in _TEXT else r[c] for c in COLUMNS])
    return buf.getvalue().encode("utf-8")


def _json(batch_id: str, sel: dict[str, Any], rows: list[dict[str, Any]]) -> bytes:
    doc = {"export_batch_id": batch_id, "selection": sel, "row_count": len(rows), "rows": rows}
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _money_format(currency: str) -> str:
    places = minor_unit_exponent(currency)
    return "#,##0" + ("." + "0" * places if places else "")


def _xlsx(batch_id: str, rows: list[dict[str, Any]]) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Font
    from openpyxl.utils import get_column_letter
    from openpyxl.writer.excel import ExcelWriter

    wb = Workbook()
    ws = wb.worksheets[0]
    ws.title = "credits"
    ws.append(list(COLUMNS))
    for cell in ws[1]:
        cell.font = Font(bold=True)
    for r in rows:
        values: list[Any] = []
        for col in COLUMNS:
            v = r[col]
            if col in _DATES:
                v = date.fromisoformat(v) if v else None
            elif col in _MONEY or col in _PERCENTS:
                v = Decimal(v)
            elif col == "resolution_rate":
                v = Decimal(v) if v else None
            elif col in _TEXT:
                v = spreadsheet_text(str(v))
            values.append(v)
        ws.append(values)
        row_idx = ws.max_row
        for i, col in enumerate(COLUMNS, start=1):
            cell = ws.cell(row=row_idx, column=i)
            if col in _TEXT:
                # A string cell, whatever it starts with: openpyxl would store a value
                # starting with "=" as a live formula.
                cell.data_type = "s"
            if col in _DATES:
                cell.number_format = "yyyy-mm-dd"
            elif col in _MONEY:
                cell.number_format = _money_format(r["currency"])
            elif col in _INTS:
                cell.number_format = "0"
            elif col == "resolution_rate":
                cell.number_format = "0.0000%"
            elif col in _PERCENTS:
                cell.number_format = "0.####"
    ws.freeze_panes = "D2"
    ws.auto_filter.ref = f"A1:{get_column_letter(len(COLUMNS))}{max(1, len(rows) + 1)}"
    for i, col in enumerate(COLUMNS, start=1):
        width = max([len(col)] + [len(str(r[col])) for r in rows])
        ws.column_dimensions[get_column_letter(i)].width = min(width + 2, 70)
    wb.properties.creator = "yoco"
    wb.properties.title = f"yoco credits export {batch_id}"
    wb.properties.created = _FIXED_TIME
    wb.properties.modified = _FIXED_TIME
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        ExcelWriter(wb, archive).write_data()
    # Re-pack with fixed entry times so the same content gives the same bytes.
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(raw.getvalue())) as zin,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout,
    ):
        for info in zin.infolist():
            fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            fixed.compress_type = zipfile.ZIP_DEFLATED
            fixed.external_attr = 0o600 << 16
            zout.writestr(fixed, zin.read(info.filename))
    return out.getvalue()


def export_credits(
    session: Session,
    fmt: str,
    *,
    since: date | None = None,
    statuses: Sequence[str] | None = None,
    contract_id: str | None = None,
    record: bool = True,
    now: datetime | None = None,
) -> ExportResult:
    """Build the finance export of the selected credits and record it; never commits.

    Promises: the same selection over unchanged credits gives the same batch id and
    byte-identical data in every format.  With ``record``, appends an ``export``
    entry (once per batch id, format and file hash).  Raises :class:`ExportRefused`
    for an unknown format or status, UnknownContract for an unknown contract.
    """
    if fmt not in FORMATS:
        raise ExportRefused(f"format: expected one of {list(FORMATS)}, got {fmt!r}")
    batch_id, sel, rows = export_rows(
        session, since=since, statuses=statuses, contract_id=contract_id
    )
    if fmt == "csv":
        data = _csv(rows)
    elif fmt == "json":
        data = _json(batch_id, sel, rows)
    else:
        data = _xlsx(batch_id, rows)
    sha = hashlib.sha256(data).hexdigest()
    event: str | None = None
    recorded = False
    if record:
        eid = entries.event_id("export", batch_id, fmt, sha)
        event = str(eid)
        sizes = journal.lock_logs(session, [entries.EXPORT_LOG])
        if entries.existing(session, eid) is None:
            entries.append(
                session,
                [
                    entries.make_entry(
                        "export",
                        eid,
                        entries.EXPORT_LOG,
                        now or datetime.now(UTC),
                        {
                            "batch_id": batch_id,
                            "format": fmt,
                            "selection": sel,
                            "row_count": len(rows),
                            "sha256": sha,
                        },
                    )
                ],
                sizes,
            )
            recorded = True
    return ExportResult(
        batch_id=batch_id,
        format=fmt,
        selection=sel,
        row_count=len(rows),
        data=data,
        sha256=sha,
        event_id=event,
        recorded=recorded,
    )
