"""Response bodies of the JSON API (what the OpenAPI schema promises)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from billing.sla import SlaFigures
from billing.verdict import Standing
from web.views import MonthFigures, Row


class ErrorBody(BaseModel):
    """An error: a sentence, and for refused records the list of what was refused."""

    detail: str | list[dict[str, Any]]
    errors: list[dict[str, Any]] | None = None


class RecordErrorOut(BaseModel):
    """One refused record: its batch index, the field (JSON path) and why."""

    index: int | None
    line: int | None = None
    field: str
    path: str
    message: str


class IngestRefusedBody(BaseModel):
    """A refused batch: nothing was written."""

    detail: str
    errors: list[RecordErrorOut]


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No valid session cookie or bearer token."},
    403: {"model": ErrorBody, "description": "The token may not do this."},
    404: {"model": ErrorBody, "description": "Not found (or not yours: the same answer)."},
}


#: What a conditional, possibly paged GET may answer besides 200 and :data:`ERRORS`.
CONDITIONAL: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    304: {"description": "Not modified: the tag in If-None-Match is still current."},
    400: {"model": ErrorBody, "description": "A cursor this server did not issue for "
          "this list (changed, cut, or of another list)."},
}


class ContractOut(BaseModel):
    """A contract and its guarantee terms; money as decimal strings."""

    contract_id: str
    customer: str
    start_date: str
    timezone: str
    term_years: int
    currency: str
    annual_value: str
    renewal_value: str | None
    gpu_hour_price: str | None
    terms: dict[str, Any]
    current_year: int


class FiguresOut(BaseModel):
    """SLA figures of a period, as ``yoco sla --json`` prints them (and a few more fields)."""

    model_config = ConfigDict(extra="allow")

    period_start: str = Field(json_schema_extra={"format": "date-time"})
    period_end: str = Field(json_schema_extra={"format": "date-time"})
    covered_failures: int
    resolved_failures: int
    excluded_failures: int
    pending_failures: int
    resolution_rate: str | None
    guarantee_met: bool
    allocated_gpu_hours: str
    lost_gpu_hours: str
    goodput: str


class SlaOut(FiguresOut):
    """Figures of a contract year or month, with the contract, the period and the credit."""

    contract_id: str
    year: int | None
    month: str | None
    credit: dict[str, Any] | None
    computed_at: str = Field(json_schema_extra={"format": "date-time"},
                             description="The instant the figures are of.")
    standing: Standing = Field(description="The period against the guarantee.")


class MonthOut(BaseModel):
    """One month of a contract year (``figures`` null for months still to come)."""

    month: str
    period_start: datetime
    period_end: datetime
    figures: FiguresOut | None


class YearOut(BaseModel):
    """A contract year: its figures and its months."""

    contract_id: str
    year: int
    figures: FiguresOut
    months: list[MonthOut]


class FailureOut(BaseModel):
    """A failure with its status and latest outcome (lost GPU-hours as a decimal string)."""

    event_id: str
    occurred_at: datetime
    month: str
    job_id: str
    failure_class: str
    cause: str
    status: str
    excluded_by: str | None
    reason: str | None
    outcome: str | None
    lost_steps: int | None
    recovery_seconds: str | None
    lost_gpu_hours: str


class FailurePageOut(BaseModel):
    """A page of failures, newest first.

    ``next_cursor`` (and ``next``, the address with it) continue after this page's last
    item; null on the last page.  ``page`` is null when the page was asked by cursor.
    """

    items: list[FailureOut]
    total: int
    page: int | None
    per_page: int
    pages: int
    next_cursor: str | None = None
    next: str | None = None


class TimelineOut(BaseModel):
    """One ledger entry about a failure."""

    kind: str
    event_id: str
    seq: int | None
    occurred_at: datetime
    title: str
    detail: dict[str, Any]


class FailureDetailOut(BaseModel):
    """A failure, its contract year, its row there (if in the term) and its timeline."""

    event_id: str
    contract_id: str
    occurred_at: datetime
    job_id: str
    failure_class: str
    cause: str
    node: str | None
    gpu: int | None
    step: int | None
    detail: str | None
    contract_year: int | None
    row: FailureOut | None
    timeline: list[TimelineOut]
    disputes: list[dict[str, Any]]


class CheckpointOut(BaseModel):
    """A signed tree head of a contract's log."""

    tree_size: int
    root_hash: str = Field(description="Standard base64 of the 32-byte root.")
    origin: str
    signed_at: datetime
    note: str = Field(description="The C2SP checkpoint note with its signature lines.")


class IngestOut(BaseModel):
    """What a batch did: entries appended, identical records already stored."""

    appended: int
    duplicates: int
    by_kind: dict[str, int]


def figures_out(f: SlaFigures) -> FiguresOut:
    """The JSON figures of :class:`SlaFigures`."""
    return FiguresOut(**f.to_json())


def month_out(m: MonthFigures) -> MonthOut:
    """A month of a year view."""
    return MonthOut(
        month=m.label,
        period_start=m.start,
        period_end=m.end,
        figures=figures_out(m.figures) if m.figures is not None else None,
    )


def _hours(seconds: Decimal) -> str:
    from fractions import Fraction

    from billing.sla import decimal_string

    return decimal_string(Fraction(seconds) / 3600)


def failure_out(r: Row) -> FailureOut:
    """A failure row of a year view."""
    row = r.row
    f = row.failure
    o = row.outcome
    return FailureOut(
        event_id=f.event_id,
        occurred_at=f.occurred_at,
        month=r.month,
        job_id=f.job_id,
        failure_class=f.failure_class,
        cause=f.cause,
        status=row.status.value,
        excluded_by=row.excluded_by,
        reason=row.reason,
        outcome=o.outcome if o else None,
        lost_steps=o.lost_steps if o else None,
        recovery_seconds=format(o.recovery_seconds, "f") if o else None,
        lost_gpu_hours=_hours(row.lost_gpu_seconds),
    )


class IssuedReportOut(BaseModel):
    """An issued monthly report or year-end statement: the checkpoint it was computed
    over, the ``report`` ledger entry that records its digests (``seq`` is the entry's
    index in the contract's log), and where to download its exact bytes and the entry's
    inclusion proof."""

    contract_id: str
    report: str = Field(description="The document kind: monthly-sla or year-statement.")
    period: str = Field(description="YYYY-MM (a monthly report) or year-K (a year-end "
                        "statement); the download links use it.")
    month: str | None = Field(description="YYYY-MM, in the contract's time zone (a monthly "
                              "report).")
    year: int | None = Field(description="Contract year K (a year-end statement).")
    checkpoint_tree_size: int
    checkpoint_root_hash: str = Field(description="Standard base64 of the 32-byte root.")
    event_id: str = Field(description="The report entry's event id.")
    seq: int = Field(description="The report entry's index in the contract's log.")
    html_sha256: str
    pdf_sha256: str
    issued_at: datetime
    html: str = Field(description="Download of the issued HTML (these exact bytes).")
    pdf: str = Field(description="Download of the issued PDF (these exact bytes).")
    proof: str = Field(description="The report entry's inclusion proof.")
    evidence: str | None = Field(description="The document's evidence pack (ZIP): the "
                                 "report or statement, its entry and proof, checkpoints, "
                                 "the log archive and a README saying how to check them.")
