"""SQLAlchemy model of issued documents (migration ``0022``): the exact bytes of every
monthly report and year-end statement that was issued, kept as issued.

A document is issued once per contract, kind and period (``YYYY-MM`` for a monthly
report, ``year-K`` for a year-end statement): the primary key is
``(contract_id, document, period)``.  Its bytes are written once and never changed:
the table is append-only (UPDATE, DELETE and TRUNCATE refused by triggers enabled
ALWAYS; the application role may only SELECT and INSERT), and the database checks
that each stored digest is the SHA-256 of the stored bytes.  ``(contract_id, seq)``
names the ``report`` entry of the contract's log that holds the same digests.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    LargeBinary,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from ledger.models import Base

__all__ = ["DOCUMENT_KINDS", "MONTHLY", "STATEMENT", "TABLES", "IssuedDocument"]

#: The document kind of monthly SLA reports (the ``report`` field of their entries).
MONTHLY = "monthly-sla"
#: The document kind of year-end statements (the year close and its credit note).
STATEMENT = "year-statement"
#: The kinds of issued documents (the ``report`` field of their ledger entries).
DOCUMENT_KINDS = (MONTHLY, STATEMENT)
TABLES = ("issued_documents",)


class IssuedDocument(Base):
    """One issued document: its HTML and PDF bytes, their digests, the checkpoint it was
    computed over and the ledger entry that records it."""

    __tablename__ = "issued_documents"

    contract_id: Mapped[str] = mapped_column(Text, primary_key=True)
    document: Mapped[str] = mapped_column(Text, primary_key=True)
    period: Mapped[str] = mapped_column(Text, primary_key=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    checkpoint_tree_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    checkpoint_root_hash: Mapped[str] = mapped_column(Text, nullable=False)
    html: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    pdf: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    html_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    pdf_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    issued_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (
        CheckConstraint("document IN ('monthly-sla', 'year-statement')", name="document_known"),
        CheckConstraint(
            "(document = 'monthly-sla' AND period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$') OR "
            "(document = 'year-statement' AND period ~ '^year-[1-9][0-9]{0,2}$')",
            name="period_format",
        ),
        CheckConstraint("html_sha256 = encode(sha256(html), 'hex')", name="html_digest"),
        CheckConstraint("pdf_sha256 = encode(sha256(pdf), 'hex')", name="pdf_digest"),
        CheckConstraint("checkpoint_tree_size > 0 AND seq >= 0", name="sizes_valid"),
        # The report entry comes after the checkpoint it speaks of.
        CheckConstraint("seq >= checkpoint_tree_size", name="entry_after_checkpoint"),
        ForeignKeyConstraint(
            ["contract_id", "seq"], ["journal_entries.log_id", "journal_entries.seq"]
        ),
    )
