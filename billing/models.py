"""SQLAlchemy models of billing's projections (migration ``0002``).

Every table is a projection of billing's journal entries (``year_close``,
``adjustment``, ``credit``, ``credit_void``, ``credit_application``,
``dispute_opened`` / ``dispute_resolved`` / ``dispute_rejected``,
``reclassification``, ``amendment``, ``export``), written in the same
transaction as the entries by :mod:`billing.projections` and rebuilt from the
journal by ``yoco ledger rebuild``.  Money is integer minor units.

The database, not only the code, guarantees one credit per contract year
(``uq_billing_credits_live_year``: unique ``(contract_id, year)`` among credits
that are not void) and one first close per year (``billing_years`` primary key
and ``uq_billing_closes_first_close``).
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from ledger.models import Base

__all__ = [
    "TABLES",
    "Amendment",
    "BillingYear",
    "Close",
    "Credit",
    "CreditApplication",
    "Dispute",
    "ExportRecord",
    "Reclassification",
]

_TS = DateTime(timezone=True)


class BillingYear(Base):
    """A closed contract year: its first close, its latest verdict, a pending adjustment."""

    __tablename__ = "billing_years"

    contract_id: Mapped[str] = mapped_column(Text, primary_key=True)
    year: Mapped[int] = mapped_column(Integer, primary_key=True)
    close_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    closed_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    closed_at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    last_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    last_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    guarantee_met: Mapped[bool] = mapped_column(Boolean, nullable=False)
    adjustments: Mapped[int] = mapped_column(Integer, nullable=False)
    # The first late record (failure, outcome, exclusion, reclassification) after the
    # latest close or adjustment: the year needs an adjustment.
    pending_seq: Mapped[int | None] = mapped_column(BigInteger)
    pending_event_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))

    __table_args__ = (CheckConstraint("year >= 1", name="year_positive"),)


class Close(Base):
    """A ``year_close`` or ``adjustment`` entry: the figures a verdict was given on."""

    __tablename__ = "billing_closes"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    year: Mapped[int] = mapped_column(Integer, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    period_start: Mapped[datetime] = mapped_column(_TS, nullable=False)
    period_end: Mapped[datetime] = mapped_column(_TS, nullable=False)
    covered_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    resolved_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    excluded_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    pending_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    threshold_percent: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    guarantee_met: Mapped[bool] = mapped_column(Boolean, nullable=False)
    tree_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    root_hash: Mapped[str] = mapped_column(Text, nullable=False)
    figures: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    terms: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)

    __table_args__ = (
        CheckConstraint("kind IN ('year_close', 'adjustment')", name="kind_known"),
        Index(
            "uq_billing_closes_first_close",
            "contract_id",
            "year",
            unique=True,
            postgresql_where=text("kind = 'year_close'"),
        ),
    )


class Credit(Base):
    """A renewal credit (``credit`` entry), with what was applied of it and whether it is void."""

    __tablename__ = "billing_credits"

    credit_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    year: Mapped[int] = mapped_column(Integer, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    credit_note: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    issued_at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    close_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    period_start: Mapped[datetime] = mapped_column(_TS, nullable=False)
    period_end: Mapped[datetime] = mapped_column(_TS, nullable=False)
    covered_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    resolved_failures: Mapped[int] = mapped_column(Integer, nullable=False)
    threshold_percent: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    credit_percent: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    currency: Mapped[str] = mapped_column(Text, nullable=False)
    base_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    amount_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    applied_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False)
    void_event_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    voided_at: Mapped[datetime | None] = mapped_column(_TS)

    __table_args__ = (
        CheckConstraint("amount_minor >= 0", name="amount_nonnegative"),
        CheckConstraint("base_minor >= 0", name="base_nonnegative"),
        CheckConstraint(
            "applied_minor >= 0 AND applied_minor <= amount_minor", name="applied_within_amount"
        ),
        CheckConstraint(
            "status IN ('issued', 'partially_applied', 'applied', 'void')", name="status_known"
        ),
        Index(
            "uq_billing_credits_live_year",
            "contract_id",
            "year",
            unique=True,
            postgresql_where=text("status <> 'void'"),
        ),
        Index("ix_billing_credits_issued_at", "issued_at"),
    )


class CreditApplication(Base):
    """Part of a credit applied to a renewal or expansion invoice (``credit_application``)."""

    __tablename__ = "billing_credit_applications"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    credit_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("billing_credits.credit_id"), nullable=False
    )
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    invoice_ref: Mapped[str] = mapped_column(Text, nullable=False)
    invoice_kind: Mapped[str] = mapped_column(Text, nullable=False)
    invoice_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    amount_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    remaining_minor: Mapped[int] = mapped_column(BigInteger, nullable=False)
    applied_on: Mapped[date] = mapped_column(Date, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)

    __table_args__ = (
        CheckConstraint("amount_minor > 0", name="amount_positive"),
        CheckConstraint("remaining_minor >= 0", name="remaining_ok"),
        Index("ix_billing_credit_applications_credit_id", "credit_id"),
    )


class Dispute(Base):
    """A customer's dispute of a failure event, and the operator's decision."""

    __tablename__ = "billing_disputes"

    dispute_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    failure_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    opened_at: Mapped[datetime] = mapped_column(_TS, nullable=False)
    opened_by: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False)
    resolution: Mapped[str | None] = mapped_column(Text)
    decision_event_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    decided_at: Mapped[datetime | None] = mapped_column(_TS)
    decided_by: Mapped[str | None] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint("status IN ('open', 'resolved', 'rejected')", name="status_known"),
        Index("ix_billing_disputes_contract_id_status", "contract_id", "status"),
    )


class Reclassification(Base):
    """A failure's class and cause as corrected by the operator (latest one counts)."""

    __tablename__ = "billing_reclassifications"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    failure_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    failure_class: Mapped[str] = mapped_column(Text, nullable=False)
    cause: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)

    __table_args__ = (Index("ix_billing_reclassifications_failure_event_id", "failure_event_id"),)


class Amendment(Base):
    """An effective-dated change of a contract's values, term or guarantee terms."""

    __tablename__ = "billing_amendments"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    amendment_type: Mapped[str] = mapped_column(Text, nullable=False)
    effective_date: Mapped[date] = mapped_column(Date, nullable=False)
    applies_to_year_in_progress: Mapped[bool] = mapped_column(Boolean, nullable=False)
    changes: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)

    __table_args__ = (Index("ix_billing_amendments_contract_id_seq", "contract_id", "seq"),)


class ExportRecord(Base):
    """A finance export: its batch id, selection, row count and the file's SHA-256."""

    __tablename__ = "billing_exports"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    log_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    batch_id: Mapped[str] = mapped_column(Text, nullable=False)
    format: Mapped[str] = mapped_column(Text, nullable=False)
    selection: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    row_count: Mapped[int] = mapped_column(Integer, nullable=False)
    sha256: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(_TS, nullable=False)

    __table_args__ = (Index("ix_billing_exports_batch_id", "batch_id"),)


#: Billing's projection tables, children first (emptied by ``yoco ledger rebuild``).
TABLES: tuple[str, ...] = (
    "billing_credit_applications",
    "billing_credits",
    "billing_closes",
    "billing_years",
    "billing_disputes",
    "billing_reclassifications",
    "billing_amendments",
    "billing_exports",
)
