"""SQLAlchemy models of the ledger: the journal, its Merkle nodes, checkpoints, projections.

The journal (``journal_entries``), the Merkle nodes and the signed checkpoints
are append-only: the migrations add triggers, enabled ALWAYS, that refuse
UPDATE, DELETE and TRUNCATE, and the application role may only INSERT and
SELECT them.  Everything else here is a projection of the journal, written in
the same transaction as the entries and rebuildable from them.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    SmallInteger,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base shared by every package's models (one metadata, one migration history)."""

    metadata = MetaData(naming_convention=NAMING)


class LedgerLog(Base):
    """One Merkle log (one per contract): its current size, advanced under a row lock."""

    __tablename__ = "ledger_logs"

    log_id: Mapped[str] = mapped_column(Text, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (CheckConstraint("size >= 0", name="size_nonnegative"),)


class JournalEntry(Base):
    """An entry of a log: the producer's record, its canonical bytes and its leaf hash."""

    __tablename__ = "journal_entries"

    log_id: Mapped[str] = mapped_column(Text, ForeignKey("ledger_logs.log_id"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    canonical: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    leaf_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    body: Mapped[dict[str, object]] = mapped_column(JSONB, nullable=False)

    __table_args__ = (
        CheckConstraint("seq >= 0", name="seq_nonnegative"),
        CheckConstraint("octet_length(leaf_hash) = 32", name="leaf_hash_sha256"),
        Index(None, "contract_id", "kind", "occurred_at"),
    )


class MerkleNode(Base):
    """Hash of the perfect subtree covering leaves [idx·2^level, (idx+1)·2^level) of a log."""

    __tablename__ = "merkle_nodes"

    log_id: Mapped[str] = mapped_column(Text, ForeignKey("ledger_logs.log_id"), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Checkpoint(Base):
    """A signed tree head (C2SP checkpoint note) of one log."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    log_id: Mapped[str] = mapped_column(Text, ForeignKey("ledger_logs.log_id"), nullable=False)
    tree_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    root_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    origin: Mapped[str] = mapped_column(Text, nullable=False)
    key_id: Mapped[str] = mapped_column(Text, nullable=False)
    note: Mapped[str] = mapped_column(Text, nullable=False)
    signed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (UniqueConstraint("log_id", "tree_size"),)


# --- projections -----------------------------------------------------------------


class Contract(Base):
    """Projection of a contract entry: the contract and the terms it was made with."""

    __tablename__ = "contracts"

    contract_id: Mapped[str] = mapped_column(Text, primary_key=True)
    customer: Mapped[str] = mapped_column(Text, nullable=False)
    start_date: Mapped[date] = mapped_column(Date, nullable=False)
    timezone: Mapped[str] = mapped_column(Text, nullable=False)
    term_years: Mapped[int] = mapped_column(Integer, nullable=False)
    currency: Mapped[str] = mapped_column(Text, nullable=False)
    annual_value: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    renewal_value: Mapped[Decimal | None] = mapped_column(Numeric)
    gpu_hour_price: Mapped[Decimal | None] = mapped_column(Numeric)
    terms: Mapped[dict[str, object]] = mapped_column(JSONB, nullable=False)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)


class JobSpan(Base):
    """A job's running span: from a job_started entry to the job_finished that closes it."""

    __tablename__ = "job_spans"

    start_event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    job_id: Mapped[str] = mapped_column(Text, nullable=False)
    gpus: Mapped[int] = mapped_column(Integer, nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    start_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finish_event_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))

    __table_args__ = (
        Index(None, "contract_id", "job_id"),
        Index(None, "contract_id", "started_at"),
    )


class Failure(Base):
    """Projection of a failure entry."""

    __tablename__ = "failures"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    job_id: Mapped[str] = mapped_column(Text, nullable=False)
    failure_class: Mapped[str] = mapped_column(Text, nullable=False)
    cause: Mapped[str] = mapped_column(Text, nullable=False)
    node: Mapped[str | None] = mapped_column(Text)
    gpu: Mapped[int | None] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(BigInteger)
    detail: Mapped[str | None] = mapped_column(Text)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index(None, "contract_id", "occurred_at"),)


class Outcome(Base):
    """Projection of an outcome entry (every outcome is kept; the latest one counts)."""

    __tablename__ = "outcomes"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    failure_event_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("failures.event_id"), nullable=False
    )
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    outcome: Mapped[str] = mapped_column(Text, nullable=False)
    lost_steps: Mapped[int] = mapped_column(BigInteger, nullable=False)
    recovery_seconds: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    step_seconds: Mapped[Decimal] = mapped_column(Numeric, nullable=False)
    gpus_affected: Mapped[int] = mapped_column(Integer, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index(None, "failure_event_id"),)


class Exclusion(Base):
    """Projection of an exclusion entry: a failure taken out of coverage, with why and by whom."""

    __tablename__ = "exclusions"

    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    failure_event_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("failures.event_id"), nullable=False
    )
    contract_id: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    approved_by: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index(None, "failure_event_id"),)


APPEND_ONLY_TABLES = ("journal_entries", "merkle_nodes", "checkpoints")
PROJECTION_TABLES = ("contracts", "job_spans", "failures", "outcomes", "exclusions")
